"""Sentence representations for debiasing without training: the mean over a sentence's tokens of the model's final
hidden state (after the final norm, before the LM head), as bias-bench computes them for GPT-2 (docs/debiasing.md).

In the chat format a sentence is read inside its chat (:class:`rbjax.model.chat.ChatTurns`: the template's headers,
BOS and any system prompt before it, as LMB scoring presents a phrase): the model reads the whole rendered prefix,
and the mean is over the sentence's own tokens only (``n_context`` leading tokens are context, in no mean). On a
``mesh`` the parameters are laid out as the scorers lay them out (:func:`rbjax.model.partition.logical_axes_for`) and
the rows are split over its ``data``/``fsdp`` axes.

Every family's module returns that state as its second output (``return_logits=False`` skips the head), so one
function serves GPT-2, Llama/Mistral/Qwen2, GPT-NeoX and Gemma 2.
"""
from __future__ import annotations

from functools import partial
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rbjax.core.mesh import batch_axes, mesh_sizes, tree_shardings
from rbjax.core.precision import get_policy
from rbjax.core.padding import pad_sequences
from rbjax.model.layers import position_ids_from_mask
from rbjax.model.partition import logical_axes_for
from rbjax.model.registry import family_of_config

__all__ = ["mean_hidden_states", "sentence_representations"]


@partial(jax.jit, static_argnames=("config", "precision"))
def mean_hidden_states(params, input_ids, attention_mask, config, precision: str = "fp32", mean_mask=None):
    """(B, d) float32: the mean of the final hidden state over each row's real tokens (or its ``mean_mask`` ones).

    Args:
        params: the model's params (any registered family). input_ids: int32 (B, L), right-padded.
        attention_mask: int32 (B, L), 1 for real tokens (every row has at least one). config: the model config.
        precision: ``"fp32"`` or ``"bf16"`` compute.
        mean_mask: int32 (B, L), 1 for the tokens averaged (a subset of the real ones, at least one a row; chat
            format: the sentence's own tokens, not the template's); ``None``: ``attention_mask``.
    """
    policy = get_policy(precision)
    fam = family_of_config(config)
    with policy.matmul_context():
        model = fam.module(config, dtype=policy.compute_dtype)
        _, hidden = model.apply({"params": params}, input_ids, attention_mask=attention_mask,
                                position_ids=position_ids_from_mask(attention_mask), return_logits=False)
    m = (attention_mask if mean_mask is None else mean_mask).astype(jnp.float32)[..., None]
    return (hidden * m).sum(axis=1) / m.sum(axis=1)


def sentence_representations(params, config, token_ids: Sequence[Sequence[int]], *, bos_id: int | None = None,
                             batch_size: int = 32, precision: str = "fp32", normalize: bool = False,
                             n_context: Sequence[int] | None = None, mesh=None) -> np.ndarray:
    """(N, d) float64 representations of N tokenised sentences.

    Args:
        token_ids: each sentence's token ids (no special tokens; ``bos_id`` is put before each when given, and
            counts in the mean, as a tokenizer that adds a BOS gives it to bias-bench's model). In the chat format:
            each rendered chat up to the end of the sentence (:attr:`rbjax.model.chat.ChatSpan.ids`).
        n_context: per sentence, its leading ids that are context only (chat format: the template's text before
            the sentence, :attr:`rbjax.model.chat.ChatSpan.n_context`): read by the model, left out of the mean.
            ``None``: every id is the sentence's. Not with ``bos_id`` (a chat template writes its own BOS).
        batch_size: rows per forward call (the sentences are taken in order of length, so that a batch holds
            sentences of about one length, and right-padded to the batch's longest, rounded up to a multiple of 8 so
            that few shapes compile; on a mesh, rows padded up to a multiple of its row shards). The result is in
            the input order.
        normalize: divide each row by its L2 norm (SentenceDebias).
        mesh: a named mesh (:func:`rbjax.core.mesh.mesh_of`) the forward pass runs on, or ``None``: one device.
    Raises:
        ValueError: an empty sentence (no token of its own), ``n_context`` of another length or with ``bos_id``,
            or a sentence longer than the model's context.
    """
    if n_context is not None and bos_id is not None:
        raise ValueError("n_context (chat format) and bos_id are alternatives: the chat template writes the BOS")
    if n_context is not None and len(n_context) != len(token_ids):
        raise ValueError(f"n_context has {len(n_context)} entries for {len(token_ids)} sentences")
    seqs = [([bos_id] if bos_id is not None else []) + [int(t) for t in s] for s in token_ids]
    ctx = [0] * len(seqs) if n_context is None else [int(c) for c in n_context]
    limit = getattr(config, "max_positions", None)
    for i, (s, c) in enumerate(zip(seqs, ctx)):
        if len(s) <= c:
            raise ValueError(f"sentence {i} has no tokens" + (f" after its {c} context tokens" if c else ""))
        if limit is not None and len(s) > limit:
            raise ValueError(f"sentence {i} has {len(s)} tokens, more than the model's {limit} positions")
    rows = None
    if mesh is not None:  # parameters as the scorers lay them out; rows over the data/fsdp axes
        from jax.sharding import NamedSharding, PartitionSpec

        sizes = mesh_sizes(mesh)
        shards = sizes["data"] * sizes["fsdp"]
        params = jax.device_put(params, tree_shardings(params, mesh, logical_axes_for(config)))
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))  # little padding (stable: ties in input order)
    out = []
    for start in range(0, len(seqs), batch_size):
        idx = order[start:start + batch_size]
        chunk, cchunk = [seqs[i] for i in idx], [ctx[i] for i in idx]
        n_rows = len(chunk) if mesh is None else -(-len(chunk) // shards) * shards
        # few widths (the longest rounded up to 8): few compiled shapes
        ids, mask = pad_sequences(chunk, 0, multiple=8, max_width=limit, rows=n_rows)
        mean = mask.copy()
        for r, c in enumerate(cchunk):
            mean[r, :c] = 0  # the context's tokens: read, not averaged
        mask[len(chunk):, 0] = mean[len(chunk):, 0] = 1  # padding rows (a mesh's): one token, dropped below
        batch = [jnp.asarray(x) for x in (ids, mask, mean)]
        if mesh is not None:
            rows = NamedSharding(mesh, PartitionSpec(batch_axes(mesh, n_rows) or None))
            batch = [jax.device_put(x, rows) for x in batch]
        h = mean_hidden_states(params, batch[0], batch[1], config, precision,
                               None if n_context is None else batch[2])
        out.append(np.asarray(jax.device_get(h), dtype=np.float64)[:len(chunk)])
    reps = np.zeros((len(seqs), config.hidden_size))
    if out:
        reps[np.asarray(order)] = np.concatenate(out)
    if normalize:
        reps = reps / np.linalg.norm(reps, axis=1, keepdims=True)
    return reps
