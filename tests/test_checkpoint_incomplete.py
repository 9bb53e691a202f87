"""Field failure: an incomplete checkpoint step folder (no orbax commit marker, array data missing: an
interrupted copy, a file system without atomic renames) was taken as the latest and resume failed with "does not
match this run's model/optimizer" although the previous step was complete. Resume from the newest complete step,
and say which folder was skipped and why."""
import shutil

import jax
import numpy as np
import pytest

from rbjax.debias.run import debias_trainer
from rbjax.train import loop

from tests.conftest import small_train_config

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")


def _drop_array_data(step_dir):
    """Delete the array chunks of a step (what an interrupted copy leaves out)."""
    gone = 0
    for d in step_dir.joinpath("state").rglob("d"):
        if d.is_dir():
            for f in d.iterdir():
                f.unlink()
                gone += 1
    assert gone, "the planted damage removed nothing: orbax's layout changed"


@pytest.mark.parametrize("damage", ["uncommitted", "arrays_missing"])
def test_resume_skips_an_incomplete_step_folder(damage, tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path,
                                                capsys):
    cfg = small_train_config(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path / "run", max_steps=3,
                             save_every=1, keep_checkpoints=3, dropout=False)
    full = debias_trainer(cfg.replace(out_dir=str(tmp_path / "full"))).run(checkpoints=False)
    debias_trainer(cfg).run(stop_after=2)  # checkpoints of updates 1 and 2
    ck = tmp_path / "run" / "checkpoints"
    step2 = ck / "2"
    assert (step2 / "commit_success.txt").is_file()
    _drop_array_data(step2)
    if damage == "uncommitted":  # no commit marker either
        (step2 / "commit_success.txt").unlink()
        (step2 / "_CHECKPOINT_METADATA").unlink()
    capsys.readouterr()
    res = debias_trainer(cfg).run()
    err = capsys.readouterr().err
    assert res.resumed_from == 1 and res.finished  # the newest complete step
    assert f"skipped the incomplete checkpoint {step2}" in err
    assert ("no commit marker" if damage == "uncommitted" else "arrays cannot be read") in err
    assert (ck / "2.incomplete").is_dir()  # kept, out of the way
    (rec,) = res.summary["incomplete_checkpoints"]
    assert rec["folder"] == str(step2) and rec["moved_to"] == str(ck / "2.incomplete")
    for a, b in zip(jax.tree.leaves(full.params), jax.tree.leaves(res.params)):  # = an uninterrupted run
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert sorted(p.name for p in ck.iterdir() if p.name.isdigit()) == ["1", "2", "3"]


def test_a_checkpoint_of_another_run_is_still_refused(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path):
    cfg = small_train_config(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path / "run", max_steps=2,
                             save_every=1, dropout=False)
    debias_trainer(cfg).run(stop_after=1)
    with pytest.raises(ValueError, match="different run"):
        debias_trainer(cfg.replace(lambda_d=50.0)).run()
    shutil.rmtree(tmp_path / "run")


def test_a_checkpoint_of_an_older_trajectory_format_is_refused(tiny_model_dir, tokenizer_dir, redditbias_dir,
                                                               tmp_path, monkeypatch):
    """CHECKPOINT_FORMAT is bumped when the same settings give another trajectory (format 5: other dropout masks):
    a checkpoint written under the previous format is not resumed as if it were this run's."""
    cfg = small_train_config(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path / "run", max_steps=2,
                             save_every=1, dropout=False)
    current = loop.CHECKPOINT_FORMAT
    monkeypatch.setattr(loop, "CHECKPOINT_FORMAT", current - 1)
    debias_trainer(cfg).run(stop_after=1)
    monkeypatch.setattr(loop, "CHECKPOINT_FORMAT", current)
    with pytest.raises(ValueError, match="different run"):
        debias_trainer(cfg).run()
