"""The causal-LM pieces that training objectives share: run the model on a micro-batch in either token layout, and
the mean next-token NLL of the targets a mask marks.

A micro-batch comes in the padded layout (``input_ids``/``attention_mask`` ``(B, L)``, one row per example) or, with
``pack`` ``(R, Lp)`` and ``unpack`` ``(B, L)`` (:func:`rbjax.train.batching.pack_index`), in the packed layout: the
examples' tokens side by side in a few rows, each slot attending only to the earlier slots of its own example
(block-diagonal causal mask from segment ids) at the example's own position ids, so every real token gets the
state it gets in the padded layout. Objectives read the states back in the padded ``(B, L, d)`` shape and never
depend on the layout (``tests/test_packed.py``: packed = padded for every objective).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from rbjax.model.layers import gather_positions, position_ids_from_mask
from rbjax.model.nll import nll_from_hidden
from rbjax.model.registry import family_of_config

__all__ = ["forward_hidden", "forward_at", "mean_next_token_nll", "forward_and_nll", "lm_loss"]


def _packed_inputs(batch: dict):
    """The model's inputs on the packed rows: ``(ids, position_ids, query × key mask, src, real)``, all (R, Lp)
    but the mask (R, Lp, Lp): each slot attends to the earlier slots of its own example, at the example's own
    positions; ``src`` is each slot's flat padded index (0 where empty), ``real`` which slots hold a token."""
    ids, mask, pack = batch["input_ids"], batch["attention_mask"], batch["pack"]
    L = ids.shape[1]
    real = pack >= 0
    src = jnp.where(real, pack, 0)
    p_ids = jnp.where(real, ids.reshape(-1)[src], 0)
    pos = jnp.where(real, position_ids_from_mask(mask).reshape(-1)[src], 0)
    seg = jnp.where(real, pack // L, -1)
    attn = seg[:, :, None] == seg[:, None, :]  # block-diagonal; the model ANDs the causal mask
    return p_ids, pos, attn, src, real


def forward_hidden(model, params, batch: dict, drop: bool, key):
    """Final hidden states of a micro-batch, in the padded layout ``(B, L, d)``, and the rows the model ran on.

    Args:
        model: the family's Flax module (``return_logits=False`` gives ``(_, hidden)``). params: its parameters.
        batch: ``input_ids``/``attention_mask`` ``(B, L)``; packed layout: also ``pack`` ``(R, Lp)`` (flat padded
            index of each slot, -1 for an empty slot) and ``unpack`` ``(B, L)`` (flat packed index of each padded
            position, -1 at padding). drop: dropout active. key: the dropout PRNG key (``None`` without dropout).

    Returns:
        ``(hidden, rows)``: float32 ``(B, L, d)`` (zeros at padding in the packed layout, which no loss reads) and
        ``rows = (h_rows, ids_rows, src, real)``, the states and ids of the rows the model ran on, ``src`` the flat
        padded index of each slot and ``real`` which slots hold a token (for :func:`mean_next_token_nll`).
    """
    ids, mask = batch["input_ids"], batch["attention_mask"]
    rngs = None if not drop else {"dropout": key}
    if "pack" not in batch:
        _, hidden = model.apply({"params": params}, ids, attention_mask=mask, deterministic=not drop, rngs=rngs,
                                return_logits=False)
        hidden = hidden.astype(jnp.float32)
        B, L = ids.shape
        return hidden, (hidden, ids, jnp.arange(B * L, dtype=jnp.int32).reshape(B, L), mask > 0)
    unpack = batch["unpack"]
    p_ids, pos, attn, src, real = _packed_inputs(batch)
    _, h_rows = model.apply({"params": params}, p_ids, attention_mask=attn, position_ids=pos,
                            deterministic=not drop, rngs=rngs, return_logits=False)
    h_rows = h_rows.astype(jnp.float32)
    d = h_rows.shape[-1]
    hidden = jnp.where((unpack >= 0)[..., None], h_rows.reshape(-1, d)[jnp.maximum(unpack, 0)], 0.0)
    return hidden, (h_rows, p_ids, src, real)


def forward_at(model, params, batch: dict, drop: bool, key, positions) -> jax.Array:
    """Final hidden states of a micro-batch at one padded position per example, in either layout: what a
    classifier on a pooled token reads (the DST objective, paper §3.2). The model's last layer computes its outputs
    at those positions only (``query_positions`` of the families' ``__call__``); the states equal
    :func:`forward_hidden`'s at them.

    Args:
        model, params, batch, drop, key: as :func:`forward_hidden`.
        positions: int (B,), a position of each example in the padded ``(B, L)`` layout (its last real token).

    Returns:
        float32 ``(B, d)``; zeros for an example without tokens in the packed layout (the filler rows of a short
        last batch, which no loss counts).
    """
    ids, mask = batch["input_ids"], batch["attention_mask"]
    rngs = None if not drop else {"dropout": key}
    positions = positions.astype(jnp.int32)
    if "pack" not in batch:
        _, h = model.apply({"params": params}, ids, attention_mask=mask, deterministic=not drop, rngs=rngs,
                           return_logits=False, query_positions=positions[:, None])
        return h[:, 0].astype(jnp.float32)
    p_ids, pos, attn, _, _ = _packed_inputs(batch)
    R, Lp = p_ids.shape
    B = ids.shape[0]
    flat = gather_positions(batch["unpack"], positions[:, None])[:, 0]  # (B,) packed slot, -1: none
    row, slot = jnp.maximum(flat, 0) // Lp, jnp.maximum(flat, 0) % Lp
    # every row asks for every example's slot (the others' are dummies at slot 0): B query rows per packed row
    sel = jnp.where(row[None, :] == jnp.arange(R, dtype=jnp.int32)[:, None], slot[None, :], 0)
    _, h = model.apply({"params": params}, p_ids, attention_mask=attn, position_ids=pos, deterministic=not drop,
                       rngs=rngs, return_logits=False, query_positions=sel)
    h = h[row, jnp.arange(B)].astype(jnp.float32)
    return jnp.where((flat >= 0)[:, None], h, 0.0)


def mean_next_token_nll(config, params, rows, score_mask, context_mask, *, compute_dtype=None) -> jax.Array:
    """Mean next-token NLL (nats) of the targets ``score_mask`` ``(B, L)`` marks, predicted from real tokens
    (``context_mask`` ``(B, L)``), over the rows the model ran on (:func:`forward_hidden`).

    The one next-token NLL of rbjax (:func:`rbjax.model.nll.nll_from_hidden`: chunked log-sum-exp over the LM head
    ``Family.lm_head(params)`` with the family's logit soft-cap, never the ``(B, L, V)`` logits), shared with the LMB
    scorer. A slot predicts the next slot when both hold consecutive tokens of the same example, so the targets and
    their count are those of the padded layout. ``compute_dtype``: the matmul dtype of a bf16 policy (``None``:
    float32). Returns a scalar; 0 when no target is marked.
    """
    h_rows, ids_rows, src, real = rows
    sf, cf = score_mask.reshape(-1), context_mask.reshape(-1)
    L = score_mask.shape[-1]  # consecutive slots of one example: next flat index, not the start of a padded row
    pair = real[:, 1:] & real[:, :-1] & (src[:, 1:] == src[:, :-1] + 1) & (src[:, 1:] % L != 0)
    m = (pair * sf[src[:, 1:]] * cf[src[:, :-1]]).astype(jnp.float32)
    fam = family_of_config(config)
    nll = nll_from_hidden(h_rows[:, :-1], fam.lm_head(params), ids_rows[:, 1:], compute_dtype=compute_dtype,
                          softcap=fam.logit_softcap(config))
    return jnp.sum(nll * m) / jnp.maximum(jnp.sum(m), 1.0)


def forward_and_nll(params, batch: dict, key, spec, score_mask):
    """The model of ``spec`` (its family, at the precision policy's compute dtype; dropout when ``key`` is given) on
    a micro-batch in either layout, and the mean next-token NLL of the targets ``score_mask`` ``(B, L)`` marks, every
    real token predicting: the causal-LM part of the debiasing and CRG objectives.

    Returns:
        ``(hidden, nll)``: float32 ``(B, L, d)`` final hidden states in the padded layout and the scalar NLL (nats).
    """
    model = family_of_config(spec.config).module(spec.config, dtype=spec.compute_dtype)
    hidden, rows = forward_hidden(model, params, batch, key is not None, key)
    nll = mean_next_token_nll(spec.config, params, rows, score_mask, batch["attention_mask"],
                              compute_dtype=spec.nll_dtype)
    return hidden, nll


def lm_loss(logits: jax.Array, input_ids: jax.Array, attention_mask: jax.Array,
            context_mask: jax.Array | None = None) -> jax.Array:
    """Causal LM loss from full logits: mean next-token cross-entropy (nats) over the real targets of a batch.

    The training step computes the same quantity from the final hidden states (:func:`mean_next_token_nll`),
    without materialising the ``(B, L, V)`` logits; this function is for callers that hold logits (and is tested
    equal to it and to PyTorch's ``labels=`` loss).

    Logit ``i`` is scored against token ``i+1``; a target counts when both tokens are real (right padding).

    Args:
        logits: ``(B, L, V)`` float32. input_ids, attention_mask: ``(B, L)``.
        context_mask: ``(B, L)`` real tokens that may *predict* (default: ``attention_mask``); with it,
            ``attention_mask`` marks the tokens to be *scored* (e.g. only a response after its context).

    Returns:
        scalar; 0 when the batch has no target.
    """
    lg = logits[:, :-1].astype(jnp.float32)
    tgt = input_ids[:, 1:]
    ctx = attention_mask if context_mask is None else context_mask
    m = (attention_mask[:, 1:] * ctx[:, :-1]).astype(jnp.float32)
    nll = jax.nn.logsumexp(lg, axis=-1) - jnp.take_along_axis(lg, tgt[..., None], axis=-1)[..., 0]
    return jnp.sum(nll * m) / jnp.maximum(jnp.sum(m), 1.0)
