"""The compile time of one training program, in token slots of computation: what the batch plan's choice of packed
shapes (:func:`rbjax.train.batching.choose_packed_shapes`) trades against the slots an extra shape saves.

At the DialoGPT-small shape (random GPT-2 117M, rbjax's initialiser), LM loss, dropout 0.1, batch 8, the religion1
training phrases (GPT-2 tokenizer, seed 42): the first update's micro-batch packed into one row of ``S`` slots for
several ``S`` (its own need and wider). For each ``S``, with the persistent compilation cache off: the wall time to
lower and compile the update (:func:`rbjax.train.step.train_step_jit`), then the median time of ``--calls`` updates.
The time of one slot is the least-squares slope of update time against ``S``; the compile time of a program in slots
is the mean compile time / that slope — the value of :data:`rbjax.train.batching.COMPILE_SLOTS_768`.

Usage::

    python benchmarks/bench_compile_slots.py [--widths 128,256,384] [--calls 5] [--smoke]

The last line printed is a JSON object with the figures and the foreign CPU of each program's timed section
(``"load"``, ``benchmarks/_common.py``).
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
from benchmarks._common import LoadMonitor  # noqa: E402

SHARED = Path(os.environ.get("RBJAX_SHARED", ROOT.parent / "shared"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--extra-slots", default="0,64,128,192", help="slots added to the update's own need, per program")
    ap.add_argument("--calls", type=int, default=5, help="timed updates per program (median)")
    ap.add_argument("--smoke", action="store_true", help="a 2-layer width-64 model (checks the script, not speed)")
    args = ap.parse_args()

    import jax
    import numpy as np

    jax.config.update("jax_enable_compilation_cache", False)  # every program compiled here, none read

    from rbjax.debias.config import DebiasRun
    from rbjax.debias.data import TrainingData
    from rbjax.debias.objective import DebiasObjective
    from rbjax.model.gpt2 import GPT2Config, init_params
    from rbjax.model.tokenizer import load_tokenizer
    from rbjax.train.batching import COMPILE_SLOTS_768, BatchPlan, packed_need
    from rbjax.train.step import StepSpec, init_state, train_step_jit

    config = GPT2Config(n_layer=2, n_embd=64, n_head=2) if args.smoke else GPT2Config()
    tok = load_tokenizer(SHARED / "tokenizers" / "gpt2")
    cfg = DebiasRun.from_flat(method="lm", bias_type="religion1", model="random", data_dir=str(SHARED / "redditbias"),
                              batch_size=8, export=False, evaluate=False, lmp=False, progress=False)
    data = TrainingData(cfg, tok, config.vocab_size)
    plan = BatchPlan.of_run(data, cfg.trainer_config)
    spec = StepSpec(config=config, objective=DebiasObjective("lm"), dropout=True)
    state = init_state(jax.tree.map(jax.numpy.asarray, init_params(config, seed=0)), spec, hparams={}, lr=5e-5,
                       t_total=10_000)
    (e, b), = plan.plan[0]
    rows = plan.batch_rows(e, b)
    lengths = np.asarray(data.mask, np.int64).sum(axis=1)[rows]
    need = packed_need(lengths, plan.rows)
    mon = LoadMonitor()
    figures = []
    for extra in (int(x) for x in args.extra_slots.split(",")):
        shape = (need[0], need[1] + extra)
        mb = plan.micro_batch(e, b, shape)
        batch = {**{k: v[None] for k, v in mb.items()}, **data.shared}
        with mon.section(f"slots_{shape[0] * shape[1]}"):
            t0 = time.perf_counter()
            prog = train_step_jit.lower(state, batch, {}, spec=spec).compile()
            compile_s = time.perf_counter() - t0
            state, m = prog(state, batch, {})  # the first call (not timed)
            jax.block_until_ready(state.params)
            times = []
            for _ in range(args.calls):
                t0 = time.perf_counter()
                state, m = prog(state, batch, {})
                jax.block_until_ready(state.params)
                times.append(time.perf_counter() - t0)
        figures.append({"shape": list(shape), "slots": shape[0] * shape[1], "compile_s": round(compile_s, 3),
                        "update_s": round(statistics.median(times), 4), "times_s": [round(t, 4) for t in times]})
        print(f"shape {shape}: compile {compile_s:.1f} s, update {statistics.median(times):.3f} s", file=sys.stderr,
              flush=True)
    slots = np.array([f["slots"] for f in figures], float)
    upd = np.array([f["update_s"] for f in figures], float)
    slope, intercept = np.polyfit(slots, upd, 1)
    compile_mean = float(np.mean([f["compile_s"] for f in figures]))
    out = {"machine": f"{platform.machine()} {os.cpu_count()} CPUs, {platform.platform()}",
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "jax": jax.__version__,
           "model": "smoke" if args.smoke else "DialoGPT-small shape", "need": list(need), "programs": figures,
           "seconds_per_slot": slope, "fixed_update_s": intercept, "compile_s_mean": compile_mean,
           "compile_slots": compile_mean / slope if slope > 0 else None, "COMPILE_SLOTS_768": COMPILE_SLOTS_768}
    mon.finish(out)  # no peer ratio: the load block says how busy the machine was while each program was timed
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
