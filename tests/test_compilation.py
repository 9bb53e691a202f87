"""Compiled programs: every program of a run is compiled before its first update (none inside the loop), and the
persistent compilation cache makes a second run of the same shapes compile nothing, a corrupt entry being ignored
(:mod:`rbjax.core.compilation`, :meth:`rbjax.train.loop.Trainer.compile`)."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rbjax.core.compilation import CompileCounter, compile_cache_dir
from rbjax.debias.run import debias_trainer
from rbjax.train.batching import BatchPlan
from tests.conftest import religion1_train_file, small_train_config

ROOT = Path(__file__).resolve().parents[1]


def _counting_builds(fn, built: list):
    """``fn``, appending to ``built`` the number of XLA programs each call builds (compiled or read from a cache)."""
    def counted(*a, **kw):
        with CompileCounter() as c:
            out = fn(*a, **kw)
        built.append(c.built)
        return out
    return counted


def test_no_update_compiles_anything(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path):
    """A packed run of several shapes: the programs are built before update 1, and from the first update to the
    last no program is built (counted with jax's monitoring events)."""
    cfg = small_train_config(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path / "r", method="lm",
                             layout="packed", max_steps=5, batch_size=4,
                             train_file=religion1_train_file(redditbias_dir, tmp_path, 40))
    tr = debias_trainer(cfg)
    tr = debias_trainer(cfg, data=tr.data, plan=BatchPlan.of_run(tr.data, cfg.trainer_config, max_shapes=3))
    shapes = {tr.plan.update_shape(u) for u in range(tr.t_total)}
    assert len(shapes) > 1
    built = []
    with CompileCounter() as counter:
        res = tr.run(checkpoints=False, callback=lambda ev: built.append(counter.built))
    assert len(set(built)) == 1 and built[0] >= len(shapes)  # all before the first update, none after
    rec = res.summary["compile"]
    assert rec["programs"] == len(shapes) and rec["seconds"] >= 0


def test_evaluation_programs_are_compiled_before_the_first_update(tiny_model_dir, tokenizer_dir, redditbias_dir,
                                                                   tmp_path, monkeypatch):
    """A debias run with its evaluation (LMB valid of two types, LMP): the evaluation's scoring programs are built
    with the training programs, before update 1, so the evaluation builds none; without them (the control) it
    builds some, so the check is not empty. The results are the same either way."""
    import jax

    import rbjax.debias.run as run_mod

    lines = tmp_path / "lmp.txt"
    lines.write_text("".join(f"line {i} of the reference set, with a few words more\n" for i in range(20)))
    built = []
    monkeypatch.setattr(run_mod, "evaluate_run", _counting_builds(run_mod.evaluate_run, built))
    results = {}
    for name, ahead in (("ahead", True), ("control", False)):
        if not ahead:
            monkeypatch.setattr(run_mod, "evaluation_programs", lambda cfg, trainer: [])
        jax.clear_caches()  # nothing compiled by an earlier test or run
        cfg = small_train_config(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path / name, method="lm",
                                 max_steps=2, evaluate=True, eval_bias="religion1,race", lmp=True,
                                 lmp_file=str(lines), lmp_max_lines=20, eval_batch_size=8)
        res = run_mod.debias(cfg)
        results[name] = (res, built[-1])
    (ahead, ev_ahead), (control, ev_control) = results["ahead"], results["control"]
    assert ahead["training"]["compile"]["after_training"] >= 2  # LMB and LMP programs, compiled before update 1
    assert ev_ahead == 0 and ev_control > 0
    assert control["training"]["compile"]["after_training"] == 0
    a = {r["bias_type"]: r["t_value"] for r in ahead["lmb_valid"]["all"]}
    assert set(a) == {"religion1", "race"}
    assert a == {r["bias_type"]: r["t_value"] for r in control["lmb_valid"]["all"]}
    assert ahead["lmp"]["perplexity"] == control["lmp"]["perplexity"]


@pytest.mark.parametrize("adapter", ["none", "lora"])
def test_sweep_chunk_evaluation_compiled_before_its_first_update(adapter, tiny_model_dir, tokenizer_dir,
                                                                 redditbias_dir, tmp_path, monkeypatch):
    """A sweep chunk of two grid points with dev LMB and LMP: the scoring programs (every point at once, or one by
    one on the frozen base with adapters) are compiled with the chunk's training programs, and the chunk's
    evaluation builds none (the start model's evaluation, before the chunk, is the control)."""
    import jax

    from rbjax.debias import sweep as sw
    from rbjax.debias.config import DebiasRun

    lines = tmp_path / "lmp.txt"
    lines.write_text("".join(f"line {i} of the reference set, with a few words more\n" for i in range(20)))
    base = DebiasRun.from_flat(dict(
        method="lmd", bias_type="religion1", model=str(tiny_model_dir), tokenizer=str(tokenizer_dir),
        data_dir=str(redditbias_dir), out_dir=str(tmp_path / "unused"), max_steps=1, progress=False,
        train_file=religion1_train_file(redditbias_dir, tmp_path, 16), layout="padded", eval_batch_size=8,
        lmp=True, lmp_file=str(lines), lmp_max_lines=20, adapter=adapter,
        **({"lora_rank": 2} if adapter == "lora" else {})))
    ahead, built = [], []
    real_jobs = sw._evaluation_programs

    def jobs(*a, **kw):
        return [lambda final: ahead.append(job(final)) or ahead[-1] for job in real_jobs(*a, **kw)]

    monkeypatch.setattr(sw, "_evaluation_programs", jobs)
    monkeypatch.setattr(sw, "_evaluate", _counting_builds(sw._evaluate, built))
    jax.clear_caches()
    grid = {"batch_size": (4,), "grad_accum": (1,), "lambda_lm": (0.001,), "lambda_d": (10.0, 100.0)}
    sel = sw.run_sweep(base, tmp_path / "sw", grid=grid, grid_chunk=2, n_bootstrap=0, dev_max_pairs=6,
                       progress=False)
    assert sel["n_runs"] == 2
    assert len(ahead) == 1 and ahead[0] >= 2  # dev LMB and LMP programs, before the chunk's first update
    # the start model's evaluation (the baseline, before any chunk) compiles its own programs: the counter works;
    # the chunk's (every point stacked, or point by point on the frozen base) builds none
    assert built[0] > 0 and built[1:] == ([0] if adapter == "none" else [0, 0])


def test_dst_evaluation_compiled_before_the_first_update(tiny_model_dir, shared_dir, tmp_path, monkeypatch):
    """``rbjax evaluate --task dst`` with the joint goal: the classifier's programs for the test pairs and for every
    joint-goal batch width are compiled with the fine-tuning programs, so scoring the test pairs and the dialogue
    builds none."""
    import jax

    from rbjax.dialog import state_tracking
    from rbjax.dialog.evaluate import evaluate

    built = []
    monkeypatch.setattr(state_tracking, "predict_proba", _counting_builds(state_tracking.predict_proba, built))
    jax.clear_caches()
    res = evaluate("dst", tiny_model_dir, tmp_path / "o", multiwoz=shared_dir / "dialog-data" / "multiwoz",
                   max_examples=24, max_steps=2, batch_size=4, grad_accum=1, joint_goal=True, jga_max_dialogues=1,
                   progress=False)
    assert res["metrics"]["joint_goal"]["n_turns"] == 4
    assert res["training"]["compile"]["after_training"] >= 2
    assert len(built) == 5 and set(built) == {0}  # the test pairs, then the dialogue's 4 turns


_SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import jax
    from rbjax.cli import main
    from rbjax.core.compilation import CompileCounter
    from rbjax.train.step import clear_programs
    model, tok, data, train, cache, out = sys.argv[1:7]
    def run(name):
        argv = ["--compile-cache", cache, "debias", "--method", "lm", "--bias", "religion1", "--model", model,
                "--tokenizer", tok, "--data-dir", data, "--train-file", train, "--out", str(Path(out) / name),
                "--batch-size", "4", "--max-steps", "2", "--no-export", "--no-lmp", "--no-progress"]
        jax.clear_caches(); clear_programs()  # as a new process: only the persistent cache remains
        with CompileCounter() as c:
            assert main(argv) == 0
        return {"built": c.built, "hits": c.cache_hits, "compiled": c.compiled}
    first = run("a")
    second = run("b")
    for f in Path(cache).rglob("*"):  # every entry damaged: ignored, compiled again, never fatal
        if f.is_file():
            f.write_bytes(b"not an executable")
    third = run("c")
    print(json.dumps({"first": first, "second": second, "third": third}))
""")


def test_second_run_compiles_nothing_and_a_corrupt_cache_is_ignored(tiny_model_dir, tokenizer_dir, redditbias_dir,
                                                                   tmp_path):
    """Three runs of the same command in one fresh process (jax's in-memory caches dropped between them): the
    first compiles, the second reads every program from the cache folder and compiles none, the third finds every
    entry corrupt and compiles again without failing."""
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", "RBJAX_COMPILE_CACHE")}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(tiny_model_dir), str(tokenizer_dir), str(redditbias_dir),
                           religion1_train_file(redditbias_dir, tmp_path, 12), str(cache), str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=ROOT, env={**env, "JAX_PLATFORMS": "cpu"}, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["first"]["compiled"] > 0
    assert r["second"]["built"] == r["first"]["built"] and r["second"]["compiled"] == 0
    assert r["third"]["compiled"] > 0
    assert "compiled" in proc.stderr  # the command's report line (XLA: N program(s), M of them read ...)


def test_compile_cache_folder_choice(tmp_path, monkeypatch):
    """--compile-cache beats $RBJAX_COMPILE_CACHE beats jax's $JAX_COMPILATION_CACHE_DIR beats the cache folder;
    'off' disables."""
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.delenv("RBJAX_COMPILE_CACHE", raising=False)
    monkeypatch.setenv("RBJAX_CACHE_DIR", str(tmp_path / "c"))
    assert compile_cache_dir() == tmp_path / "c" / "compile-cache"
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "j"))
    assert compile_cache_dir() == tmp_path / "j"
    monkeypatch.setenv("RBJAX_COMPILE_CACHE", str(tmp_path / "r"))
    assert compile_cache_dir() == tmp_path / "r"
    assert compile_cache_dir(str(tmp_path / "x")) == tmp_path / "x"
    assert compile_cache_dir("off") is None
    monkeypatch.setenv("RBJAX_COMPILE_CACHE", "off")
    assert compile_cache_dir() is None
