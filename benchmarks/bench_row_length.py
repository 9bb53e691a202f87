"""Packed rows of a training update: the same micro-batch in 1 to N rows, to measure what a row's attention costs.

The trainer packs a micro-batch's examples side by side into ``R`` rows of ``Lp`` slots and computes each row's
block-diagonal attention densely, so an update costs about ``fixed + a · slots + b · R · Lp²``. This script times
the DST update (DialoGPT-small shape, random GPT-2 117M, dropout on, Adam, clip 1.0, accumulation 1) of one real
micro-batch (the first 12 binary slot-value examples of the offline MultiWOZ 2.0 test split, as
``bench_packed_train.py``) packed into each row count of ``--rows`` (:func:`rbjax.train.batching.pack_micro_batch`,
each in its own need ``(R, fullest row)``), the shapes interleaved round after round, and fits ``a`` and ``b`` by
least squares. ``a / b`` is the row length at which a row's attention costs as much as the rest of its update:
:data:`rbjax.train.batching.ATTENTION_SLOTS_768`, which the planner uses to choose a plan's rows
(:func:`rbjax.train.batching.choose_rows`).

Usage::

    python benchmarks/bench_row_length.py [--rows 1,2,3,4,5,6,8] [--repeats 8] [--smoke]

The last line printed is a JSON object with every shape's median update time and the fit, and the foreign CPU of
the timed rounds (``"load"``, ``benchmarks/_common.py``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks._common import LoadMonitor, dst_array_data  # noqa: E402

SHARED = Path(os.environ.get("RBJAX_SHARED", ROOT.parent / "shared"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,2,3,4,5,6,8", help="comma list of row counts")
    ap.add_argument("--repeats", type=int, default=8, help="timed rounds (every shape once a round)")
    ap.add_argument("--smoke", action="store_true", help="a 2-layer width-64 model (checks the script, not speed)")
    args = ap.parse_args()

    import jax
    import numpy as np

    from rbjax.dialog.state_tracking import DSTObjective, init_head
    from rbjax.model.gpt2 import GPT2Config, init_params
    from rbjax.model.tokenizer import load_tokenizer
    from rbjax.train.batching import ATTENTION_SLOTS_768, BatchPlan
    from rbjax.train.step import StepSpec, init_state, train_step_jit

    config = GPT2Config(n_layer=2, n_embd=64, n_head=2) if args.smoke else GPT2Config()
    tok = load_tokenizer(SHARED / "tokenizers" / "gpt2")
    data = dst_array_data(12, tok)
    spec = StepSpec(config=config, objective=DSTObjective(), dropout=True)
    start = {"gpt2": jax.device_get(init_params(config, seed=0)), "head": init_head(config, 0)}
    mon = LoadMonitor()
    runs = []
    for r in (int(x) for x in args.rows.split(",")):
        plan = BatchPlan(data, 12, 1, 1, 42, "drop", 1, layout="packed", rows=r, max_shapes=1)
        host = {**plan.update_batch(0), **data.shared}
        state = init_state(jax.tree.map(lambda x: x.copy(), start), spec, hparams={}, lr=5e-5, t_total=10_000)
        t0 = time.perf_counter()
        state, _ = train_step_jit(state, host, spec=spec)
        jax.block_until_ready(state.params)
        shape = tuple(host["pack"].shape[1:])
        print(f"shape {shape}: compiled and run once in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        runs.append({"rows": r, "shape": shape, "host": host, "state": state, "times": []})
    tokens = int(runs[0]["host"]["attention_mask"].sum())
    with mon.section("rounds"):  # every shape once a round, interleaved
        for i in range(args.repeats):
            for x in runs:
                t0 = time.perf_counter()
                x["state"], _ = train_step_jit(x["state"], x["host"], spec=spec)
                jax.block_until_ready(x["state"].params)
                x["times"].append(time.perf_counter() - t0)
            print(f"round {i + 1}/{args.repeats}: " + ", ".join(f"{x['shape']} {x['times'][-1]:.2f} s"
                                                              for x in runs), file=sys.stderr, flush=True)
    figures = [{"shape": list(x["shape"]), "slots": x["shape"][0] * x["shape"][1],
                "quadratic": x["shape"][0] * x["shape"][1] ** 2, "update_s": statistics.median(x["times"]),
                "times_s": [round(t, 4) for t in x["times"]]} for x in runs]
    X = np.array([[1.0, f["slots"], f["quadratic"]] for f in figures])
    y = np.array([f["update_s"] for f in figures])
    (fixed, a, b), *_ = np.linalg.lstsq(X, y, rcond=None)
    fit = {"fixed_s": fixed, "s_per_slot": a, "s_per_row_slot2": b, "attention_slots": a / b if b > 0 else None,
           "residuals_s": (y - X @ np.array([fixed, a, b])).round(4).tolist()}
    for f in figures:
        print(f"{tuple(f['shape'])}: {f['update_s']:.3f} s", file=sys.stderr)
    print(f"fit: {fixed:.3f} s + {a * 1e3:.3f} ms/slot + {b * 1e6:.3f} us per R·Lp² -> attention_slots "
          f"{fit['attention_slots']} (ATTENTION_SLOTS_768 = {ATTENTION_SLOTS_768})", file=sys.stderr)
    if mon.void:
        print("the fit's attention_slots was timed under foreign load: VOID", file=sys.stderr)
    print(json.dumps(mon.finish({"machine": f"{platform.machine()} {os.cpu_count()} CPUs, {platform.platform()}",
                                 "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "jax": jax.__version__,
                                 "load_average": os.getloadavg(),
                                 "model": "smoke" if args.smoke else "DialoGPT-small shape",
                                 "tokens": tokens, "figures": figures, "fit": fit})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
