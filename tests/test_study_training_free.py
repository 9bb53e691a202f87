"""The methods without training in a study (SentenceDebias, INLP, Self-Debias; docs/study.md): planned as one run
each with their defaults (no sweep, no training run; SentenceDebias and Self-Debias, which no seed changes, under the
first seed only), measured and benchmarked like every method, Self-Debias's dialog stage without DST; the dry run's cost
counts no training for them; settings that cannot run are named when the file is read; and a small study of them
runs end to end, its report listing them, Self-Debias's LMP beside the others' and why it has no DST."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rbjax.cli import main
from rbjax.study.config import load_study
from rbjax.study.run import TRAIN_LINES, estimate_cost, plan_study

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "experiments" / "paper.toml"
TINY = ROOT / "experiments" / "tiny.toml"
FREE = ["sentence-debias", "inlp", "self-debias"]


def _methods(ms):
    return f"study.methods={json.dumps(ms)}"


def test_the_plan_of_a_study_with_the_methods_without_training(tmp_path, capsys):
    """tiny.toml (two seeds, religion1 debiased, every dialog task, HD with a grid) with CDA and the three methods
    without training: each has one run stage of kind "debias" (no sweep entry, no training run), then lmb_test and
    dialog like CDA's; SentenceDebias and Self-Debias only under the first seed; Self-Debias's dialog without DST."""
    cfg = load_study(TINY, [_methods(["hd", "cda", *FREE]), "study.data_dir=/nonexistent-data"])
    stages = {s.name: s for s in plan_study(cfg, tmp_path / "out", progress=False)}
    for m in FREE:
        run = stages[f"seed42/religion1/{m}/run"]
        assert run.kind == "debias" and run.training_runs == 0
        assert f"seed42/religion1/{m}/lmb_test" in stages
    assert stages["seed42/religion1/cda/run"].kind == "train"
    assert stages["seed42/sweeps"].info["methods"] == ["hd"]  # no grid of theirs
    assert {s for s in stages if s.startswith("seed43/religion1/") and s.endswith("/run")} == {
        "seed43/religion1/cda/run", "seed43/religion1/inlp/run"}  # INLP's seed splits its sets; the others: once
    assert "seed43/religion1/inlp/lmb_test" in stages and "seed43/religion1/sentence-debias/lmb_test" not in stages
    assert "seed42/religion1/sentence-debias/dialog" in stages and "seed42/religion1/inlp/dialog" in stages
    # Self-Debias: LMP and CRG with the rescaling, no DST (its classifier never reads the next-token distribution)
    assert "seed42/religion1/self-debias/dialog" in stages
    from rbjax.study.run import _Study

    study = _Study(cfg, tmp_path / "out", False)
    assert study._dialog_tasks("self-debias") == ["lmp", "crg"] and study._dialog_tasks("inlp") == ["lmp", "dst", "crg"]
    assert sum(s.training_runs for s in stages.values()) == 2 * (2 + 1 + 1)  # HD's two points + its retraining, CDA
    out = tmp_path / "out"
    assert main(["run", str(TINY), "--out", str(out), "--dry-run", "--set", _methods(["cda", *FREE])]) == 0
    text = capsys.readouterr().out
    assert "(grid: ; without training: sentence-debias, inlp, self-debias)" in text
    assert "seed42/religion1/inlp/run" in text and "debias  (no training: the method's defaults, no grid)" in text
    assert "Self-Debias's scoring is counted at (1 + prefixes)× the plain scorer's" in text


def test_the_dry_run_cost_counts_no_training_for_them():
    """The paper study (five types, one seed) with the three added: the same training runs and tokens; 15 more models
    evaluated; by hand, the phrases scored grow by SentenceDebias's and INLP's counterfactual sentences (each
    type's training lines and their twins: 2 × 4,444 each) and by 15 models + one prefix pass of Self-Debias per
    type (each RedditBias type has one bias-bench prefix) × the 2,432 test phrases of the five types."""
    base = estimate_cost(load_study(PAPER))
    cost = estimate_cost(load_study(PAPER, [_methods(["lmd", "add", "hd", "cda", *FREE])]))
    assert cost["training_runs"] == base["training_runs"] == 830
    assert cost["training_tokens"] == base["training_tokens"] and cost["train_hours"] == base["train_hours"]
    assert cost["models_evaluated"] == base["models_evaluated"] + 15 == 36
    lines = sum(TRAIN_LINES.values())
    assert lines == 720 + 720 + 763 + 1521 + 720
    assert cost["phrases_scored"] - base["phrases_scored"] == 2 * (2 * lines) + (15 + 5) * 2432
    only = estimate_cost(load_study(PAPER, [_methods(["sentence-debias"]), "study.seeds=[1, 2, 3]"]))
    assert only["training_runs"] == 0 and only["models_evaluated"] == 1 + 5  # no seed changes it: once


def test_self_debias_in_a_study_with_a_mesh():
    """Self-Debias is scored on the [study] mesh like any model (the scorer splits its rows, and its parameters by
    the mesh's fsdp / tensor axes): the study file is accepted and its stages carry the mesh."""
    study = load_study(PAPER, [_methods(["self-debias"]), "study.mesh=data=1"])
    assert study.mesh == "data=1"


@pytest.mark.parametrize("sets, message", [
    (['sweep.methods=["inlp"]'], "sweep.methods has inlp, whose grid is over sweep.inlp_iterations: give its "
                                 "values"),
    (['sweep.methods=["nope"]'], "sweep.methods must be a list of lmd, add, hd, cda, lm, sentence-debias, inlp, "
                                 "self-debias"),
    ([_methods(["nope"])], "unknown method(s) ['nope'] (expected lmd, add, hd, cda, lm, sentence-debias, inlp, "
                           "self-debias)"),
])
def test_settings_that_cannot_run_are_named(sets, message, tmp_path, capsys):
    args = ["run", str(TINY), "--out", str(tmp_path / "o"), "--dry-run"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 1
    assert message in capsys.readouterr().err


def test_a_study_of_the_methods_without_training_runs_and_reports_them(shared_dir, tmp_path):
    """One type, one seed, LMP only (a few lines): SentenceDebias's run folder holds model/ (measured and evaluated
    like a trained one), Self-Debias's none (measured and its LMP scored with the rescaled distribution); the report
    lists both beside the baseline, Self-Debias's LMP filled, and says why it has no DST; the study's export refuses it
    by name."""
    study = tmp_path / "s.toml"
    study.write_text(f"""
[study]
random_model = {{ n_embd = 32, n_layer = 2, n_head = 2, n_positions = 64, vocab_size = 50257, seed = 0 }}
tokenizer = "{shared_dir / 'tokenizers' / 'gpt2'}"
data_dir = "{shared_dir / 'redditbias'}"
bias_types = ["religion1"]
methods = ["sentence-debias", "self-debias"]
seeds = [42]

[measure]
n_bootstrap = 0

[dialog]
tasks = ["lmp"]
lmp = {{ lmp_max_lines = 8 }}
""")
    out = tmp_path / "out"
    assert main(["run", str(study), "--out", str(out), "--no-progress"]) == 0
    st = json.loads((out / "stages.json").read_text())["stages"]
    assert all(v["status"] == "done" for v in st.values())
    sd, self_d = out / "seed42/religion1/sentence-debias", out / "seed42/religion1/self-debias"
    assert json.loads((sd / "run/results.json").read_text())["training_free"] is True
    assert (sd / "run/model/config.json").is_file() and (sd / "dialog/lmp.json").is_file()
    assert not (self_d / "run/model").exists()
    lmp, base_lmp = (json.loads((f / "dialog/lmp.json").read_text()) for f in (self_d, out / "baseline"))
    assert lmp["model"]["self_debias"]["prefixes"] and lmp["metrics"]["perplexity"] is not None
    assert lmp["metrics"]["mean_nll"] != base_lmp["metrics"]["mean_nll"]  # the rescaled log-likelihoods
    recs = json.loads((self_d / "lmb_test/lmb.json").read_text())
    base = json.loads((out / "baseline/lmb_test/lmb.json").read_text())
    assert recs[0]["t_value"] != base[0]["t_value"]  # the rescaled distribution, not the base model, was scored
    md = (out / "report.md").read_text()
    assert "| SentenceDebias |" in md and "| Self-Debias |" in md  # Table 3 rows beside the baseline
    assert f"| Self-Debias (religion1) | {lmp['metrics']['perplexity']:.3f} | n/a | n/a |" in md
    assert "DST does not apply (its classifier never reads the next-token distribution" in md
    assert main(["export", str(self_d), "--out", str(tmp_path / "exp")]) == 1
