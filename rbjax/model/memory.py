"""Memory plan: per-device bytes of a scoring or training run, from the model's ``config.json`` alone.

No weights are read: the parameter shapes come from ``jax.eval_shape`` of the family's ``init_params`` (the same
shapes the loader fills), and each parameter's per-device share from the mesh rules
(:func:`rbjax.core.mesh.logical_spec` with the family's logical axes, :mod:`rbjax.model.partition`): a parameter split
``fsdp × tensor`` ways holds ``1/(fsdp·tensor)`` of its bytes on each device, a replicated one all of them.

Parts (bytes on one device):

Bytes per value are the precision policy's (:func:`rbjax.core.precision.get_policy` of ``precision`` and
``param_dtype``): ``param_bytes`` for stored parameters, ``accum_bytes`` (float32: 4, whatever the precision) for
gradients, optimiser state and activations, ``compute_bytes`` for a generation's KV cache.

* ``parameters``: Σ per-device share × ``param_bytes`` (fp32: 4; ``--param-dtype bf16`` scoring: 2); with a
  stacked grid chunk, × points per ``grid`` row.
* ``gradients`` (training): the parameters' count in ``accum_bytes`` (the gradient takes the parameters' layout),
  plus one more copy for the accumulator when ``grad_accum > 1`` (the scan's carry).
* ``optimizer`` (training): Adam's two moments, 2 × the parameters' count in ``accum_bytes`` (same layout).
* ``activations`` — an estimate, not a measurement. With b rows per device (the batch over ``data × fsdp``), s
  tokens per row, d the width, I the MLP width, H heads, N layers, V the vocabulary, t the ``tensor`` size, 4 bytes
  (``accum_bytes``) per value (the residual stream, softmax and losses are float32 whatever the precision):

  - training keeps, per layer, what the backward pass reads: the two norm inputs, q, k, v, the attention output,
    its projection, the MLP input and output (9·d values per token), the MLP hidden states before and after the
    activation and the gate (3·I/t), the attention scores and probabilities (2·H·s/t):
    ``N · b·s · (9·d + 3·I/t + 2·H·s/t) · 4``; plus the logits and their gradient ``2 · b·s·V/t · 4``;
  - scoring keeps one layer at a time: ``b·s · (4·d + I/t + H·s/t) · 4``, plus the chunked LM head
    (:data:`rbjax.model.nll.HEAD_CHUNK` vocabulary rows at a time).

  Real programs differ (XLA fuses, rematerialises and keeps temporaries); the estimate is meant to tell a 124M run
  from an 8B one, not to be exact — the plan keeps :data:`HEADROOM` of each device free for it.
* ``kv_cache`` (generation): ``2 · N · B · S · kv_heads · head_dim · compute_bytes`` (the cache is kept in the
  compute dtype: 4 bytes in fp32) over the rows' and ``tensor``'s split.
* with low-rank adapters (``adapter``): ``parameters`` = the frozen base once (its storage dtype, split as above)
  + the adapters (fp32; ``fsdp`` splits their larger dimension, :mod:`rbjax.model.partition`) per point;
  ``gradients`` and ``optimizer`` are the adapters' only. A grid chunk
  of n points therefore costs base + n × (adapter, gradient, two moments) + n × activations.

:func:`plan_for_model` reads a model folder's ``config.json``; :meth:`MemoryPlan.check` raises :class:`PlanError` naming
the largest part and a mesh or batch that would fit; :meth:`MemoryPlan.format` is what ``--dry-run`` prints.
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from rbjax.core.mesh import AXES, DEFAULT_RULES, logical_spec, mesh_label, mesh_sizes, parse_mesh
from rbjax.core.precision import get_policy
from rbjax.model import registry
from rbjax.model.lora import LORA, LoraSpec, adapter_param_count, target_modules
from rbjax.model.nll import HEAD_CHUNK
from rbjax.model.partition import logical_axes_for

if TYPE_CHECKING:  # the plan reads a handle's config only
    from rbjax.model.handle import ModelHandle

__all__ = ["flops_per_token", "MemoryPlan", "PlanError", "plan_memory", "plan_for_model", "device_memory_bytes",
           "HEADROOM", "FLAGS", "DEVICE_MEMORY_HELP"]

#: the help of every ``--device-memory-gb`` (the ``device_memory_gb`` argument of :func:`plan_for_model`)
DEVICE_MEMORY_HELP = ("memory of one device for the memory plan, checked before the weights are loaded (default: what "
                      "the device reports; a CPU reports none and is not checked)")

#: fraction of a device's memory the plan leaves free (XLA temporaries, fragmentation, the runtime)
HEADROOM = 0.10
GB = 1e9


class PlanError(ValueError):
    """A plan that does not fit its devices (raised before anything is loaded)."""


@dataclasses.dataclass
class MemoryPlan:
    """Per-device bytes of each part (``parts``), whole-model bytes (``totals``), the mesh and the device memory.

    Attributes:
        parts: ``{"parameters", "gradients", "optimizer", "activations", "kv_cache"}`` → bytes on one device.
        totals: the same parts summed over the devices that hold distinct slices (parameters: the full model).
        mesh: axis sizes. device_bytes: memory of one device (``None``: unknown, nothing checked).
        suggestion: a mesh / batch that would fit (when this plan does not).
    """

    parts: dict
    totals: dict
    mesh: dict
    device_bytes: int | None
    settings: dict
    n_params: int
    suggestion: str | None = None

    @property
    def per_device(self) -> int:
        return int(sum(self.parts.values()))

    @property
    def usable_bytes(self) -> int | None:
        return None if self.device_bytes is None else int(self.device_bytes * (1 - HEADROOM))

    @property
    def fits(self) -> bool:
        return self.device_bytes is None or self.per_device <= self.usable_bytes

    @property
    def largest(self) -> str:
        return max(self.parts, key=self.parts.get)

    def to_dict(self) -> dict:
        return {"parts": self.parts, "per_device": self.per_device, "mesh": mesh_label(self.mesh),
                "device_bytes": self.device_bytes, "fits": self.fits, "n_params": self.n_params,
                "settings": self.settings, "suggestion": self.suggestion}

    def format(self) -> str:
        """The plan as ``--dry-run`` prints it: per part the bytes on one device, the bytes of the whole run (every
        slice once, however many devices hold a copy: per device × devices ≈ whole run × devices per slice, small
        unsplit parameters such as norms being on every device), and how many devices hold each slice (rounded)."""
        s = self.settings
        n_dev = math.prod(self.mesh.values())
        lines = [f"memory plan: {s['model']} ({self.n_params / 1e9:.3g}B parameters), "
                 f"{'training' if s['training'] else 'generation' if s.get('kv_cache') else 'scoring'}, "
                 f"mesh {mesh_label(self.mesh)} ({n_dev} device{'' if n_dev == 1 else 's'}), "
                 f"batch {s['batch_size']} × {s['seq_len']} tokens, precision {s['precision']}, "
                 f"parameters stored in {s['param_dtype']}"]
        if s.get("adapter"):
            a = s["adapter"]
            pts = s["n_points"]
            lines.append(f"  LoRA rank {a['rank']} on {a['targets']}: {a['trained_parameters']:,} trained parameters "
                         f"per point ({a['trained_parameters'] / self.n_params:.3%}; fp32, with their gradients and "
                         f"Adam moments) beside one frozen base"
                         + (f", {pts} grid points" if pts > 1 else ""))
        lines.append(f"  {'part':<12} {'per device':>13}   {'whole run':>11}   held by (whole run: each slice once, "
                     "however many devices hold it)")
        for k, v in self.parts.items():
            tot = self.totals[k]
            copies = round(n_dev * v / tot) if tot else 1
            held = ("every device" if copies == n_dev and n_dev > 1 else
                    f"{copies} device{'' if copies == 1 else 's'}" + ("" if copies == 1 else " per slice"))
            lines.append(f"  {k:<12} {v / GB:10.3f} GB   {tot / GB:8.3f} GB   {held}")
        lines.append(f"  {'total':<12} {self.per_device / GB:10.3f} GB per device")
        if self.device_bytes is None:
            lines.append("  device memory: unknown (pass --device-memory-gb to check the plan)")
        else:
            lines.append(f"  device memory {self.device_bytes / GB:.3g} GB, usable {self.usable_bytes / GB:.3g} GB "
                         f"({HEADROOM:.0%} kept free): {'fits' if self.fits else 'DOES NOT FIT'}")
            if not self.fits:
                lines.append(f"  largest part: {self.largest}. {self.suggestion or ''}")
        return "\n".join(lines)

    def check(self, printed: bool = False) -> "MemoryPlan":
        """Raise :class:`PlanError` when the plan does not fit, naming the largest part and what would fit
        (``printed``: the plan was printed just before, as ``--dry-run`` does)."""
        if not self.fits:
            raise PlanError(
                f"{self.settings['model']}: needs {self.per_device / GB:.3g} GB per device on mesh "
                f"{mesh_label(self.mesh)}, more than the {self.usable_bytes / GB:.3g} GB usable of "
                f"{self.device_bytes / GB:.3g} GB; the largest part is {self.largest} "
                f"({self.parts[self.largest] / GB:.3g} GB). "
                f"{self.suggestion or ''} "
                + ("(the plan above)" if printed else "(--dry-run prints the plan)"))
        return self


def _dims(config) -> dict:
    g = lambda *names, default=None: next((getattr(config, n) for n in names  # noqa: E731
                                           if getattr(config, n, None) is not None), default)
    d = g("hidden_size", "n_embd")
    H = g("num_attention_heads", "n_head")
    I = g("intermediate_size", "inner_dim", default=4 * d)  # noqa: E741
    return {"d": d, "H": H, "I": I, "N": g("num_hidden_layers", "n_layer"), "V": config.vocab_size,
            "kv": g("num_key_value_heads", default=H), "hd": g("head_dim", default=d // H)}


_SHAPES: dict = {}


def _param_shapes(config) -> Any:
    """Parameter shapes of ``config`` (``jax.eval_shape`` of the family's init: no arrays; cached per config)."""
    if config not in _SHAPES:
        fam = registry.family_of_config(config)
        _SHAPES[config] = jax.eval_shape(lambda: fam.init_params(config, 0))
    return _SHAPES[config]


def flops_per_token(config) -> int:
    """Forward matmul FLOPs per token of ``config``'s model, ``2 ×`` (every weight matrix a token passes through, the
    LM head included; not the embedding lookups, nor the attention scores, which depend on the length): the unit of
    work that scales a cost measured at one model size to another (:func:`rbjax.study.run.estimate_cost`).
    Counted from the family's own parameter shapes: every ``kernel``, plus ``d × V`` where the head is the tied
    embedding (no kernel has the vocabulary's size)."""
    dims = _dims(config)
    n, vocab_kernel = 0, False
    for path, x in jax.tree_util.tree_leaves_with_path(_param_shapes(config)):
        name = str(getattr(path[-1], "key", path[-1]))
        if name == "kernel":
            n += int(np.prod(x.shape))
            vocab_kernel |= dims["V"] in x.shape
    return 2 * (n + (0 if vocab_kernel else dims["d"] * dims["V"]))


class _SizesMesh:
    """Enough of a Mesh for :func:`logical_spec` (axis sizes only: a plan needs no devices)."""

    def __init__(self, sizes: dict):
        self.shape = {a: int(sizes.get(a, 1)) for a in AXES}
        self.axis_names = AXES


def _per_device_elems(shapes, config, sizes: dict) -> tuple[int, int]:
    """(elements on one device, elements in all) of the parameters laid out by the family's rules."""
    axes_fn = logical_axes_for(config)
    m = _SizesMesh(sizes)
    per, total = 0, 0
    for path, x in jax.tree_util.tree_leaves_with_path(shapes):
        keys = tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))
        n = int(np.prod(x.shape))
        spec = logical_spec(axes_fn(keys, tuple(x.shape)), tuple(x.shape), m, DEFAULT_RULES)
        split = math.prod(m.shape[a] for e in spec if e for a in ((e,) if isinstance(e, str) else e))
        per += n // split
        total += n
    return per, total


def _adapter_shapes(config, spec: LoraSpec) -> dict:
    """The adapter matrices of ``spec`` on ``config``'s model as a shapes tree (``…/lora/A``, ``…/lora/B``)."""
    shapes = _param_shapes(config)
    tree: dict = {}
    for mod in target_modules(config, spec.targets):
        node = shapes
        for k in mod:
            node = node[k]
        din, dout = node["kernel"].shape
        t = tree
        for k in mod:
            t = t.setdefault(k, {})
        t[LORA] = {"A": jax.ShapeDtypeStruct((din, spec.rank), np.float32),
                   "B": jax.ShapeDtypeStruct((spec.rank, dout), np.float32)}
    return tree


def plan_memory(config, *, mesh=None, training: bool, batch_size: int, seq_len: int, grad_accum: int = 1,
                n_points: int = 1, precision: str = "fp32", param_dtype: str = "fp32", kv_cache: tuple | None = None,
                device_bytes: int | None = None, model_name: str = "model", suggest: bool = True,
                flags: dict | None = None, adapter: LoraSpec | None = None) -> MemoryPlan:
    """The :class:`MemoryPlan` of ``config`` (module docstring for the formulas).

    Args:
        mesh: a :class:`jax.sharding.Mesh` or axis sizes ``{"data": 2, "fsdp": 4}`` (default: one device).
        training: a debiasing run (gradients, Adam moments, stored activations) or scoring.
        batch_size, seq_len: rows and tokens per row of one (micro-)batch, all devices together.
        grad_accum: micro-batches per update (> 1 adds a gradient accumulator). n_points: grid points of a stacked
            chunk (split over ``grid``). kv_cache: ``(rows, slots)`` of a generation cache.
        device_bytes: memory of one device (``None``: unknown).
        flags: the command's options that the suggestion names, ``{"batch_size", "grad_accum", "param_dtype"}``
            (default :data:`FLAGS`: ``rbjax measure`` / ``debias``'s; ``None`` for an option the command lacks).
        adapter: training low-rank adapters (:class:`rbjax.model.lora.LoraSpec`): the base (stored as
            ``param_dtype``) is held once whatever the points, and the gradients, the Adam moments and the trained
            parameters are the adapters' (fp32, replicated), × the points per ``grid`` row.
    """
    sizes = mesh_sizes(mesh) if mesh is not None and not isinstance(mesh, dict) else {a: int((mesh or {}).get(a, 1))
                                                                                     for a in AXES}
    shapes = _param_shapes(config)
    per, total = _per_device_elems(shapes, config, sizes)
    dm = _dims(config)
    policy = get_policy(precision, param_dtype)
    pbytes, abytes = policy.param_bytes, policy.accum_bytes
    pts = max(1, math.ceil(n_points / sizes["grid"]))
    rows_split = sizes["data"] * sizes["fsdp"]
    b = max(1, math.ceil(batch_size / rows_split))
    t, s = sizes["tensor"], seq_len
    n_adapter = 0
    if adapter is not None and training:  # one frozen base; per point the adapters, their gradients and moments
        n_adapter = adapter_param_count(config, adapter)
        a_per, _ = _per_device_elems(_adapter_shapes(config, adapter), config, sizes)
        parts = {"parameters": per * pbytes + a_per * abytes * pts}
        totals = {"parameters": total * pbytes + n_adapter * abytes * n_points}
        parts["gradients"] = a_per * abytes * pts * (2 if grad_accum > 1 else 1)
        parts["optimizer"] = a_per * abytes * 2 * pts
        totals["gradients"], totals["optimizer"] = (n_adapter * abytes * n_points * (2 if grad_accum > 1 else 1),
                                                    n_adapter * abytes * 2 * n_points)
    else:
        parts = {"parameters": per * pbytes * pts}
        totals = {"parameters": total * pbytes * n_points}
        if training:
            parts["gradients"] = per * abytes * pts * (2 if grad_accum > 1 else 1)
            parts["optimizer"] = per * abytes * 2 * pts
            totals["gradients"], totals["optimizer"] = (total * abytes * n_points * (2 if grad_accum > 1 else 1),
                                                        total * abytes * 2 * n_points)
    if training:
        act = (dm["N"] * b * s * (9 * dm["d"] + 3 * dm["I"] / t + 2 * dm["H"] * s / t) * abytes
               + 2 * b * s * dm["V"] / t * abytes)
    else:
        act = (b * s * (4 * dm["d"] + dm["I"] / t + dm["H"] * s / t) * abytes
               + b * s * min(HEAD_CHUNK, dm["V"]) * abytes)
    parts["activations"] = int(act * pts)
    totals["activations"] = int(act * pts * rows_split * sizes["grid"])
    if kv_cache is not None:
        B, S = kv_cache
        kv = 2 * dm["N"] * B * S * dm["kv"] * dm["hd"] * policy.compute_bytes
        parts["kv_cache"] = int(kv / rows_split / (t if dm["kv"] % t == 0 else 1))
        totals["kv_cache"] = int(kv)
    settings = {"model": model_name, "training": training, "batch_size": batch_size, "seq_len": seq_len,
                "grad_accum": grad_accum, "n_points": n_points, "precision": precision, "param_dtype": param_dtype,
                "kv_cache": None if kv_cache is None else [int(x) for x in kv_cache]}
    if adapter is not None and training:
        settings["adapter"] = {"rank": adapter.rank, "targets": adapter.targets, "trained_parameters": n_adapter}
    plan = MemoryPlan(parts={k: int(v) for k, v in parts.items()}, totals={k: int(v) for k, v in totals.items()},
                      mesh=sizes, device_bytes=device_bytes, settings=settings, n_params=total)
    if suggest and not plan.fits:
        plan.suggestion = _suggest(config, plan, kv_cache, {**FLAGS, **(flags or {})}, adapter)
    return plan


#: the options a plan's suggestion names (those of ``rbjax measure`` and ``rbjax debias``)
FLAGS = {"batch_size": "--batch-size", "grad_accum": "--grad-accum", "param_dtype": "--param-dtype"}


def _suggest(config, plan: MemoryPlan, kv_cache, flags: dict, adapter: LoraSpec | None = None) -> str | None:
    """The first of: the same batch on another mesh of these devices (more fsdp, then tensor), then smaller
    micro-batches (with more accumulation: the same update) on each mesh."""
    n = math.prod(plan.mesh.values())
    s = plan.settings
    meshes = []
    for f in sorted((x for x in range(1, n + 1) if n % x == 0), reverse=True):
        for t in (x for x in range(1, n // f + 1) if (n // f) % x == 0):
            meshes.append({"grid": 1, "data": n // f // t, "fsdp": f, "tensor": t})
    meshes.sort(key=lambda m: (-(m["fsdp"] * m["tensor"]), m["tensor"]))
    batches = [s["batch_size"]]
    while batches[-1] > 1:
        batches.append(max(1, batches[-1] // 2))
    for bs in batches:
        for m in meshes:
            p = plan_memory(config, mesh=m, training=s["training"], batch_size=bs, seq_len=s["seq_len"],
                            grad_accum=s["grad_accum"] * (s["batch_size"] // bs), n_points=s["n_points"],
                            precision=s["precision"], param_dtype=s["param_dtype"], kv_cache=kv_cache,
                            device_bytes=plan.device_bytes, suggest=False, adapter=adapter)
            if p.fits:
                m_txt = ",".join(f"{k}={v}" for k, v in m.items() if v > 1 and k != "grid")
                what = f"--mesh {m_txt}" if m_txt else "one device"
                if bs != s["batch_size"]:
                    accum = s["grad_accum"] * (s["batch_size"] // bs)
                    what += f" with micro-batches of {bs} rows" + (
                        (f" ({flags['batch_size']} {bs} {flags['grad_accum']} {accum} keeps the update)"
                         if flags.get("grad_accum") else f" ({flags['batch_size']} {bs})") if s["training"]
                        else f" ({flags['batch_size']} {bs})")
                return f"Would fit: {what} ({p.per_device / GB:.2f} GB per device)."
    devices = "this device" if n == 1 else f"these {n} devices"
    state = sum(v for k, v in plan.totals.items() if k in ("parameters", "gradients", "optimizer"))
    need = math.ceil(state / plan.usable_bytes)
    if need <= n:  # the state would fit split over these devices: what does not is a single row's activations
        return (f"No mesh or batch over {devices} fits: even micro-batches of one row need more than the "
                f"{plan.usable_bytes / GB:.3g} GB usable (activations; shorter rows or more memory per device).")
    return (f"No mesh or batch over {devices} fits: the parameters"
            f"{', gradients and optimizer state' if s['training'] else ''} alone are {state / GB:.4g} GB, "
            f"at least {need} devices of this size (e.g. --mesh fsdp={1 << (need - 1).bit_length()})"
            f"{'' if s['training'] or not flags.get('param_dtype') else ' or ' + flags['param_dtype'] + ' bf16'}.")


def device_memory_bytes(device=None) -> int | None:
    """Memory of one device as its runtime reports it (``bytes_limit`` of ``memory_stats()``; GPUs and TPUs), or
    ``None`` (a CPU reports nothing)."""
    dev = device or jax.devices()[0]
    try:
        st = dev.memory_stats()
    except Exception:  # noqa: BLE001 — backends without memory statistics raise various errors
        return None
    return int(st["bytes_limit"]) if st and st.get("bytes_limit") else None


def plan_for_model(model: "ModelHandle", *, mesh: str | dict | None, training: bool, batch_size: int, seq_len: int,
                   grad_accum: int = 1, n_points: int = 1, precision: str = "fp32", param_dtype: str = "fp32",
                   device_memory_gb: float | None = None, n_devices: int | None = None, kv_cache=None,
                   flag_prefix: str = "--", flags: dict | None = None, adapter: LoraSpec | None = None) -> MemoryPlan:
    """The plan of a model from its ``config.json`` only.

    ``model``: the run's :class:`rbjax.model.handle.ModelHandle` (its :meth:`~rbjax.model.handle.ModelHandle.model_config`:
    of a hub id only ``config.json`` is fetched, no weights; the same handle then loads the model without reading
    ``config.json`` again). ``mesh``: a ``--mesh`` string (parsed against ``n_devices``, default
    ``jax.device_count()``) or sizes; ``None``: the default layout (parameters replicated, rows over ``data``).
    ``device_memory_gb``: overrides what the device reports. ``flags``: :func:`plan_memory`'s.

    Raises:
        FileNotFoundError: no ``config.json``. ValueError: a bad mesh or config. RuntimeError: a hub id whose
        ``config.json`` cannot be fetched.
    """
    config = model.model_config()
    n = jax.device_count() if n_devices is None else n_devices
    if isinstance(mesh, str) or mesh is None:
        sizes = parse_mesh(mesh, n, flag=f"{flag_prefix}mesh") or {"grid": 1, "data": n, "fsdp": 1, "tensor": 1}
    else:
        sizes = mesh
    dev_bytes = int(device_memory_gb * GB) if device_memory_gb else device_memory_bytes()
    return plan_memory(config, mesh=sizes, training=training, batch_size=batch_size, seq_len=seq_len,
                       grad_accum=grad_accum, n_points=n_points, precision=precision, param_dtype=param_dtype,
                       kv_cache=kv_cache, device_bytes=dev_bytes, model_name=model.name, flags=flags, adapter=adapter)
