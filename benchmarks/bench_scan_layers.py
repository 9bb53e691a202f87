"""Compile time against depth: the model's layers unrolled (rbjax's GPT-2 today) or as one ``jax.lax.scan`` body
over layer parameters stacked at call time (the way levanter and maxtext keep compile time flat in depth), at width
768 and the GPT-2 vocabulary, for 2, 6 and 12 layers.

For each depth and variant: the wall time to lower and compile one training gradient (``value_and_grad`` of the
mean next-token NLL of a batch of 8 × 36 tokens, every position real, no dropout), the steady time of one call
(median of ``--calls``), and the parity of the scanned variant against the unrolled one (loss and gradient, max
relative difference). The scanned variant keeps rbjax's parameter layout (``h_0``, ``h_1``, … as the Hugging Face
checkpoint names them) and stacks the layers inside the program, so its gradient flows back to the same tree.

Usage::

    python benchmarks/bench_scan_layers.py [--depths 2,6,12] [--calls 3]

The last line printed is a JSON object with the figures and the foreign CPU of each timed section (``"load"``,
``benchmarks/_common.py``).
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--depths", default="2,6,12")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--width", type=int, default=768)
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np
    import flax.linen as nn

    from rbjax.core.compilation import enable_compile_cache
    from rbjax.core.io import versions
    from rbjax.model.gpt2 import GPT2Config, GPT2LMHeadModel, _Block, init_params
    from rbjax.model.layers import attention_inputs

    enable_compile_cache("off")  # compile times, not cache reads
    mon = LoadMonitor()
    B, L = 8, 36
    out = {"machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()}, "versions": versions(),
           "batch": [B, L], "width": args.width, "depths": {}}
    for depth in [int(d) for d in args.depths.split(",")]:
        cfg = GPT2Config(n_layer=depth, n_embd=args.width, n_head=args.width // 64)
        params = init_params(cfg, 0)
        ids = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (B, L)), jnp.int32)
        mask = jnp.ones((B, L), jnp.int32)
        model = GPT2LMHeadModel(cfg)

        def nll(logits):
            lp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
            return -jnp.mean(jnp.take_along_axis(lp, ids[:, 1:, None], axis=-1))

        def unrolled(p):
            return nll(model.apply({"params": p}, ids, attention_mask=mask)[0])

        block = _Block(cfg, jnp.float32, 0)
        ln_f = nn.LayerNorm(cfg.layer_norm_epsilon)

        def scanned(p):
            ai = attention_inputs(B, L, mask, None, None)
            x = p["wte"]["embedding"][ids] + p["wpe"]["embedding"][ai.q_pos]
            stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[p[f"h_{i}"] for i in range(depth)])
            x, _ = jax.lax.scan(lambda h, lp: (block.apply({"params": lp}, h, ai.allowed, True)[0], None), x,
                                stacked)
            hidden = ln_f.apply({"params": p["ln_f"]}, x)
            return nll(jnp.dot(hidden, p["wte"]["embedding"].T))

        row, grads = {}, {}
        for name, fn in (("unrolled", unrolled), ("scanned", scanned)):
            with mon.section(f"depth_{depth}_{name}"):
                t0 = time.perf_counter()
                compiled = jax.jit(jax.value_and_grad(fn)).lower(params).compile()
                compile_s = time.perf_counter() - t0
                times = []
                for _ in range(args.calls):
                    t0 = time.perf_counter()
                    v, g = compiled(params)
                    jax.block_until_ready(g)
                    times.append(time.perf_counter() - t0)
            grads[name] = (float(v), g)
            row[name] = {"compile_s": compile_s, "step_s": statistics.median(times)}
        (lu, gu), (ls, gs) = grads["unrolled"], grads["scanned"]
        row["parity"] = {"loss_rel": abs(lu - ls) / abs(lu),
                         "grad_max_rel": max(float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(a)) + 1e-30))
                                             for a, b in zip(jax.tree.leaves(gu), jax.tree.leaves(gs)))}
        out["depths"][depth] = row
        print(f"[depth {depth}] {json.dumps(row)}", file=sys.stderr, flush=True)
    mon.finish(out)  # no ratio: the load block says how busy the machine was in each timed section
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
