"""Low-rank adapters (LoRA, Hu et al. 2021) for every model family: which dense layers take one, how an adapter is
initialised, kept beside its frozen layer, merged into it, and named in the PEFT format.

**Where an adapter lives.** In the parameter tree, beside the kernel it adapts: a dense layer's parameters
``{"kernel": (in, out), "bias"?}`` gain ``{LORA: {"A": (in, r), "B": (r, out), "scale": (), "dropout"?: ()}}``.
The dense layers (:class:`rbjax.model.layers.Linear`, GPT-2's ``Conv1D``-style ``_Dense``) add
``scale · (dropout(x) @ A) @ B`` to their output when their parameters hold one
(:func:`rbjax.model.layers.lora_update`), unmerged: the frozen kernel is never copied and never differentiated. An
adapted tree is therefore *self-describing*: every code path that runs a model — the trainer's objectives, the LMB
scorer, the sampler, the DST classifier — runs the adapted model without knowing about adapters, and the
per-module ``scale`` (α/r, or α/√r with rsLoRA) is data, as PEFT's per-module ``scaling``.

**Initialisation** as PEFT's default (``init_lora_weights=True``): ``A`` uniform in ``±1/√in`` (PyTorch's
``kaiming_uniform_(a=√5)`` of ``lora_A``), drawn from a seeded JAX key per module; ``B`` zero — an untrained
adapter changes nothing, bit for bit.

**Targets** are named per family by the modules' Hugging Face names inside a decoder layer (PEFT's
``target_modules``): :data:`TARGETS`. ``--lora-targets`` takes ``all-linear`` (every projection of attention and
MLP, not the LM head: PEFT's ``all-linear``), ``attention``, ``mlp``, or a comma list of names, each matching the
modules whose name equals it or ends with ``.name`` (PEFT's rule: ``c_proj`` is GPT-2's attention and MLP output,
``q_proj`` Llama's query). The embeddings are not an adapter target (LoRA on a tied embedding changes only the
input lookup in PEFT, never the output rows the debiasing losses read).

Why our own module rather than ``qwix``'s LoRA (docs/debiasing.md, "Adapters"): qwix intercepts JAX's
``dot_general`` calls of flax modules and creates its adapters as new parameters at ``init``; our models are ours,
the rotary families share one dense layer and GPT-2 has one, so an adapter entry read by those two layers is two
lines of model code, works under ``vmap`` with an unbatched base, keeps PEFT's layout and initialisation, and needs
no dependency.
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rbjax.model.layers import LORA
from rbjax.model.registry import family_of_config

__all__ = ["LORA", "TARGETS", "LAYER_PREFIX", "TARGET_GROUPS", "LoraSpec", "target_names", "target_modules",
           "add_adapters", "has_adapters", "is_adapter_param", "adapter_modules", "merge_adapters", "strip_adapters",
           "adapter_param_count", "hf_module_name", "module_path_of_hf", "hf_module_names", "OTHER_MODULES"]

#: family -> {HF module name inside a decoder layer: (its rbjax path inside a layer, group)}
TARGETS: dict[str, dict[str, tuple[tuple[str, ...], str]]] = {
    "gpt2": {"attn.c_attn": (("attn", "c_attn"), "attention"), "attn.c_proj": (("attn", "c_proj"), "attention"),
             "mlp.c_fc": (("mlp", "c_fc"), "mlp"), "mlp.c_proj": (("mlp", "c_proj"), "mlp")},
    "llama": {**{f"self_attn.{n}": (("self_attn", n), "attention") for n in ("q_proj", "k_proj", "v_proj", "o_proj")},
              **{f"mlp.{n}": (("mlp", n), "mlp") for n in ("gate_proj", "up_proj", "down_proj")}},
    "gpt_neox": {"attention.query_key_value": (("attention", "query_key_value"), "attention"),
                 "attention.dense": (("attention", "dense"), "attention"),
                 "mlp.dense_h_to_4h": (("mlp", "dense_h_to_4h"), "mlp"),
                 "mlp.dense_4h_to_h": (("mlp", "dense_4h_to_h"), "mlp")},
}
TARGETS["gemma2"] = TARGETS["llama"]

#: family -> (the HF model's modules outside its decoder layers, the modules of decoder layer i that are no adapter
#: target, as suffixes of the layer's name; "" is the layer itself): with :data:`TARGETS` and :data:`LAYER_PREFIX`,
#: every module name of the ``transformers`` model (``named_modules()``; tests/test_lora.py checks it per family), so
#: that a PEFT config selecting one of them by name or pattern is seen (:func:`hf_module_names`)
OTHER_MODULES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "gpt2": (("transformer", "transformer.wte", "transformer.wpe", "transformer.drop", "transformer.h",
              "transformer.ln_f", "lm_head"),
             ("", ".ln_1", ".attn", ".attn.attn_dropout", ".attn.resid_dropout", ".ln_2", ".mlp", ".mlp.act",
              ".mlp.dropout")),
    "llama": (("model", "model.embed_tokens", "model.layers", "model.norm", "model.rotary_emb", "lm_head"),
              ("", ".self_attn", ".mlp", ".mlp.act_fn", ".input_layernorm", ".post_attention_layernorm")),
    "gpt_neox": (("gpt_neox", "gpt_neox.embed_in", "gpt_neox.emb_dropout", "gpt_neox.layers",
                  "gpt_neox.final_layer_norm", "gpt_neox.rotary_emb", "lm_head"),
                 ("", ".input_layernorm", ".post_attention_layernorm", ".post_attention_dropout",
                  ".post_mlp_dropout", ".attention", ".mlp", ".mlp.act")),
    "gemma2": (("model", "model.embed_tokens", "model.layers", "model.norm", "model.rotary_emb", "lm_head"),
               ("", ".self_attn", ".mlp", ".mlp.act_fn", ".input_layernorm", ".post_attention_layernorm",
                ".pre_feedforward_layernorm", ".post_feedforward_layernorm")),
}

#: family -> (rbjax name of decoder layer i, HF module name of decoder layer i), as format strings of i
LAYER_PREFIX = {"gpt2": ("h_{i}", "transformer.h.{i}"), "llama": ("layers_{i}", "model.layers.{i}"),
                "gpt_neox": ("layers_{i}", "gpt_neox.layers.{i}"), "gemma2": ("layers_{i}", "model.layers.{i}")}

#: the group words ``--lora-targets`` takes besides module names
TARGET_GROUPS = ("all-linear", "attention", "mlp")


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """One adapter setting (hashable): rank ``r``, ``alpha``, dropout rate of the adapter's input, the targets
    (:func:`target_names`) and rsLoRA (scale α/√r instead of α/r, Kalajdzievski 2023).

    Raises:
        ValueError: a rank < 1, alpha ≤ 0 or a dropout rate outside [0, 1).
    """

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: str = "all-linear"
    rslora: bool = False

    def __post_init__(self):
        if not (isinstance(self.rank, int) and self.rank >= 1):
            raise ValueError(f"LoRA rank must be a positive integer, got {self.rank!r}")
        if not self.alpha > 0:
            raise ValueError(f"LoRA alpha must be > 0, got {self.alpha!r}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"LoRA dropout must be in [0, 1), got {self.dropout!r}")

    @property
    def scale(self) -> float:
        """α/r, or α/√r with rsLoRA (PEFT's ``scaling``)."""
        return self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)


def _family(config) -> str:
    return family_of_config(config).name


def target_names(config, targets: str) -> list[str]:
    """The HF module names (inside a decoder layer, :data:`TARGETS`) that ``targets`` selects for ``config``'s
    family, in the table's order.

    Raises:
        ValueError: an empty list, or a name that matches no module of the family (the message lists them).
    """
    table = TARGETS[_family(config)]
    words = [w.strip() for w in str(targets).split(",") if w.strip()]
    if not words:
        raise ValueError("--lora-targets is empty; give all-linear, attention, mlp or module names")
    chosen: set[str] = set()
    for w in words:
        if w == "all-linear":
            hit = set(table)
        elif w in ("attention", "mlp"):
            hit = {n for n, (_, g) in table.items() if g == w}
        else:
            hit = {n for n in table if n == w or n.endswith("." + w)}
        if not hit:
            raise ValueError(f"--lora-targets {w!r} names no module of the {_family(config)} family; its modules: "
                             f"{', '.join(table)} (or {', '.join(TARGET_GROUPS)})")
        chosen |= hit
    return [n for n in table if n in chosen]


def target_modules(config, targets: str) -> list[tuple[str, ...]]:
    """The rbjax paths of the dense layers ``targets`` selects, every decoder layer (module paths in the model's
    parameter tree, e.g. ``("h_0", "attn", "c_attn")``)."""
    fam = _family(config)
    prefix = LAYER_PREFIX[fam][0]
    names = target_names(config, targets)
    return [(prefix.format(i=i),) + TARGETS[fam][n][0] for i in range(config.num_layers) for n in names]


def hf_module_name(config, path: tuple[str, ...]) -> str:
    """The HF (PEFT) module name of an adapted module's rbjax path, e.g. ``("h_0", "attn", "c_attn")`` →
    ``"transformer.h.0.attn.c_attn"``.

    Raises:
        KeyError: a path that is no adapter target of the family.
    """
    fam = _family(config)
    ours, hf = LAYER_PREFIX[fam]
    m = re.fullmatch(ours.replace("{i}", r"(\d+)"), path[0]) if path else None
    inner = {p: n for n, (p, _) in TARGETS[fam].items()}
    if m is None or tuple(path[1:]) not in inner:
        raise KeyError(f"{'/'.join(path)} is not an adapter target of the {fam} family")
    return f"{hf.format(i=int(m.group(1)))}.{inner[tuple(path[1:])]}"


def hf_module_names(config) -> dict[str, tuple[str, ...] | None]:
    """Every module name of ``config``'s model as ``transformers`` names it (``named_modules()``, the names PEFT's
    ``target_modules`` are matched against) → the rbjax path of an adapter target (:func:`module_path_of_hf`), or
    ``None`` for a module rbjax does not adapt (embeddings, norms, the LM head, containers)."""
    fam = _family(config)
    ours, hf = LAYER_PREFIX[fam]
    top, inside = OTHER_MODULES[fam]
    out: dict[str, tuple[str, ...] | None] = {n: None for n in top}
    for i in range(config.num_layers):
        layer = hf.format(i=i)
        out.update({layer + s: None for s in inside})
        out.update({f"{layer}.{n}": (ours.format(i=i),) + p for n, (p, _) in TARGETS[fam].items()})
    return out


def module_path_of_hf(config, name: str) -> tuple[str, ...]:
    """The inverse of :func:`hf_module_name` (``KeyError`` for a name that is no adapter target of the family)."""
    fam = _family(config)
    ours, hf = LAYER_PREFIX[fam]
    for inner, (p, _) in TARGETS[fam].items():
        m = re.fullmatch(re.escape(hf).replace(r"\{i\}", r"(\d+)") + r"\." + re.escape(inner), name)
        if m is not None and int(m.group(1)) < config.num_layers:
            return (ours.format(i=int(m.group(1))),) + p
    raise KeyError(f"{name} is not an adapter target of the {fam} family (targets: {', '.join(TARGETS[fam])})")


def _get(tree: dict, path: tuple):
    for k in path:
        tree = tree[k]
    return tree


def _find_prefix(params: dict, module: tuple) -> tuple:
    """The path under which ``params`` holds the model (``()``, or e.g. ``("gpt2",)`` for DST's tree)."""
    if _has(params, module):
        return ()
    for k, v in params.items():
        if isinstance(v, dict) and _has(v, module):
            return (k,)
    raise KeyError(f"no module {'/'.join(module)} in the parameter tree")


def _has(tree, path) -> bool:
    for k in path:
        if not isinstance(tree, dict) or k not in tree:
            return False
        tree = tree[k]
    return isinstance(tree, dict) and "kernel" in tree


def add_adapters(params: dict, config, spec: LoraSpec, seed: int, *, base_dtype=None) -> dict:
    """``params`` with a fresh adapter on every target module (module docstring): ``A`` uniform ±1/√in from
    ``fold_in(PRNGKey(seed), module index)``, ``B`` zero, ``scale`` = ``spec.scale``, ``dropout`` when > 0; all
    float32. The model may sit under one key of ``params`` (DST's ``{"gpt2": …, "head": …}``).

    Args:
        base_dtype: store the frozen base's floating-point leaves in this dtype (``jnp.bfloat16``: half the memory;
            the adapters stay float32). Arrays split over a mesh are cast where they lie.

    Raises:
        ValueError: a bad target name; a tree that already holds adapters.
    """
    if has_adapters(params):
        raise ValueError("the parameters already hold adapters")
    modules = target_modules(config, spec.targets)
    pre = _find_prefix(params, modules[0])
    if base_dtype is not None:
        def cast(x):
            if not jnp.issubdtype(x.dtype, jnp.floating):
                return x
            return x.astype(base_dtype) if isinstance(x, jax.Array) else np.asarray(x).astype(base_dtype)

        model = jax.tree.map(cast, _get(params, pre) if pre else params)
        params = {**params, pre[0]: model} if pre else model
    out = _copy_dicts(params)
    root = jax.random.PRNGKey(seed)
    for i, mod in enumerate(modules):
        node = _get(out, pre + mod)
        din, dout = node["kernel"].shape
        bound = 1.0 / math.sqrt(din)
        a = jax.random.uniform(jax.random.fold_in(root, i), (din, spec.rank), jnp.float32, -bound, bound)
        entry = {"A": np.asarray(a), "B": np.zeros((spec.rank, dout), np.float32),
                 "scale": np.asarray(spec.scale, np.float32)}
        if spec.dropout > 0:
            entry["dropout"] = np.asarray(spec.dropout, np.float32)
        node[LORA] = entry
    return out


def _copy_dicts(tree):
    return {k: _copy_dicts(v) for k, v in tree.items()} if isinstance(tree, dict) else tree


def has_adapters(params) -> bool:
    """The tree holds at least one adapter entry."""
    if not isinstance(params, dict):
        return False
    return any(k == LORA or has_adapters(v) for k, v in params.items())


def is_adapter_param(path: tuple) -> bool:
    """A trained adapter matrix (``…/lora/A`` or ``…/lora/B``) at dict-key ``path``; ``scale`` and ``dropout`` are
    fixed settings."""
    return len(path) >= 2 and path[-2] == LORA and path[-1] in ("A", "B")


def adapter_modules(params: dict, prefix: tuple = ()) -> dict[tuple, dict]:
    """``{module path: its adapter entry}`` of every adapted module of ``params``."""
    out = {}
    for k, v in params.items():
        if k == LORA:
            out[prefix] = v
        elif isinstance(v, dict):
            out.update(adapter_modules(v, prefix + (k,)))
    return out


def merge_adapters(params: dict) -> dict:
    """The plain model of an adapted tree: each adapted kernel replaced by ``kernel + scale · A @ B`` (float32) and
    the adapter entries removed; other leaves as they are. Equal to the unmerged adapted model to float32 rounding
    (tests: logits 1e-5)."""
    if not has_adapters(params):
        return params

    def walk(tree):
        if not isinstance(tree, dict):
            return tree
        if LORA in tree:
            a = tree[LORA]
            delta = np.asarray(a["A"], np.float32) @ np.asarray(a["B"], np.float32) * np.float32(a["scale"])
            kernel = np.asarray(jax.device_get(tree["kernel"]), np.float32) + delta
            return {**{k: v for k, v in tree.items() if k != LORA}, "kernel": kernel}
        return {k: walk(v) for k, v in tree.items()}

    return walk(params)


def strip_adapters(params: dict) -> dict:
    """The frozen base of an adapted tree (adapter entries removed)."""
    if not isinstance(params, dict):
        return params
    return {k: strip_adapters(v) for k, v in params.items() if k != LORA}


def adapter_param_count(config, spec: LoraSpec) -> int:
    """Trained adapter numbers (``A`` and ``B`` of every target) of ``config``'s model, from its shapes alone."""
    shapes = jax.eval_shape(lambda: family_of_config(config).init_params(config, 0))
    n = 0
    for mod in target_modules(config, spec.targets):
        din, dout = _get(shapes, mod)["kernel"].shape
        n += spec.rank * (din + dout)
    return n


def describe(spec: LoraSpec, config) -> dict[str, Any]:
    """The adapter's settings as recorded (results, model cards): rank, alpha, dropout, rsLoRA, scale and the
    resolved target module names."""
    return {"adapter": "lora", "rank": spec.rank, "alpha": spec.alpha, "dropout": spec.dropout,
            "rslora": spec.rslora, "scale": spec.scale, "targets": target_names(config, spec.targets)}
