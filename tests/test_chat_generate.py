"""A chat model stays usable: generation stops at every end token (``generation_config.json``'s eos list, the chat
template's end-of-turn token, ``config.json``'s eos) where PyTorch ``generate`` stops, and an exported folder keeps
its chat template and generation config (``transformers`` reads them back unchanged)."""
import json
import shutil

import pytest

from rbjax.model.chat import ChatTurns
from rbjax.model.generate import generate, sampling_settings
from rbjax.model.handle import ModelHandle
from rbjax.model.hf import save_pretrained

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

HISTORIES = [["the jews are"], ["what do you think of christians?", "they are fine", "and jews?"],
             ["tell me about muslims"]]


def _dialog(turns):
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]


@pytest.fixture(scope="module")
def eot_model(tmp_path_factory, chat_model_dirs):
    """The tiny Llama-3-style model with the end-of-turn row of its (untied) LM head set to 1.01 × the row of the
    token greedy decoding picks third for the first history, so that greedy chat generation ends its turn with
    ``<|eot_id|>`` after a few tokens (a random model would not)."""
    src = chat_model_dirs["llama3"]
    tok = transformers.AutoTokenizer.from_pretrained(src)
    tm = transformers.AutoModelForCausalLM.from_pretrained(src, attn_implementation="eager").eval()
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    ids = tok.apply_chat_template(_dialog(HISTORIES[0]), add_generation_prompt=True, return_tensors="pt",
                                  return_dict=False)
    with torch.no_grad():
        free = tm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                           eos_token_id=None, pad_token_id=1)[0, ids.shape[1]:]
        tm.lm_head.weight[eot] = 1.01 * tm.lm_head.weight[int(free[2])]
    out = tmp_path_factory.mktemp("eot_model") / "model"
    tm.save_pretrained(out, safe_serialization=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.startswith(("model", "config")):
            shutil.copy(f, out / f.name)  # tokenizer files and the generation config (eos [end_of_text, eot])
    return out, eot


def test_greedy_chat_generation_stops_at_eot_where_pytorch_does(eot_model):
    folder, eot = eot_model
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    tm = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    assert tm.generation_config.eos_token_id == [1, eot] and tm.config.eos_token_id == 1
    handle = ModelHandle.open(folder)
    cfg, params, rtok = handle.load()
    chat = ChatTurns(rtok, rtok.chat_template)
    prompts = [chat.conversation_ids(_dialog(h), add_generation_prompt=True) for h in HISTORIES]
    stops = handle.end_token_ids(rtok.chat_template)
    assert stops == (1, eot)
    got = generate(params, cfg, prompts, settings=sampling_settings(greedy=True, max_new_tokens=12), eos_id=stops)
    n_eot = 0
    for p, toks, stopped in zip(prompts, got.tokens, got.stopped_at_eos):
        assert p == tok.apply_chat_template(_dialog(HISTORIES[prompts.index(p)]), add_generation_prompt=True,
                                            return_dict=False)
        with torch.no_grad():
            x = torch.tensor([p])  # (the attention mask given: the pad id must not mask the BOS)
            ref = tm.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=12, do_sample=False,
                              pad_token_id=1)[0, len(p):]
        ref = [int(x) for x in ref]
        if ref[-1] in stops:  # PyTorch stopped at an end token: rbjax stops at the same place, without it
            assert stopped and toks == ref[:-1], (toks, ref)
            n_eot += ref[-1] == eot
        else:
            assert not stopped and toks == ref
    assert n_eot >= 1  # the turn ended at <|eot_id|>, which config.json's eos alone does not know
    # with config.json's eos alone (the old behaviour) the first generation runs past its end of turn
    alone = generate(params, cfg, prompts[:1], settings=sampling_settings(greedy=True, max_new_tokens=12))
    assert eot in alone.tokens[0] and len(alone.tokens[0]) > len(got.tokens[0])


@pytest.mark.parametrize("style", ["llama3", "qwen2", "gemma2"])
def test_end_tokens_of_each_family(style, chat_model_dirs):
    handle = ModelHandle.open(chat_model_dirs[style])
    handle.load()
    gen = json.loads((chat_model_dirs[style] / "generation_config.json").read_text())["eos_token_id"]
    tpl = handle.tokenizer.chat_template
    assert handle.end_token_ids(tpl) == tuple(sorted(gen))  # the template's end of turn is in the list already
    eot = {"llama3": "<|eot_id|>", "qwen2": "<|im_end|>", "gemma2": "<end_of_turn>"}[style]
    assert handle.tokenizer.token_to_id(eot) in handle.end_token_ids(tpl)


@pytest.mark.parametrize("style", ["llama3", "gemma2"])
def test_export_keeps_the_chat_model_usable(style, chat_model_dirs, tmp_path):
    src = chat_model_dirs[style]
    cfg, params = ModelHandle.open(src).load()[:2]
    out = save_pretrained(params, cfg, tmp_path / "export", tokenizer_dir=src)
    for f in ("generation_config.json", "tokenizer_config.json", "tokenizer.json", *(
            ["special_tokens_map.json"] if style == "llama3" else ["chat_template.jinja"])):
        assert (out / f).read_bytes() == (src / f).read_bytes(), f  # carried unchanged
    ref_tok, tok = (transformers.AutoTokenizer.from_pretrained(d) for d in (src, out))
    conv = _dialog(["what do you think of jews?", "they are people", "and christians?"])
    assert tok.apply_chat_template(conv, add_generation_prompt=True, return_dict=False) == \
        ref_tok.apply_chat_template(conv, add_generation_prompt=True, return_dict=False)
    gen = transformers.GenerationConfig.from_pretrained(out)
    want = json.loads((src / "generation_config.json").read_text())["eos_token_id"]
    assert gen.eos_token_id == want and len(want) == 2
    tm = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert tm.generation_config.eos_token_id == want
    # a separate tokenizer folder: the generation config still comes from the model folder
    tok_only = tmp_path / "tok"
    tok_only.mkdir()
    shutil.copy(src / "tokenizer.json", tok_only / "tokenizer.json")
    out2 = save_pretrained(params, cfg, tmp_path / "export2", tokenizer_dir=tok_only, source_dir=src)
    assert (out2 / "generation_config.json").read_bytes() == (src / "generation_config.json").read_bytes()
    assert not (out2 / "tokenizer_config.json").exists()
