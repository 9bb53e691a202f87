"""Dialog in chat format: DSTC-7 contexts rendered through the model's chat template (user and assistant turns
alternating, the model answering as the assistant), CRG generation stopping at every end token where PyTorch
``generate`` does, CRG fine-tuning with the loss on the response and its end-of-turn token, and the tasks without a
chat format (lmp, dst) refusing it."""
import json

import numpy as np
import pytest

from rbjax.core.errors import SettingError
from rbjax.dialog import crg_data
from rbjax.dialog.crg_generation import chat_prompt
from rbjax.dialog.evaluate import evaluate
from rbjax.dialog.tasks.crg import CRGSettings
from rbjax.model.handle import ModelHandle
from tests.test_chat_generate import HISTORIES, eot_model  # noqa: F401 (a fixture)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CONTEXTS = ["START EOS what do you think of christians ?", "START EOS tell me about jews EOS they are people",
            "START EOS any tips for a first marathon ? EOS start slow EOS and then ?"]


def _tsv(path, rows):
    path.write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_context_turns_and_roles():
    assert crg_data.context_turns("START EOS a b. EOS c EOS  d ") == ["a b.", "c", "d"]
    assert crg_data.context_turns("no markers here") == ["no markers here"]
    assert crg_data.context_turns("START EOS EOSINOPHIL counts") == ["EOSINOPHIL counts"]  # a word, not a marker
    m = crg_data.dialog_messages(["a", "b", "c"], response="r")
    assert [x["role"] for x in m] == ["user", "assistant", "user", "assistant"] and m[-1]["content"] == "r"
    # an even number of turns: the oldest (which would be the assistant's) is left out, the chat starts with the user
    assert [x["content"] for x in crg_data.dialog_messages(["a", "b"])] == ["b"]


@pytest.mark.parametrize("style", ["llama3", "qwen2", "gemma2"])
def test_chat_prompts_are_transformers_chat_template_ids(chat_model_dirs, style):
    folder = chat_model_dirs[style]
    handle = ModelHandle.open(folder)
    system = None if style == "gemma2" else "You are a helpful assistant."
    chat = CRGSettings(format="chat", system=system).chat_turns(handle.tokenizer)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    for c in CONTEXTS:
        msgs = crg_data.dialog_messages(crg_data.context_turns(c))
        want = tok.apply_chat_template(([{"role": "system", "content": system}] if system else []) + msgs,
                                       add_generation_prompt=True, return_dict=False)
        assert chat_prompt(chat, c) == list(want)
    long = "START EOS " + " EOS ".join(f"turn number {i} says something about the jews" for i in range(30))
    ids = chat_prompt(chat, long, 64)
    assert len(ids) <= 64 and ids[:len(ids) - 3] != []  # the oldest turns left out, the rendering kept whole
    assert tok.decode(ids).rstrip().endswith(tok.decode(chat_prompt(chat, "START EOS x", 64)).rstrip()[-8:])


def test_crg_chat_generation_stops_at_eot_where_pytorch_does(eot_model, redditbias_dir, tmp_path):  # noqa: F811
    folder, eot = eot_model  # its end-of-turn row makes greedy decoding end the first dialog's turn early
    contexts = ["START EOS " + " EOS ".join(h) for h in HISTORIES]
    test = _tsv(tmp_path / "test.txt", [[f"k{i}", "s", f"d{i}", "1", "2", c, "__UNDISCLOSED__"]
                                        for i, c in enumerate(contexts)])
    res = evaluate("crg", folder, tmp_path / "out", test_file=test, format="chat", greedy=True, max_new_tokens=12,
                   meteor=False, progress=False)
    gen = res["generation"]
    assert gen["format"] == "chat" and eot in gen["chat"]["end_token_ids"]
    recs = [json.loads(x) for x in (tmp_path / "out" / "crg_responses.jsonl").read_text().splitlines()]
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    tm = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    n_eot = 0
    for c, r in zip(contexts, recs):
        ids = tok.apply_chat_template(crg_data.dialog_messages(crg_data.context_turns(c)), add_generation_prompt=True,
                                      return_tensors="pt", return_dict=False)
        with torch.no_grad():
            out = tm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                              pad_token_id=1)[0, ids.shape[1]:].tolist()
        if out[-1] in tm.generation_config.eos_token_id:
            n_eot += out[-1] == eot
            out = out[:-1]
        assert r["response"] == tok.decode(out), (r["response"], tok.decode(out))
        assert "<|eot_id|>" not in r["response"]
    assert n_eot >= 1
    # the format enters the key: the raw format is another result
    with pytest.raises(Exception, match="other inputs|differ"):
        evaluate("crg", folder, tmp_path / "out", test_file=test, greedy=True, max_new_tokens=12, meteor=False,
                 progress=False)


def test_crg_chat_fine_tuning_masks_the_template(chat_model_dirs, tmp_path):
    folder = chat_model_dirs["llama3"]
    handle = ModelHandle.open(folder)
    chat = CRGSettings(format="chat").chat_turns(handle.tokenizer)
    rows = [crg_data.DSTC7Row(hash=f"t{i}", subreddit="s", conv_id="c", score=1, turn=2, context=c,
                              response=f"reply number {i}", line=i + 1) for i, c in enumerate(CONTEXTS)]
    arrays, stats = crg_data.build_chat_crg_arrays(rows, chat, block_size=96)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    for i, r in enumerate(rows):
        msgs = crg_data.dialog_messages(crg_data.context_turns(r.context), r.response)
        full = tok.apply_chat_template(msgs, return_dict=False)
        n = int(arrays["attention_mask"][i].sum())
        assert arrays["input_ids"][i, :n].tolist() == list(full[:n]) and full[n - 1] == eot
        scored = arrays["input_ids"][i][arrays["loss_mask"][i] > 0].tolist()
        assert scored[-1] == eot and tok.decode(scored[:-1]).strip() == r.response  # the reply and its end of turn
    assert stats["n_examples"] == 3 and stats["n_dropped_too_long"] == 0
    # too long: the oldest turns go two by two; a last turn + reply that cannot fit is dropped
    lengths = arrays["attention_mask"].sum(1)
    cut, st = crg_data.build_chat_crg_arrays(rows, chat, block_size=int(lengths[2]) - 1)
    assert st["n_context_cut"] == 1 and st["n_examples"] == 3 and max(lengths[:2]) < lengths[2] - 1
    short = tok.apply_chat_template(crg_data.dialog_messages(crg_data.context_turns(rows[2].context))[2:]
                                    + [{"role": "assistant", "content": rows[2].response}], return_dict=False)
    assert cut["input_ids"][2, :int(cut["attention_mask"][2].sum())].tolist() == list(short)[:len(
        cut["input_ids"][2, :int(cut["attention_mask"][2].sum())])]
    train = _tsv(tmp_path / "train.txt", [[r.hash, "s", "c", "1", "2", r.context, r.response] for r in rows])
    test = _tsv(tmp_path / "test.txt", [["k0", "s", "d", "1", "2", CONTEXTS[0], ""]])
    res = evaluate("crg", folder, tmp_path / "out", train_file=train, test_file=test, format="chat", max_steps=1,
                   batch_size=3, grad_accum=1, block_size=96, meteor=False, greedy=True, max_new_tokens=4,
                   progress=False)
    assert res["fine_tuned"] and res["training"]["updates"] == 1 and np.isfinite(res["training"]["last"]["lm_loss"])
    assert res["training"]["examples"]["n_loss_tokens"] == int(arrays["loss_mask"].sum())


def test_tasks_without_a_chat_format_refuse_it(tmp_path, capsys):
    with pytest.raises(SettingError, match="LMP is the perplexity of Reddit comments"):
        evaluate("lmp", "unused", tmp_path, format="chat")
    with pytest.raises(SettingError, match="DST's classifier"):
        evaluate("dst", "unused", tmp_path, format="chat")
    with pytest.raises(SettingError, match="system"):
        CRGSettings(system="hi")  # raw format: would be ignored
    with pytest.raises(SettingError, match="semantics"):
        CRGSettings(format="chat", semantics="reference")
    from rbjax.cli import main

    hyp = tmp_path / "h.txt"
    hyp.write_text("a\n")
    assert main(["evaluate", "--task", "crg-metrics", "--hyp", str(hyp), "--refs", str(hyp), "--out",
                 str(tmp_path / "m"), "--format", "chat"]) != 0
    assert "--format concerns a model task" in capsys.readouterr().err
