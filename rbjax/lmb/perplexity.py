"""Per-phrase perplexity under a GPT-2 (paper §3.1), jit-compiled and batched.

Perplexity of a phrase with tokens x_1..x_n is ``exp(mean_{j=2..n} -log p(x_j | x_<j))``:
the mean next-token negative log-likelihood (natural log) over tokens 2..n, exactly as
the reference's ``perplexity_score`` computes it (HF GPT-2 loss with ``labels=ids``, no
BOS/EOS added). With ``bos=True`` an ``<|endoftext|>`` is prepended and all n tokens
are scored. A phrase with fewer than 2 scorable tokens has no perplexity: it is
reported as unscorable (NaN, ``n_scored == 0``), never as 0 (the reference's fallback).

Batches are right-padded to a length bucket and a fixed batch size, with a mask, so a
whole run compiles one shape per bucket. Padding never leaks into a score: padded keys
are masked out of attention and padded targets out of the loss.
"""
from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rbjax.model.gpt2 import GPT2Config, GPT2LMHeadModel, position_ids_from_mask

#: default length buckets (GPT-2 tokens; RedditBias phrases have 4-26): fine where phrases are dense, so little
#: compute goes to padding, and few enough that a run compiles a handful of programs (≈1 s each at the
#: DialoGPT-small shape on CPU); longer phrases go to multiples of 64
DEFAULT_BUCKETS: tuple[int, ...] = (4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 64)


#: vocabulary columns per step of the chunked log-sum-exp (see :func:`chunked_logsumexp`)
HEAD_CHUNK = 8192


def chunked_logsumexp(h, emb, chunk: int = HEAD_CHUNK):
    """``logsumexp(h @ emb.T, axis=-1)`` without materialising the (N, V) logits.

    The tied LM head of GPT-2 has V = 50257 columns; for a batch of 1024 positions its logits
    are 200 MB, and writing and re-reading them dominates scoring on CPU. This streams over
    ``chunk`` columns at a time with a running max / sum (exact up to fp32 rounding).

    Args:
        h: (N, d) float32 states; emb: (V, d) output embeddings.
    Returns:
        (N,) float32.
    """
    V = emb.shape[0]
    chunk = min(chunk, V)
    n = -(-V // chunk)

    def body(carry, i):
        m, s = carry
        start = jnp.minimum(i * chunk, V - chunk)  # the last chunk overlaps; its repeated columns are masked
        lg = h @ jax.lax.dynamic_slice_in_dim(emb, start, chunk, 0).T
        lg = jnp.where((start + jnp.arange(chunk))[None, :] >= i * chunk, lg, -jnp.inf)
        mn = jnp.maximum(m, lg.max(-1))
        s = s * jnp.exp(m - mn) + jnp.exp(lg - mn[:, None]).sum(-1)
        return (mn, s), None

    init = (jnp.full(h.shape[:1], -jnp.inf, h.dtype), jnp.zeros(h.shape[:1], h.dtype))
    (m, s), _ = jax.lax.scan(body, init, jnp.arange(n))
    return m + jnp.log(s)


@partial(jax.jit, static_argnames=("config",))
def token_nll(params, input_ids, attention_mask, config: GPT2Config):
    """Summed next-token NLL and scored-token count per row.

    Works for right- or left-padded rows (positions are counted from the first real
    token). Target j is scored when tokens j-1 and j are both real. The LM head's
    normaliser is computed by :func:`chunked_logsumexp`.

    Args:
        params: GPT-2 params pytree.
        input_ids: int32 (B, L).
        attention_mask: int32 (B, L), 1 for real tokens.
        config: static :class:`GPT2Config`.
    Returns:
        ``(nll_sum, n_scored)``: float32 (B,) in nats, int32 (B,).
    """
    model = GPT2LMHeadModel(config)
    pos = position_ids_from_mask(attention_mask)
    _, hidden = model.apply({"params": params}, input_ids, attention_mask=attention_mask, position_ids=pos,
                            return_logits=False)
    B, L, d = hidden.shape
    h = hidden[:, :-1].astype(jnp.float32)
    emb = params["wte"]["embedding"].astype(jnp.float32)
    targets = input_ids[:, 1:]
    tmask = (attention_mask[:, 1:] * attention_mask[:, :-1]).astype(jnp.float32)
    lse = chunked_logsumexp(h.reshape(-1, d), emb).reshape(B, L - 1)
    tgt = jnp.einsum("bld,bld->bl", h, emb[targets])
    nll = (lse - tgt) * tmask
    return nll.sum(-1), tmask.sum(-1).astype(jnp.int32)


class PhraseError(ValueError):
    """A phrase that cannot be scored; ``index`` is its position in the input list."""

    def __init__(self, index: int, message: str):
        super().__init__(f"phrase {index}: {message}")
        self.index = index
        self.problem = message


@dataclasses.dataclass(frozen=True)
class PhraseScores:
    """Scores of a list of phrases, in input order.

    Attributes:
        mean_nll: float64 (N,), mean next-token NLL in nats (NaN when unscorable).
        n_scored: int (N,), number of scored tokens (0 = unscorable).
        n_tokens: int (N,), phrase length in tokens (without an added BOS).
        nll_sum: float64 (N,), summed next-token NLL in nats (0 when unscorable); corpus-level
            estimators (e.g. LMP) pool these.
    """

    mean_nll: np.ndarray
    n_scored: np.ndarray
    n_tokens: np.ndarray
    nll_sum: np.ndarray

    @property
    def perplexity(self) -> np.ndarray:
        """exp(mean NLL); NaN for unscorable phrases."""
        return np.exp(self.mean_nll)

    @property
    def scorable(self) -> np.ndarray:
        return self.n_scored > 0


def _bucket(n: int, buckets: Sequence[int]) -> int:
    for b in buckets:
        if n <= b:
            return b
    return int(math.ceil(n / 64) * 64)


class PerplexityScorer:
    """Scores token-id sequences with a GPT-2 on the default JAX device.

    Args:
        params: GPT-2 params (numpy or jax arrays; moved to the device once).
        config: the model's :class:`GPT2Config`.
        batch_size: rows per compiled batch (phrases are sorted by length and cut into
            consecutive batches; only the last one is padded up with empty rows).
        buckets: length buckets; a run compiles at most one program per bucket used.
        bos_id: when given, prepend this id (e.g. 50256) and score every phrase token.
        precision: matmul precision (``"highest"`` keeps fp32 exact on GPU/TPU, where the
            default may use TF32/bf16 passes).
    """

    def __init__(self, params, config: GPT2Config, batch_size: int = 64,
                 buckets: Sequence[int] = DEFAULT_BUCKETS, bos_id: int | None = None,
                 precision: str = "highest"):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.config = config
        self.params = jax.device_put(params)
        self.batch_size = int(batch_size)
        self.buckets = tuple(sorted(buckets))
        self.bos_id = bos_id
        self.precision = precision

    def score_ids(self, token_ids: Sequence[Sequence[int]],
                  progress: Callable[[int], None] | None = None) -> PhraseScores:
        """Score token-id lists. ``progress(k)`` is called after each batch with its row count."""
        n = len(token_ids)
        seqs = [([self.bos_id] if self.bos_id is not None else []) + list(map(int, t)) for t in token_ids]
        lengths = np.array([len(s) for s in seqs], dtype=np.int64)
        max_pos = self.config.n_positions
        too_long = np.nonzero(lengths > max_pos)[0]
        if len(too_long):
            i = int(too_long[0])
            raise PhraseError(i, f"{int(lengths[i])} tokens, but the model takes at most {max_pos}")
        vmax = self.config.vocab_size
        for i, s in enumerate(seqs):
            if s and (min(s) < 0 or max(s) >= vmax):
                raise PhraseError(i, f"a token id outside the model vocabulary [0, {vmax})")
        nll_sum = np.zeros(n, dtype=np.float64)
        n_scored = np.zeros(n, dtype=np.int64)
        # Sort by length and cut into consecutive batches; each batch is padded to the bucket of
        # its longest phrase. Only the very last batch is partial, and at most one program is
        # compiled per bucket.
        order = [int(i) for i in np.argsort(lengths, kind="stable") if lengths[i] >= 2]
        with jax.default_matmul_precision(self.precision):
            for start in range(0, len(order), self.batch_size):
                rows = order[start:start + self.batch_size]
                L = min(_bucket(int(lengths[rows[-1]]), self.buckets), max_pos)
                ids = np.zeros((self.batch_size, L), dtype=np.int32)
                mask = np.zeros((self.batch_size, L), dtype=np.int32)
                for r, i in enumerate(rows):
                    ids[r, :lengths[i]] = seqs[i]
                    mask[r, :lengths[i]] = 1
                s, c = token_nll(self.params, ids, mask, self.config)
                s, c = np.asarray(s, dtype=np.float64), np.asarray(c)
                nll_sum[rows] = s[: len(rows)]
                n_scored[rows] = c[: len(rows)]
                if progress is not None:
                    progress(len(rows))
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(n_scored > 0, nll_sum / np.maximum(n_scored, 1), np.nan)
        n_tok = lengths - (1 if self.bos_id is not None else 0)
        if progress is not None:
            unscored = int(np.sum(lengths < 2))
            if unscored:
                progress(unscored)
        return PhraseScores(mean_nll=mean, n_scored=n_scored, n_tokens=n_tok, nll_sum=nll_sum)

    def score_texts(self, texts: Sequence[str], tokenizer, progress=None) -> PhraseScores:
        """Tokenise (no special tokens, as the reference) and score ``texts``."""
        return self.score_ids(tokenizer.encode_batch(list(texts)), progress=progress)
