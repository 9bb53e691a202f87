"""The sweep as vmapped programs: compile count of the 54-point grid, resume without redoing points, inputs changed
→ refused, a study over several methods in one command, and the Ray executor surviving a killed worker."""
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from rbjax.debias.config import DebiasRun
from tests.conftest import religion1_train_file

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")


def _base(model_dir, tokenizer_dir, redditbias_dir, tmp_path, **kw):
    # the padded token layout: one compiled program per batch plan (packed sweeps: tests/mesh_checks.py, the CLI)
    d = dict(method="lmd", bias_type="religion1", model=str(model_dir), tokenizer=str(tokenizer_dir),
             data_dir=str(redditbias_dir), out_dir=str(tmp_path / "unused"), train_file=religion1_train_file(
                 redditbias_dir, tmp_path, 16), epochs=1, lmp=False, progress=False, eval_batch_size=32,
             layout="padded")
    d.update(kw)
    return DebiasRun.from_flat(d)


def _jsonl(path):
    return [json.loads(ln) for ln in Path(path).read_text().splitlines()]


def test_full_grid_compiles_one_program_per_batch_plan(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path):
    """A 54-point grid with the paper's shape (3 batch sizes × accumulation {1, 5, 8} × the paper's 6 λ
    combinations; batch sizes 1, 2, 4 instead of 4, 8, 16 to keep the tiny run short), 1 update per point: at most 9
    training programs (one per batch plan), 9 chunks of 6 points, every point recorded and selected from; a rerun
    redoes nothing."""
    from rbjax.train.step import compiled_programs
    from rbjax.debias.sweep import PAPER_GRID, run_sweep

    base = _base(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path, max_steps=1,
                 train_file=religion1_train_file(redditbias_dir, tmp_path, 32))
    grid = {**PAPER_GRID, "batch_size": (1, 2, 4)}
    before = compiled_programs()
    sel = run_sweep(base, tmp_path / "sw", grid=grid, grid_chunk=6, n_bootstrap=0, dev_max_pairs=6, progress=False)
    assert compiled_programs() - before <= 9
    recs = _jsonl(tmp_path / "sw" / "sweep.jsonl")
    assert len(recs) == 54 and len({r["id"] for r in recs}) == 54 and sel["n_runs"] == 54
    assert len({r["chunk"] for r in recs}) == 9
    assert len(list((tmp_path / "sw" / "chunks").iterdir())) == 9
    run_sweep(base, tmp_path / "sw", grid=grid, grid_chunk=6, n_bootstrap=0, dev_max_pairs=6, progress=False)
    assert len(_jsonl(tmp_path / "sw" / "sweep.jsonl")) == 54  # nothing redone


def test_sweep_resumes_points_and_refuses_other_inputs(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path):
    import shutil

    from rbjax.debias.sweep import run_sweep
    from tests.conftest import make_torch_gpt2_folder

    model = tmp_path / "m"
    shutil.copytree(tiny_model_dir, model)
    base = _base(model, tokenizer_dir, redditbias_dir, tmp_path, max_steps=2)
    grid = {"batch_size": (4,), "grad_accum": (1, 2), "lambda_lm": (0.001,), "lambda_d": (10.0, 100.0)}
    run_sweep(base, tmp_path / "sw", grid=grid, max_points=2, grid_chunk=2, n_bootstrap=0, dev_max_pairs=6,
              progress=False)
    first = _jsonl(tmp_path / "sw" / "sweep.jsonl")
    sel = run_sweep(base, tmp_path / "sw", grid=grid, grid_chunk=2, n_bootstrap=0, dev_max_pairs=6,
                    progress=False)
    recs = _jsonl(tmp_path / "sw" / "sweep.jsonl")
    assert len(recs) == 4 and recs[:2] == first and sel["n_runs"] == 4  # the first two were not trained again
    assert all(r["key"] for r in recs) and len({r["key"] for r in recs}) == 4
    other = make_torch_gpt2_folder(tmp_path / "other", seed=3)
    shutil.copy(other / "model.safetensors", model / "model.safetensors")
    with pytest.raises(ValueError, match="sweep of other inputs.*model"):
        run_sweep(base, tmp_path / "sw", grid=grid, grid_chunk=2, n_bootstrap=0, dev_max_pairs=6, progress=False)


def test_cli_study_over_methods_and_selection(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path, capsys):
    from rbjax.cli import main

    out = tmp_path / "study"
    argv = ["sweep", "--method", "lmd,cda", "--bias", "religion1", "--model", str(tiny_model_dir), "--tokenizer",
            str(tokenizer_dir), "--data-dir", str(redditbias_dir), "--out", str(out), "--train-file",
            religion1_train_file(redditbias_dir, tmp_path, 12), "--max-steps", "1", "--batch-sizes", "4",
            "--grad-accums", "1", "--lambda-lms", "0.01", "--lambda-ds", "10,100", "--n-bootstrap", "0",
            "--dev-max-pairs", "6", "--lmp-file", str(Path(redditbias_dir) / "text_files/humanref6k.txt"),
            "--lmp-max-lines", "8", "--no-progress"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "lmd on religion1" in text and "cda on religion1" in text
    for m, n in (("lmd", 2), ("cda", 1)):
        sel = json.loads((out / "religion1" / m / "selection.json").read_text())
        assert sel["n_runs"] == n and sel["baseline"]["lmp"]["perplexity"] > 1
        assert sel["default"]["lmp"] is not None and sel["reference"]["id"]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")  # ray.init: fork+exec
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the same warning, raised at fork
def test_ray_executor_survives_a_killed_worker(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path):
    """A 4-point grid as 2 chunks on a local Ray cluster with 2 workers; one worker is SIGKILLed mid-chunk: Ray
    retries the task, which resumes from the chunk's checkpoint; a rerun redoes nothing."""
    ray = pytest.importorskip("ray")
    from rbjax.debias.sweep import run_sweep

    base = _base(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path, max_steps=40, save_every=1,
                 save_every_s=0.0, train_file=religion1_train_file(redditbias_dir, tmp_path, 24))
    grid = {"batch_size": (4,), "grad_accum": (1, 2), "lambda_lm": (0.01,), "lambda_d": (10.0, 100.0)}
    out = tmp_path / "sw"
    killed = []

    def killer():
        deadline = time.time() + 240
        while time.time() < deadline and not killed:
            for run in out.glob("chunks/*/running.json"):
                ck = run.parent / "checkpoints"
                if ck.is_dir() and any(p.name.isdigit() and int(p.name) >= 2 for p in ck.iterdir()):
                    pid = json.loads(run.read_text())["pid"]
                    os.kill(pid, signal.SIGKILL)
                    killed.append(run.parent.name)
                    return
            time.sleep(0.2)

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"JAX_PLATFORMS": "cpu"}})
    try:
        t = threading.Thread(target=killer, daemon=True)
        t.start()
        sel = run_sweep(base, out, grid=grid, grid_chunk=2, n_bootstrap=0, dev_max_pairs=6, progress=False,
                        executor="ray")
        t.join(timeout=1)
        assert killed, "no chunk was killed (it finished before its second checkpoint?)"
        recs = _jsonl(out / "sweep.jsonl")
        assert sel["n_runs"] == 4 and len(recs) == 4
        assert any(r["chunk"] == killed[0] and r["resumed_from"] for r in recs)
        run_sweep(base, out, grid=grid, grid_chunk=2, n_bootstrap=0, dev_max_pairs=6, progress=False,
                  executor="ray")
        assert len(_jsonl(out / "sweep.jsonl")) == 4
    finally:
        ray.shutdown()


def test_dev_lmb_of_stacked_models_equals_each_alone(tiny_model_dir, tokenizer_dir, redditbias_dir):
    """The sweep scores a chunk's points in one vmapped pass: equal to scoring each model on its own."""
    import jax
    import numpy as np

    from rbjax.debias.sweep import dev_lmb
    from rbjax.dialog.reddit_perplexity import read_reference_lines, reddit_perplexity
    from rbjax.model.hf import load_pretrained
    from rbjax.model.tokenizer import load_tokenizer

    config, p0 = load_pretrained(tiny_model_dir)
    tok = load_tokenizer(tokenizer_dir)
    p1 = jax.tree.map(lambda x: x * 1.3, p0)
    stacked = jax.tree.map(lambda *x: np.stack(x), p0, p1)
    kw = dict(n_bootstrap=0, max_pairs=10, batch_size=16)
    both = dev_lmb(stacked, config, tok, "religion1", str(redditbias_dir), stacked=True, **kw)
    for params, got in zip((p0, p1), both):
        alone = dev_lmb(params, config, tok, "religion1", str(redditbias_dir), **kw)
        assert got["n_pairs"] == alone["n_pairs"] == 10
        np.testing.assert_allclose(got["t_value"], alone["t_value"], rtol=1e-4)
        np.testing.assert_allclose(got["reference"]["t_value"], alone["reference"]["t_value"], rtol=1e-4)
    lines = read_reference_lines(Path(redditbias_dir) / "text_files/humanref6k.txt", 12)
    lmps = reddit_perplexity(stacked, config, tok, lines, batch_size=8, stacked=True)
    for params, got in zip((p0, p1), lmps):
        alone = reddit_perplexity(params, config, tok, lines, batch_size=8)
        np.testing.assert_allclose(got["perplexity"], alone["perplexity"], rtol=1e-5)
    assert both[0]["t_value"] != both[1]["t_value"]


def test_context_cache_holds_one_sweep_and_reloads_on_change(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path):
    """The chunks of a sweep share one loaded start model (:class:`ContextCache`, owned by the caller); another
    sweep's settings or new weights at the same path load afresh, and only one context is held."""
    import shutil

    import numpy as np

    from rbjax.debias.sweep import ContextCache
    from tests.conftest import make_torch_gpt2_folder

    model = tmp_path / "m"
    shutil.copytree(tiny_model_dir, model)
    cache = ContextCache()
    base = _base(model, tokenizer_dir, redditbias_dir, tmp_path)
    first = cache.get(base)
    assert cache.get(base) is first  # the same sweep: not loaded again
    other = cache.get(base.replace(method="cda"))
    assert other is not first and other.key != first.key and cache.get(base) is not first  # one held at a time
    shutil.copy(make_torch_gpt2_folder(tmp_path / "other", seed=3) / "model.safetensors", model / "model.safetensors")
    new = cache.get(base)
    assert new.key != first.key  # new weights at the same path are another model
    import jax

    pairs = list(zip(jax.tree.leaves(first.params), jax.tree.leaves(new.params)))
    assert all(a.shape == b.shape for a, b in pairs) and not all(np.array_equal(a, b) for a, b in pairs)


def test_a_chunk_with_its_records_is_not_trained_again(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path,
                                                        monkeypatch):
    """A chunk's records file is a keyed result (the points' keys): the same task returns it without training;
    a task of other points (another key) trains."""
    from rbjax.debias import sweep
    from rbjax.debias.sweep import ContextCache, GridPoint, run_chunk

    base = _base(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path, max_steps=1)
    pt = GridPoint(batch_size=4, grad_accum=1, lambda_lm=0.01, lambda_d=10.0)
    task = {"base": base.to_dict(), "plan": [4, 1], "points": [pt.as_dict()], "chunk_id": "c", "out": str(tmp_path),
            "key": {"sweep": "k"}, "n_bootstrap": 0, "dev_max_pairs": 4, "keep_checkpoints": False, "n_devices": 1}
    cache = ContextCache()
    first = run_chunk(task, contexts=cache)
    trained = []
    real = sweep.debias_trainer
    monkeypatch.setattr(sweep, "debias_trainer", lambda *a, **k: (trained.append(1), real(*a, **k))[1])
    assert run_chunk(task, contexts=cache) == first and trained == []  # reused, nothing trained
    other = run_chunk({**task, "key": {"sweep": "other"}}, contexts=cache)
    assert trained == [1] and other[0]["key"] != first[0]["key"]
