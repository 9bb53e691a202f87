"""Dead ends: the study owns its folders (a changed training or sweep setting reruns the stages that read
it, keeping what did not change), a measure-setting change prints one line per stage, an unwritable --out is named
before any work, and every study value is validated when the file is read (--dry-run included)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rbjax.cli import main

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")

#: the smallest study with every kind of training stage: one grid method (one grid point), one method without a
#: grid (CDA), one bias type, one seed, one update per run, no dialog checks
MINI = """
[study]
name = "mini"
random_model = { n_embd = 32, n_layer = 2, n_head = 2, n_positions = 64, vocab_size = 50257, seed = 0 }
bias_types = ["religion1"]
methods = ["lmd", "cda"]
seeds = [42]

[training]
epochs = 1
max_steps = 1
eval_batch_size = 64
lmp_max_lines = 8
layout = "padded"   # one compiled program per run (the token layout is not this file's subject)

[sweep]
methods = ["lmd"]
batch_size = [4]
grad_accum = [1]
lambda_lm = [0.01]
lambda_d = [10.0]
n_bootstrap = 0
dev_max_pairs = 16

[measure]
n_bootstrap = 0

[dialog]
tasks = []
"""


def _ran(err: str) -> set[str]:
    return set(re.findall(r"\[\d+/\d+\] (\S+) \.\.\.", err))


def test_changed_training_and_sweep_settings_rerun_their_stages(shared_dir, tmp_path, capsys):
    study = tmp_path / "mini.toml"
    study.write_text(MINI)
    out = tmp_path / "run"
    args = ["run", str(study), "--out", str(out), "--no-progress", "--no-report",
            "--set", f"study.tokenizer={shared_dir / 'tokenizers' / 'gpt2'}",
            "--set", f"study.data_dir={shared_dir / 'redditbias'}"]
    assert main(args) == 0
    capsys.readouterr()
    sweep_dir = out / "seed42/religion1/lmd/sweep"
    # a trajectory setting: the sweep, the CDA run and the measurements of their models run again (not refused)
    assert main(args + ["--set", "training.max_steps=2"]) == 0
    err = capsys.readouterr().err
    assert _ran(err) == {"seed42/sweeps", "seed42/religion1/cda/run", "seed42/religion1/lmd/lmb_test",
                         "seed42/religion1/cda/lmb_test"}, err
    assert "holds a sweep of other inputs" not in err
    assert [json.loads(r)["updates"] for r in (sweep_dir / "sweep.jsonl").read_text().splitlines()] == [2]
    cda = json.loads((out / "seed42/religion1/cda/run/results.json").read_text())
    assert cda["training"]["updates"] == 2
    # a grid setting: the finished point is kept, only the new one is trained
    assert main(args + ["--set", "training.max_steps=2", "--set", "sweep.lambda_d=[10.0, 50.0]"]) == 0
    err = capsys.readouterr().err
    assert "seed42/sweeps" in _ran(err) and "seed42/religion1/cda/run" not in _ran(err)
    recs = [json.loads(r) for r in (sweep_dir / "sweep.jsonl").read_text().splitlines()]
    assert sorted(r["point"]["lambda_d"] for r in recs) == [10.0, 50.0]  # 10.0 from before, 50.0 new
    # a measure setting: the measurement stages run again, one line each (no per-type "--resume: reusing")
    assert main(args + ["--set", "training.max_steps=2", "--set", "sweep.lambda_d=[10.0, 50.0]",
                        "--set", "measure.n_bootstrap=10"]) == 0
    cap = capsys.readouterr()
    assert _ran(cap.err) == {"baseline/lmb_test", "seed42/religion1/lmd/lmb_test", "seed42/religion1/cda/lmb_test"}
    assert "--resume" not in cap.err and "reusing" not in cap.err, cap.err
    assert "3 of them reused their stored perplexities" in cap.out


def test_unwritable_out_is_named_before_any_work(tmp_path, capsys, monkeypatch):
    from rbjax.core import io as rio

    study = tmp_path / "mini.toml"
    study.write_text(MINI)
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    assert main(["run", str(study), "--out", str(blocker / "sub"), "--no-progress"]) == 1
    assert f"cannot create --out {blocker / 'sub'}: {blocker} exists and is not a folder" in capsys.readouterr().err
    # a folder of something else: the study would own it, so it is refused
    other = tmp_path / "results"
    other.mkdir()
    (other / "lmb.json").write_text("[]")
    assert main(["run", str(study), "--out", str(other), "--no-progress"]) == 1
    assert "holds files but is not a study folder" in capsys.readouterr().err
    assert [p.name for p in other.iterdir()] == ["lmb.json"]
    assert not (tmp_path / "afile.d").exists()
    # read-only (root ignores permission bits: os.access is what rbjax asks, so it is made to say no)
    ro = tmp_path / "ro"
    ro.mkdir()
    real = rio.os.access
    monkeypatch.setattr(rio.os, "access", lambda p, m: False if Path(p) == ro else real(p, m))
    for cmd in (["run", str(study), "--out", str(ro / "s")],
                ["debias", "--method", "cda", "--bias", "religion1", "--model", str(tmp_path / "nomodel"),
                 "--out", str(ro / "d")],
                ["plot", str(tmp_path), "--out", str(ro / "f.png")],
                ["retrieve", "--bias", "religion1", "--dump", str(study), "--out", str(ro / "c.csv")]):
        assert main(cmd) == 1, cmd
        err = capsys.readouterr().err
        assert f"{ro} is not writable" in err and ".tmp" not in err and "Errno" not in err, (cmd, err)
    assert list(ro.iterdir()) == []


@pytest.mark.parametrize("text, message", [
    ('[training]\nepochs = "one"\n', r"mini.toml: \[training\] epochs: training.epochs must be an integer, got 'one'"),
    ("[training]\nmax_steps = -3\n", r"mini.toml: \[training\] max_steps: max_steps must be >= 1, got -3"),
    ("[sweep]\nbatch_size = [0]\n", r"\[sweep\] batch_size: sweep.batch_size must be a non-empty list of positive"),
    ('[measure]\nsplit = "dev"\n', r"\[measure\] split: measure.split must be test, valid or valid\+test"),
    ("[dialog]\ntasks = []\nlmp = { lmp_max_lines = 0 }\n", r"\[dialog\] lmp: dialog.lmp: lmp_max_lines must be"),
])
def test_every_study_value_is_validated_when_read(tmp_path, capsys, text, message):
    sec = text.split("]")[0] + "]"
    parts = re.split(r"(?m)^(?=\[)", MINI)  # the section under test replaces the mini study's own
    study = tmp_path / "mini.toml"
    study.write_text("".join(p for p in parts if not p.startswith(sec)) + text)
    assert main(["run", str(study), "--out", str(tmp_path / "o"), "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert re.search(message, err) and "training tokens" not in err, err


def test_set_value_errors_name_the_set(tmp_path, capsys):
    study = tmp_path / "mini.toml"
    study.write_text(MINI)
    for s, msg in (("training.max_steps=-3", "--set 'training.max_steps=-3': max_steps must be >= 1, got -3"),
                   ("sweep.lambda_d=[10.0, -1]", "--set 'sweep.lambda_d=[10.0, -1]': sweep.lambda_d must be"),
                   ("measure.n_bootstrap=-1", "--set 'measure.n_bootstrap=-1': measure.n_bootstrap must be an "
                                              "integer >= 0")):
        assert main(["run", str(study), "--out", str(tmp_path / "o"), "--dry-run", "--set", s]) == 1
        err = capsys.readouterr().err
        assert msg in err and "training tokens" not in err, err
