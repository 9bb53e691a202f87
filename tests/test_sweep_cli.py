"""`rbjax sweep` end to end on a tiny random GPT-2: two grid points, dev LMB, selection files, resume."""
import csv
import json

import pytest

from rbjax.cli import main

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")


def test_sweep_cli_smoke_then_resume(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["sweep", "--method", "lmd", "--bias", "religion1", "--model", str(tiny_model_dir),
            "--tokenizer", str(tokenizer_dir), "--data-dir", str(redditbias_dir), "--out", str(out),
            "--batch-sizes", "4", "--grad-accums", "1", "--lambda-lms", "0.01", "--lambda-ds", "10,100",
            "--max-points", "2", "--max-steps", "2", "--no-lmp", "--dev-max-pairs", "16", "--n-bootstrap", "100",
            "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    runs = [json.loads(ln) for ln in (out / "sweep.jsonl").read_text().splitlines()]
    assert [r["id"] for r in runs] == ["b4_a1_lm0.01_d10", "b4_a1_lm0.01_d100"]
    for r in runs:
        assert r["updates"] == 2 and r["lmp"] is None
        assert r["dev"]["n_pairs"] == 16 and isinstance(r["dev"]["t_value"], float)
    sel = json.loads((out / "selection.json").read_text())
    assert sel["n_runs"] == 2 and sel["baseline_lmp"] is None
    assert sel["reference"]["id"] == max(runs, key=lambda r: r["dev"]["reference"]["p_value"])["id"]
    assert sel["default"]["id"] == min(runs, key=lambda r: abs(r["dev"]["t_value"]))["id"]  # no LMP: least |t|
    with open(out / "sweep.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["id"] for r in rows] == [r["id"] for r in runs]
    assert [float(r["dev_t"]) for r in rows] == pytest.approx([r["dev"]["t_value"] for r in runs])
    baseline = json.loads((out / "baseline.json").read_text())
    assert baseline["dev"]["n_pairs"] == 16
    assert "2 run(s)" in printed and str(out / "selection.json") in printed
    # the same command again: finished points are reused, not retrained
    assert main(argv) == 0
    assert len((out / "sweep.jsonl").read_text().splitlines()) == 2
    assert json.loads((out / "selection.json").read_text())["default"]["id"] == sel["default"]["id"]


def test_sweep_cli_bad_settings_are_clear_errors(tiny_model_dir, tmp_path, capsys):
    base = ["sweep", "--method", "lmd", "--bias", "religion1", "--model", str(tiny_model_dir), "--out",
            str(tmp_path / "s")]
    with pytest.raises(SystemExit):
        main(base + ["--batch-sizes", "4,x"])
    assert "comma list" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(base + ["--grad-accums", "0"])
    assert "positive integers" in capsys.readouterr().err
