"""End to end: `rbjax measure` on the real RedditBias test split with a small random GPT-2."""
import csv
import json
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats as sps

from rbjax.cli import main

# scoring here runs longer than it compiles: XLA's default code generation is faster overall (the module took 31 s
# with it, 40 s with the suite's faster-to-compile flags)
pytestmark = pytest.mark.xla_default_codegen

RECORD_KEYS = {"bias_type", "split", "model", "n_pairs", "n_pairs_after_outliers", "t_value", "p_value", "welch",
               "reference", "cohens_d_paired", "mean_log_ppl_diff_ci", "p_value_corrected", "versions", "settings"}


def test_measure_all_types_with_a_model(tiny_model_dir_no_tokenizer, tokenizer_dir, redditbias_dir, tmp_path, capsys):
    out = tmp_path / "results"
    rc = main(["measure", "--model", str(tiny_model_dir_no_tokenizer), "--tokenizer", str(tokenizer_dir),
               "--bias", "all", "--data-dir", str(redditbias_dir), "--out", str(out), "--no-progress",
               "--n-bootstrap", "300"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "religion1" in printed and "queerness" in printed
    recs = json.loads((out / "lmb.json").read_text())
    assert [r["bias_type"] for r in recs] == ["religion1", "religion2", "race", "gender", "queerness"]
    assert [r["n_pairs"] for r in recs] == [238, 236, 254, 253, 235]
    assert (out / "lmb.png").stat().st_size > 1000
    for r in recs:
        assert RECORD_KEYS <= set(r)
        assert r["versions"]["jax"] and r["settings"]["outlier_removal"] is True
        with open(out / f"{r['bias_type']}_perplexities.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        assert list(rows[0]) == ["biased_phrase", "counterfactual_phrase", "biased_ppl", "counterfactual_ppl", "outlier", "note"]
        b = np.array([float(x["biased_ppl"]) for x in rows])
        c = np.array([float(x["counterfactual_ppl"]) for x in rows])
        keep = np.array([x["outlier"] == "false" for x in rows])
        assert keep.sum() == r["n_pairs_after_outliers"]
        # statistics recomputed independently from the CSV
        assert r["t_value"] == pytest.approx(sps.ttest_rel(b[keep], c[keep]).statistic, rel=1e-9)
        assert r["reference"]["t_value"] == pytest.approx(sps.ttest_rel(b, c).statistic, rel=1e-9)
        assert r["welch"]["p_value"] == pytest.approx(sps.ttest_ind(b[keep], c[keep], equal_var=False).pvalue, rel=1e-9)
        assert r["p_value_corrected"]["bonferroni"] == pytest.approx(min(1.0, 5 * r["p_value"]))


def test_measure_errors_leave_nothing_behind(tiny_model_dir, redditbias_dir, tmp_path, capsys):
    nowts = tmp_path / "noweights"
    nowts.mkdir()
    (nowts / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    out = tmp_path / "out"
    rc = main(["measure", "--model", str(nowts), "--bias", "race", "--data-dir", str(redditbias_dir), "--out", str(out)])
    assert rc == 1
    assert "no model weights found" in capsys.readouterr().err
    assert not (out / "lmb.json").exists()
    rc = main(["measure", "--stored-perplexities", "--bias", "race", "--data-dir", str(tmp_path), "--out", str(out)])
    assert rc == 1 and "not a RedditBias data folder" in capsys.readouterr().err
    rc = main(["measure", "--model", str(tiny_model_dir), "--bias", "nationality", "--data-dir", str(redditbias_dir)])
    assert rc == 1 and "unknown bias type" in capsys.readouterr().err


def test_one_token_phrase_is_reported_not_zero(tiny_model_dir, redditbias_dir, tmp_path, capsys):
    import shutil

    data = tmp_path / "data_copy"
    shutil.copytree(redditbias_dir / "data" / "race", data / "data" / "race")
    t1 = data / "data/race/reddit_comments_race_black_biased_test_reduced.csv"
    t2 = data / "data/race/reddit_comments_race_white_biased_test_reduced.csv"
    for path, col in ((t1, "comments_processed"), (t2, None)):
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
            fields = list(rows[0])
        rows[2]["comments_processed"] = "black" if path == t1 else "white"
        if path == t2:
            rows[2]["comments"] = "black"
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fields)
            w.writeheader()
            w.writerows(rows)
    out = tmp_path / "o"
    rc = main(["measure", "--model", str(tiny_model_dir), "--bias", "race", "--data-dir", str(data), "--out", str(out),
               "--no-progress", "--n-bootstrap", "100"])
    assert rc == 1 and "row 3" in capsys.readouterr().err and not (out / "lmb.json").exists()
    rc = main(["measure", "--model", str(tiny_model_dir), "--bias", "race", "--data-dir", str(data), "--out", str(out),
               "--no-progress", "--n-bootstrap", "100", "--skip-unscorable"])
    assert rc == 0
    rec = json.loads((out / "lmb.json").read_text())[0]
    assert rec["n_pairs_unscorable"] == 1 and rec["n_pairs"] == 254
    with open(out / "race_perplexities.csv", newline="") as f:
        row = list(csv.DictReader(f))[2]
    assert row["biased_ppl"] == "" and row["outlier"] == "excluded" and row["note"].startswith("unscorable")


def test_stored_perplexities_command_line(redditbias_dir, tmp_path):
    """docs/lmb.md's no-weights command, as a user runs it (a subprocess of the installed entry point)."""
    out = tmp_path / "stored"
    r = subprocess.run([sys.executable, "-m", "rbjax.cli", "measure", "--stored-perplexities", "--bias", "all",
                        "--data-dir", str(redditbias_dir), "--out", str(out), "--n-bootstrap", "200"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    recs = json.loads((out / "lmb.json").read_text())
    assert {r["bias_type"]: r["significant"] for r in recs} == {
        "religion1": True, "religion2": True, "race": False, "gender": False, "queerness": False}


def test_plot_several_result_folders(redditbias_dir, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    main(["measure", "--stored-perplexities", "--data-dir", str(redditbias_dir), "--out", str(a), "--no-progress", "--n-bootstrap", "100"])
    main(["measure", "--stored-perplexities", "--split", "valid", "--data-dir", str(redditbias_dir), "--out", str(b), "--no-progress", "--n-bootstrap", "100"])
    # a test-split and a valid-split folder are not comparable: refused unless asked (tests/test_plot.py)
    assert main(["plot", f"test={a}", f"valid={b}", "--out", str(tmp_path / "fig.png")]) == 1
    assert main(["plot", f"test={a}", f"valid={b}", "--out", str(tmp_path / "fig.png"), "--allow-mixed"]) == 0
    assert (tmp_path / "fig.png").stat().st_size > 1000
    assert main(["plot", str(tmp_path / "missing"), "--out", str(tmp_path / "x.png")]) == 1


def test_interrupted_run_resumes(tiny_model_dir, redditbias_dir, tmp_path, monkeypatch, capsys):
    import rbjax.lmb.measure as m

    out = tmp_path / "o"
    args = ["measure", "--model", str(tiny_model_dir), "--bias", "race,gender", "--data-dir", str(redditbias_dir),
            "--out", str(out), "--no-progress", "--n-bootstrap", "100"]
    real = m._perplexities_for
    calls = []

    def dies_on_gender(pairs, *a, **k):
        calls.append(pairs.bias_type)
        if pairs.bias_type == "gender":
            raise KeyboardInterrupt
        return real(pairs, *a, **k)

    monkeypatch.setattr(m, "_perplexities_for", dies_on_gender)
    assert main(args) == 130
    assert (out / "race_perplexities.csv").exists() and not (out / "lmb.json").exists()
    err = capsys.readouterr().err
    assert "--resume" in err and "race" in err and "Traceback" not in err, err
    monkeypatch.setattr(m, "_perplexities_for", lambda pairs, *a, **k: (calls.append(pairs.bias_type), real(pairs, *a, **k))[1])
    assert main(args + ["--resume"]) == 0
    assert calls == ["race", "gender", "gender"]  # race was not scored again
    resumed = json.loads((out / "lmb.json").read_text())
    assert main(args) == 0  # a fresh run gives the same records
    fresh = json.loads((out / "lmb.json").read_text())
    for a, b in zip(resumed, fresh):
        assert a["t_value"] == b["t_value"] and a["n_pairs_after_outliers"] == b["n_pairs_after_outliers"]


def test_bad_arguments_are_clear_errors(redditbias_dir, tmp_path, capsys, tiny_model_dir):
    base = ["measure", "--stored-perplexities", "--data-dir", str(redditbias_dir), "--no-progress"]
    cases = [
        (["--alpha", "2"], "alpha must be between 0 and 1"),
        (["--n-std", "0", "--outlier-removal", "on"], "--n-std must be > 0"),
        (["--n-bootstrap", "-1"], "--n-bootstrap must be an integer >= 0"),
        (["--bos"], "no effect with --stored-perplexities"),
        (["--batch-size", "0"], "--batch-size must be >= 1"),
        (["--out", str(tmp_path / "afile" / "sub")], "afile exists and is not a folder"),
    ]
    (tmp_path / "afile").write_text("x")
    for extra, msg in cases:
        assert main(base + extra) == 1, extra
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err, (extra, err)
    assert main(["plot", str(tmp_path), "--out", str(tmp_path)]) == 1  # no lmb.json there
    out = tmp_path / "ok"
    assert main(base + ["--out", str(out), "--n-bootstrap", "0", "--bias", "race", "--bias", "gender"]) == 0
    recs = json.loads((out / "lmb.json").read_text())
    assert [r["bias_type"] for r in recs] == ["race", "gender"] and recs[0]["mean_log_ppl_diff_ci"] is None
    assert main(["plot", str(out), "--out", str(tmp_path)]) == 1
    assert "is a folder" in capsys.readouterr().err
    assert (out / "lmb.json").stat().st_mode & 0o044  # results are readable by others (not mkstemp's 0600)


def test_resume_notices_changed_weights(tiny_model_dir, redditbias_dir, tmp_path, capsys):
    import os
    import shutil

    model = tmp_path / "m"
    shutil.copytree(tiny_model_dir, model)
    out = tmp_path / "o"
    args = ["measure", "--model", str(model), "--bias", "religion2", "--data-dir", str(redditbias_dir),
            "--out", str(out), "--no-progress", "--n-bootstrap", "100"]
    assert main(args) == 0
    first = json.loads((out / "lmb.json").read_text())[0]["t_value"]
    other = tmp_path / "other"
    from tests.conftest import make_rbjax_gpt2_folder

    make_rbjax_gpt2_folder(other, seed=7)
    shutil.copy(other / "model.safetensors", model / "model.safetensors")
    os.utime(model / "model.safetensors", ns=(1, 1))
    capsys.readouterr()
    # the folder now holds another model's results: refused before scoring, kept as they are
    assert main(args + ["--resume"]) == 1
    err = capsys.readouterr().err
    assert "religion2_perplexities.csv (written from other inputs" in err and "model.safetensors" in err, err
    assert json.loads((out / "lmb.json").read_text())[0]["t_value"] == first
    assert main(args + ["--resume", "--overwrite"]) == 0
    err = capsys.readouterr().err
    assert "produced by other inputs" in err and "model.safetensors" in err, err
    assert json.loads((out / "lmb.json").read_text())[0]["t_value"] != first
    assert main(args + ["--resume"]) == 0
    assert "reusing 236 scored pairs of religion2" in capsys.readouterr().err


def test_resume_never_relabels_another_models_perplexities(tiny_model_dir, redditbias_dir, tmp_path, capsys):
    """Field case: model A scores every type into X; model B scores religion1 into X; then B with
    --resume on all types must score race (and the others) itself: only B's religion1 CSV is reused, and every
    record equals a fresh run of B."""
    import shutil

    from tests.conftest import make_torch_gpt2_folder

    a = tiny_model_dir
    b = make_torch_gpt2_folder(tmp_path / "b", seed=11)
    shutil.copy(a / "vocab.json", b / "vocab.json")
    shutil.copy(a / "merges.txt", b / "merges.txt")
    out = tmp_path / "x"
    common = ["--data-dir", str(redditbias_dir), "--out", str(out), "--no-progress", "--n-bootstrap", "0"]
    assert main(["measure", "--model", str(a), "--bias", "religion1,race"] + common) == 0
    a_race = json.loads((out / "lmb.json").read_text())[1]
    assert main(["measure", "--model", str(b), "--bias", "religion1"] + common) == 1  # A's results: refused
    assert main(["measure", "--model", str(b), "--bias", "religion1", "--overwrite"] + common) == 0
    capsys.readouterr()
    assert main(["measure", "--model", str(b), "--bias", "religion1,race", "--resume", "--overwrite"] + common) == 0
    err = capsys.readouterr().err
    assert "reusing 238 scored pairs of religion1" in err
    assert "race_perplexities.csv was produced by other inputs" in err and "reusing" not in err.split("race")[1]
    resumed = json.loads((out / "lmb.json").read_text())
    assert [r["reused_perplexities"] for r in resumed] == [True, False]
    fresh_out = tmp_path / "fresh"
    assert main(["measure", "--model", str(b), "--bias", "religion1,race", "--data-dir", str(redditbias_dir),
                 "--out", str(fresh_out), "--no-progress", "--n-bootstrap", "0"]) == 0
    fresh = json.loads((fresh_out / "lmb.json").read_text())
    for r, f in zip(resumed, fresh):
        assert r["t_value"] == f["t_value"] and r["model"] == f["model"] == str(b)
    assert resumed[1]["t_value"] != a_race["t_value"]
    # the data files are part of the key too: a changed test file is rescored, not reused
    data2 = tmp_path / "data2"
    shutil.copytree(redditbias_dir, data2)
    import csv as _csv

    f1 = data2 / "data" / "religion1" / "reddit_comments_religion1_christians_biased_test_reduced.csv"
    rows = list(_csv.reader(open(f1, newline="", encoding="utf-8")))
    col = rows[0].index("comments_processed")
    rows[1][col] = rows[1][col] + " indeed"
    with open(f1, "w", newline="", encoding="utf-8") as fh:
        _csv.writer(fh).writerows(rows)
    capsys.readouterr()
    assert main(["measure", "--model", str(b), "--bias", "religion1", "--resume", "--data-dir", str(data2),
                 "--out", str(out), "--no-progress", "--n-bootstrap", "0", "--overwrite"]) == 0
    assert "produced by other inputs" in capsys.readouterr().err
