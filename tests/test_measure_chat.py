"""LMB in the chat format (``rbjax measure --format chat``): each phrase scored as a turn of the model's own chat
template, only its own tokens scored, against PyTorch on the full rendered chats; lmb.json's record of the format;
``rbjax compare`` refusing a format change unless asked."""
import json

import numpy as np
import pytest

from rbjax.cli import main
from rbjax.core.errors import SettingError
from rbjax.data.redditbias import load_pairs
from rbjax.lmb import perplexity
from rbjax.lmb.compare import MismatchError, compare_runs, format_comparison
from rbjax.lmb.config import MeasureConfig
from rbjax.lmb.measure import LoadedModel, chat_pair_ids, measure_bias, pair_perplexities_of_models
from rbjax.model.chat import ChatTurns

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

#: (style, role, system prompt, fixed user message, score the end of turn)
CASES = [("llama3", "assistant", "You are a helpful assistant.", None, False),
         ("llama3", "user", None, None, True),
         ("qwen2", "assistant", None, "What do you think?", False),
         ("gemma2", "assistant", None, "Tell me something.", True)]
EOT = {"llama3": "<|eot_id|>", "qwen2": "<|im_end|>", "gemma2": "<end_of_turn>"}


@pytest.fixture(scope="module")
def pairs(redditbias_dir):
    return load_pairs("religion1", "test", redditbias_dir)


def _messages(phrase, role, system, prompt):
    m = [{"role": "system", "content": system}] if system else []
    if prompt:
        m.append({"role": "user", "content": prompt})
    return m + [{"role": role, "content": phrase}]


def _torch_perplexities(folder, style, phrases, role, system, prompt, eot_scored):
    """Per phrase: the chat as transformers renders it, the phrase's tokens found independently (the tokens of its
    rendered text, ending just before the end-of-turn token that closes its message), the mean NLL of those tokens
    (and of the end-of-turn token when scored) under the PyTorch model on the whole chat."""
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    tm = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    eot = tok.convert_tokens_to_ids(EOT[style])
    trims = style in ("llama3", "gemma2")  # their templates write message['content'] | trim
    rows, spans = [], []
    convs = [_messages(p, role, system, prompt) for p in phrases]
    for p, ids in zip(phrases, tok.apply_chat_template(convs, tokenize=True, return_dict=False)):
        end = max(i for i, t in enumerate(ids) if t == eot)  # the last message's end of turn
        n = len(tok.encode(p.strip() if trims else p, add_special_tokens=False))
        rows.append(ids)
        spans.append((end - n, end + 1 if eot_scored else end))
    out = []
    for b in range(0, len(rows), 64):  # right-padded batches: a causal model's real positions are unaffected
        chunk = rows[b:b + 64]
        L = max(map(len, chunk))
        x = torch.tensor([r + [0] * (L - len(r)) for r in chunk])
        mask = torch.tensor([[1] * len(r) + [0] * (L - len(r)) for r in chunk])
        with torch.no_grad():
            lp = torch.log_softmax(tm(x, attention_mask=mask).logits.double(), -1)
        tgt = lp[:, :-1].gather(-1, x[:, 1:, None])[..., 0]  # tgt[:, j-1] = log p(x_j | x_<j)
        for r, (start, stop) in enumerate(spans[b:b + 64]):
            out.append(float(np.exp(-float(tgt[r, start - 1:stop - 1].sum()) / (stop - start))))
    return np.array(out), np.array([stop - start for start, stop in spans])


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}{'-eot' if c[4] else ''}")
def test_span_perplexities_equal_pytorch(case, chat_model_dirs, pairs):
    style, role, system, prompt, eot = case
    folder = chat_model_dirs[style]
    model = LoadedModel(folder, batch_size=16)
    cfg = MeasureConfig(format="chat", role=role, system=system, prompt=prompt, score_end_of_turn=eot)
    chat = cfg.chat_turns(model.tokenizer)
    ((b, c, notes),) = pair_perplexities_of_models(model.scorer, model.tokenizer, pairs, chat=chat)
    assert not any(notes)
    k = model.scorer.last_stats["row_context"]
    assert k >= 4  # the template prefix is run once per packed row, not once per pair
    for side, ppl in (("biased", b), ("counterfactual", c)):
        phrases = getattr(pairs, side)
        ref, n = _torch_perplexities(folder, style, phrases, role, system, prompt, eot)
        np.testing.assert_allclose(ppl, ref, rtol=1e-4)
    a, cc, (na, nc) = chat_pair_ids(chat, pairs)
    assert [len(x) - k for x, k in zip(cc, nc)] == list(n)  # the scored counts found two ways agree


def test_row_context_changes_nothing(chat_model_dirs, pairs, monkeypatch):
    model = LoadedModel(chat_model_dirs["qwen2"], batch_size=16)
    chat = ChatTurns(model.tokenizer, model.tokenizer.chat_template, system="Be brief.")
    a, c, n_context = chat_pair_ids(chat, pairs)
    shared_b, shared_c = model.scorer.score_pairs(a, c, n_context=n_context)
    assert model.scorer.last_stats["row_context"] > 4
    monkeypatch.setattr(perplexity, "MIN_ROW_CONTEXT", 10**6)  # every tree carries its whole context
    alone_b = model.scorer.score_ids(a, n_context=n_context[0])
    assert model.scorer.last_stats["row_context"] == 0
    np.testing.assert_allclose(shared_b.mean_nll, alone_b.mean_nll, rtol=1e-5)
    np.testing.assert_array_equal(shared_b.n_scored, alone_b.n_scored)
    np.testing.assert_array_equal(shared_b.n_tokens, [len(x) - k for x, k in zip(a, n_context[0])])
    assert np.isfinite(shared_c.mean_nll).all()


def test_measure_and_compare_in_chat_format(chat_model_dirs, redditbias_dir, tmp_path, capsys):
    folder = chat_model_dirs["llama3"]
    kw = dict(bias_types="religion1", data_dir=redditbias_dir, progress=False, plot=False, n_bootstrap=0)
    raw = measure_bias(folder, out_dir=tmp_path / "raw", **kw)[0]
    assert raw["inputs"]["format"] == "raw" and "chat" not in raw["inputs"]
    rc = main(["measure", "--model", str(folder), "--bias", "religion1", "--data-dir", str(redditbias_dir),
               "--out", str(tmp_path / "chat"), "--no-progress", "--n-bootstrap", "0", "--format", "chat",
               "--system", "You are a helpful assistant.", "--prompt", "What do you think?"])
    assert rc == 0
    # the summary says the format
    assert (f"LMB of {folder}: chat format ({folder / 'tokenizer_config.json'}): each phrase as the assistant's "
            "turn, system prompt 'You are a helpful assistant.', after the user message 'What do you think?', "
            "end-of-turn token not scored\n") in capsys.readouterr().out
    rec = json.loads((tmp_path / "chat" / "lmb.json").read_text())[0]
    inp = rec["inputs"]
    assert inp["format"] == "chat" and rec["settings"]["format"] == "chat"
    ch = inp["chat"]
    tpl = json.loads((folder / "tokenizer_config.json").read_text())["chat_template"]
    import hashlib

    assert ch["template_sha256"] == hashlib.sha256(tpl.encode()).hexdigest()
    assert (ch["role"], ch["system"], ch["prompt"], ch["score_end_of_turn"]) == (
        "assistant", "You are a helpful assistant.", "What do you think?", False)
    ex = ch["example"]
    ref = transformers.AutoTokenizer.from_pretrained(folder)
    want = ref.apply_chat_template(_messages(ex["phrase"], "assistant", ch["system"], ch["prompt"]), tokenize=False)
    assert ex["rendered"] == want and ex["scored_text"].strip() == ex["phrase"].strip()
    assert ex["n_context_tokens"] > 10
    # --resume reuses the chat-format CSV; another system prompt is another input
    state = json.loads((tmp_path / "chat" / ".rbjax_measure_run.json").read_text())
    assert state["types"]["religion1"]["key"]["chat"]["system"] == "You are a helpful assistant."
    capsys.readouterr()
    # compare refuses a format change unless asked, and then says what it compares
    with pytest.raises(MismatchError, match="format: the assistant's turn of the chat template.*vs raw text.*"
                                            "--allow-format-change"):
        compare_runs(tmp_path / "chat", tmp_path / "raw", n_bootstrap=0)
    res = compare_runs(tmp_path / "chat", tmp_path / "raw", n_bootstrap=0, allow_format_change=True,
                       labels=("chat", "raw"))
    assert res["formats"]["changed"] and res["formats"]["a"]["format"] == "chat"
    assert "two formats of the pairs" in format_comparison(res)
    rc = main(["compare", str(tmp_path / "chat"), str(tmp_path / "raw"), "--out", str(tmp_path / "cmp"),
               "--n-bootstrap", "0", "--allow-format-change"])
    assert rc == 0 and "two formats of the pairs" in capsys.readouterr().out
    same = compare_runs(tmp_path / "chat", tmp_path / "chat", n_bootstrap=0)
    assert not same["formats"]["changed"] and same["formats"]["note"] is None


def test_chat_format_errors(chat_model_dirs, tiny_model_dir, redditbias_dir, tmp_path, capsys):
    with pytest.raises(SettingError, match="bos has no effect with --format chat"):
        MeasureConfig(format="chat", bos=True)
    with pytest.raises(ValueError, match="--format chat scores phrases with a model"):
        measure_bias(stored_perplexities=True, bias_types="religion1", data_dir=redditbias_dir, format="chat")
    rc = main(["measure", "--model", str(tiny_model_dir), "--bias", "religion1", "--data-dir", str(redditbias_dir),
               "--out", str(tmp_path / "o"), "--format", "chat", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1 and f"{tiny_model_dir}: the model has no chat template" in err and "--chat-template" in err
    assert not (tmp_path / "o" / "lmb.json").exists()
    rc = main(["measure", "--model", str(chat_model_dirs["gemma2"]), "--bias", "religion1", "--data-dir",
               str(redditbias_dir), "--out", str(tmp_path / "g"), "--format", "chat", "--system", "Be kind.",
               "--no-progress"])
    assert rc == 1 and "System role not supported" in capsys.readouterr().err
    rc = main(["measure", "--model", str(tiny_model_dir), "--bias", "religion1", "--data-dir", str(redditbias_dir),
               "--out", str(tmp_path / "r"), "--role", "user"])
    assert rc == 1 and "--role has no effect with the raw format" in capsys.readouterr().err
    # --score-end-of-turn with a template that ends no turn with a token: the template is at fault, not a row of the
    # data, and what it writes is shown as text, not as a byte-level token ('Ċ')
    plain = tmp_path / "plain.jinja"
    plain.write_text("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
    rc = main(["measure", "--model", str(tiny_model_dir), "--bias", "religion1", "--data-dir", str(redditbias_dir),
               "--out", str(tmp_path / "e"), "--format", "chat", "--chat-template", str(plain),
               "--score-end-of-turn", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1 and (f"{plain}: the chat template writes no end-of-turn token after the assistant's message (it "
                        "writes '\\n' after it)") in err, err
    assert "row" not in err and "religion1" not in err and "Ċ" not in err
    assert not (tmp_path / "e").exists()
