"""Logical axis names of every model family's parameters (the levanter / maxtext way).

Each family declares, once, a table of ``(path pattern, logical names)``: the names of a parameter's dimensions,
e.g. ``("vocab", "embed")`` for an embedding matrix, ``("embed", "mlp")`` for an MLP input kernel, ``("mlp",
"embed")`` for its output kernel, ``("embed", "heads")`` for a query projection and ``("heads", "embed")`` for the
attention output. :func:`logical_axes_for` turns a config into the function :func:`rbjax.core.mesh.tree_shardings`
takes; :data:`rbjax.core.mesh.DEFAULT_RULES` map the names to mesh axes (``embed`` → ``fsdp``; ``vocab``, ``heads``,
``kv_heads``, ``qkv``, ``mlp`` → ``tensor``). Norm scales, biases of the embedding width and position embeddings'
position axis are not split (``None``).

Names:

=========  =====================================================================================================
vocab      the vocabulary (embedding / LM-head rows)
embed      the residual-stream width d
heads      query heads × head_dim (columns of q, rows of the attention output)
kv_heads   key/value heads × head_dim (grouped-query k, v)
qkv        GPT-2's / GPT-NeoX's fused [q | k | v] (or per-head interleaved) columns
mlp        the MLP's inner width
=========  =====================================================================================================

Splitting a fused ``qkv`` column block over ``tensor`` is correct whatever the layout (XLA's SPMD partitioner
inserts the communication a split head needs), but costs more communication than separate q/k/v projections; see
docs/scale.md.

Low-rank adapters (``…/lora/A``, ``…/lora/B`` and their settings, :mod:`rbjax.model.lora`) name no dimension: they
are replicated over ``tensor``, and ``fsdp`` splits the largest dimension of a matrix it divides, as for any
parameter (:func:`rbjax.core.mesh.logical_spec`), so an adapter's Adam moments are split like the base's.

A parameter path no table entry matches raises ``KeyError`` naming it (a new parameter must be named, never
silently replicated).
"""
from __future__ import annotations

import re
from typing import Any, Callable

from rbjax.model import registry
from rbjax.model.layers import LORA

__all__ = ["LOGICAL_AXES", "logical_axes_for", "logical_axes_of_family"]

_V = (None,)  # a vector that is not split

#: family name -> [(regex searched in the "/"-joined dict path, logical names)], first match wins
LOGICAL_AXES: dict[str, list[tuple[str, tuple]]] = {
    "gpt2": [
        (r"(^|/)(wte|lm_head)/embedding$", ("vocab", "embed")),
        (r"(^|/)wpe/embedding$", (None, "embed")),
        (r"/attn/c_attn/kernel$", ("embed", "qkv")),
        (r"/attn/c_attn/bias$", ("qkv",)),
        (r"/attn/c_proj/kernel$", ("heads", "embed")),
        (r"/mlp/c_fc/kernel$", ("embed", "mlp")),
        (r"/mlp/c_fc/bias$", ("mlp",)),
        (r"/mlp/c_proj/kernel$", ("mlp", "embed")),
        (r"/(bias|scale)$", _V),
    ],
    "llama": [
        (r"(^|/)(embed_tokens|lm_head)/embedding$", ("vocab", "embed")),
        (r"/self_attn/q_proj/kernel$", ("embed", "heads")),
        (r"/self_attn/q_proj/bias$", ("heads",)),
        (r"/self_attn/[kv]_proj/kernel$", ("embed", "kv_heads")),
        (r"/self_attn/[kv]_proj/bias$", ("kv_heads",)),
        (r"/self_attn/o_proj/kernel$", ("heads", "embed")),
        (r"/mlp/(gate_proj|up_proj)/kernel$", ("embed", "mlp")),
        (r"/mlp/(gate_proj|up_proj)/bias$", ("mlp",)),
        (r"/mlp/down_proj/kernel$", ("mlp", "embed")),
        (r"/(bias|scale)$", _V),
    ],
    "gpt_neox": [
        (r"(^|/)(embed_in|embed_out)/embedding$", ("vocab", "embed")),
        (r"/attention/query_key_value/kernel$", ("embed", "qkv")),
        (r"/attention/query_key_value/bias$", ("qkv",)),
        (r"/attention/dense/kernel$", ("heads", "embed")),
        (r"/mlp/dense_h_to_4h/kernel$", ("embed", "mlp")),
        (r"/mlp/dense_h_to_4h/bias$", ("mlp",)),
        (r"/mlp/dense_4h_to_h/kernel$", ("mlp", "embed")),
        (r"/(bias|scale)$", _V),
    ],
}
LOGICAL_AXES["gemma2"] = LOGICAL_AXES["llama"]  # same parameter names (plus more norm scales)


def logical_axes_of_family(family: str) -> Callable[[tuple, tuple], tuple | None]:
    """``(dict path, shape) -> logical names`` for ``family``'s parameters (and Adam moments, same paths).

    Raises:
        KeyError: an unknown family, or (when called) a path no entry of the family's table matches.
    """
    table = [(re.compile(p), names) for p, names in LOGICAL_AXES[family]]

    def axes(path: tuple, shape: tuple) -> tuple | None:
        if LORA in path:  # a low-rank adapter (rbjax.model.lora): no named dimension (fsdp may take its largest)
            return (None,) * len(shape)
        s = "/".join(path)
        for rx, names in table:
            if rx.search("/" + s if not s.startswith("/") else s):
                if len(names) != len(shape):
                    raise ValueError(f"{family} parameter {s}: logical axes {names} but shape {tuple(shape)}")
                return names
        raise KeyError(f"{family} parameter {s!r} (shape {tuple(shape)}) has no logical axes in "
                       f"rbjax.model.partition.LOGICAL_AXES[{family!r}]")

    return axes


def logical_axes_for(config: Any) -> Callable[[tuple, tuple], tuple | None]:
    """The logical-axes function of ``config``'s family (:func:`rbjax.model.registry.family_of_config`)."""
    return logical_axes_of_family(registry.family_of_config(config).name)
