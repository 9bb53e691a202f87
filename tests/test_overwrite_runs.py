"""``--overwrite`` of a command that writes a run folder: the new run replaces the earlier one as a whole or not at
all. ``rbjax debias --overwrite`` sets the earlier run's files aside and deletes them only once the new run has
finished: a bad input, an error or Ctrl-C before then leaves the earlier run as it was; a finished one leaves none
of its files (no ``adapter/`` of an adapter run beside a full fine-tuning, no old checkpoint). The training itself
is replaced by a stand-in (no compilation): what is tested is the folder."""
import json
from pathlib import Path

import pytest

from rbjax.cli import main
from rbjax.core.interrupt import Interrupted
from rbjax.train.loop import Trainer, TrainResult


def _earlier_run(out: Path) -> dict:
    """A finished run's files (an adapter run: model/ and adapter/) and a file of the user's; returns the folder's
    content."""
    for name, text in {"results.json": '{"status": "done", "key": {"old": 1}}', "config.json": "{}",
                       "metrics.jsonl": "{}\n", "model/config.json": "{}", "model/model.safetensors": "old weights",
                       "adapter/adapter_config.json": "{}", "checkpoints/2/old": "x",
                       "lmb_valid/race_perplexities.csv": "old", "notes.txt": "the user's"}.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    return _content(out)


def _content(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _argv(tiny_model_dir, tokenizer_dir, redditbias_dir, out, *extra):
    return ["debias", "--method", "hd", "--bias", "religion1", "--model", str(tiny_model_dir), "--tokenizer",
            str(tokenizer_dir), "--data-dir", str(redditbias_dir), "--out", str(out), "--batch-size", "4",
            "--max-steps", "1", "--layout", "padded", "--no-eval", "--no-lmp", "--no-progress", "--overwrite", *extra]


def test_debias_overwrite_keeps_the_earlier_run_when_the_new_one_fails(tiny_model_dir, tokenizer_dir,
                                                                        redditbias_dir, tmp_path, capsys,
                                                                        monkeypatch):
    out = tmp_path / "run"
    before = _earlier_run(out)
    # bad inputs: refused before anything is touched (a missing LMP file; a model folder without its weights)
    argv = [a for a in _argv(tiny_model_dir, tokenizer_dir, redditbias_dir, out) if a != "--no-lmp"]
    assert main(argv + ["--lmp-file", str(tmp_path / "missing.txt")]) == 1
    assert "LMP reference file not found" in capsys.readouterr().err
    assert _content(out) == before
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_bytes((tiny_model_dir / "config.json").read_bytes())
    assert main(_argv(no_weights, tokenizer_dir, redditbias_dir, out)) == 1
    capsys.readouterr()
    assert _content(out) == before
    (no_weights / "config.json").unlink()
    no_weights.rmdir()
    # Ctrl-C during the new run's training (it has written a checkpoint and metrics): the earlier run comes back

    def interrupted(self, out_dir=None, **kw):
        (Path(out_dir) / "checkpoints" / "1").mkdir(parents=True)
        (Path(out_dir) / "checkpoints" / "1" / "new").write_text("y")
        (Path(out_dir) / "metrics.jsonl").write_text('{"update": 1}\n')
        raise Interrupted("training interrupted; its checkpoint is saved: run the same command again")

    monkeypatch.setattr(Trainer, "run", interrupted)
    assert main(_argv(tiny_model_dir, tokenizer_dir, redditbias_dir, out)) == 130
    err = capsys.readouterr().err
    assert f"the earlier run in {out} is kept as it was" in err and "run the same command again" not in err
    assert _content(out) == before
    # an error after training (here: in the export)

    def broken(*a, **k):
        raise OSError("no space left on device")

    monkeypatch.setattr(Trainer, "run", _finished)
    monkeypatch.setattr("rbjax.debias.run.save_pretrained", broken)
    assert main(_argv(tiny_model_dir, tokenizer_dir, redditbias_dir, out)) == 1
    assert "no space left on device" in capsys.readouterr().err
    assert _content(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # nothing left beside (nor inside: _content)


def _finished(self, out_dir=None, **kw):
    """A stand-in for training: one update that changes nothing, finished."""
    (Path(out_dir) / "metrics.jsonl").write_text('{"update": 1}\n')
    return TrainResult(state=self.initial_state(), updates_done=self.t_total, t_total=self.t_total, finished=True,
                       resumed_from=None, summary={"skipped_updates": [0]}, frozen=self.frozen)


def test_debias_overwrite_leaves_only_the_new_runs_files(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path,
                                                         monkeypatch):
    out = tmp_path / "run"
    _earlier_run(out)
    monkeypatch.setattr(Trainer, "run", _finished)
    assert main(_argv(tiny_model_dir, tokenizer_dir, redditbias_dir, out)) == 0  # a full fine-tuning, no eval
    got = _content(out)
    assert got["notes.txt"] == b"the user's"  # not a file of the run: untouched
    assert not [f for f in got if f.split("/")[0] in ("adapter", "checkpoints", "lmb_valid")]
    assert got["metrics.jsonl"] == b'{"update": 1}\n' and got["model/model.safetensors"] != b"old weights"
    assert json.loads(got["results.json"])["status"] == "done" and "adapter" not in json.loads(got["results.json"])
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "metrics.jsonl", "model", "notes.txt",
                                                     "results.json"]  # the earlier files are deleted, none aside


# ------------------------------------------------------------------------------------------ rbjax sweep
def _earlier_sweep(out: Path) -> dict:
    """A finished sweep whose selections by both rules were retrained (``--final both``)."""
    for name in ("sweep.jsonl", "sweep.csv", "selection.json", "baseline.json", "sweep_settings.json",
                 "points/p1/results.json", "selected_default/results.json", "selected_default/model/config.json",
                 "selected_reference/results.json", "selected_reference/model/config.json"):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(f"old {name}")
    return _content(out)


def _sweep_argv(tiny_model_dir, tokenizer_dir, redditbias_dir, out):
    return ["sweep", "--method", "lmd", "--bias", "religion1", "--model", str(tiny_model_dir), "--tokenizer",
            str(tokenizer_dir), "--data-dir", str(redditbias_dir), "--out", str(out), "--batch-sizes", "4",
            "--grad-accums", "1", "--lambda-lms", "0.01", "--lambda-ds", "10", "--max-steps", "1", "--no-lmp",
            "--final", "default", "--no-progress", "--overwrite"]


def test_sweep_overwrite_leaves_no_selected_point_of_the_earlier_sweep(tiny_model_dir, tokenizer_dir,
                                                                       redditbias_dir, tmp_path, capsys,
                                                                       monkeypatch):
    """A new sweep retraining only its default selection over one that retrained both: the earlier
    selected_reference/ (another sweep's point, which `rbjax export --rule reference` would export with the new
    selection's numbers) is gone; a sweep that fails keeps the earlier one whole. The sweep itself is a stand-in."""
    from rbjax.commands import sweep as cmd

    out = tmp_path / "sweep"
    before = _earlier_sweep(out)
    point = {"id": "p", "dev": {"t_value": 1.0, "p_value": 0.5, "reference": {"p_value": 0.5}}, "lmp": None}

    def new_sweep(bases, *a, **k):
        for _, folder in bases:
            for name in ("sweep.jsonl", "sweep.csv", "selection.json", "selected_default/results.json"):
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                (folder / name).write_text(f"new {name}")
        return [{"n_runs": 1, "baseline": {}, "default": point, "reference": point} for _ in bases]

    def failing_sweep(bases, *a, **k):
        new_sweep(bases)
        raise RuntimeError("a chunk failed")

    monkeypatch.setattr(cmd, "run_sweeps", failing_sweep)
    assert main(_sweep_argv(tiny_model_dir, tokenizer_dir, redditbias_dir, out)) == 1
    assert "a chunk failed" in capsys.readouterr().err
    assert _content(out) == before
    monkeypatch.setattr(cmd, "run_sweeps", new_sweep)
    assert main(_sweep_argv(tiny_model_dir, tokenizer_dir, redditbias_dir, out)) == 0
    capsys.readouterr()
    assert sorted(_content(out)) == ["selected_default/results.json", "selection.json", "sweep.csv", "sweep.jsonl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep"]
