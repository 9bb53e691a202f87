"""Scoring batches sharded over 8 simulated CPU devices equals scoring on one device.

The device count must be fixed before JAX initialises, so the check runs in a subprocess with
``XLA_FLAGS=--xla_force_host_platform_device_count=8``.
"""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import simulated_devices_env

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp, numpy as np
    from rbjax.lmb.perplexity import PerplexityScorer
    from rbjax.model.gpt2 import GPT2Config, init_params

    assert jax.device_count() == 8, jax.devices()
    cfg = GPT2Config(vocab_size=500, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    rng = np.random.default_rng(0)
    a, c = [], []
    for i in range(90):
        x = [int(t) for t in rng.integers(0, 500, size=rng.integers(1, 25))]
        p = int(rng.integers(0, len(x) + 1))
        a.append(x)
        c.append(x[:p] + [int(t) for t in rng.integers(0, 500, size=rng.integers(0, 12))])
    params = init_params(cfg, 0)
    sharded = PerplexityScorer(params, cfg, batch_size=6)
    one = PerplexityScorer(params, cfg, batch_size=6, devices=jax.devices()[:1])
    sb, sc = sharded.score_pairs(a, c)
    ob, oc = one.score_pairs(a, c)
    stacked = jax.tree.map(lambda *x: jnp.stack(x), params, init_params(cfg, 1))
    mb, _ = PerplexityScorer(stacked, cfg, batch_size=6, stacked=True).score_pairs(a, c)
    # the program really runs on all 8 devices: its output is split along the row axis
    from jax.sharding import NamedSharding, PartitionSpec
    from rbjax.lmb.perplexity import _packed_nll_jit
    z = lambda *shape: jax.device_put(np.zeros(shape, np.int32), NamedSharding(sharded.mesh, PartitionSpec("data")))
    out = _packed_nll_jit(sharded.params, sharded.params["wte"]["embedding"], z(8, 64), z(8, 64), z(8, 64),
                          z(8, 64), z(8, 60), z(8, 60, 2), config=cfg, precision="fp32")
    print(json.dumps({
        "out_devices": len(out.sharding.device_set), "out_shard_rows": out.addressable_shards[0].data.shape[0],
        "mesh": None if sharded.mesh is None else dict(sharded.mesh.shape),
        "programs": sorted(map(list, sharded.programs)),
        "diff_b": float(np.nanmax(np.abs(sb.nll_sum - ob.nll_sum) / np.maximum(ob.nll_sum, 1e-9))),
        "diff_c": float(np.nanmax(np.abs(sc.nll_sum - oc.nll_sum) / np.maximum(oc.nll_sum, 1e-9))),
        "diff_stacked": float(np.nanmax(np.abs(mb[0].nll_sum - ob.nll_sum) / np.maximum(ob.nll_sum, 1e-9))),
        "counts_equal": bool((sb.n_scored == ob.n_scored).all() and (sc.n_scored == oc.n_scored).all()),
        "scored": int(sb.n_scored.sum() + sc.n_scored.sum()),
    }))
""")


def test_sharded_scoring_equals_one_device():
    env = simulated_devices_env(8, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["mesh"] == {"data": 8}
    assert res["out_devices"] == 8 and res["out_shard_rows"] == 1
    assert all(p[0] % 8 == 0 for p in res["programs"]), res  # rows per batch: a multiple of the device count
    assert res["counts_equal"] and res["scored"] > 1000
    assert res["diff_b"] < 1e-5 and res["diff_c"] < 1e-5 and res["diff_stacked"] < 1e-5, res
