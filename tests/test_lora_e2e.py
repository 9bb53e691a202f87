"""Adapters end to end through the commands (tiny random models):

* ``rbjax debias --adapter lora`` → ``OUT/model`` (merged) and ``OUT/adapter`` (PEFT); ``rbjax export`` writes the
  merged model or, with ``--adapter-only``, the PEFT folder with a model card that records rank, α, targets and the
  base's content key; PEFT loads the exported adapter on the base with the merged model's logits;
  ``rbjax measure --model BASE --adapter FOLDER`` gives the merged model's perplexities without merging;
* ``rbjax sweep --adapter lora``: a chunk of grid points on one base, each point scored;
* the study's ``[training] adapter`` and the 8B adapter study's dry run (fits one 80 GB device);
* slow: every family (GPT-2, Llama, GPT-NeoX, Gemma 2) debiased with adapters by each method, exported adapter-only,
  loaded by PEFT with equal logits.
"""
import csv
import json
from pathlib import Path

import numpy as np
import pytest

from rbjax.cli import main
from tests.conftest import PARITY_INIT, make_tokenizer_json

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")
ROOT = Path(__file__).resolve().parents[1]


def _csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _debias(model, tok, data, out, method="hd", extra=()):
    return main(["debias", "--method", method, "--bias", "religion1", "--model", str(model), "--tokenizer", str(tok),
                 "--data-dir", str(data), "--out", str(out), "--batch-size", "4", "--max-steps", "2",
                 "--layout", "padded", "--adapter", "lora", "--lora-rank", "4", "--lora-dropout", "0",
                 "--lr", "1e-2", "--no-eval", "--no-lmp", "--no-progress", *extra])


def _peft_logits_equal(base, adapter, merged, ids):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    pm = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(base), str(adapter)).eval()
    ref = transformers.AutoModelForCausalLM.from_pretrained(merged).eval()
    with torch.no_grad():
        a, b = pm(torch.tensor(ids)).logits.numpy(), ref(torch.tensor(ids)).logits.numpy()
        base_logits = transformers.AutoModelForCausalLM.from_pretrained(base)(torch.tensor(ids)).logits.numpy()
    assert np.abs(a - base_logits).max() > 1e-3  # the trained adapter changes the model
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max())


def test_debias_export_peft_and_measure_with_adapter(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path, capsys):
    run = tmp_path / "run"
    capsys.readouterr()
    assert _debias(tiny_model_dir, tokenizer_dir, redditbias_dir, run) == 0
    # the summary says what was trained, and on what
    assert ("  trained on raw text (the paper's format); LoRA adapters of rank 4 (α 16) trained on a frozen base "
            "model stored in fp32\n") in capsys.readouterr().out
    res = json.loads((run / "results.json").read_text())
    ad = res["adapter"]
    assert ad["rank"] == 4 and ad["targets"] == ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]
    assert ad["base_model_key"] and ad["folder"] == str(run / "adapter")
    assert res["config"]["adapter"] == "lora" and res["key"]["trajectory"]["adapter"]["lora_rank"] == 4
    # export: the merged model, and the adapters alone
    assert main(["export", str(run), "--out", str(tmp_path / "merged")]) == 0
    assert main(["export", str(run), "--adapter-only", "--out", str(tmp_path / "ad")]) == 0
    files = sorted(p.name for p in (tmp_path / "ad").iterdir())
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md", "export.json"} <= set(files)
    assert "model.safetensors" not in files and (tmp_path / "merged" / "model.safetensors").is_file()
    card = (tmp_path / "ad" / "README.md").read_text()
    assert "library_name: peft" in card and "LoRA (low-rank adapters) of rank 4" in card
    assert ad["base_model_key"] in card and "attn.c_attn" in card
    ids = np.array([[464, 6772, 389, 257, 1310, 286, 4682, 290], [40, 892, 340, 318, 845, 922, 1110, 13]])
    _peft_logits_equal(tiny_model_dir, tmp_path / "ad", tmp_path / "merged", ids)
    # measure: the base + the adapter folder (unmerged) = the merged model
    common = ["--bias", "religion1", "--data-dir", str(redditbias_dir), "--n-bootstrap", "0", "--no-progress"]
    capsys.readouterr()
    assert main(["measure", "--model", str(tiny_model_dir), "--adapter", str(tmp_path / "ad"), "--out",
                 str(tmp_path / "m_ad"), *common]) == 0
    assert (f"LMB of {tiny_model_dir}: raw text (the paper's format); with the LoRA adapter {tmp_path / 'ad'} "
            "(unmerged)\n") in capsys.readouterr().out  # the summary names the adapter
    assert main(["measure", "--model", str(tmp_path / "merged"), "--out", str(tmp_path / "m_merged"), *common]) == 0
    a, b = _csv(tmp_path / "m_ad" / "religion1_perplexities.csv"), _csv(tmp_path / "m_merged" / "religion1_perplexities.csv")
    for col in ("biased_ppl", "counterfactual_ppl"):
        np.testing.assert_allclose([float(r[col]) for r in a], [float(r[col]) for r in b], rtol=1e-5)
    rec = json.loads((tmp_path / "m_ad" / "lmb.json").read_text())[0]
    assert rec["settings"]["adapter"] == str(tmp_path / "ad")
    assert rec["settings"]["adapter_base"]["same"] is True
    # the adapter records its base: an absolute path (PEFT's AutoPeftModel finds it from any folder) and the base's
    # weights key; on other weights (here the merged model: the adapter would be applied twice) it is refused
    from rbjax.model.peft_adapter import base_weights_key, recorded_base_key

    conf = json.loads((tmp_path / "ad" / "adapter_config.json").read_text())
    assert conf["base_model_name_or_path"] == str(Path(tiny_model_dir).resolve())
    assert recorded_base_key(tmp_path / "ad") == base_weights_key(tiny_model_dir)
    capsys.readouterr()
    assert main(["measure", "--model", str(tmp_path / "merged"), "--adapter", str(tmp_path / "ad"), "--out",
                 str(tmp_path / "m_other"), *common]) == 1
    assert "trained on other base weights" in capsys.readouterr().err and not (tmp_path / "m_other").exists()
    assert main(["measure", "--model", str(tmp_path / "merged"), "--adapter", str(tmp_path / "ad"), "--out",
                 str(tmp_path / "m_other"), "--allow-other-base", *common]) == 0
    other = json.loads((tmp_path / "m_other" / "lmb.json").read_text())[0]["settings"]["adapter_base"]
    assert other["same"] is False and other["recorded"] == recorded_base_key(tmp_path / "ad")
    assert main(["measure", "--model", str(tiny_model_dir), "--allow-other-base", "--out", str(tmp_path / "m_x"),
                 *common]) == 1
    assert "give --adapter" in capsys.readouterr().err
    peft = pytest.importorskip("peft")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(elsewhere)
        assert peft.AutoPeftModelForCausalLM.from_pretrained(str(tmp_path / "ad")) is not None
    # a pair benchmark scores the adapter too (and keys its results by the adapter's files)
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("id,category,sentence_1,sentence_2,stereotypical\nq1,g,She is a nurse.,He is a nurse.,1\n"
                     "q2,g,He cried all day.,She cried all day.,2\nq3,g,The girl can not drive.,The boy can not drive.,1\n",
                     encoding="utf-8")
    bench = ["--benchmark", "pairs", "--pairs", str(pairs), "--n-bootstrap", "0", "--no-progress"]
    assert main(["measure", "--model", str(tiny_model_dir), "--adapter", str(tmp_path / "ad"), "--out",
                 str(tmp_path / "p_ad"), *bench]) == 0
    assert main(["measure", "--model", str(tmp_path / "merged"), "--out", str(tmp_path / "p_merged"), *bench]) == 0
    assert main(["measure", "--model", str(tiny_model_dir), "--out", str(tmp_path / "p_base"), *bench]) == 0
    pa, pm, pb = (_csv(tmp_path / d / "g_perplexities.csv") for d in ("p_ad", "p_merged", "p_base"))
    np.testing.assert_allclose([float(r["biased_ppl"]) for r in pa], [float(r["biased_ppl"]) for r in pm], rtol=1e-5)
    assert [r["biased_ppl"] for r in pa] != [r["biased_ppl"] for r in pb]
    prec = json.loads((tmp_path / "p_ad" / "lmb.json").read_text())[0]
    assert prec["settings"]["adapter"] == str(tmp_path / "ad")
    capsys.readouterr()
    res.pop("adapter")  # a run trained without adapters has no adapter record (nor folder) to export
    (run / "results.json").write_text(json.dumps(res))
    assert main(["export", str(run), "--adapter-only", "--out", str(tmp_path / "y")]) == 1
    assert "was not trained with adapters" in capsys.readouterr().err


def test_sweep_with_adapters_scores_each_point_on_one_base(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path,
                                                           capsys):
    out = tmp_path / "sweep"
    argv = ["sweep", "--method", "lmd", "--bias", "religion1", "--model", str(tiny_model_dir),
            "--tokenizer", str(tokenizer_dir), "--data-dir", str(redditbias_dir), "--out", str(out),
            "--batch-sizes", "4", "--grad-accums", "1", "--lambda-lms", "0.01", "--lambda-ds", "10,100",
            "--max-points", "2", "--max-steps", "2", "--no-lmp", "--dev-max-pairs", "16", "--n-bootstrap", "0",
            "--no-progress", "--layout", "padded", "--adapter", "lora", "--lora-rank", "2", "--lr", "1e-2"]
    assert main(argv + ["--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "LoRA rank 2 on all-linear" in plan and "2 grid points" in plan
    assert main(argv) == 0
    runs = [json.loads(ln) for ln in (out / "sweep.jsonl").read_text().splitlines()]
    assert len(runs) == 2 and runs[0]["dev"]["t_value"] != runs[1]["dev"]["t_value"]  # each point its own adapters
    assert json.loads((out / "sweep_settings.json").read_text())["settings"]["adapter"]["lora_rank"] == 2


def test_adapter_study_dry_run_fits_one_80gb_device(capsys):
    study = ROOT / "experiments" / "llama3.1-8b-instruct-lora.toml"
    model = ROOT / "tests" / "fixtures" / "llama3.1_8b_instruct"
    assert main(["run", str(study), "--out", "/nonexistent/l", "--dry-run", "--device-memory-gb", "80",
                 "--set", f"study.model='{model}'"]) == 0
    text = capsys.readouterr().out
    assert "lmd, add, hd: memory of the largest sweep chunk (54 grid points" in text
    assert "LoRA rank 8 on all-linear: 20,971,520 trained parameters per point" in text  # 32 × (q,k,v,o,gate,up,down)
    assert "parameters stored in bf16" in text and "6 grid points" in text
    assert text.count("(10% kept free): fits") == 1 and "DOES NOT FIT" not in text
    # the study's report says how its models were trained
    from rbjax.study.config import load_study
    from rbjax.study.report import _cutdowns

    notes = _cutdowns(load_study(study).raw)
    assert any("trained LoRA adapters (rank 8, α 16, dropout 0.05, on all-linear)" in n and "bf16" in n
               for n in notes)


# ------------------------------------------------------------------------------------------------- every family
FAMILY_CONFIGS = {
    "llama": {"model_type": "llama", "num_key_value_heads": 2, "tie_word_embeddings": False},
    "gpt_neox": {"model_type": "gpt_neox", "rotary_pct": 0.5, "use_parallel_residual": True},
    "gemma2": {"model_type": "gemma2", "num_key_value_heads": 2, "head_dim": 8, "query_pre_attn_scalar": 8,
               "sliding_window": 4},
}


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", *FAMILY_CONFIGS])
def test_every_family_every_method_with_adapters(family, tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path):
    from rbjax.model.hf import save_pretrained
    from rbjax.model.registry import FAMILIES

    if family == "gpt2":
        model, tok = tiny_model_dir, tokenizer_dir
    else:
        tok = make_tokenizer_json(tmp_path / "tok", kind="bytelevel", add_bos=family != "gpt_neox",
                                  redditbias_dir=redditbias_dir)
        fam = FAMILIES[family]
        d = {"vocab_size": 400, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "max_position_embeddings": 128, "initializer_range": PARITY_INIT,
             "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3, **FAMILY_CONFIGS[family]}
        cfg = fam.config_from_hf(d, family)
        model = save_pretrained(fam.init_params(cfg, 0), cfg, tmp_path / "model", tokenizer_dir=tok)
    ids = np.array([[5, 17, 33, 8, 61, 40, 12, 90], [9, 4, 44, 21, 30, 6, 50, 11]])
    for method in ("lmd", "add", "hd", "cda"):
        run = tmp_path / method
        assert _debias(model, tok, redditbias_dir, run, method=method) == 0, (family, method)
        assert main(["export", str(run), "--adapter-only", "--out", str(tmp_path / f"{method}_ad")]) == 0
        _peft_logits_equal(model, tmp_path / f"{method}_ad", run / "model", ids)
    common = ["--bias", "religion1", "--data-dir", str(redditbias_dir), "--n-bootstrap", "0", "--no-progress"]
    assert main(["measure", "--model", str(model), "--adapter", str(tmp_path / "hd_ad"), "--out",
                 str(tmp_path / "m"), *common]) == 0
    assert main(["measure", "--model", str(tmp_path / "hd" / "model"), "--out", str(tmp_path / "m2"), *common]) == 0
    for col in ("biased_ppl", "counterfactual_ppl"):
        np.testing.assert_allclose([float(r[col]) for r in _csv(tmp_path / "m" / "religion1_perplexities.csv")],
                                   [float(r[col]) for r in _csv(tmp_path / "m2" / "religion1_perplexities.csv")],
                                   rtol=1e-5)
