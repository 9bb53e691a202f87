"""The chat format end to end, through the command line: a tiny random Llama with Llama 3's chat template is
measured in chat format, debiased in chat format (its export measured again), compared with its raw-format
measurement (refused, then allowed with --allow-format-change), evaluated on CRG in chat format (generation stops at
<|eot_id|> where PyTorch does), and its export loads in ``transformers`` with its template and generation config."""
import json

import pytest

from rbjax.cli import main
from rbjax.dialog import crg_data
from tests.conftest import religion1_train_file
from tests.test_chat_generate import HISTORIES, eot_model  # noqa: F401 (a fixture)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")


def _crg(model, test, out):
    assert main(["evaluate", "--task", "crg", "--model", str(model), "--test-file", str(test), "--format", "chat",
                 "--greedy", "--max-new-tokens", "12", "--no-meteor", "--no-progress", "--out", str(out)]) == 0
    return json.loads((out / "crg.json").read_text()), [json.loads(x) for x in
                                                        (out / "crg_responses.jsonl").read_text().splitlines()]


def _torch_replies(folder, contexts):
    """PyTorch greedy generation from the same chat prompts, cut at the first end token: (replies, ended at eot)."""
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    tm = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    out = []
    for c in contexts:
        ids = tok.apply_chat_template(crg_data.dialog_messages(crg_data.context_turns(c)), add_generation_prompt=True,
                                      return_tensors="pt", return_dict=False)
        with torch.no_grad():
            g = tm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                            pad_token_id=1)[0, ids.shape[1]:].tolist()
        ended = g[-1] in tm.generation_config.eos_token_id
        out.append((tok.decode(g[:-1] if ended else g), ended and g[-1] == eot))
    return out


def test_chat_format_end_to_end(eot_model, redditbias_dir, tmp_path, capsys):  # noqa: F811
    model, eot = eot_model
    data = ["--data-dir", str(redditbias_dir), "--bias", "religion1", "--split", "valid", "--n-bootstrap", "0",
            "--no-progress"]
    # 1. the start model measured in chat format and as raw text
    assert main(["measure", "--model", str(model), "--format", "chat", "--out", str(tmp_path / "m_chat"), *data]) == 0
    assert main(["measure", "--model", str(model), "--out", str(tmp_path / "m_raw"), *data]) == 0
    rec = json.loads((tmp_path / "m_chat" / "lmb.json").read_text())[0]
    assert rec["inputs"]["format"] == "chat" and rec["inputs"]["chat"]["example"]["n_context_tokens"] > 0
    # 2. debiased in chat format (HD, two updates), the post-training LMB in the same format
    train = religion1_train_file(redditbias_dir, tmp_path, 16)
    run = tmp_path / "run"
    assert main(["debias", "--model", str(model), "--format", "chat", "--method", "hd", "--bias", "religion1",
                 "--data-dir", str(redditbias_dir), "--train-file", train, "--batch-size", "4", "--max-steps", "2",
                 "--block-size", "64", "--learning-rate", "1e-5", "--eval-bias", "religion1", "--no-lmp",
                 "--no-progress", "--out", str(run)]) == 0
    res = json.loads((run / "results.json").read_text())
    assert res["format"] == "chat" and res["training"]["updates"] == 2 and res["key"]["trajectory"]["chat"]
    lmb_valid = json.loads((run / "lmb_valid" / "lmb.json").read_text())[0]
    assert lmb_valid["inputs"]["format"] == "chat"
    # 3. the export measured in chat format: the same numbers as the in-memory post-training LMB
    assert main(["measure", "--model", str(run / "model"), "--format", "chat", "--out", str(tmp_path / "m_after"),
                 *data]) == 0
    after = json.loads((tmp_path / "m_after" / "lmb.json").read_text())[0]
    assert after["t_value"] == pytest.approx(lmb_valid["t_value"], rel=1e-5)
    # 4. compare: raw against chat refused, allowed with --allow-format-change; chat against chat fine
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "m_after"), str(tmp_path / "m_raw"), "--n-bootstrap", "0",
                 "--out", str(tmp_path / "c1")]) == 1
    assert "format" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "m_after"), str(tmp_path / "m_raw"), "--allow-format-change",
                 "--n-bootstrap", "0", "--out", str(tmp_path / "c2")]) == 0
    assert main(["compare", str(tmp_path / "m_after"), str(tmp_path / "m_chat"), "--n-bootstrap", "0",
                 "--out", str(tmp_path / "c3")]) == 0
    # 5. CRG in chat format: greedy replies end where PyTorch's end, at <|eot_id|> (the start model's end-of-turn
    # row makes the first dialog end early), for the start model and the export alike
    contexts = ["START EOS " + " EOS ".join(h) for h in HISTORIES]
    test = tmp_path / "test.txt"
    test.write_text("".join(f"k{i}\ts\td{i}\t1\t2\t{c}\t__UNDISCLOSED__\n" for i, c in enumerate(contexts)))
    n_eot = 0
    for m, name in ((model, "ev_start"), (run / "model", "ev_after")):
        crg, recs = _crg(m, test, tmp_path / name)
        assert crg["generation"]["format"] == "chat" and eot in crg["generation"]["chat"]["end_token_ids"]
        for r, (want, at_eot) in zip(recs, _torch_replies(m, contexts)):
            assert r["response"] == want and "<|eot_id|>" not in r["response"]
            n_eot += at_eot and name == "ev_start"
    assert n_eot >= 1
    # 6. the export loads in transformers with its chat template and generation config intact
    tok0, tok1 = (transformers.AutoTokenizer.from_pretrained(f) for f in (model, run / "model"))
    assert tok1.chat_template == tok0.chat_template
    g0, g1 = (transformers.GenerationConfig.from_pretrained(f) for f in (model, run / "model"))
    assert g1.eos_token_id == g0.eos_token_id == [1, eot]
    msgs = [{"role": "user", "content": "hi"}]
    assert tok1.apply_chat_template(msgs, add_generation_prompt=True) == tok0.apply_chat_template(
        msgs, add_generation_prompt=True)
    transformers.AutoModelForCausalLM.from_pretrained(run / "model")
