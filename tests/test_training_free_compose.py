"""SentenceDebias and INLP beyond the raw format on one device (docs/debiasing.md §10):

* the chat format: each sentence read as a turn of the model's chat template (as LMB scoring renders a phrase), its
  representation the mean over its own tokens only; the run records the format;
* a sharded model: the representation pass (fitting) and the measurement of the run folder on 8 simulated devices
  (data, and data × fsdp × tensor) equal one device's;
* on top of an adapter: a projection fitted on a LoRA run folder takes its representations from base + adapter, and
  its folded model is base + adapter + projection.
"""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from rbjax.cli import main
from rbjax.debias import projection as pr
from rbjax.model.handle import ModelHandle
from rbjax.model.hf import load_pretrained
from rbjax.model.registry import family_of_config
from tests.conftest import religion1_train_file, simulated_devices_env

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")
ROOT = Path(__file__).resolve().parents[1]
#: ChatML with a newline after each content (GPT-2's BPE then never merges a phrase's last character with the
#: template's text, so the phrase's tokens are those of the phrase alone, as the hand computation below takes them)
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}\n<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def corpus(redditbias_dir, tmp_path_factory):
    return religion1_train_file(redditbias_dir, tmp_path_factory.mktemp("corpus"), 12)


def _hidden(params, config, ids):
    """(L, d) float64 final hidden states of one unpadded row."""
    _, h = family_of_config(config).module(config).apply({"params": params}, jnp.asarray([ids], jnp.int32),
                                                         return_logits=False)
    return np.asarray(h[0], np.float64)


def test_sentence_debias_in_chat_format_averages_the_phrase_tokens(tiny_model_dir, corpus, tmp_path, capsys):
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML, encoding="utf-8")
    out = tmp_path / "sd"
    assert main(["debias", "--method", "sentence-debias", "--bias", "religion1", "--model", str(tiny_model_dir),
                 "--corpus", corpus, "--out", str(out), "--format", "chat", "--chat-template", str(template),
                 "--system", "Be kind."]) == 0
    assert "sentences read in the chat format" in capsys.readouterr().out
    res = json.loads((out / "results.json").read_text())
    assert res["settings"]["format"] == "chat" and res["settings"]["system"] == "Be kind."
    assert res["format"] == "chat" and res["chat"]["example"]["scored_text"] == res["chat"]["example"]["phrase"]
    assert res["key"]["chat"]["template_sha256"] and res["key"]["bos"] is None

    # by hand: the rendered text before the phrase (written out here, not rendered by rbjax), the phrase's own
    # tokens after it, the mean over those of a forward pass over the whole row (GPT-2's BPE splits at "\n")
    config, params, tok = ModelHandle.open(tiny_model_dir).load()
    before = tok.encode("<|im_start|>system\nBe kind.\n<|im_end|>\n<|im_start|>assistant\n")
    sets = [r.split(",") for r in (out / "pairs.csv").read_text(encoding="utf-8").splitlines()[1:]]
    assert all(len(s) == 2 for s in sets)  # (the tiny corpus has no comma in a phrase)
    reps = np.zeros((2, len(sets), config.hidden_size))
    for i, s in enumerate(sets):
        for g in range(2):
            phrase = tok.encode(s[g])
            v = _hidden(params, config, before + phrase)[len(before):].mean(axis=0)
            reps[g, i] = v / np.linalg.norm(v)
    want = pr.sentence_debias_subspace(reps, k=1)
    np.testing.assert_allclose(np.load(out / "subspace.npy"), want, atol=1e-5)
    # the raw format reads the bare phrases: another subspace
    assert main(["debias", "--method", "sentence-debias", "--bias", "religion1", "--model", str(tiny_model_dir),
                 "--corpus", corpus, "--out", str(tmp_path / "raw")]) == 0
    raw = json.loads((tmp_path / "raw" / "results.json").read_text())
    assert "format" not in raw["settings"] and "chat" not in raw["key"]  # a raw run's key is what it was
    assert np.abs(np.load(tmp_path / "raw" / "subspace.npy") - want).max() > 1e-3
    # a scoring-only setting is refused by its flag
    with pytest.raises(SystemExit, match="--score-end-of-turn would have no effect"):
        main(["debias", "--method", "inlp", "--bias", "religion1", "--model", str(tiny_model_dir), "--out",
              str(tmp_path / "x"), "--format", "chat", "--score-end-of-turn"])


def test_a_projection_on_a_lora_run_composes_with_its_adapter(tiny_model_dir, tokenizer_dir, redditbias_dir, corpus,
                                                             tmp_path):
    lora = tmp_path / "lora"
    assert main(["debias", "--method", "lmd", "--bias", "religion1", "--model", str(tiny_model_dir), "--tokenizer",
                 str(tokenizer_dir), "--data-dir", str(redditbias_dir), "--out", str(lora), "--batch-size", "4",
                 "--max-steps", "1", "--layout", "padded", "--adapter", "lora", "--lora-rank", "2",
                 "--lora-dropout", "0", "--lr", "5e-2", "--no-eval", "--no-lmp", "--no-progress"]) == 0
    out = tmp_path / "sd"
    assert main(["debias", "--method", "sentence-debias", "--bias", "religion1", "--model", str(lora),
                 "--corpus", corpus, "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["model"]["run_folder"] == str(lora)  # the LoRA run's model/: base + adapter, merged

    # base + the PEFT adapter, unmerged (as measure --adapter applies it): its representations give the subspace
    from rbjax.model.peft_adapter import load_adapter
    base_cfg, base = load_pretrained(tiny_model_dir)
    adapted, _ = load_adapter(lora / "adapter", base, base_cfg)
    tok = ModelHandle.open(tiny_model_dir).tokenizer
    sets = [r.split(",") for r in (out / "pairs.csv").read_text(encoding="utf-8").splitlines()[1:]]
    reps = np.zeros((2, len(sets), base_cfg.hidden_size))
    for i, s in enumerate(sets):
        for g in range(2):
            v = _hidden(adapted, base_cfg, tok.encode(s[g])).mean(axis=0)
            reps[g, i] = v / np.linalg.norm(v)
    want = pr.sentence_debias_subspace(reps, k=1)
    np.testing.assert_allclose(np.load(out / "subspace.npy"), want, atol=1e-5)
    base_reps = np.stack([[_hidden(base, base_cfg, tok.encode(s[g])).mean(axis=0) for s in sets] for g in range(2)])
    base_reps /= np.linalg.norm(base_reps, axis=2, keepdims=True)
    assert np.abs(pr.sentence_debias_subspace(base_reps, k=1) - want).max() > 1e-4  # the adapter changed them

    # the folded model: base + adapter + projection, logits = (P h_adapted) Wᵀ
    p = np.load(out / "projection.npy")
    cfg, params, _ = ModelHandle.open(out).load()
    ids = [464, 14177, 389, 257, 1332]
    logits, _ = family_of_config(cfg).module(cfg).apply({"params": params}, jnp.asarray([ids], jnp.int32))
    w = np.asarray(base["wte"]["embedding"], np.float64)
    np.testing.assert_allclose(np.asarray(logits[0]), (_hidden(adapted, base_cfg, ids) @ p) @ w.T, atol=1e-4)


MESH_SCRIPT = textwrap.dedent("""
    import csv, json, sys
    from pathlib import Path
    import jax, numpy as np
    from rbjax.debias.training_free import ProjectionRun, run_training_free
    from rbjax.lmb.pair_benchmark import measure_pair_benchmark
    from rbjax.lmb.config import MeasureConfig

    assert jax.device_count() == 8, jax.devices()
    model, corpus, pairs, tmp = sys.argv[1:5]
    out = {}
    for method in ("sentence-debias", "inlp"):
        runs = {}
        for mesh in (None, "data=8", "data=2,fsdp=2,tensor=2"):
            d = Path(tmp) / f"{method}-{mesh}"
            r = run_training_free(ProjectionRun(method=method, bias_type="religion1", model=model, out_dir=str(d),
                                                corpus=corpus, iterations=3, mesh=mesh, batch_size=5))
            runs[mesh] = (np.load(d / "subspace.npy"), np.load(d / "projection.npy"), r["mesh"], d)
        one = runs[None]
        out[method] = {m: {"subspace": float(np.abs(r[0] - one[0]).max()) if r[0].shape == one[0].shape else None,
                           "projection": float(np.abs(r[1] - one[1]).max()), "recorded": r[2]}
                       for m, r in runs.items() if m is not None}
        out[method]["removed"] = int(one[0].shape[0])
    ppl = {}
    for mesh in (None, "data=2,fsdp=2,tensor=2"):
        m = Path(tmp) / f"measure-{mesh}"
        measure_pair_benchmark(str(runs[None][3]), "pairs", MeasureConfig(n_bootstrap=0, mesh=mesh),
                               pairs_file=pairs, progress=False, out_dir=str(m))
        with open(m / "g_perplexities.csv", newline="") as f:
            ppl[str(mesh)] = [[float(r["biased_ppl"]), float(r["counterfactual_ppl"])] for r in csv.DictReader(f)]
    print(json.dumps({"fit": out, "ppl": ppl}))
""")


def test_fitting_and_measuring_on_a_mesh_equal_one_device(tiny_model_dir, corpus, tmp_path):
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("id,category,sentence_1,sentence_2,stereotypical\nq1,g,She is a nurse.,He is a nurse.,1\n"
                     "q2,g,He cried all day.,She cried all day.,2\nq3,g,The jews are rich.,The christians are rich.,1\n",
                     encoding="utf-8")
    env = simulated_devices_env(8, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", MESH_SCRIPT, str(tiny_model_dir), corpus, str(pairs), str(tmp_path)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    for method, fit in res["fit"].items():
        assert fit["removed"] >= 1, res
        for mesh in ("data=8", "data=2,fsdp=2,tensor=2"):
            assert fit[mesh]["recorded"] == mesh and fit[mesh]["subspace"] is not None, (method, mesh, res)
            assert fit[mesh]["subspace"] < 1e-5 and fit[mesh]["projection"] < 1e-5, (method, mesh, res)
    one, sharded = np.asarray(res["ppl"]["None"]), np.asarray(res["ppl"]["data=2,fsdp=2,tensor=2"])
    assert one.shape == (3, 2) and np.all(np.isfinite(one))
    np.testing.assert_allclose(sharded, one, rtol=1e-5)
