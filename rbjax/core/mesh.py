"""Device meshes for training and scoring: named axes ``grid`` (hyper-parameter points), ``data`` (batch rows),
``fsdp`` (parameters, gradients and optimizer state sharded, batch rows too) and ``tensor`` (attention heads, MLP
columns and the vocabulary split).

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

Parameters larger than one device (the levanter / maxtext scheme): every parameter carries *logical* axis
names, declared once per model family (:mod:`rbjax.model.partition`): ``("vocab", "embed")`` for an embedding,
``("embed", "mlp")`` for an MLP input kernel, ``("heads", "embed")`` for an attention output, ``(None,)`` for a
norm. :data:`DEFAULT_RULES` map logical names to mesh axes: ``embed`` → ``fsdp`` (each device holds a slice of every
weight; XLA gathers a layer's weights where it needs them and reduce-scatters their gradients), ``heads``, ``kv_heads``,
``qkv``, ``mlp``, ``vocab`` → ``tensor`` (each device computes its heads / MLP columns / vocabulary slice). A mesh
axis of size 1, or one that does not divide the dimension, is dropped for that parameter (for ``fsdp``: the largest
other dimension it divides takes it instead), so every model runs on every mesh — only the memory saved differs.
:func:`parse_mesh` reads ``--mesh data=2,fsdp=4``; :func:`make_mesh` builds the 4-axis mesh.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = ["AXES", "DEFAULT_RULES", "grid_mesh", "padded_points", "shard_state", "shard_batch", "replicate", "to_host",
           "parse_mesh", "make_mesh", "mesh_of", "mesh_sizes", "mesh_label", "logical_spec", "tree_shardings", "shard_tree",
           "is_model_parallel", "batch_axes", "mesh_product", "run_mesh"]

#: the mesh axes, outermost first (``grid`` and ``data`` neighbours are the farthest apart; ``tensor`` neighbours,
#: which talk on every layer, are adjacent devices)
AXES = ("grid", "data", "fsdp", "tensor")

#: logical parameter axis → mesh axis (levanter's ``axis_mapping`` / maxtext's ``logical_axis_rules``)
DEFAULT_RULES: dict[str, str] = {"embed": "fsdp", "vocab": "tensor", "heads": "tensor", "kv_heads": "tensor",
                                 "qkv": "tensor", "mlp": "tensor"}


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


def parse_mesh(text: str | None, n_devices: int, *, flag: str = "--mesh") -> dict[str, int] | None:
    """``"data=2,fsdp=4"`` → ``{"grid": 1, "data": 2, "fsdp": 4, "tensor": 1}`` (unnamed axes are 1).

    ``None``/empty/``"auto"`` → ``None`` (today's behaviour: :func:`grid_mesh` picks ``grid`` × ``data``). One size
    may be ``-1`` (or ``*``): it takes the devices the others leave.

    Raises:
        ValueError: naming ``flag``: an unknown axis, a repeated axis, a size that is not a positive integer, or sizes
        whose product is not ``n_devices``.
    """
    if text is None or not str(text).strip() or str(text).strip() == "auto":
        return None
    sizes: dict[str, int] = {}
    free = None
    for part in str(text).split(","):
        name, eq, val = part.strip().partition("=")
        name = name.strip()
        if not eq:
            raise ValueError(f"{flag} {text!r}: {part.strip()!r} is not AXIS=SIZE (axes: {', '.join(AXES)})")
        if name not in AXES:
            raise ValueError(f"{flag} {text!r}: unknown axis {name!r} (axes: {', '.join(AXES)})")
        if name in sizes or name == free:
            raise ValueError(f"{flag} {text!r}: axis {name!r} given twice")
        val = val.strip()
        if val in ("-1", "*"):
            if free is not None:
                raise ValueError(f"{flag} {text!r}: only one axis may take the remaining devices (-1)")
            free = name
            continue
        try:
            n = int(val)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"{flag} {text!r}: the size of {name!r} must be a positive integer, got {val!r}")
        sizes[name] = n
    prod = math.prod(sizes.values())
    if free is not None:
        if n_devices % prod:
            raise ValueError(f"{flag} {text!r}: the given sizes multiply to {prod}, which does not divide the "
                             f"{n_devices} devices")
        sizes[free] = n_devices // prod
        prod = n_devices
    if prod != n_devices:
        raise ValueError(f"{flag} {text!r}: the axis sizes multiply to {prod}, but there "
                         f"{'is 1 device' if n_devices == 1 else f'are {n_devices} devices'} "
                         f"(jax.devices()); the product must equal the device count")
    return {a: sizes.get(a, 1) for a in AXES}


def run_mesh(text: str | None, *, n_points: int = 1, batch_size: int = 1, stacked: bool = False,
             flag: str = "--mesh") -> Mesh:
    """The device mesh of a run, built once by the run's composition root: ``text`` (a ``--mesh`` setting) over all
    devices, or, without one, the ``grid`` × ``data`` mesh :func:`grid_mesh` picks for ``n_points`` points of
    micro-batch ``batch_size``.

    Raises:
        ValueError: naming ``flag``: a mesh that does not fit the devices, or a ``grid`` axis for a single run
        (``stacked`` false: it has no grid points to spread).
    """
    sizes = parse_mesh(text, jax.device_count(), flag=flag)
    if sizes is None:
        return grid_mesh(n_points if stacked else 1, batch_size)
    if not stacked and sizes["grid"] > 1:
        raise ValueError(f"{flag} {text}: a single run has no grid points to spread; use data, fsdp, tensor (grid is "
                         "for rbjax sweep)")
    return make_mesh(sizes)


def mesh_of(text: str | None, *, flag: str = "--mesh") -> Mesh | None:
    """The mesh a ``--mesh`` setting names over all devices, or ``None`` without one (the default layout: rows over
    this process's devices, parameters replicated) — the scorers' mesh, where :func:`run_mesh` is a training run's.

    Raises:
        ValueError: naming ``flag``: a mesh that does not fit the devices.
    """
    return None if not text else make_mesh(parse_mesh(text, jax.device_count(), flag=flag))


def mesh_product(text: str | None) -> int:
    """The device count a ``--mesh`` string names (the product of its sizes; ``-1`` counts as 1): checks its syntax
    before any device exists, and sizes a ``--dry-run`` plan for devices this machine does not have."""
    n = 1
    for part in str(text or "").split(","):
        v = part.partition("=")[2].strip()
        n *= int(v) if v.isdigit() and int(v) > 0 else 1
    return n


def make_mesh(sizes: dict[str, int], devices: list | None = None) -> Mesh:
    """A ``("grid", "data", "fsdp", "tensor")`` mesh of ``sizes`` (missing axes: 1) over ``devices`` (default: all),
    in the given device order (``tensor`` neighbours are neighbouring devices)."""
    devs = list(jax.devices() if devices is None else devices)
    shape = tuple(int(sizes.get(a, 1)) for a in AXES)
    if math.prod(shape) != len(devs):
        raise ValueError(f"mesh {mesh_label(dict(zip(AXES, shape)))} needs {math.prod(shape)} devices, "
                         f"{len(devs)} given")
    return Mesh(np.asarray(devs, dtype=object).reshape(shape), AXES)


def mesh_sizes(mesh: Mesh) -> dict[str, int]:
    """Every axis of :data:`AXES` with its size in ``mesh`` (1 where the mesh lacks it)."""
    return {a: int(mesh.shape.get(a, 1)) for a in AXES}


def mesh_label(sizes: dict[str, int] | Mesh) -> str:
    """``"grid=1,data=2,fsdp=4,tensor=1"`` (the form :func:`parse_mesh` reads; recorded in results)."""
    if isinstance(sizes, Mesh):
        sizes = mesh_sizes(sizes)
    return ",".join(f"{a}={int(sizes.get(a, 1))}" for a in AXES)


def is_model_parallel(mesh: Mesh) -> bool:
    """The mesh splits parameters (an ``fsdp`` or ``tensor`` axis larger than 1)."""
    s = mesh_sizes(mesh)
    return s["fsdp"] > 1 or s["tensor"] > 1


def batch_axes(mesh: Mesh, n_rows: int) -> tuple[str, ...]:
    """The mesh axes that split ``n_rows`` batch rows: ``data`` and ``fsdp`` (FSDP is data parallelism whose
    replicas each hold a slice of the parameters), as many of them as divide ``n_rows``; ``tensor`` devices share
    their rows."""
    s = mesh_sizes(mesh)
    axes: list[str] = []
    prod = 1
    for a in ("data", "fsdp"):
        if a in mesh.shape and s[a] > 1 and n_rows % (prod * s[a]) == 0:
            axes.append(a)
            prod *= s[a]
    return tuple(axes)


def logical_spec(names: tuple | None, shape: tuple, mesh: Mesh, rules: dict[str, str] | None = None,
                 lead: tuple = ()) -> P:
    """The :class:`PartitionSpec` of one array with logical axis ``names`` (one per dimension after ``lead``; ``None``
    entries and ``names=None`` are replicated) on ``mesh`` by ``rules`` (default :data:`DEFAULT_RULES`).

    ``lead``: specs of leading dimensions not named logically (``("grid",)`` for a stacked state). A mesh axis is
    used at most once per array and only where it divides the dimension; ``fsdp`` falls back to the largest other
    dimension it divides (levanter shards the largest axis the same way)."""
    rules = DEFAULT_RULES if rules is None else rules
    s = mesh_sizes(mesh)
    body = list(shape[len(lead):])
    out: list = [None] * len(body)
    used = {a for a in lead if a}
    if names is not None:
        if len(names) != len(body):
            raise ValueError(f"logical axes {names} do not match the array's shape {tuple(shape)}")
        for i, n in enumerate(names):
            ax = rules.get(n) if n is not None else None
            if ax and ax in mesh.shape and s[ax] > 1 and ax not in used and body[i] % s[ax] == 0:
                out[i] = ax
                used.add(ax)
        # the dimension named for fsdp did not take it (absent, or not divisible): the largest free dimension it
        # divides takes it (vectors stay replicated: they are small)
        if "fsdp" in mesh.shape and s["fsdp"] > 1 and "fsdp" not in used and len(body) >= 2:
            free = [i for i in range(len(body)) if out[i] is None and body[i] % s["fsdp"] == 0]
            if free:
                out[max(free, key=lambda i: body[i])] = "fsdp"
    return P(*lead, *out)


def tree_shardings(tree: Any, mesh: Mesh, logical_axes: Callable[[tuple, tuple], tuple | None] | None = None,
                   stacked: bool = False, rules: dict[str, str] | None = None) -> Any:
    """A :class:`NamedSharding` per leaf of ``tree`` (parameters, or a whole train state: Adam's moments mirror the
    parameters' dict paths and take the same specs).

    ``logical_axes(path, shape)``: the family's logical names for a leaf, from the leaf's dict-key path (strings;
    attribute and index entries such as ``opt_state`` / ``mu`` are left out) and its shape without the stacked axis;
    ``None`` (or no function) replicates. ``stacked``: leaves carry a leading point axis split over ``grid``.
    """
    lead = ("grid",) if stacked else ()

    def one(path, x):
        shape = tuple(np.shape(x))
        if len(shape) < len(lead):
            return NamedSharding(mesh, P())
        keys = tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))
        named = logical_axes is not None and keys and len(shape) > len(lead)  # step, λ, lr: no dict path
        names = logical_axes(keys, shape[len(lead):]) if named else None
        return NamedSharding(mesh, logical_spec(names, shape, mesh, rules, lead))

    return jax.tree_util.tree_map_with_path(one, tree)


def shard_tree(tree: Any, mesh: Mesh, logical_axes=None, stacked: bool = False, rules=None) -> Any:
    """``tree`` placed by :func:`tree_shardings` (host numpy or device arrays; each device receives only its slice)."""
    return jax.tree.map(jax.device_put, tree, tree_shardings(tree, mesh, logical_axes, stacked, rules))


def padded_points(n_points: int, mesh: Mesh) -> int:
    """``n_points`` rounded up to a multiple of the mesh's grid axis."""
    g = mesh.shape["grid"]
    return int(math.ceil(n_points / g) * g)


def replicate(tree: Any, mesh: Mesh) -> Any:
    """Every leaf on every device of ``mesh``."""
    s = NamedSharding(mesh, P())
    return jax.tree.map(lambda x: jax.device_put(x, s), tree)


def shard_state(state: Any, mesh: Mesh, stacked: bool, logical_axes=None) -> Any:
    """A (stacked) train state on ``mesh``: the leading point axis over ``grid``, or replicated when not stacked;
    on a mesh with ``fsdp``/``tensor`` axes, parameters and optimizer moments split by ``logical_axes`` (the family's
    names, :func:`tree_shardings`)."""
    if is_model_parallel(mesh) or logical_axes is not None and len(mesh.axis_names) > 2:
        return shard_tree(state, mesh, logical_axes, stacked)
    if not stacked:
        return replicate(state, mesh)
    s = NamedSharding(mesh, P("grid"))
    return jax.tree.map(lambda x: jax.device_put(x, s), state)


def shard_batch(batch: dict, mesh: Mesh, row_axis: int = 1, shared_keys: tuple[str, ...] = ()) -> dict:
    """Host batch → device arrays with rows (axis ``row_axis``) split over ``data`` (and ``fsdp``, where the mesh
    has it: :func:`batch_axes`); ``shared_keys`` replicated."""
    out = {}
    for k, v in batch.items():
        v = np.asarray(v)
        axes = () if k in shared_keys or v.ndim <= row_axis else batch_axes(mesh, v.shape[row_axis])
        if not axes:
            spec = P()
        else:
            spec = P(*([None] * row_axis + [axes if len(axes) > 1 else axes[0]]))
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
