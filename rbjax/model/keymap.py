"""HF state-dict keys ⇄ rbjax parameter paths for the families built from ``nn.Linear`` layers.

A family lists its entries ``(hf_key, param_path, transpose)``: ``transpose`` for ``nn.Linear`` weights, stored
(out, in) by PyTorch and (in, out) by rbjax; embeddings and norm weights are copied as they are. One conversion
in each direction checks what a checkpoint holds against the shapes the family's own ``init`` gives, so a missing,
unexpected or mis-shaped weight is named instead of loaded wrongly.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

Entry = tuple  # (hf_key: str, path: tuple[str, ...], transpose: bool)


def expected_shapes(module, dummy_len: int = 2) -> dict[tuple, tuple]:
    """Parameter shapes of a family module, from its ``init`` traced abstractly (no arrays are allocated)."""
    tree = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), jnp.zeros((1, dummy_len), jnp.int32)))
    return {k: tuple(v.shape) for k, v in flatten_dict(tree["params"]).items()}


def from_hf(state: dict, entries: list[Entry], shapes: dict[tuple, tuple], source: str, family: str,
            ignore: re.Pattern | None = None) -> dict:
    """Params pytree (float32 numpy) from a flat HF state dict.

    Raises:
        ValueError: unexpected keys (named, first 8), missing weights, a shape that differs from the config's, or a
            non-floating dtype — each naming ``source``.
    """
    params = {}
    used = set()
    for hf, path, transpose in entries:
        if hf not in state:
            continue
        a = state[hf]
        lazy = hasattr(a, "read") and hasattr(a, "shape")  # rbjax.model.hf.LazyTensor: read slice by slice later
        a = a if lazy else np.asarray(a)
        if not np.issubdtype(a.dtype, np.floating):
            raise ValueError(f"{source}: weight {hf} has dtype {a.dtype}, expected floating point")
        params[path] = ((a.T if transpose else a) if lazy else
                        np.ascontiguousarray((a.T if transpose else a).astype(np.float32, copy=False)))
        used.add(hf)
    unexpected = sorted(k for k in state if k not in used and not (ignore is not None and ignore.search(k)))
    if unexpected:
        raise ValueError(f"{source}: unexpected {family} weights {unexpected[:8]}{' …' if len(unexpected) > 8 else ''}"
                         " (a different architecture or config?)")
    by_path = {path: hf for hf, path, _ in entries}
    missing = sorted(by_path[p] for p in shapes if p not in params)
    if missing:
        raise ValueError(f"{source}: missing weights {missing[:8]}{' …' if len(missing) > 8 else ''}")
    for p, want in shapes.items():
        got = params[p].shape
        if tuple(got) != want:
            hf_shape = got[::-1] if dict((e[1], e[2]) for e in entries)[p] else got
            want_hf = want[::-1] if dict((e[1], e[2]) for e in entries)[p] else want
            raise ValueError(f"{source}: weight {by_path[p]} has shape {tuple(hf_shape)}, config expects "
                             f"{tuple(want_hf)}")
    return unflatten_dict(params)


def to_hf(params: dict, entries: list[Entry]) -> dict[str, np.ndarray]:
    """The flat HF state dict (float32 numpy, contiguous) of a params pytree."""
    flat = flatten_dict(params)
    out = {}
    for hf, path, transpose in entries:
        if path in flat:
            a = np.asarray(flat[path], dtype=np.float32)
            out[hf] = np.ascontiguousarray(a.T if transpose else a)
    return out


def tied_head(state: dict, emb_key: str, head_key: str, source: str) -> None:
    """With tied embeddings a checkpoint may also hold the head; it must equal the embedding (then it is dropped
    from ``state``), else the checkpoint is not the tied model its config says.

    Raises:
        ValueError: naming both keys.
    """
    if head_key in state:
        if emb_key in state and not np.array_equal(np.asarray(state[head_key]), np.asarray(state[emb_key])):
            raise ValueError(f"{source}: {head_key} differs from {emb_key} but config tie_word_embeddings is true")
        if emb_key not in state:
            state[emb_key] = state[head_key]
        del state[head_key]
