"""Next-token negative log-likelihood from final hidden states and the output embedding (the LM head) — one implementation for
scoring (LMB, LMP) and training (the LM loss).

The LM head is ``logits = h @ emb.T`` with ``emb`` the (V, d) output embedding — GPT-2's tied ``wte`` (V = 50,257
columns), or an untied head (Llama, GPT-NeoX: :attr:`rbjax.model.registry.Family.lm_head`). Gemma 2 soft-caps the
logits, ``z ↦ cap·tanh(z/cap)`` (``softcap``; :attr:`rbjax.model.registry.Family.logit_softcap`), before the
softmax: every function here takes ``softcap`` and applies it to every logit, in the log-sum-exp and to the
target's logit, with the exact gradient. The NLL of target ``t`` at a position with final
state ``h`` is ``logsumexp(h @ wte.T) − h · wte[t]`` (natural log, nats). Materialising the (positions × V) logits
costs 200 MB per 1,024 positions, and writing and re-reading them dominates on CPU, so the log-sum-exp is streamed
over vocabulary chunks with a running max (:func:`chunked_logsumexp`), forward and backward: its gradient is a
custom VJP that recomputes the softmax from the saved log-sum-exp. Under differentiation (training) both passes
take all the columns in one step while the (positions × V) float32 logits fit in :data:`HEAD_GRAD_BYTES` — a
micro-batch's positions are few, a loop over chunks costs more than the bytes it saves, and XLA then computes the
logits once for both passes (benchmarks/RESULTS.md, "The LM head under differentiation") — and stream over chunks
above it, so a long batch never stores the logits. The backward's matmuls are traced when the gradient is taken, so
the caller takes it under the same matmul precision as the loss (:func:`rbjax.train.step.train_step` does): traced
under another one they would compute the logits again, and in that precision.

Precision: ``compute_dtype=jnp.bfloat16`` feeds the matmuls bf16 inputs with float32 accumulation; the running
max, the sum of exponentials and the log are always float32. ``None`` (default) computes in float32.
"""
from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp

from rbjax.model.layers import soft_cap

__all__ = ["HEAD_CHUNK", "HEAD_GRAD_BYTES", "chunked_logsumexp", "nll_from_hidden", "next_token_nll",
           "mean_next_token_nll"]

#: at most this many vocabulary columns per step of the streamed log-sum-exp
HEAD_CHUNK = 8192

#: under differentiation the log-sum-exp computes all vocabulary columns in one step (no loop) while positions × V
#: × 4 bytes stay within this; beyond it, it streams over :data:`HEAD_CHUNK`-column chunks. Training's memory plan
#: already counts the logits and their gradient (:mod:`rbjax.model.memory`).
HEAD_GRAD_BYTES = 512 * 2**20


def _grad_chunk(h, V: int, chunk: int) -> int:
    """The chunk width of the differentiated log-sum-exp: all ``V`` columns while the logits fit
    :data:`HEAD_GRAD_BYTES`, else ``chunk``."""
    return V if math.prod(h.shape[:-1]) * V * 4 <= HEAD_GRAD_BYTES else chunk


def _chunks(V: int, max_chunk: int) -> tuple[int, int]:
    """(number of chunks, chunk width): the fewest chunks of at most ``max_chunk`` columns, as even as possible,
    so the last (overlapping) chunk repeats fewer than ``n`` columns (50,257 → 7 × 7,180)."""
    n = -(-V // max(1, min(max_chunk, V)))
    return n, -(-V // n)


def _dot_t(a, b, dt):
    """``a @ b.T`` with ``dt`` inputs and float32 accumulation."""
    return jax.lax.dot_general(a.astype(dt), b.astype(dt), (((a.ndim - 1,), (1,)), ((), ())),
                               preferred_element_type=jnp.float32)


def _lse_forward(h, emb, chunk, cdt, cap):
    V = emb.shape[0]
    n, c = _chunks(V, chunk)
    overlap = n * c - V
    hc = h.astype(cdt)

    def body(carry, i):
        m, s = carry
        start = jnp.minimum(i * c, V - c)  # the last chunk is shifted left; its repeated columns are masked
        lg = soft_cap(_dot_t(hc, jax.lax.dynamic_slice_in_dim(emb, start, c, 0), cdt), cap)
        if overlap:
            lg = jnp.where((start + jnp.arange(c)) >= i * c, lg, -jnp.inf)
        mn = jnp.maximum(m, lg.max(-1))
        s = s * jnp.exp(m - mn) + jnp.exp(lg - mn[..., None]).sum(-1)
        return (mn, s), None

    shape = h.shape[:-1]
    init = (jnp.full(shape, -jnp.inf, jnp.float32), jnp.zeros(shape, jnp.float32))
    (m, s), _ = jax.lax.scan(body, init, jnp.arange(n))
    return m + jnp.log(s)


@partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _lse(h, emb, chunk, cdt, cap):
    return _lse_forward(h, emb, chunk, cdt, cap)


def _lse_fwd(h, emb, chunk, cdt, cap):
    lse = _lse_forward(h, emb, _grad_chunk(h, emb.shape[0], chunk), cdt, cap)
    return lse, (h, emb, lse)


def _lse_bwd(chunk, cdt, cap, res, g):
    h, emb, lse = res
    V, d = emb.shape
    lead = h.shape[:-1]
    n, c = _chunks(V, _grad_chunk(h, V, chunk))
    overlap = n * c - V
    hc = h.astype(cdt)
    hf = hc.reshape(-1, d)
    gf = g.reshape(-1).astype(jnp.float32)
    lf = lse.reshape(-1)

    def body(dh, i):
        start = jnp.minimum(i * c, V - c)
        e = jax.lax.dynamic_slice_in_dim(emb, start, c, 0)
        z = soft_cap(_dot_t(hf, e, cdt), cap)
        p = jnp.exp(z - lf[:, None]) * gf[:, None]  # g · softmax, this chunk's columns
        if cap is not None:  # d(cap·tanh(x/cap))/dx = 1 − tanh² = 1 − (z/cap)²
            p = p * (1.0 - jnp.square(z / jnp.float32(cap)))
        if overlap:
            p = jnp.where((start + jnp.arange(c)) >= i * c, p, 0.0)
        dh = dh + jnp.dot(p.astype(cdt), e.astype(cdt), preferred_element_type=jnp.float32)
        de = jax.lax.dot_general(p.astype(cdt), hf, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        return dh, de

    dh, des = jax.lax.scan(body, jnp.zeros(hf.shape, jnp.float32), jnp.arange(n))
    de = jnp.concatenate([des[:-1].reshape(-1, d), des[-1, overlap:]], axis=0) if n > 1 else des[0]
    return dh.reshape(*lead, d).astype(h.dtype), de.astype(emb.dtype)


_lse.defvjp(_lse_fwd, _lse_bwd)


def chunked_logsumexp(h, emb, chunk: int = HEAD_CHUNK, compute_dtype=None, softcap: float | None = None):
    """``logsumexp(h @ emb.T, axis=-1)`` without materialising the (…, V) logits, differentiable (with ``softcap``:
    ``logsumexp(softcap · tanh(h @ emb.T / softcap))``).

    Streams over vocabulary chunks of at most ``chunk`` columns with a running max / sum (exact up to float32
    rounding). Differentiated, it takes all columns at once while positions × V × 4 bytes stay within
    :data:`HEAD_GRAD_BYTES` (faster), else chunk by chunk; its gradient (custom VJP) recomputes the softmax from
    the saved result, so beyond that budget memory stays O(positions × chunk).

    Args:
        h: (..., d) final hidden states. emb: (V, d) output embeddings (GPT-2: ``params['wte']['embedding']``).
        chunk: at most this many columns per step. compute_dtype: matmul input dtype (``None``: float32).
        softcap: final-logit soft-cap (Gemma 2's ``final_logit_softcapping``) or ``None``.
    Returns:
        float32 (...).
    """
    cdt = jnp.dtype(compute_dtype or jnp.float32)
    return _lse(h, emb, int(chunk), cdt, None if softcap is None else float(softcap))


def nll_from_hidden(h, emb, targets, *, chunk: int = HEAD_CHUNK, compute_dtype=None, softcap: float | None = None):
    """Next-token NLL (nats) of ``targets`` given the final states ``h`` that predict them.

    Args:
        h: (N, d) or (..., d) hidden states. emb: (V, d) output embedding (the LM head).
        targets: int, ``h.shape[:-1]`` (one target per state) or ``h.shape[:-1] + (K,)`` (K targets scored from
            the same state: the log-sum-exp is computed once, e.g. the two continuations of a shared prefix).
        softcap: final-logit soft-cap or ``None`` (see the module docstring).
    Returns:
        float32, the shape of ``targets``: ``logsumexp(z) − z[target]`` with ``z = h @ emb.T`` (soft-capped).
    """
    cdt = jnp.dtype(compute_dtype or jnp.float32)
    lse = chunked_logsumexp(h, emb, chunk, cdt, softcap)
    multi = targets.ndim == h.ndim
    e = emb[targets]  # (..., [K,] d)
    hh = h[..., None, :] if multi else h
    tgt = jnp.sum(hh.astype(cdt).astype(jnp.float32) * e.astype(cdt).astype(jnp.float32), axis=-1)
    tgt = soft_cap(tgt, None if softcap is None else float(softcap))
    return (lse[..., None] if multi else lse) - tgt


def next_token_nll(hidden, emb, input_ids, attention_mask, *, chunk: int = HEAD_CHUNK, compute_dtype=None,
                   softcap: float | None = None):
    """Per-position next-token NLL of padded rows: position i predicts token i+1.

    A target j counts when tokens j−1 and j are both real (right or left padding, as the attention mask says).

    Args:
        hidden: (B, L, d) final hidden states (``GPT2LMHeadModel(..., return_logits=False)[1]``).
        emb: (V, d) output embedding. input_ids: int (B, L). attention_mask: (B, L), 1 for real tokens.
        softcap: final-logit soft-cap or ``None``.
    Returns:
        ``(nll, mask)``: float32 (B, L−1) NLL in nats (0 where masked) and the float32 (B, L−1) target mask.
    """
    m = (attention_mask[:, 1:] * attention_mask[:, :-1]).astype(jnp.float32)
    nll = nll_from_hidden(hidden[:, :-1], emb, input_ids[:, 1:], chunk=chunk, compute_dtype=compute_dtype,
                          softcap=softcap)
    return nll * m, m


def mean_next_token_nll(hidden, emb, input_ids, attention_mask, *, chunk: int = HEAD_CHUNK, compute_dtype=None,
                        softcap: float | None = None):
    """The causal LM loss: mean next-token NLL (nats) over the real targets of a batch; 0 when it has none.

    Equal in value and gradient to ``logsumexp(h @ emb.T) − logit[target]`` averaged over the target mask
    (tests/test_nll.py), without the (B, L, V) logits.
    """
    nll, m = next_token_nll(hidden, emb, input_ids, attention_mask, chunk=chunk, compute_dtype=compute_dtype,
                            softcap=softcap)
    return jnp.sum(nll) / jnp.maximum(jnp.sum(m), 1.0)

