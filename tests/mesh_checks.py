"""Multi-device checks run by tests/test_mesh.py in a subprocess with 8 simulated CPU devices.

JAX reads ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` once, when its CPU backend starts, so these checks
cannot run inside the pytest process (which has already started JAX with one device): the test starts this script
with the flag set and reads the JSON line it prints for each check.

Usage::

    XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \\
        python tests/mesh_checks.py --model DIR --tokenizer DIR --data-dir DIR --work DIR CHECK [CHECK ...]

Checks (each prints ``{"check": NAME, ...figures}`` on one line):

* ``data_parallel``: one run (3 updates, dropout on, packed token layout with one packed shape) trained on a 1 × 8 ``grid × data`` mesh (each micro-batch's
  rows split over 8 devices, gradients all-reduced by XLA) and on one device; maximum absolute and relative
  parameter differences, and the losses of both.
* ``grid_chunk``: a chunk of 6 grid points (batch 4, padded token layout) on the 8-device mesh :func:`rbjax.core.mesh.grid_mesh` picks, and
  the same chunk on one device; the mesh shape and the maximum parameter differences over the points.
* ``dropout_masks``: :func:`rbjax.model.layers.keep_mask` of one key computed with its output split over a
  ``grid × data`` mesh (rows over ``data``; vmapped over ``grid`` points sharing the key, as a grid chunk's step) and
  on one device: equal element for element.
* ``scorer_ahead``: the LMB scorer's programs compiled ahead from the parameters' shapes alone (rows split over the 8
  devices), then phrases scored: the programs built by each.
* ``self_debias``: Self-Debias pair scoring (2 prefixes) with the rows split over the 8 devices (its programs
  compiled ahead from the parameters' shapes) and on ``data=2,fsdp=2,tensor=2`` (parameters split), against one
  device: the relative differences of the summed log-likelihoods, the programs built by each step.
* ``sweep_compiles``: a small sweep (2 batch plans × 4 λ points, chunks of 2) with the local executor on all 8
  devices; the training programs compiled (:func:`rbjax.train.step.compiled_programs`), the batch plans, chunks
  and mesh shapes.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _train_file(data_dir: Path, work: Path, n: int) -> str:
    lines = (data_dir / "text_files/religion1/religion1_bias_manual_train.txt").read_text().splitlines()
    f = work / f"train{n}.txt"
    f.write_text("\n".join([ln for ln in lines if ln.strip()][:n]) + "\n")
    return str(f)


def _cfg(args, **kw):
    from rbjax.debias.config import DebiasRun

    d = dict(method="lmd", bias_type="religion1", model=args.model, tokenizer=args.tokenizer, data_dir=args.data_dir,
             out_dir=str(Path(args.work) / "unused"), train_file=_train_file(Path(args.data_dir), Path(args.work), 16),
             epochs=1, export=False, evaluate=False, lmp=False, progress=False)
    d.update(kw)
    return DebiasRun.from_flat(d)


def _run(trainer):
    """Train without checkpoints; ``(result, metrics per update [per point], parameter sharding specs)``."""
    import numpy as np

    rows, specs = [], set()

    def cb(ev):
        if ev["kind"] == "update":
            ms = ev["metrics"] if isinstance(ev["metrics"], list) else [ev["metrics"]]
            rows.append([[m[k] for k in ("lm_loss", "debias_loss", "total", "grad_norm")] for m in ms])
            specs.update(str(x.sharding.spec) for x in __import__("jax").tree.leaves(ev["params"]))

    res = trainer.run(checkpoints=False, callback=cb)
    return res, np.asarray(rows, np.float64), sorted(specs)


def _compare(params_a, params_b, init, metrics_a, metrics_b, lr: float) -> dict:
    """Parameter and metric differences of two runs of the same points (b: the one-device reference).

    ``max_abs``: largest parameter difference; ``max_abs_over_lr``: the same in units of one update's size (Adam
    moves a weight by about ``lr`` per update); ``rel_to_movement``: ‖a − b‖₂ / ‖b − init‖₂ over all points;
    ``metrics_rel``: largest relative difference of the per-update losses and gradient norms.
    """
    import jax
    import numpy as np

    mx, d2, m2 = 0.0, 0.0, 0.0
    for a, b, i in zip(jax.tree.leaves(params_a), jax.tree.leaves(params_b), jax.tree.leaves(init)):
        a, b, i = (np.asarray(x, np.float64) for x in (a, b, i))
        mx = max(mx, float(np.abs(a - b).max()))
        d2 += float(((a - b) ** 2).sum())
        m2 += float(((b - i) ** 2).sum())
    mrel = float((np.abs(metrics_a - metrics_b) / np.maximum(np.abs(metrics_b), 1e-6)).max())
    return {"max_abs": mx, "max_abs_over_lr": mx / lr, "rel_to_movement": (d2 / m2) ** 0.5, "movement": m2 ** 0.5,
            "metrics_rel": mrel}


def check_data_parallel(args) -> dict:
    import jax

    from rbjax.core.mesh import grid_mesh
    from rbjax.debias.run import debias_trainer
    from rbjax.train.batching import BatchPlan

    lr = 5e-4
    cfg = _cfg(args, method=args.method, batch_size=8, grad_accum=2, max_steps=3, learning_rate=lr)
    devs = jax.devices()
    t8 = debias_trainer(cfg, mesh=grid_mesh(1, cfg.trainer.batch_size, devs))
    # the packed layout with one packed shape for the 3 updates: one compiled program per mesh instead of three
    plan = BatchPlan.of_run(t8.data, cfg.trainer_config, max_shapes=1)
    t8 = debias_trainer(cfg, mesh=grid_mesh(1, cfg.trainer.batch_size, devs), data=t8.data, plan=plan)
    ids = t8.device_batch(0)["input_ids"]
    # on a 4-wide data axis the dropout keys (A, 4) must stay whole: their axis 1 holds key words, not rows
    b4 = debias_trainer(cfg, mesh=grid_mesh(1, 4, devs[:4]), data=t8.data, plan=t8.plan).device_batch(0)
    r8, m8, specs = _run(t8)
    t1 = debias_trainer(cfg, mesh=grid_mesh(1, cfg.trainer.batch_size, devs[:1]), data=t8.data, plan=plan)
    r1, m1, _ = _run(t1)
    assert cfg.trainer.layout == "packed" and len(plan.shapes) == 1
    return {"mesh": dict(t8.mesh.shape), "batch_spec": str(ids.sharding.spec),
            "batch_devices": len(ids.sharding.device_set), "batch_shard_shape": list(ids.addressable_shards[0].data.shape),
            "batch_shape": list(ids.shape), "param_specs": specs, "rng_spec_data4": str(b4["rng"].sharding.spec),
            "ids_spec_data4": str(b4["input_ids"].sharding.spec), "updates": len(m8),
            **_compare(r8.params, r1.params, t1.init_params, m8, m1, lr)}


def check_grid_chunk(args) -> dict:
    import jax
    import numpy as np

    from rbjax.core.mesh import grid_mesh
    from rbjax.debias.run import debias_trainer, lambda_point

    lr = 5e-4
    # the padded token layout: one compiled program per mesh (check_data_parallel runs the packed rows)
    cfg = _cfg(args, method=args.method, batch_size=4, grad_accum=1, max_steps=3, layout="padded")
    # six points of one batch plan; the learning rates differ too, so that the points end up far apart
    pts = [lambda_point(lm, d, lr * (1 + k)) for k, (lm, d) in enumerate(
        (lm, d) for lm in (0.001, 0.01) for d in (10.0, 50.0, 100.0))]
    t8 = debias_trainer(cfg, points=pts)  # the default mesh: grid_mesh over all 8 devices
    r8, m8, specs = _run(t8)
    t1 = debias_trainer(cfg, points=pts, mesh=grid_mesh(len(pts), 4, jax.devices()[:1]))
    r1, m1, _ = _run(t1)
    init = jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (len(pts),) + np.shape(x)), t1.init_params)
    p8 = jax.tree.map(lambda x: np.asarray(x)[:len(pts)], jax.device_get(r8.state.params))
    p1 = jax.tree.map(lambda x: np.asarray(x)[:len(pts)], jax.device_get(r1.state.params))
    apart = min(_compare(r1.point_params(i), r1.point_params(j), t1.init_params, m1, m1, lr)["max_abs"]
                for i in range(len(pts)) for j in range(i))
    return {"mesh": dict(t8.mesh.shape), "n_padded": t8.n_padded, "n_points": len(pts), "param_specs": specs,
            "updates": len(m8), "closest_points_max_abs": apart, **_compare(p8, p1, init, m8, m1, lr)}


def check_sweep_compiles(args) -> dict:
    import jax

    from rbjax.core.mesh import grid_mesh
    from rbjax.debias import sweep as sw
    from rbjax.train.step import compiled_programs

    base = _cfg(args, method="lmd", max_steps=1, train_file=_train_file(Path(args.data_dir), Path(args.work), 32),
                eval_batch_size=32)
    # 2 batch plans (batch 2, 4) × 4 λ points, in chunks of 2: each plan's program must serve both of its chunks
    grid = {"batch_size": (2, 4), "grad_accum": (1,), "lambda_lm": (0.001, 0.01), "lambda_d": (10.0, 100.0)}
    plans = sw.batch_plans(sw.grid_points("lmd", grid))
    before = compiled_programs()
    sel = sw.run_sweep(base, Path(args.work) / "sweep", grid=grid, grid_chunk=2, n_bootstrap=0, dev_max_pairs=4,
                       progress=False)
    after = compiled_programs()
    meshes = sorted({str(dict(grid_mesh(2, b).shape)) for (b, _), _ in plans})
    chunks = sorted(p.name for p in (Path(args.work) / "sweep" / "chunks").iterdir())
    return {"programs": after - before, "batch_plans": len(plans), "n_runs": sel["n_runs"], "chunks": chunks,
            "n_devices": jax.device_count(), "meshes": meshes}


def check_scorer_ahead(args) -> dict:
    import jax
    import numpy as np

    from rbjax.core.compilation import CompileCounter
    from rbjax.lmb.perplexity import PerplexityScorer
    from rbjax.model.handle import ModelHandle

    model = ModelHandle.open(args.model, args.tokenizer)
    model.load()
    lines = (Path(args.data_dir) / "text_files/religion1/religion1_bias_manual_train.txt").read_text().splitlines()
    ids = model.tokenizer.encode_batch([ln for ln in lines if ln.strip()][:120])
    # an earlier check of this process (a debias run compiles its evaluation ahead) may hold a program of the same
    # shape in memory: forget them, so that what is built ahead is counted here
    jax.clear_caches()
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), model.params)
    ahead = PerplexityScorer(abstract, model.config, batch_size=8)
    shapes = ahead.program_shapes(ids)
    with CompileCounter() as c:
        n = ahead.compile_programs(shapes)
    built_ahead = c.built
    scorer = PerplexityScorer(jax.tree.map(np.asarray, model.params), model.config, batch_size=8)
    with CompileCounter() as c:
        scorer.score_ids(ids)
    return {"programs": n, "built_ahead": built_ahead, "built_scoring": c.built, "n_devices": scorer.n_devices,
            "used": sorted(list(p[:3]) for p in scorer.programs), "planned": sorted(list(s) for s in shapes)}


def check_self_debias(args) -> dict:
    import jax
    import numpy as np

    from rbjax.core.compilation import CompileCounter
    from rbjax.core.mesh import make_mesh, parse_mesh
    from rbjax.lmb.self_debias import SelfDebiasScorer
    from rbjax.model.handle import ModelHandle
    from rbjax.model.self_debias import BIAS_BENCH_PREFIXES, SelfDebiasSettings

    model = ModelHandle.open(args.model, args.tokenizer)
    model.load()
    tok, cfg = model.tokenizer, model.config
    lines = (Path(args.data_dir) / "text_files/religion1/religion1_bias_manual_train.txt").read_text().splitlines()
    texts = [ln.strip() for ln in lines if ln.strip()][:16]
    a = tok.encode_batch(texts)
    c = tok.encode_batch([t.replace("jews", "christians").replace("jew", "christian") for t in texts])
    prefixes = (BIAS_BENCH_PREFIXES["religion"], BIAS_BENCH_PREFIXES["race-color"])
    pre_ids, settings = [tok.encode(t) for t in prefixes], SelfDebiasSettings(prefixes, decay_constant=1e4)
    params = jax.tree.map(np.asarray, model.params)

    def scorer(p, **kw):
        return SelfDebiasScorer(p, cfg, pre_ids, settings, batch_size=8, **kw)

    ref = scorer(params, devices=jax.devices()[:1]).score_pairs(a, c)
    ahead = scorer(jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), model.params))
    shapes = ahead.program_shapes(pairs=(a, c))
    with CompileCounter() as built:
        n = ahead.compile_programs(shapes)
    rows = scorer(params)
    with CompileCounter() as scoring:
        got = rows.score_pairs(a, c)
    split = scorer(params, mesh=make_mesh(parse_mesh("data=2,fsdp=2,tensor=2", 8)))
    got_split = split.score_pairs(a, c)

    def rel(x, y):
        return max(float(np.max(np.abs(u.nll_sum - v.nll_sum) / np.abs(v.nll_sum))) for u, v in zip(x, y))

    from rbjax.lmb.perplexity import PerplexityScorer  # the rescaling's effect (that a lost prefix would show)

    base = PerplexityScorer(params, cfg, batch_size=8, devices=jax.devices()[:1]).score_pairs(a, c)
    return {"n_devices": rows.n_devices, "programs": n, "built_ahead": built.built, "built_scoring": scoring.built,
            "used": sorted(list(p[1:4]) for p in rows.programs), "planned": sorted(list(s) for s in shapes),
            "rows_rel": rel(got, ref), "split_rel": rel(got_split, ref), "vs_plain_rel": rel(base, ref),
            "param_specs": sorted({str(x.sharding.spec) for x in jax.tree.leaves(split.params)}),
            "scored": int(sum(int(x.n_scored.sum()) for x in ref))}


def check_dropout_masks(args) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from rbjax.model.layers import keep_mask

    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("grid", "data"))
    key = jax.random.key_data(jax.random.key(7, impl="rbg"))
    masked = lambda k, x: jnp.where(keep_mask(k, 0.9, x.shape), x, 0.0)  # noqa: E731
    x = jnp.ones((8, 4, 16, 32), jnp.float32)
    one = np.asarray(jax.jit(masked)(key, x))
    rows = jax.jit(masked, out_shardings=NamedSharding(mesh, P("data")))(
        key, jax.device_put(x, NamedSharding(mesh, P("data"))))
    points = jax.jit(jax.vmap(masked, in_axes=(None, 0)), out_shardings=NamedSharding(mesh, P("grid", "data")))(
        key, jax.device_put(jnp.ones((4,) + x.shape, jnp.float32), NamedSharding(mesh, P("grid", "data"))))
    return {"kept": float(one.mean()), "rows_equal": bool(np.array_equal(np.asarray(rows), one)),
            "points_equal": bool(all(np.array_equal(np.asarray(points)[i], one) for i in range(4)))}


CHECKS = {"data_parallel": check_data_parallel, "grid_chunk": check_grid_chunk, "sweep_compiles": check_sweep_compiles,
          "scorer_ahead": check_scorer_ahead, "dropout_masks": check_dropout_masks, "self_debias": check_self_debias}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--method", default="lmd")
    p.add_argument("checks", nargs="+", choices=sorted(CHECKS))
    args = p.parse_args(argv)
    import warnings

    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    import jax

    n = jax.device_count()
    if n != 8:
        raise SystemExit(f"expected 8 simulated CPU devices, got {n}: set "
                         "XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts")
    Path(args.work).mkdir(parents=True, exist_ok=True)
    import time

    for c in args.checks:
        t0 = time.perf_counter()
        r = CHECKS[c](args)
        print(json.dumps({"check": c, **r}), flush=True)
        print(f"check {c}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
