"""The LM head under differentiation: all vocabulary columns in one step against streamed chunks.

:func:`rbjax.model.nll.chunked_logsumexp` is the log-sum-exp of the LM head's logits ``h @ emb.T``; training
differentiates it (the LM loss of every debiasing method and CRG's response loss; DST's classifier has no vocabulary
head). This script times its value and gradient (``jax.grad`` of ``Σ lse · g`` with respect to ``h`` and ``emb``,
jitted) at the GPT-2 head's shape (V = 50,257, width 768) for several position counts (a micro-batch's packed slots:
LM at batch 8 ≈ 124), two ways, interleaved round after round:

* **one step**: the default, :data:`rbjax.model.nll.HEAD_GRAD_BYTES` large enough that the logits fit: one matmul
  for the logits, which XLA computes once for both passes;
* **streamed**: ``HEAD_GRAD_BYTES = 0``: a loop over ``HEAD_CHUNK``-column chunks, forward and backward (what every
  micro-batch did before).

And the forward alone (scoring: no gradient, always streamed), for reference. Both ways give the same values (the
check printed: the largest relative difference of the embedding gradient).

Usage::

    python benchmarks/bench_lm_head.py [--positions 124,300,700,1152] [--repeats 7]

The last line printed is a JSON object with every median; the streamed / one-step ratios are under ``"ratios"``
(``streamed_over_one_step_<positions>``), or ``"void_ratios"`` when the machine had foreign CPU load while they were
timed (``"load"``, ``benchmarks/_common.py``).
"""
from __future__ import annotations

import argparse
import json
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
    ap.add_argument("--positions", default="124,300,700,1152", help="comma list of position counts")
    ap.add_argument("--repeats", type=int, default=7, help="timed rounds (every variant once a round)")
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--width", type=int, default=768)
    args = ap.parse_args()
    import jax
    import jax.numpy as jnp
    import numpy as np

    from rbjax.model import nll

    V, d = args.vocab, args.width
    emb = jax.random.normal(jax.random.PRNGKey(1), (V, d)) * 0.02
    budget = nll.HEAD_GRAD_BYTES
    mon = LoadMonitor()
    rows, ratios, depends = [], {}, {}
    for P in (int(p) for p in args.positions.split(",")):
        h = jax.random.normal(jax.random.PRNGKey(0), (P, d)) * 0.5
        g = jnp.ones((P,))
        fns, outs = {}, {}
        for way, nbytes in (("one_step", budget), ("streamed", 0)):
            nll.HEAD_GRAD_BYTES = nbytes  # read when the function is traced: each jit below traces at its first call
            fns[way] = jax.jit(jax.grad(lambda h, e: (nll.chunked_logsumexp(h, e) * g).sum(), argnums=(0, 1)))
            outs[way] = jax.block_until_ready(fns[way](h, emb))
        nll.HEAD_GRAD_BYTES = budget
        fns["forward"] = jax.jit(nll.chunked_logsumexp)
        jax.block_until_ready(fns["forward"](h, emb))
        times = {k: [] for k in fns}
        with mon.section(f"positions_{P}"):  # every variant once a round, interleaved
            for _ in range(args.repeats):
                for k, f in fns.items():
                    t0 = time.perf_counter()
                    jax.block_until_ready(f(h, emb))
                    times[k].append(time.perf_counter() - t0)
        a, b = (np.asarray(outs[k][1]) for k in ("one_step", "streamed"))
        row = {"positions": P, **{f"{k}_ms": 1e3 * statistics.median(v) for k, v in times.items()},
               "emb_grad_max_rel_diff": float(np.abs(a - b).max() / np.abs(b).max())}
        ratio = row["streamed_ms"] / row["one_step_ms"]
        ratios[f"streamed_over_one_step_{P}"], depends[f"streamed_over_one_step_{P}"] = ratio, [f"positions_{P}"]
        print(f"{P:6d} positions: one step {row['one_step_ms']:7.1f} ms, streamed {row['streamed_ms']:7.1f} ms "
              f"({mon.ratio_text(ratio, unit='x', sections=[f'positions_{P}'])}), "
              f"forward alone {row['forward_ms']:6.1f} ms, "
              f"max rel. diff {row['emb_grad_max_rel_diff']:.1e}", flush=True)
        rows.append(row)
    print(json.dumps(mon.finish({"vocab": V, "width": d, "head_grad_bytes": budget, "repeats": args.repeats,
                                 "rows": rows, "jax": jax.__version__,
                                 "machine": platform.processor() or platform.machine()}, ratios, depends)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
