"""Tokens/s of scoring and training against the number of ``fsdp`` / ``tensor`` shards, and the bytes each step
moves between devices.

For every mesh over all devices (``data=n``, ``fsdp=n``, ``fsdp=n/2,tensor=2``, ``fsdp=n/4,tensor=4``, ...), a GPT-2
shaped model (random weights) is

* scored: :class:`rbjax.lmb.perplexity.PerplexityScorer` on random phrases (the packed LMB program), and
* trained: the family-level step (mean next-token NLL, gradient, Adam) with parameters, gradients and moments laid
  out by the family's logical axes (:mod:`rbjax.model.partition`), rows over ``data × fsdp``.

Per mesh: tokens/s (median of ``--repeats`` timed calls after a warm-up), per-device parameter bytes, and from the
compiled training program: XLA's ``bytes accessed`` (cost analysis: memory traffic of the whole program, all
devices) and the bytes the collectives move (all-gather, reduce-scatter, all-reduce, all-to-all,
collective-permute outputs in the optimized HLO, per device).

Runs unchanged on CPUs (simulated devices:
``XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu python benchmarks/bench_sharding.py``), GPUs
and TPUs. ``--json FILE`` writes the figures, with the foreign CPU of each mesh's timed sections (``"load"``,
``benchmarks/_common.py``; also in the JSON line printed last).
"""
from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks._common import LoadMonitor  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from rbjax.core.mesh import batch_axes, make_mesh, mesh_label, tree_shardings  # noqa: E402
from rbjax.lmb.perplexity import PerplexityScorer  # noqa: E402
from rbjax.model import gpt2  # noqa: E402
from rbjax.model.partition import logical_axes_for  # noqa: E402

_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "pred": 1, "s8": 1, "u8": 1, "f64": 8, "s64": 8}
_COLL = re.compile(r"=\s*(\(?[^=]*?\)?)\s+(all-gather|reduce-scatter|all-reduce|all-to-all|collective-permute)"
                   r"(-start)?\(")
_SHAPE = re.compile(r"(f32|bf16|f16|s32|u32|pred|s8|u8|f64|s64)\[([0-9,]*)\]")


def collective_bytes(hlo: str) -> dict:
    """Bytes of each collective's output in an optimized HLO module (per device), by kind."""
    out: dict = {}
    for line in hlo.splitlines():
        m = _COLL.search(line)
        if not m:
            continue
        n = 0
        for dt, dims in _SHAPE.findall(m.group(1)):
            n += _BYTES[dt] * int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
        out[m.group(2)] = out.get(m.group(2), 0) + n
    return out


def meshes(n: int) -> list[dict]:
    out = [{"data": n}]
    t = 1
    while t <= n:
        out.append({"fsdp": n // t, "tensor": t} if t < n else {"tensor": n})
        t *= 2
    return out


def timed(fn, repeats: int) -> float:
    fn()  # warm-up / compile
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=16, help="training rows per step")
    ap.add_argument("--seq", type=int, default=64, help="tokens per training row")
    ap.add_argument("--phrases", type=int, default=256, help="phrases scored per call")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="write the figures to this file")
    a = ap.parse_args(argv)

    cfg = gpt2.GPT2Config(vocab_size=a.vocab, n_positions=max(128, a.seq), n_embd=a.width, n_layer=a.layers,
                          n_head=a.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    params = jax.device_get(gpt2.init_params(cfg, 0))
    n_params = sum(x.size for x in jax.tree.leaves(params))
    rng = np.random.default_rng(0)
    phrases = [rng.integers(0, a.vocab, rng.integers(8, 20)).tolist() for _ in range(a.phrases)]
    n_tok = sum(len(p) for p in phrases)
    ids = rng.integers(0, a.vocab, (a.batch, a.seq)).astype(np.int32)
    mask = np.ones_like(ids)
    model = gpt2.GPT2LMHeadModel(cfg)
    opt = optax.adam(1e-4)

    def loss(p, ids, mask):
        logits = model.apply({"params": p}, ids, mask)[0].astype(jnp.float32)
        lp = jax.nn.log_softmax(logits[:, :-1])
        return -jnp.take_along_axis(lp, ids[:, 1:, None], -1).mean()

    def step(p, o, ids, mask):
        v, g = jax.value_and_grad(loss)(p, ids, mask)
        u, o = opt.update(g, o, p)
        return optax.apply_updates(p, u), o, v

    n = jax.device_count()
    dev = jax.devices()[0]
    mon = LoadMonitor()
    rows = []
    for sizes in meshes(n):
        mesh = make_mesh(sizes)
        axes = logical_axes_for(cfg)
        sh = tree_shardings(params, mesh, axes)
        p = jax.device_put(params, sh)
        o = jax.jit(opt.init, out_shardings=tree_shardings(jax.eval_shape(opt.init, params), mesh, axes))(p)
        osh = jax.tree.map(lambda x: x.sharding, o)
        rs = NamedSharding(mesh, P(batch_axes(mesh, a.batch) or None))
        x, xm = jax.device_put(ids, rs), jax.device_put(mask, rs)
        f = jax.jit(step, out_shardings=(sh, osh, NamedSharding(mesh, P())), donate_argnums=(0, 1))
        compiled = f.lower(p, o, x, xm).compile()
        ca = compiled.cost_analysis()
        ca = ca[0] if isinstance(ca, (list, tuple)) else ca
        coll = collective_bytes(compiled.as_text())
        state = [p, o]

        def train_once():
            state[0], state[1], v = f(state[0], state[1], x, xm)
            v.block_until_ready()

        with mon.section(f"{mesh_label(mesh)} train"):
            t_train = timed(train_once, a.repeats)
        pbytes = sum(s.data.nbytes for leaf in jax.tree.leaves(state[0]) for s in leaf.addressable_shards
                     if s.device == dev)
        state.clear()
        del p, o
        sc = PerplexityScorer(params, cfg, batch_size=64, mesh=mesh, row_len=32)
        with mon.section(f"{mesh_label(mesh)} score"):
            t_score = timed(lambda: sc.score_ids(phrases), a.repeats)
        rows.append({"mesh": mesh_label(mesh), "train_tokens_per_s": a.batch * a.seq / t_train,
                     "score_tokens_per_s": n_tok / t_score, "param_bytes_per_device": int(pbytes),
                     "bytes_accessed": float(ca.get("bytes accessed", float("nan"))) if ca else None,
                     "collective_bytes_per_device": coll, "collective_total": int(sum(coll.values()))})
        r = rows[-1]
        print(f"{r['mesh']:<34} train {r['train_tokens_per_s']:9.0f} tok/s   score {r['score_tokens_per_s']:9.0f} "
              f"tok/s   params/dev {pbytes / 1e6:7.2f} MB   collectives/step/dev {r['collective_total'] / 1e6:7.2f} MB"
              f"   bytes accessed {r['bytes_accessed'] / 1e6 if r['bytes_accessed'] else float('nan'):8.1f} MB",
              flush=True)
    meta = {"devices": f"{n} × {dev.device_kind} ({dev.platform})", "machine": platform.processor() or platform.machine(),
            "model": {"width": a.width, "layers": a.layers, "heads": a.heads, "vocab": a.vocab, "params": int(n_params)},
            "train_batch": [a.batch, a.seq], "phrases": a.phrases, "score_tokens": n_tok, "jax": jax.__version__}
    mon.finish(meta)  # no ratio: the load block says how busy the machine was while each mesh was timed
    print(json.dumps(meta))
    if a.json:
        Path(a.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
