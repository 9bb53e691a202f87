"""The trainer under stress: non-finite gradients, vmapped grid points = sequential runs, Ctrl-C saves and resumes,
reruns keep their records, resume keys on the starting model's content, and a bias type of one's own trains."""
import json
import os
import signal
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rbjax.debias import run as dr
from rbjax.debias.run import debias_trainer, lambda_point
from rbjax.train.optim import global_norm, make_optimizer
from rbjax.train.step import TrainState
from tests.conftest import religion1_train_file
from tests.conftest import small_train_config as _cfg

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")


# ------------------------------------------------------------------------------------- non-finite gradients
def _one_update(params, grads, lr=5e-5):
    opt = make_optimizer()
    new, st, _, _ = opt.apply(params, grads, opt.init(params), lr)
    return new, st


def test_failure_case_overflowing_gradient_norm():
    """Clip 1.0 + Adam (lr 5e-5) on ones(100) with gradient full(100, 1e20): the global norm is 1e21 (its sum of
    squares overflows float32, the norm must not), each clipped entry is 0.1, each weight moves by about −5e-5."""
    params = {"w": jnp.ones(100, jnp.float32)}
    grads = {"w": jnp.full(100, 1e20, jnp.float32)}
    assert float(optax.tree.norm(grads)) == np.inf  # the naive norm overflows ...
    np.testing.assert_allclose(float(global_norm(grads)), 1e21, rtol=1e-6)  # ... ours does not
    from rbjax.train.optim import clip_by_global_norm

    clipped, _ = clip_by_global_norm(1.0).update(grads, optax.EmptyState())
    np.testing.assert_allclose(np.asarray(clipped["w"]), 0.1, rtol=1e-6)
    new, st = _one_update(params, grads)
    np.testing.assert_allclose(np.asarray(new["w"]) - 1.0, -5e-5, rtol=1e-3)
    assert int(st.total_notfinite) == 0


def test_failure_case_non_finite_gradient_is_skipped():
    """A gradient holding inf or NaN never reaches the parameters or the Adam moments; the skip is counted."""
    params = {"w": jnp.array([1.0, 2.0]), "b": jnp.array([0.5])}
    for bad in (np.inf, np.nan):
        grads = {"w": jnp.array([bad, 1.0]), "b": jnp.array([0.0])}
        assert not np.isfinite(float(global_norm(grads)))
        new, st = _one_update(params, grads)
        for k in params:
            assert np.array_equal(np.asarray(new[k]), np.asarray(params[k]))
        assert int(st.total_notfinite) == 1 and int(st.notfinite_count) == 1
        assert all(float(jnp.abs(x).sum()) == 0.0 for x in jax.tree.leaves((st.mu, st.nu)))
        assert int(st.count) == 0


def test_non_finite_point_of_a_grid_does_not_touch_the_others(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path):
    """Vmapped grid: a point whose loss weight is inf gets non-finite gradients and skips its updates; the other
    point trains exactly as it would alone."""
    cfg = _cfg(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path / "g", method="add",
               train_file=religion1_train_file(redditbias_dir, tmp_path, 8), max_steps=2, dropout=False)
    good, bad = lambda_point(0.01, 10.0, 1e-3), lambda_point(0.01, float("inf"), 1e-3)
    tr = debias_trainer(cfg, points=[good, bad])
    res = tr.run(checkpoints=False)
    assert res.summary["skipped_updates"] == [0, 2]
    init = tr.init_params
    for a, b in zip(jax.tree.leaves(init), jax.tree.leaves(res.point_params(1))):
        assert np.array_equal(np.asarray(a), np.asarray(b))  # the bad point never moved
    alone = debias_trainer(cfg.replace(lambda_lm=0.01, lambda_d=10.0, learning_rate=1e-3)).run(checkpoints=False)
    for a, b in zip(jax.tree.leaves(alone.params), jax.tree.leaves(res.point_params(0))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_checkpoint_is_never_written_with_non_finite_parameters(tmp_path):
    from rbjax.train.checkpoint import Checkpointer, NonFiniteParameters

    p = {"w": jnp.array([1.0, np.nan])}
    st = TrainState(params=p, opt_state=make_optimizer().init(p), step=jnp.int32(3), hparams=jnp.ones(2),
                    lr=jnp.float32(1e-3), t_total=jnp.float32(5))
    ck = Checkpointer(tmp_path / "ck")
    with pytest.raises(NonFiniteParameters, match="update 3"):
        ck.save(3, st, {"update": 3})
    assert ck.latest_step() is None
    ck.close()


# ------------------------------------------------------------------------------------ grid = sequential runs
@pytest.mark.parametrize("method,accum", [("lmd", 1), ("hd", 2)])
def test_vmapped_grid_points_equal_their_sequential_runs(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path,
                                                         method, accum):
    """Three grid points of one batch plan trained as one vmapped program equal each point trained alone (with
    dropout: every point sees the same data and dropout stream), to float32 tolerance."""
    cfg = _cfg(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path / "g", method=method, grad_accum=accum,
               train_file=religion1_train_file(redditbias_dir, tmp_path, 12), max_steps=3)
    pts = [lambda_point(0.001, 10.0, 5e-4), lambda_point(0.01, 100.0, 5e-4), lambda_point(0.01, 50.0, 1e-4)]
    grid = debias_trainer(cfg, points=pts).run(checkpoints=False)
    for i, p in enumerate(pts):
        alone = debias_trainer(cfg.replace(lambda_lm=p.hparams["lambda_lm"], lambda_d=p.hparams["lambda_d"], learning_rate=p.learning_rate))
        res = alone.run(checkpoints=False)
        for a, b in zip(jax.tree.leaves(res.params), jax.tree.leaves(grid.point_params(i))):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-5, atol=2e-6)


def test_grid_chunk_checkpoint_resumes_bit_identically(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path):
    cfg = _cfg(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path / "full", method="lmd",
               train_file=religion1_train_file(redditbias_dir, tmp_path, 12), max_steps=3, save_every=1)
    pts = [lambda_point(0.001, 10.0, 5e-4), lambda_point(0.01, 100.0, 5e-4)]
    full = debias_trainer(cfg, points=pts).run()
    cfg_b = cfg.replace(out_dir=str(tmp_path / "killed"))
    assert not debias_trainer(cfg_b, points=pts).run(stop_after=2).finished
    res = debias_trainer(cfg_b, points=pts).run()
    assert res.resumed_from == 2
    for a, b in zip(jax.tree.leaves(full.state.params), jax.tree.leaves(res.state.params)):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="different run.*points"):
        debias_trainer(cfg_b, points=pts[:1] + [lambda_point(0.01, 50.0, 5e-4)]).run()


# --------------------------------------------------------------------------------------------------- Ctrl-C
def test_sigint_saves_a_checkpoint_and_the_run_resumes(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path):
    """Ctrl-C during a 5-update run with --save-every 100: the update in flight finishes, a checkpoint of it is
    written, Interrupted says where and how to resume; the rerun ends bit-identical to an uninterrupted run."""
    from rbjax.core.interrupt import Interrupted

    cfg = _cfg(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path / "a", max_steps=5, save_every=100)
    full = debias_trainer(cfg).run(checkpoints=False)

    def ctrl_c(ev):
        if ev["kind"] == "update" and ev["update"] == 2:
            os.kill(os.getpid(), signal.SIGINT)

    cfg_b = cfg.replace(out_dir=str(tmp_path / "b"))
    with pytest.raises(Interrupted) as ei:
        debias_trainer(cfg_b).run(callback=ctrl_c)
    msg = str(ei.value)
    assert "SIGINT" in msg and "update 2/5" in msg and "run the same command again" in msg and "checkpoints" in msg
    res = debias_trainer(cfg_b).run()
    assert res.resumed_from == 2 and res.finished
    for a, b in zip(jax.tree.leaves(full.params), jax.tree.leaves(res.params)):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    assert [json.loads(ln)["step"] for ln in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()] == \
        [1, 2, 3, 4, 5]


def test_cli_ctrl_c_prints_the_resume_hint_without_traceback(tiny_model_dir, tokenizer_dir, redditbias_dir,
                                                             tmp_path, capsys, monkeypatch):
    from rbjax.cli import main
    from rbjax.train.loop import Trainer

    real = Trainer.run

    def run_and_interrupt(self, *a, **kw):
        kw["callback"] = lambda ev: ev["kind"] == "update" and ev["update"] == 1 and os.kill(os.getpid(),
                                                                                             signal.SIGTERM)
        return real(self, *a, **kw)

    monkeypatch.setattr(Trainer, "run", run_and_interrupt)
    argv = ["debias", "--method", "lm", "--bias", "religion1", "--model", str(tiny_model_dir), "--tokenizer",
            str(tokenizer_dir), "--data-dir", str(redditbias_dir), "--out", str(tmp_path / "r"), "--max-steps", "3",
            "--batch-size", "4", "--no-eval", "--no-lmp", "--no-progress"]
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "SIGTERM" in err and "update 1/3" in err and "Traceback" not in err
    monkeypatch.setattr(Trainer, "run", real)
    assert main(argv) == 0
    res = json.loads((tmp_path / "r" / "results.json").read_text())
    assert res["training"]["resumed_from"] == 1 and res["training"]["updates"] == 3
    # the record covers the whole run (both sessions), not only the updates after the resume
    lines = [json.loads(ln) for ln in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3]
    assert res["training"]["tokens"] == sum(m["tokens"] for m in lines)
    assert res["training"]["tokens"] > res["training"]["this_session"]["tokens"] > 0
    assert res["training"]["sessions"] == 2 and res["training"]["train_s"] >= res["training"]["this_session"]["train_s"]


def test_ctrl_c_during_the_evaluation_keeps_the_training_record(tiny_model_dir, tokenizer_dir, redditbias_dir,
                                                                tmp_path, capsys, monkeypatch):
    """Interrupted while measuring the trained model: the message names `rbjax debias` (not measure's --resume),
    and the rerun reuses the final checkpoint with a full training record rebuilt from metrics.jsonl."""
    from rbjax.cli import main
    from rbjax.lmb import measure

    real = measure.measure_bias
    calls = []

    def interrupted_measure(*a, **kw):
        calls.append(1)
        raise KeyboardInterrupt

    monkeypatch.setattr(measure, "measure_bias", interrupted_measure)
    argv = ["debias", "--method", "lm", "--bias", "religion1", "--model", str(tiny_model_dir), "--tokenizer",
            str(tokenizer_dir), "--data-dir", str(redditbias_dir), "--out", str(tmp_path / "r"), "--max-steps", "2",
            "--batch-size", "4", "--eval-bias", "religion1", "--no-lmp", "--no-progress"]
    assert main(argv) == 130 and calls
    err = capsys.readouterr().err
    assert "interrupted during the evaluation" in err and "rbjax debias command again" in err
    assert "--resume" not in err and "Traceback" not in err
    monkeypatch.setattr(measure, "measure_bias", real)
    assert main(argv) == 0
    out = capsys.readouterr().out
    res = json.loads((tmp_path / "r" / "results.json").read_text())
    lines = [json.loads(ln) for ln in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert res["reused"]["training"] and res["training"]["updates"] == 2
    assert res["training"]["tokens"] == sum(m["tokens"] for m in lines) > 0 and res["training"]["train_s"] > 0
    assert res["training"]["last"]["step"] == 2 and "last update" in out


# ----------------------------------------------------------------------------------- reruns keep their records
def test_rerun_of_a_finished_run_keeps_training_and_adds_evaluations(tiny_model_dir, tokenizer_dir, redditbias_dir,
                                                                     tmp_path, capsys):
    from rbjax.cli import main

    out = tmp_path / "run"
    lmp = str(Path(redditbias_dir) / "text_files" / "humanref6k.txt")
    base = ["debias", "--method", "hd", "--bias", "religion1", "--model", str(tiny_model_dir), "--tokenizer",
            str(tokenizer_dir), "--data-dir", str(redditbias_dir), "--out", str(out), "--max-steps", "2",
            "--batch-size", "4", "--lmp-file", lmp, "--lmp-max-lines", "16", "--no-progress"]
    assert main(base + ["--eval-bias", "religion1"]) == 0
    first = json.loads((out / "results.json").read_text())
    assert [r["bias_type"] for r in first["lmb_valid"]["all"]] == ["religion1"]
    capsys.readouterr()
    assert main(base + ["--eval-bias", "race"]) == 0  # another evaluation of the same finished run
    err = capsys.readouterr().err
    second = json.loads((out / "results.json").read_text())
    assert "training finished earlier" in err and "added the LMB of race" in err
    assert second["training"] == first["training"]  # the record of the real training, not a 0-update rerun
    assert second["training"]["train_s"] > 0 and second["training"]["tokens"] > 0
    assert second["reused"]["training"] and second["reused"]["lmb_types"] == ["religion1"] and second["reused"]["lmp"]
    assert {r["bias_type"] for r in second["lmb_valid"]["all"]} == {"religion1", "race"}
    t_rel1 = next(r["t_value"] for r in first["lmb_valid"]["all"] if r["bias_type"] == "religion1")
    assert next(r["t_value"] for r in second["lmb_valid"]["all"] if r["bias_type"] == "religion1") == t_rel1
    assert main(base + ["--eval-bias", "race"]) == 0  # identical rerun: nothing to do, and it says so
    assert "this run is complete" in capsys.readouterr().err
    assert json.loads((out / "results.json").read_text()) == second
    # the same inputs with another setting (the evaluation's batch size): not complete, so its record is rewritten
    # with the settings of this run (everything reused)
    assert main(base + ["--eval-bias", "race", "--eval-batch-size", "3"]) == 0
    assert "this run is complete" not in capsys.readouterr().err
    third = json.loads((out / "results.json").read_text())
    assert third["config"]["eval_batch_size"] == 3 and third["training"] == first["training"]
    assert third["reused"]["training"] and third["reused"]["lmp"]
    # another starting model with the same path: refused, never relabelled
    import shutil

    from tests.conftest import make_torch_gpt2_folder

    other = make_torch_gpt2_folder(tmp_path / "other", seed=5)
    moved = tmp_path / "moved"
    shutil.copytree(tiny_model_dir, moved)
    shutil.copy(other / "model.safetensors", moved / "model.safetensors")
    assert main([a if a != str(tiny_model_dir) else str(moved) for a in base]) == 1
    assert "finished run with other inputs" in capsys.readouterr().err


def test_checkpoint_of_another_starting_model_is_refused(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path):
    """Resume is keyed on the starting model's content: same path, other weights → refused with the reason."""
    import shutil

    from tests.conftest import make_torch_gpt2_folder

    model = tmp_path / "m"
    shutil.copytree(tiny_model_dir, model)
    cfg = _cfg(model, tokenizer_dir, redditbias_dir, tmp_path / "run", max_steps=3)
    debias_trainer(cfg).run(stop_after=1)
    other = make_torch_gpt2_folder(tmp_path / "other", seed=9)
    shutil.copy(other / "model.safetensors", model / "model.safetensors")
    with pytest.raises(ValueError, match="different run.*model"):
        debias_trainer(cfg).run()


def test_out_that_is_a_file_is_a_clear_error(tiny_model_dir, tmp_path, capsys):
    from rbjax.cli import main

    f = tmp_path / "afile"
    f.write_text("x")
    assert main(["debias", "--method", "hd", "--bias", "religion1", "--model", str(tiny_model_dir),
                 "--out", str(f)]) == 1
    err = capsys.readouterr().err
    assert "exists and is not a folder" in err and "Errno" not in err


def test_debias_help_has_no_doubled_defaults_and_every_option_is_explained(capsys):
    from rbjax.cli import build_parser

    for cmd in ("debias", "sweep"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([cmd, "--help"])
        text = capsys.readouterr().out
        assert "(default: None)" not in text and text.count("(default:") > 5
        import re

        assert not re.search(r"default[^()]*\)\s*\(default:", " ".join(text.split())), text
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for cmd in ("debias", "sweep"):
        for act in sub.choices[cmd]._actions:
            assert act.help, f"rbjax {cmd} {act.option_strings} has no help"


@pytest.mark.parametrize("method,semantics", [("lmd", "paper"), ("hd", "paper"), ("lmd", "reference"),
                                              ("add", "reference")])
def test_triggers_built_once_equal_per_batch_triggers(tiny_model_dir, tokenizer_dir, redditbias_dir, method,
                                                      semantics, tmp_path):
    """The trigger arrays are built once (per example in paper semantics, per micro-batch of a batch plan in
    reference semantics, where the attribute windows end at the micro-batch's longest sentence); every micro-batch's
    arrays equal the TriggerBuilder run on that very batch, as the old per-batch code did."""
    from rbjax.debias.triggers import TriggerBuilder
    from rbjax.specs import load_spec

    cfg = _cfg(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path / "r", method=method, semantics=semantics,
               batch_size=7, max_steps=None, epochs=1)  # 720 phrases: the last micro-batch is partial
    tr = debias_trainer(cfg)
    assert tr.n_examples % 7
    tb = TriggerBuilder(load_spec("religion1"), tr.tokenizer, semantics=semantics)
    for b in range(tr.n_batches):
        mb = tr.plan.micro_batch(0, b)
        ids, mask = mb["input_ids"], mb["attention_mask"]
        if method == "lmd":
            t = tb.lmd(ids, mask)
            np.testing.assert_array_equal(mb["lmd_mask"], t.mask)
            np.testing.assert_array_equal(mb["norm"], t.norm)
        else:
            o = tb.attributes(ids, mask, max_occurrences=tr.data.n_occ)
            np.testing.assert_array_equal(mb["occ_weights"], o.weights)
            np.testing.assert_array_equal(mb["occ_mask"], o.mask)


def test_whole_run_totals_sum_every_session(tmp_path):
    """Hand-made metric lines: a short first session (killed after update 2 at 1.5 s) and a resumed one whose first
    update already took 4 s (compilation): 3 + 2 + 5 + 7 = 17 tokens over 1.5 + 6.0 s in 2 sessions."""
    from rbjax.debias.run import whole_run_totals

    rows = [{"step": 1, "tokens": 3, "elapsed_s": 0.5, "session": 1.0},
            {"step": 2, "tokens": 2, "elapsed_s": 1.5, "session": 1.0},
            {"step": 3, "tokens": 5, "elapsed_s": 4.0, "session": 2.0},
            {"step": 4, "tokens": 7, "elapsed_s": 6.0, "session": 2.0}]
    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert whole_run_totals(p, 4) == {"tokens": 17, "train_s": 7.5, "sessions": 2, "updates_logged": 4}
    # the session in progress is left out of the seconds (its caller adds its own, longer measure)
    assert whole_run_totals(p, 4, current=2.0)["train_s"] == 1.5
    # lines of older versions (no session tag): a session starts where elapsed_s drops
    p.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "session"}) + "\n"
                         for r in rows[:2] + [{**rows[2], "elapsed_s": 1.0}, rows[3]]))
    assert whole_run_totals(p, 4) == {"tokens": 17, "train_s": 7.5, "sessions": 2, "updates_logged": 4}
    # grid chunks: only point 0 counts; a missing update: no totals (the caller says so)
    p.write_text("".join(json.dumps({**r, "point": i}) + "\n" for r in rows for i in (0, 1)))
    assert whole_run_totals(p, 4)["tokens"] == 17
    p.write_text("".join(json.dumps(r) + "\n" for r in rows if r["step"] != 3))
    assert whole_run_totals(p, 4) is None and whole_run_totals(tmp_path / "none.jsonl", 4) is None


def test_a_signal_during_the_last_checkpoint_write_is_not_lost(tiny_model_dir, tokenizer_dir, redditbias_dir,
                                                               tmp_path, monkeypatch):
    """SIGTERM while the last update's checkpoint is written (after the loop's last look at the flag): training
    is saved and complete, and the run stops there instead of going on to what follows (evaluation)."""
    from rbjax.core.interrupt import Interrupted
    from rbjax.train.checkpoint import Checkpointer

    real = Checkpointer.save

    def save_and_signal(self, step, *a, **kw):
        out = real(self, step, *a, **kw)
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(Checkpointer, "save", save_and_signal)
    cfg = _cfg(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path / "a", max_steps=2, save_every=100)
    with pytest.raises(Interrupted) as ei:
        debias_trainer(cfg).run()
    assert "SIGTERM" in str(ei.value) and "update 2/2" in str(ei.value) and "run the same command again" in str(
        ei.value)
    monkeypatch.setattr(Checkpointer, "save", real)
    res = debias_trainer(cfg).run()
    assert res.resumed_from == 2 and res.finished


def test_sigterm_outside_training_stops_the_command_at_once():
    """The console script turns SIGTERM into an interrupt everywhere, not only in training: exit 130 within
    seconds, a message, no traceback. The stand-in for a long evaluation is a slow step inside the command
    (``enable_compile_cache`` made to wait)."""
    import subprocess
    import sys
    import time

    code = ("import sys, time, rbjax.cli as c\n"
            "def slow(*a):\n    print('ready', flush=True)\n    time.sleep(60)\n"
            "c.enable_compile_cache = slow\n"
            "sys.argv = ['rbjax', 'report', 'nowhere']\n"
            "c.console_main()\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert time.monotonic() - t0 < 10
    assert p.returncode == 130 and "SIGTERM" in err and "Traceback" not in err


def test_a_run_without_evaluation_hashes_no_weights(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path,
                                                    monkeypatch):
    """No export, no LMB, no LMP: nothing is keyed on the trained weights, so none are hashed (a sha256 over every
    weight took ≈ 3 s after each DialoGPT-small run); with the LMB on, they key its reuse and are hashed once."""
    hashed = []
    real = dr.tree_digest
    monkeypatch.setattr(dr, "tree_digest", lambda tree: (hashed.append(1), real(tree))[1])
    res = dr.debias(_cfg(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path / "a", max_steps=1))
    assert res["training"]["updates"] == 1 and hashed == []
    res = dr.debias(_cfg(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path / "b", max_steps=1, evaluate=True,
                         eval_bias="religion1"))
    assert hashed == [1] and res["lmb_valid"]["all"][0]["bias_type"] == "religion1"
