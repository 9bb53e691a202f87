"""GPT-2's HF state-dict keys ⇄ rbjax parameter paths (the key map of the ``gpt2`` family).

HF PyTorch checkpoints store ``c_attn``/``c_proj``/``c_fc`` weights as ``Conv1D`` (in, out), which is rbjax's
layout, so they are copied without a transpose. The LM head is tied to ``wte``; a checkpoint without
``lm_head.weight`` is tied implicitly, and one whose ``lm_head.weight`` differs from ``wte`` is refused — unless the
config says ``tie_word_embeddings: false``: then ``lm_head.weight`` is the head ``lm_head`` of its own (HF
``GPT2LMHeadModel`` untied; a model debiased by a projection of its final state is exported so). HF's Flax layout (``flax_model.msgpack``) is read too: its
Conv1D kernels are stored (out, in).
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from rbjax.model.gpt2 import GPT2Config

# (HF key suffix inside a block, rbjax path inside a block, kind)
_BLOCK_MAP = [
    ("ln_1.weight", ("ln_1", "scale")), ("ln_1.bias", ("ln_1", "bias")),
    ("attn.c_attn.weight", ("attn", "c_attn", "kernel")), ("attn.c_attn.bias", ("attn", "c_attn", "bias")),
    ("attn.c_proj.weight", ("attn", "c_proj", "kernel")), ("attn.c_proj.bias", ("attn", "c_proj", "bias")),
    ("ln_2.weight", ("ln_2", "scale")), ("ln_2.bias", ("ln_2", "bias")),
    ("mlp.c_fc.weight", ("mlp", "c_fc", "kernel")), ("mlp.c_fc.bias", ("mlp", "c_fc", "bias")),
    ("mlp.c_proj.weight", ("mlp", "c_proj", "kernel")), ("mlp.c_proj.bias", ("mlp", "c_proj", "bias")),
]
_TOP_MAP = [
    ("wte.weight", ("wte", "embedding")), ("wpe.weight", ("wpe", "embedding")),
    ("ln_f.weight", ("ln_f", "scale")), ("ln_f.bias", ("ln_f", "bias")),
]
# HF buffers that are not parameters
_IGNORED = re.compile(r"(^|\.)attn\.(bias|masked_bias)$")


def _expected_shapes(cfg: GPT2Config) -> dict[tuple, tuple]:
    d, inner = cfg.n_embd, cfg.inner_dim
    shapes = {("wte", "embedding"): (cfg.vocab_size, d), ("wpe", "embedding"): (cfg.n_positions, d),
              ("ln_f", "scale"): (d,), ("ln_f", "bias"): (d,)}
    blk = {("ln_1", "scale"): (d,), ("ln_1", "bias"): (d,), ("ln_2", "scale"): (d,), ("ln_2", "bias"): (d,),
           ("attn", "c_attn", "kernel"): (d, 3 * d), ("attn", "c_attn", "bias"): (3 * d,),
           ("attn", "c_proj", "kernel"): (d, d), ("attn", "c_proj", "bias"): (d,),
           ("mlp", "c_fc", "kernel"): (d, inner), ("mlp", "c_fc", "bias"): (inner,),
           ("mlp", "c_proj", "kernel"): (inner, d), ("mlp", "c_proj", "bias"): (d,)}
    for i in range(cfg.n_layer):
        for k, s in blk.items():
            shapes[(f"h_{i}",) + k] = s
    if not cfg.tie_word_embeddings:
        shapes[("lm_head", "embedding")] = (cfg.vocab_size, d)
    return shapes


def _set(tree: dict, path: tuple, value) -> None:
    for p in path[:-1]:
        tree = tree.setdefault(p, {})
    tree[path[-1]] = value


def state_dict_to_params(state: dict[str, np.ndarray], cfg: GPT2Config, source: str = "checkpoint") -> dict:
    """Convert an HF PyTorch-layout state dict (numpy arrays) to an rbjax params pytree.

    Accepts keys with or without the ``transformer.`` prefix.

    Raises:
        ValueError: missing or unexpected keys, shape mismatches, or an ``lm_head`` that differs from ``wte`` under
            a tied config.
    """
    flat = {}
    for k, v in state.items():
        key = k[len("transformer."):] if k.startswith("transformer.") else k
        flat[key] = v
    params: dict = {}
    used = set()
    for hf, path in _TOP_MAP:
        if hf in flat:
            _set(params, path, flat[hf]); used.add(hf)
    for i in range(cfg.n_layer):
        for hf, path in _BLOCK_MAP:
            key = f"h.{i}.{hf}"
            if key in flat:
                _set(params, (f"h_{i}",) + path, flat[key]); used.add(key)
    if not cfg.tie_word_embeddings:
        if "lm_head.weight" in flat:
            _set(params, ("lm_head", "embedding"), flat["lm_head.weight"]); used.add("lm_head.weight")
    elif "lm_head.weight" in flat:
        used.add("lm_head.weight")
        if "wte.weight" in flat and not np.array_equal(np.asarray(flat["lm_head.weight"]), np.asarray(flat["wte.weight"])):
            raise ValueError(f"{source}: lm_head.weight differs from wte.weight, but config tie_word_embeddings "
                             "is true (a tied head)")
        if "wte.weight" not in flat:
            _set(params, ("wte", "embedding"), flat["lm_head.weight"])
    unexpected = sorted(k for k in flat if k not in used and not _IGNORED.search(k))
    if unexpected:
        raise ValueError(f"{source}: unexpected GPT-2 weights {unexpected[:8]}{' …' if len(unexpected) > 8 else ''}")
    _check(params, cfg, source)
    return params


def _check(params: dict, cfg: GPT2Config, source: str) -> None:
    from flax.traverse_util import flatten_dict

    got = flatten_dict(params)
    want = _expected_shapes(cfg)
    missing = sorted(".".join(k) for k in want if k not in got)
    if missing:
        raise ValueError(f"{source}: missing weights {missing[:8]}{' …' if len(missing) > 8 else ''}")
    for k, shape in want.items():
        if tuple(got[k].shape) != shape:
            raise ValueError(f"{source}: weight {'.'.join(k)} has shape {tuple(got[k].shape)}, config expects {shape}")
        dt = got[k].dtype if hasattr(got[k], "dtype") else np.asarray(got[k]).dtype  # a LazyTensor is not read
        if not np.issubdtype(dt, np.floating):
            raise ValueError(f"{source}: weight {'.'.join(k)} has dtype {dt}, expected floating point")


def flax_msgpack_to_state(path: Path) -> dict[str, np.ndarray]:
    """HF Flax GPT-2 weights (``flax_model.msgpack``) as a PyTorch-layout state dict."""
    from flax.serialization import msgpack_restore

    tree = msgpack_restore(path.read_bytes())
    if "transformer" in tree:
        tree = tree["transformer"]
    state = {}
    for name in ("wte", "wpe"):
        state[f"{name}.weight"] = np.asarray(tree[name]["embedding"])
    state["ln_f.weight"] = np.asarray(tree["ln_f"]["scale"])
    state["ln_f.bias"] = np.asarray(tree["ln_f"]["bias"])
    for i, blk in tree["h"].items():
        for ln in ("ln_1", "ln_2"):
            state[f"h.{i}.{ln}.weight"] = np.asarray(blk[ln]["scale"])
            state[f"h.{i}.{ln}.bias"] = np.asarray(blk[ln]["bias"])
        for mod, sub in (("attn", "c_attn"), ("attn", "c_proj"), ("mlp", "c_fc"), ("mlp", "c_proj")):
            # HF's FlaxConv1D stores its kernel (out, in) and transposes it at call time.
            state[f"h.{i}.{mod}.{sub}.weight"] = np.asarray(blk[mod][sub]["kernel"]).T
            state[f"h.{i}.{mod}.{sub}.bias"] = np.asarray(blk[mod][sub]["bias"])
    return state


def params_to_state_dict(params: dict, cfg: GPT2Config) -> dict[str, np.ndarray]:
    """The inverse of :func:`state_dict_to_params`: HF keys (``transformer.`` prefix), numpy float32."""
    state = {}
    get = lambda path: np.ascontiguousarray(np.asarray(_get(params, path), dtype=np.float32))  # noqa: E731
    for hf, path in _TOP_MAP:
        state[f"transformer.{hf}"] = get(path)
    for i in range(cfg.n_layer):
        for hf, path in _BLOCK_MAP:
            state[f"transformer.h.{i}.{hf}"] = get((f"h_{i}",) + path)
    if not cfg.tie_word_embeddings:
        state["lm_head.weight"] = get(("lm_head", "embedding"))
    return state


def _get(tree, path):
    for p in path:
        tree = tree[p]
    return tree
