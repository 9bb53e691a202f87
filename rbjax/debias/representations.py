"""Sentence representations for debiasing without training: the mean over a sentence's tokens of the model's final
hidden state (after the final norm, before the LM head), as bias-bench computes them for GPT-2 (docs/debiasing.md).

Every family's module returns that state as its second output (``return_logits=False`` skips the head), so one
function serves GPT-2, Llama/Mistral/Qwen2, GPT-NeoX and Gemma 2.
"""
from __future__ import annotations

from functools import partial
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rbjax.core.precision import get_policy
from rbjax.core.padding import pad_sequences
from rbjax.model.layers import position_ids_from_mask
from rbjax.model.registry import family_of_config

__all__ = ["mean_hidden_states", "sentence_representations"]


@partial(jax.jit, static_argnames=("config", "precision"))
def mean_hidden_states(params, input_ids, attention_mask, config, precision: str = "fp32"):
    """(B, d) float32: the mean of the final hidden state over each row's real tokens.

    Args:
        params: the model's params (any registered family). input_ids: int32 (B, L), right-padded.
        attention_mask: int32 (B, L), 1 for real tokens (every row has at least one). config: the model config.
        precision: ``"fp32"`` or ``"bf16"`` compute.
    """
    policy = get_policy(precision)
    fam = family_of_config(config)
    with policy.matmul_context():
        model = fam.module(config, dtype=policy.compute_dtype)
        _, hidden = model.apply({"params": params}, input_ids, attention_mask=attention_mask,
                                position_ids=position_ids_from_mask(attention_mask), return_logits=False)
    m = attention_mask.astype(jnp.float32)[..., None]
    return (hidden * m).sum(axis=1) / m.sum(axis=1)


def sentence_representations(params, config, token_ids: Sequence[Sequence[int]], *, bos_id: int | None = None,
                             batch_size: int = 32, precision: str = "fp32", normalize: bool = False) -> np.ndarray:
    """(N, d) float64 representations of N tokenised sentences.

    Args:
        token_ids: each sentence's token ids (no special tokens; ``bos_id`` is put before each when given, and
            counts in the mean, as a tokenizer that adds a BOS gives it to bias-bench's model).
        batch_size: rows per forward call (sentences are right-padded to the batch's longest, rounded up to a
            multiple of 8 so that few shapes compile). normalize: divide each row by its L2 norm (SentenceDebias).
    Raises:
        ValueError: an empty sentence (no token at all), or one longer than the model's context.
    """
    seqs = [([bos_id] if bos_id is not None else []) + [int(t) for t in s] for s in token_ids]
    limit = getattr(config, "max_positions", None)
    for i, s in enumerate(seqs):
        if not s:
            raise ValueError(f"sentence {i} has no tokens")
        if limit is not None and len(s) > limit:
            raise ValueError(f"sentence {i} has {len(s)} tokens, more than the model's {limit} positions")
    out = []
    for start in range(0, len(seqs), batch_size):
        chunk = seqs[start:start + batch_size]
        ids, mask = pad_sequences(chunk, 0, multiple=8, max_width=limit)  # few widths: few compiled shapes
        out.append(np.asarray(mean_hidden_states(params, jnp.asarray(ids), jnp.asarray(mask), config, precision),
                              dtype=np.float64))
    reps = np.concatenate(out) if out else np.zeros((0, config.hidden_size))
    if normalize:
        reps = reps / np.linalg.norm(reps, axis=1, keepdims=True)
    return reps
