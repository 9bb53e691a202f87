"""Grid files (``rbjax sweep --grid-config``; experiments/grids/*.toml) and the multi-host switch (``--distributed``,
``RBJAX_DISTRIBUTED``): the paper's files hold the paper's grid and settings, a study takes each method's grid from
its file, the command line wins over a file, bad files are refused naming the file and key."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rbjax.debias.config import DebiasRun
from rbjax.debias.grid_config import config_for_method, load_grid_config, load_grid_configs, merge
from rbjax.debias.sweep import PAPER_GRID, grid_points
from tests.conftest import religion1_train_file

ROOT = Path(__file__).resolve().parents[1]
GRIDS = ROOT / "experiments" / "grids"

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")


def test_paper_grid_files():
    cfgs = load_grid_configs([GRIDS])
    assert sorted(m for c in cfgs for m in c.methods) == ["add", "cda", "hd", "lmd"]
    paper = {k: tuple(v) for k, v in PAPER_GRID.items()}
    for m in ("lmd", "add", "hd"):
        c = config_for_method(cfgs, m)
        assert Path(c.path).name == f"{m}.toml" and c.grid == paper
        grid, _ = merge(c, paper, set())
        assert len(grid_points(m, grid)) == 54
    cda = config_for_method(cfgs, "cda")
    assert cda.grid == {"batch_size": (2,), "grad_accum": (1,)}  # the reference's single CTDA run
    assert len(grid_points("cda", merge(cda, paper, set())[0])) == 1
    for c in cfgs:  # §5.1 / docs/debiasing.md §5 "Setup", and rbjax's defaults agree with them
        s = c.settings
        assert (s["epochs"], s["learning_rate"], s["adam_b1"], s["adam_b2"], s["adam_eps"], s["max_grad_norm"],
                s["block_size"], s["seed"], s["dropout"], s["precision"]) == (2, 5e-5, 0.9, 0.999, 1e-8, 1.0, 36, 42,
                                                                             True, "fp32")
        d = DebiasRun.from_flat(method=c.methods[0])
        assert all(d.to_dict()[k] == v for k, v in s.items())


def test_command_line_wins_over_the_file(tmp_path):
    f = tmp_path / "g.toml"
    f.write_text('[grid]\nbatch_size = [2]\nlambda_d = [5, 7]\n[settings]\nepochs = 1\nseed = 3\n')
    c = load_grid_config(f)
    paper = {k: tuple(v) for k, v in PAPER_GRID.items()}
    cli = {**paper, "lambda_d": (1.0,)}  # --lambda-ds 1 given
    grid, settings = merge(c, cli, {"lambda_d", "seed"})  # --lambda-ds and --seed 9 given, --epochs not written
    assert grid == {"batch_size": (2,), "grad_accum": paper["grad_accum"], "lambda_lm": paper["lambda_lm"],
                    "lambda_d": (1.0,)}
    assert settings == {"epochs": 1}
    assert merge(None, cli, {"lambda_d"}) == (cli, {})


def test_an_option_given_at_its_default_beats_the_file(tmp_path, monkeypatch, tiny_model_dir):
    """The one precedence rule (command line > file > default; given = written): ``--lr 5e-5``, the default value,
    written on the command line beats the grid file's learning_rate, as ``--lambda-ds 10,50,100`` (the paper's axis)
    beats the file's axis; an option not written (--epochs, --batch-sizes) leaves the file's value. Checked on what
    ``rbjax sweep`` hands to the sweeps (run_sweeps is stopped before any training)."""
    from rbjax.cli import main
    from rbjax.commands import sweep as sweep_command

    f = tmp_path / "g.toml"
    f.write_text("[grid]\nbatch_size = [2]\nlambda_d = [5]\n[settings]\nlearning_rate = 1e-4\nepochs = 3\n")
    assert DebiasRun.from_flat().optimizer.learning_rate == 5e-5 and PAPER_GRID["lambda_d"] == (10.0, 50.0, 100.0)

    class Stop(Exception):
        pass

    seen = {}

    def run_sweeps(bases, sweep_cfg, *, method_grids, **kw):
        seen.update(cfg=bases[0][0], grid=method_grids["lmd"])
        raise Stop

    monkeypatch.setattr(sweep_command, "run_sweeps", run_sweeps)
    argv = ["sweep", "--method", "lmd", "--bias", "religion1", "--out", str(tmp_path / "o"), "--grid-config", str(f),
            "--model", str(tiny_model_dir)]  # (the memory plan reads its config.json before run_sweeps)
    with pytest.raises(Stop):
        main(argv + ["--lr", "5e-5", "--lambda-ds", "10,50,100"])
    assert seen["cfg"].optimizer.learning_rate == 5e-5 and seen["cfg"].trainer.epochs == 3
    assert seen["grid"]["lambda_d"] == (10.0, 50.0, 100.0) and seen["grid"]["batch_size"] == (2,)
    with pytest.raises(Stop):
        main(argv)
    assert seen["cfg"].optimizer.learning_rate == 1e-4 and seen["cfg"].trainer.epochs == 3
    assert seen["grid"]["lambda_d"] == (5.0,) and seen["grid"]["batch_size"] == (2,)
    # the same in Python: merge(file, parsed axes, the names written)
    c = load_grid_config(f)
    paper = {k: tuple(v) for k, v in PAPER_GRID.items()}
    assert merge(c, paper, {"learning_rate", "lambda_d"}) == ({**paper, "batch_size": (2,)}, {"epochs": 3})
    assert merge(c, paper, set()) == ({**paper, "batch_size": (2,), "lambda_d": (5.0,)},
                                      {"learning_rate": 1e-4, "epochs": 3})


@pytest.mark.parametrize("text,match", [
    ("[grid]\nbatch_size = [4, 0]\n", r"\[grid\] batch_size: 0 is not a positive integer"),
    ("[grid]\nbatch_size = []\n", r"batch_size: expected a non-empty list"),
    ("[grid]\nlambda_d = [10, 10]\n", r"lambda_d: repeated values"),
    ("[grid]\nlr = [1e-4]\n", r"unknown axis.*lr"),
    ("[settings]\nbatch_size = 4\n", r"batch_size is a grid axis"),
    ("[settings]\nmethod = 'lmd'\n", r"method is chosen on the command line"),
    ("[settings]\nlearning_rat = 1e-4\n", r"learning_rat is not a training setting"),
    ("[settings]\nepochs = 0\n", r"\[settings\] epochs must be >= 1, got 0"),
    ("methods = ['lmdx']\n", r"methods must be a list of"),
    ("gird = 1\n", r"unknown key\(s\) \['gird'\]"),
    ("[grid\n", r"not valid TOML"),
])
def test_bad_grid_files_are_refused(tmp_path, text, match):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(ValueError, match=match) as e:
        load_grid_config(f)
    assert str(f) in str(e.value)


def test_conflicting_grid_files_are_refused(tmp_path):
    (tmp_path / "a.toml").write_text("methods = ['lmd']\n")
    (tmp_path / "b.toml").write_text("methods = ['lmd', 'hd']\n")
    with pytest.raises(ValueError, match="both name method 'lmd'"):
        load_grid_configs([tmp_path])
    (tmp_path / "c.toml").write_text("")
    (tmp_path / "d.toml").write_text("")
    with pytest.raises(ValueError, match="apply to every method"):
        load_grid_configs([tmp_path / "c.toml", tmp_path / "d.toml"])
    with pytest.raises(FileNotFoundError, match="missing.toml: --grid-config file not found"):
        load_grid_config(tmp_path / "missing.toml")


def test_cli_study_takes_each_methods_grid_from_its_file(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path):
    """``rbjax sweep --method lmd,cda --grid-config FOLDER``: LMD's file gives 1 batch plan × 2 λ points, CDA's a
    single run at batch 2; a setting of the file (max_steps 1) is used unless the command line gives another
    (--seed stays the file's, --max-steps 2 on the command line wins)."""
    from rbjax.cli import main

    g = tmp_path / "grids"
    g.mkdir()
    (g / "lmd.toml").write_text("methods = ['lmd']\n[grid]\nbatch_size = [4]\ngrad_accum = [1]\n"
                                "lambda_lm = [0.01]\nlambda_d = [10, 100]\n[settings]\nmax_steps = 1\nseed = 7\n")
    (g / "cda.toml").write_text("methods = ['cda']\n[grid]\nbatch_size = [2]\ngrad_accum = [1]\n"
                                "[settings]\nmax_steps = 1\n")
    out = tmp_path / "study"
    argv = ["sweep", "--method", "lmd,cda", "--bias", "religion1", "--model", str(tiny_model_dir), "--tokenizer",
            str(tokenizer_dir), "--data-dir", str(redditbias_dir), "--out", str(out), "--train-file",
            religion1_train_file(redditbias_dir, tmp_path, 12), "--grid-config", str(g), "--max-steps", "2",
            "--n-bootstrap", "0", "--dev-max-pairs", "4", "--no-lmp", "--no-progress", "--layout", "padded"]
    assert main(argv) == 0
    lmd = [json.loads(x) for x in (out / "religion1" / "lmd" / "sweep.jsonl").read_text().splitlines()]
    cda = [json.loads(x) for x in (out / "religion1" / "cda" / "sweep.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in lmd) == ["b4_a1_lm0.01_d10", "b4_a1_lm0.01_d100"]
    assert [r["point"]["batch_size"] for r in cda] == [2]
    assert all(r["updates"] == 2 for r in lmd + cda)  # --max-steps 2 beat the files' 1
    st = json.loads((out / "religion1" / "lmd" / "sweep_settings.json").read_text())["settings"]
    assert st["seed"] == 7 and st["grid"]["lambda_d"] == [10.0, 100.0]
    assert json.loads((out / "religion1" / "cda" / "sweep_settings.json").read_text())["settings"]["seed"] == 42


def test_distributed_switch(monkeypatch):
    from rbjax.core.distributed import requested

    monkeypatch.delenv("RBJAX_DISTRIBUTED", raising=False)
    assert not requested() and requested(True)
    for v, want in (("1", True), ("true", True), ("0", False), ("", False), ("no", False)):
        monkeypatch.setenv("RBJAX_DISTRIBUTED", v)
        assert requested() is want
    monkeypatch.setenv("JAX_NUM_PROCESSES", "two")
    monkeypatch.setenv("RBJAX_DISTRIBUTED", "1")
    from rbjax.core.distributed import initialize

    with pytest.raises(ValueError, match=r"\$JAX_NUM_PROCESSES must be an integer"):
        initialize()


def test_distributed_and_ray_are_exclusive(capsys, tmp_path):
    from rbjax.cli import main

    rc = main(["sweep", "--method", "lmd", "--bias", "religion1", "--out", str(tmp_path / "o"), "--executor", "ray",
               "--distributed"])
    assert rc == 1 and "choose one" in capsys.readouterr().err
