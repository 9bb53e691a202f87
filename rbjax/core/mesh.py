"""Device meshes for training and scoring: a ``grid`` axis (hyper-parameter points) × a ``data`` axis (batch rows).

The same code runs on one CPU, on several simulated CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=8``),
on a multi-GPU node and on a TPU slice; several hosts join with ``jax.distributed.initialize()`` before anything else
(see docs/scale.md), after which ``jax.devices()`` lists every host's devices and the same mesh spans them.

* A stacked train state (one point per row of its leading axis) is split over ``grid``: points train in parallel
  with no communication between them.
* A batch is split over ``data`` along its rows (micro-batch axis 1 of an update batch): data parallelism; XLA
  inserts the gradient all-reduce.
* Scoring batches are split over every device (both axes).

:func:`grid_mesh` picks the shape: as many devices on ``grid`` as there are points to spread (padding the chunk up to
a multiple, the padding points being discarded), the rest on ``data`` where the batch divides evenly.
"""
from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = ["grid_mesh", "padded_points", "shard_state", "shard_batch", "replicate", "to_host"]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def grid_mesh(n_points: int, batch_size: int, devices: list | None = None) -> Mesh:
    """A ``("grid", "data")`` mesh over ``devices`` (default: all) for ``n_points`` points of micro-batch
    ``batch_size``.

    The grid axis gets the largest divisor g of the device count with ``g ≤ n_points`` (points are padded to a
    multiple of g); the data axis gets the remaining devices when ``batch_size`` divides evenly over them, else as
    many as divide it (devices left over are not used, and the choice is visible in ``mesh.devices``).
    """
    devs = list(jax.devices() if devices is None else devices)
    n = len(devs)
    best = (1, 1)
    for g in _divisors(n):
        if g > max(1, n_points):
            continue
        d_max = n // g
        d = max(x for x in _divisors(d_max) if batch_size % x == 0)
        if g * d > best[0] * best[1] or (g * d == best[0] * best[1] and g > best[0]):
            best = (g, d)
    g, d = best
    return Mesh(np.asarray(devs[:g * d], dtype=object).reshape(g, d), ("grid", "data"))


def padded_points(n_points: int, mesh: Mesh) -> int:
    """``n_points`` rounded up to a multiple of the mesh's grid axis."""
    g = mesh.shape["grid"]
    return int(math.ceil(n_points / g) * g)


def replicate(tree: Any, mesh: Mesh) -> Any:
    """Every leaf on every device of ``mesh``."""
    s = NamedSharding(mesh, P())
    return jax.tree.map(lambda x: jax.device_put(x, s), tree)


def shard_state(state: Any, mesh: Mesh, stacked: bool) -> Any:
    """A (stacked) train state on ``mesh``: the leading point axis over ``grid``, or replicated when not stacked."""
    if not stacked:
        return replicate(state, mesh)
    s = NamedSharding(mesh, P("grid"))
    return jax.tree.map(lambda x: jax.device_put(x, s), state)


def shard_batch(batch: dict, mesh: Mesh, row_axis: int = 1, shared_keys: tuple[str, ...] = ()) -> dict:
    """Host batch → device arrays with rows (axis ``row_axis``) split over ``data``; ``shared_keys`` replicated."""
    d = mesh.shape["data"]
    out = {}
    for k, v in batch.items():
        v = np.asarray(v)
        if k in shared_keys or v.ndim <= row_axis or v.shape[row_axis] % d:
            spec = P()
        else:
            spec = P(*([None] * row_axis + ["data"]))
        out[k] = jax.device_put(v, NamedSharding(mesh, spec))
    return out


def to_host(tree: Any) -> Any:
    """Every leaf as a numpy array on this host, whole.

    Same as ``jax.device_get`` on one host; for an array spread over several hosts' devices (a mesh after
    ``jax.distributed.initialize()``), its shards are gathered from every process
    (``multihost_utils.process_allgather``, a collective: every process must call this at the same point).
    """
    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
            from jax.experimental import multihost_utils

            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(jax.device_get(x))

    return jax.tree.map(one, tree)
