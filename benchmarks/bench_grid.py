"""Grid benchmark: grid points trained as one vmapped program vs one point at a time, and the compile
count and compile time of the paper's 54-point grid.

Runs on whatever ``jax.devices()`` gives (one CPU, a GPU, several devices, a TPU host): the same figures everywhere,
plus tokens/s per device.

1. **Grid throughput** (point-updates/s) at two shapes, LMD loss (paper semantics) on real RedditBias religion1
   training phrases with their triggers, dropout on, accumulation 1:

   * ``small``: a GPT-2 of width 64, 2 layers, GPT-2 vocabulary (50257), batch 8;
   * ``dialogpt``: the DialoGPT-small shape (``GPT2Config()``: 12 layers, width 768, 124M parameters), batch 8, with
     a chunk that fits (default: 2 points on a CPU, 6 — the paper's λ combinations of one batch plan — on an
     accelerator).

   Random weights (``rbjax.model.gpt2.init_params``), the GPT-2 tokenizer of ``../shared/tokenizers/gpt2``. Both ways
   use the trainer users run (:func:`rbjax.debias.run.debias_trainer`, no checkpoints): *vmapped* trains the chunk's
   points as one program over a stacked state; *one at a time* trains each point alone with the unvmapped step
   (the same batch plan, so the same data). Each run does ``--updates`` updates; the first (compile, warm-up) is
   dropped and the median of the others is the update time. Vmapped and one-at-a-time runs alternate
   ``--repeats`` times (load changes on a shared machine hit both alike); medians over repeats are reported, with
   every repeat listed. Throughput = points / (time for one update of every point). tokens/s counts the real
   (unpadded) tokens of every point's update, divided by the number of devices.

2. **Compile count and time of the 54-point grid** (a small GPT-2, width 32, 2 layers): ``run_sweep`` over the paper's
   grid (batch {4, 8, 16} × accumulation {1, 5, 8} × λ_LM {0.001, 0.01} × λ_D {10, 50, 100}), 1 update per point,
   dev LMB on 8 pairs, no LMP. Training programs compiled (``compiled_programs()``), the XLA compile time of those
   programs (JAX's compile log), and the wall time of the whole sweep.

3. **N models scored at once** (``--skip-scoring`` to omit): the dev LMB of a chunk, i.e. the religion1 valid pairs
   (both sides) scored by N models with different weights, as one vmapped pass over their stacked parameters
   (``PerplexityScorer(stacked=True)``, what the sweep does after a chunk) against N scorers one after another; at
   the small shape (``--small-points`` models) and the DialoGPT-small shape (the DialoGPT chunk). Rounds alternate,
   medians reported; the first call of each (compile) is timed separately.

Usage::

    python benchmarks/bench_grid.py [--updates 3] [--repeats 2] [--chunk N] [--skip-dialogpt] [--skip-sweep]
                                    [--skip-training] [--skip-scoring] [--scoring-repeats 3]
                                    [--json-out FILE]

The last line printed is a JSON object with every figure and the machine's description. The vmapped / one-at-a-time
speedups are under ``"ratios"`` (``<measurement>_vmapped_speedup``), or under ``"void_ratios"`` (printed VOID) when the
machine had foreign CPU load during that measurement (``"load"``: each measurement is a section of the load monitor,
``benchmarks/_common.py``).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks._common import LoadMonitor  # noqa: E402

SHARED = Path(os.environ.get("RBJAX_SHARED", ROOT.parent / "shared"))

#: the paper's 6 (λ_LM, λ_D) combinations of one batch plan
LAMBDAS = [(lm, d) for lm in (0.001, 0.01) for d in (10.0, 50.0, 100.0)]


def machine() -> dict:
    import jax

    d = jax.devices()
    info = {"platform": platform.platform(), "processor": platform.processor() or None, "cpus": os.cpu_count(),
            "python": platform.python_version(), "jax": jax.__version__, "backend": d[0].platform,
            "devices": len(d), "device_kind": d[0].device_kind}
    try:
        info["load_average"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            info["mem_total_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    return info


def _base_cfg(out: Path, batch_size: int, updates: int, **kw):
    from rbjax.debias.config import DebiasRun

    return DebiasRun.from_flat(method="lmd", bias_type="religion1", model="(random weights)",
                       tokenizer=str(SHARED / "tokenizers" / "gpt2"), data_dir=str(SHARED / "redditbias"),
                       out_dir=str(out), batch_size=batch_size, grad_accum=1, max_steps=updates, export=False,
                       evaluate=False, lmp=False, progress=False, **kw)


def _timed_run(trainer) -> tuple[list[float], int]:
    """Train; the wall time of each update (from one update's end to the next's) and the tokens of one update."""
    marks = [time.perf_counter()]
    trainer.run(checkpoints=False, callback=lambda ev: marks.append(time.perf_counter())
                if ev["kind"] == "update" else None)
    return [b - a for a, b in zip(marks, marks[1:])], trainer.plan.tokens(0)


def grid_throughput(name: str, config, n_points: int, batch_size: int, updates: int, repeats: int) -> dict:
    """Vmapped chunk vs one point at a time (see the module docstring)."""
    import jax

    from rbjax.debias.data import TrainingData
    from rbjax.train.batching import BatchPlan
    from rbjax.debias.run import debias_trainer, lambda_point
    from rbjax.model.gpt2 import init_params
    from rbjax.model.handle import ModelHandle
    from rbjax.model.tokenizer import load_tokenizer

    tmp = Path(tempfile.mkdtemp(prefix="bench_grid_"))
    cfg = _base_cfg(tmp, batch_size, updates)
    tok = load_tokenizer(cfg.tokenizer)
    params = init_params(config, 0)
    data = TrainingData(cfg, tok, config.vocab_size)
    plan = BatchPlan.of_run(data, cfg.trainer_config)
    pts = [lambda_point(lm, d, cfg.optimizer.learning_rate) for lm, d in (LAMBDAS * 4)[:n_points]]
    model = ModelHandle.from_params(params, config, tok, name=f"bench-{name}", digest=f"bench-{name}")
    common = dict(model=model, data=data, plan=plan)
    grid = debias_trainer(cfg, points=pts, **common)
    singles = [debias_trainer(cfg, points=p, **common) for p in pts]
    n_dev = len(jax.devices())
    rounds = {"vmapped": [], "one_at_a_time": []}
    first = {"vmapped": [], "one_at_a_time": []}
    tokens = None
    for r in range(repeats):
        ts, tokens = _timed_run(grid)
        first["vmapped"].append(ts[0])
        rounds["vmapped"].append(statistics.median(ts[1:]))
        per_point = [_timed_run(t)[0] for t in singles]
        first["one_at_a_time"].append(sum(ts[0] for ts in per_point))
        rounds["one_at_a_time"].append(sum(statistics.median(ts[1:]) for ts in per_point))
        print(f"  {name} repeat {r + 1}/{repeats}: one update of all {n_points} points: vmapped "
              f"{rounds['vmapped'][-1]:.3f} s, one at a time {rounds['one_at_a_time'][-1]:.3f} s", flush=True)
    out = {"shape": name, "n_layer": config.n_layer, "n_embd": config.n_embd, "vocab_size": config.vocab_size,
           "n_params": int(sum(x.size for x in jax.tree.leaves(params))), "points": n_points,
           "batch_size": batch_size, "tokens_per_point_update": tokens, "updates_per_run": updates,
           "repeats": repeats, "devices": n_dev, "mesh": dict(grid.mesh.shape)}
    for k, v in rounds.items():
        t = statistics.median(v)
        out[k] = {"update_all_points_s": t, "point_updates_per_s": n_points / t,
                  "tokens_per_s_per_device": tokens * n_points / t / n_dev,
                  "rounds_s": [round(x, 4) for x in v],
                  "first_update_s": [round(x, 3) for x in first[k]]}
    out["vmapped_speedup"] = out["vmapped"]["point_updates_per_s"] / out["one_at_a_time"]["point_updates_per_s"]
    return out


class _CompileLog(logging.Handler):
    """Collects JAX's 'Finished XLA compilation of <fn> in <s> sec' log lines (jax_log_compiles)."""

    PAT = re.compile(r"Finished XLA compilation of (\S+) in ([0-9.eE+-]+) sec")

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.items: list[tuple[str, float]] = []

    def emit(self, record):
        m = self.PAT.search(record.getMessage())
        if m:
            self.items.append((m.group(1), float(m.group(2))))


def sweep_compiles() -> dict:
    """The paper's 54-point grid on a small GPT-2: programs compiled, their compile time, the sweep's wall time."""
    import jax

    from rbjax.train.step import compiled_programs
    from rbjax.debias.sweep import PAPER_GRID, batch_plans, grid_points, run_sweep
    from rbjax.model.gpt2 import GPT2Config, init_params
    from rbjax.model.hf import save_pretrained

    tmp = Path(tempfile.mkdtemp(prefix="bench_grid_sweep_"))
    config = GPT2Config(n_embd=32, n_layer=2, n_head=2, n_positions=128)
    model = save_pretrained(init_params(config, 0), config, tmp / "model",
                            tokenizer_dir=SHARED / "tokenizers" / "gpt2")
    base = _base_cfg(tmp / "unused", 4, 1).replace(model=str(model), tokenizer=str(model), eval_batch_size=32)
    n_plans = len(batch_plans(grid_points("lmd", PAPER_GRID)))
    log = _CompileLog()
    lg = logging.getLogger("jax")
    old = (lg.level, lg.propagate)
    lg.addHandler(log)
    lg.setLevel(logging.WARNING)  # jax_log_compiles logs "Finished XLA compilation ..." at WARNING
    lg.propagate = False  # collected here, not printed
    jax.config.update("jax_log_compiles", True)
    try:
        before = compiled_programs()
        t0 = time.perf_counter()
        sel = run_sweep(base, tmp / "sweep", grid=PAPER_GRID, n_bootstrap=0, dev_max_pairs=8, progress=False)
        wall = time.perf_counter() - t0
        programs = compiled_programs() - before
    finally:
        jax.config.update("jax_log_compiles", False)
        lg.removeHandler(log)
        lg.setLevel(old[0])
        lg.propagate = old[1]
    train = [s for f, s in log.items if "_grid_step" in f or "train_step" in f]
    return {"points": sel["n_runs"], "batch_plans": n_plans, "training_programs": programs,
            "training_compile_s": sum(train), "training_compile_s_each": [round(s, 2) for s in train],
            "all_compiles": len(log.items), "all_compile_s": sum(s for _, s in log.items), "sweep_wall_s": wall,
            "model": {"n_embd": 32, "n_layer": 2, "vocab_size": config.vocab_size}, "updates_per_point": 1,
            "dev_pairs": 8}


def scoring_throughput(name: str, config, n_models: int, repeats: int) -> dict:
    """Dev LMB of ``n_models`` models: one stacked (vmapped) pass vs one scorer per model (module docstring, 3)."""
    import jax
    import numpy as np

    from rbjax.data.redditbias import load_pairs
    from rbjax.lmb.perplexity import PerplexityScorer
    from rbjax.model.gpt2 import init_params
    from rbjax.model.tokenizer import load_tokenizer

    tok = load_tokenizer(SHARED / "tokenizers" / "gpt2")
    pairs = load_pairs("religion1", "valid", SHARED / "redditbias")
    A, C = tok.encode_batch(pairs.biased), tok.encode_batch(pairs.counterfactual)
    models = [init_params(config, seed) for seed in range(n_models)]
    stacked = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *models)
    many = PerplexityScorer(stacked, config, stacked=True)
    singles = [PerplexityScorer(m, config) for m in models]

    def run_stacked():
        a, c = many.score_pairs(A, C)
        return np.stack([np.concatenate([x.mean_nll, y.mean_nll]) for x, y in zip(a, c)])

    def run_singles():
        return np.stack([np.concatenate([r[0].mean_nll, r[1].mean_nll]) for r in (s.score_pairs(A, C)
                                                                                for s in singles)])

    first, rounds, outs = {}, {"vmapped": [], "one_at_a_time": []}, {}
    for k, fn in (("vmapped", run_stacked), ("one_at_a_time", run_singles)):
        t0 = time.perf_counter()
        outs[k] = fn()
        first[k] = time.perf_counter() - t0
    for _ in range(repeats):
        for k, fn in (("vmapped", run_stacked), ("one_at_a_time", run_singles)):
            t0 = time.perf_counter()
            fn()
            rounds[k].append(time.perf_counter() - t0)
    ok = np.isfinite(outs["one_at_a_time"])
    diff = float(np.max(np.abs(outs["vmapped"][ok] - outs["one_at_a_time"][ok]) / np.abs(outs["one_at_a_time"][ok])))
    n_phr = 2 * len(A)
    out = {"shape": name, "models": n_models, "pairs": len(A), "phrases_per_model": n_phr, "repeats": repeats,
           "max_rel_diff_mean_nll": diff}
    for k in rounds:
        t = statistics.median(rounds[k])
        out[k] = {"s": t, "model_phrases_per_s": n_models * n_phr / t, "rounds_s": [round(x, 3) for x in rounds[k]],
                  "first_call_s": round(first[k], 2)}
    out["vmapped_speedup"] = out["vmapped"]["model_phrases_per_s"] / out["one_at_a_time"]["model_phrases_per_s"]
    print(f"  scoring {name}: {n_models} models × {n_phr} phrases: vmapped {out['vmapped']['s']:.2f} s, one after "
          f"another {out['one_at_a_time']['s']:.2f} s", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--updates", type=int, default=3, help="updates per run (the first is dropped)")
    ap.add_argument("--repeats", type=int, default=2, help="interleaved repeats of vmapped / one at a time")
    ap.add_argument("--chunk", type=int, help="points of the DialoGPT-small chunk (default: 2 on CPU, 6 otherwise)")
    ap.add_argument("--small-points", type=int, default=6, help="points of the small-shape chunk")
    ap.add_argument("--skip-dialogpt", action="store_true", help="no DialoGPT-small-shape measurement")
    ap.add_argument("--skip-sweep", action="store_true", help="no 54-point compile measurement")
    ap.add_argument("--skip-training", action="store_true", help="no grid-throughput (training) measurement")
    ap.add_argument("--skip-scoring", action="store_true", help="no N-models scoring measurement")
    ap.add_argument("--scoring-repeats", type=int, default=3, help="alternating rounds of the scoring measurement")
    ap.add_argument("--json-out", help="also write the JSON summary to this file")
    args = ap.parse_args()
    if args.updates < 2:
        ap.error("--updates must be >= 2 (the first update is dropped)")
    import warnings

    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    import jax

    from rbjax.model.gpt2 import GPT2Config

    info = machine()
    print(f"machine: {json.dumps(info)}", flush=True)
    res: dict = {"machine": info}
    mon = LoadMonitor()
    small = GPT2Config(n_embd=64, n_layer=2, n_head=2, n_positions=128)
    chunk = args.chunk or (2 if jax.devices()[0].platform == "cpu" else 6)  # points / models at DialoGPT-small
    if not args.skip_training:
        with mon.section("small"):
            res["small"] = grid_throughput("small", small, args.small_points, 8, args.updates, args.repeats)
    if not args.skip_dialogpt and not args.skip_training:
        with mon.section("dialogpt"):
            res["dialogpt"] = grid_throughput("dialogpt", GPT2Config(), chunk, 8, args.updates, args.repeats)
    if not args.skip_scoring:
        with mon.section("scoring_small"):
            res["scoring_small"] = scoring_throughput("small", small, args.small_points, args.scoring_repeats)
        if not args.skip_dialogpt:
            with mon.section("scoring_dialogpt"):
                res["scoring_dialogpt"] = scoring_throughput("dialogpt", GPT2Config(), chunk, args.scoring_repeats)
    if not args.skip_sweep:
        print("  54-point grid (small GPT-2), 1 update per point ...", flush=True)
        with mon.section("sweep54"):
            res["sweep54"] = sweep_compiles()
    ratios, depends = {}, {}
    for k in ("small", "dialogpt", "scoring_small", "scoring_dialogpt"):
        if k in res:  # each speedup out of its measurement's figures, into the ratios (void or not)
            ratios[f"{k}_vmapped_speedup"], depends[f"{k}_vmapped_speedup"] = res[k].pop("vmapped_speedup"), [k]
    res["load_average_after"] = machine().get("load_average")
    print()
    for k in ("small", "dialogpt"):
        if k in res:
            r = res[k]
            print(f"{k:9s} {r['points']} points, batch {r['batch_size']}: point-updates/s vmapped "
                  f"{r['vmapped']['point_updates_per_s']:.3f}, one at a time "
                  f"{r['one_at_a_time']['point_updates_per_s']:.3f} "
                  f"(×{mon.ratio_text(ratios[f'{k}_vmapped_speedup'], unit='', sections=[k])}); tokens/s/device "
                  f"{r['vmapped']['tokens_per_s_per_device']:.0f} vs {r['one_at_a_time']['tokens_per_s_per_device']:.0f}")
    for k in ("scoring_small", "scoring_dialogpt"):
        if k in res:
            r = res[k]
            print(f"{k:16s} {r['models']} models × {r['phrases_per_model']} phrases: model-phrases/s vmapped "
                  f"{r['vmapped']['model_phrases_per_s']:.1f}, one after another "
                  f"{r['one_at_a_time']['model_phrases_per_s']:.1f} "
                  f"(×{mon.ratio_text(ratios[f'{k}_vmapped_speedup'], unit='', sections=[k])}); max rel diff "
                  f"{r['max_rel_diff_mean_nll']:.1e}")
    if "sweep54" in res:
        s = res["sweep54"]
        print(f"sweep54   {s['points']} points, {s['batch_plans']} batch plans: {s['training_programs']} training "
              f"programs, {s['training_compile_s']:.1f} s compiling them; whole sweep {s['sweep_wall_s']:.1f} s")
    line = json.dumps(mon.finish(res, ratios, depends))
    if args.json_out:
        from rbjax.core.io import atomic_write_text

        atomic_write_text(args.json_out, line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
