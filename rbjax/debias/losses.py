"""Debiasing losses of RedditBias (Barikeri et al., ACL 2021, §4.1–§4.3) as pure JAX functions.

Every function takes arrays only; the masks and occurrence weights come from :mod:`rbjax.debias.triggers`
(host-side numpy, built once per batch outside ``jit``). All functions are pure and work under ``jax.jit``,
``jax.grad`` and ``jax.vmap``. String arguments (``semantics``, ``reduction``) are *static*: jit with
``static_argnames=("semantics", "reduction")`` or close over them.

Notation and shapes
-------------------
* ``h``: final hidden states **after ``ln_f``**, the vectors the tied LM head multiplies, shape ``(B, L, d)``.
  An unbatched ``(L, d)`` input (with unbatched masks) is accepted everywhere and equals a batch of one.
* ``targets``: target vectors ``(P, 2, d)``: for pair ``p``, ``targets[p, 0]`` is e_{t1} and ``targets[p, 1]`` is
  e_{t2}, rows of the output embedding (the LM head: GPT-2's tied ``wte``, or an untied head) averaged over the term's subwords (paper §4.2 fn); see
  :func:`gather_targets`.
* ``mask`` (LMD): ``(B, L, P)``, 1 where pair ``p`` applies to the state ``h[b, i]``.
* ``occ_weights`` (ADD, HD): ``(B, N, L)``, row ``n`` holds the averaging weights of the ``n``-th attribute occurrence
  of sentence ``b`` over positions (``1/span`` on its span, or all zeros for the reference code's zero-vector
  fallback); ``occ_mask`` ``(B, N)`` marks real occurrences (padding rows are 0).

Paper vs reference (``semantics="paper"`` is the default; ``"reference"`` reproduces the official PyTorch code,
umanlp/redditbias_debias_conv_ai@996c6e1 ``src/transformers/modeling_gpt2.py``; see ``docs/debiasing.md``):

=====================  ==========================================  ===============================================
what                   paper (default)                             reference
=====================  ==========================================  ===============================================
LMD positions/trigger  term occurrences (t1 or t2), state h_{i-1}  every non-pad, non-"!" position of a sentence
                       that predicts the term (triggers.py)        whose ids contain t1 (triggers.py)
LMD normalisation      mean over P_t per position, mean over       per pair: sum over positions / n_s (non-pad
                       triggered positions (``reduction``)         count); sum over sentences and pairs; / |P|
ADD/HD attributes      A1 words/phrases (wildcards), span mean     id-set membership incl. the zero padding ("!"),
                       (triggers.py)                               order-free window or a zero vector (triggers.py)
HD loss                Σ_o Σ_{j<k} |<h_o, b_j>| (eq. 4)            Σ_o ‖Σ_{o'<=o} B Bᵀ h_{o'}‖₁ (running sum within
                                                                   the micro-batch, L1 of the projected d-vector)
HD k                   smallest k with share >= 50 %               smallest k with share > 50 % (strict)
HD pair rows           (e_t1 − e_t2)/2                             (e_t2 − e_t1)/2 (same subspace)
target gradient        flows into e_t (LMD, ADD); HD subspace is   stop_gradient on all target vectors
                       held fixed (stop_gradient) in both modes
λ weighting            λ_lm·L_lm + λ_d·L_d always                  unweighted L_lm when L_d == 0
=====================  ==========================================  ===============================================
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = [
    "SEMANTICS",
    "gather_targets",
    "attribute_states",
    "equalising_loss",
    "attribute_distance_loss",
    "subspace_mask",
    "bias_subspace",
    "neutralisation_loss",
    "total_loss",
    "safe_cosine",
]

SEMANTICS = ("paper", "reference")


def _check(semantics: str, reduction: str | None = None) -> None:
    if semantics not in SEMANTICS:
        raise ValueError(f"semantics must be one of {SEMANTICS}, got {semantics!r}")
    if reduction is not None and reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")


def _targets(targets: jax.Array, semantics: str) -> jax.Array:
    # Reference: the heads read ``lm_head.weight.data`` (modeling_gpt2.py:1066,1346,2041): detached.
    return jax.lax.stop_gradient(targets) if semantics == "reference" else targets


def _add_batch(h, *arrays):
    """Accept an unbatched call (h of shape (L, d)) by adding a batch axis of one to every array."""
    if h.ndim == 2:
        return (h[None],) + tuple(None if a is None else jnp.asarray(a)[None] for a in arrays)
    if h.ndim != 3:
        raise ValueError(f"h must have shape (B, L, d) or (L, d), got {h.shape}")
    return (h,) + tuple(None if a is None else jnp.asarray(a) for a in arrays)


def _loss_dtype(dtype):
    """The dtype the losses compute in: float32 (the accumulation dtype of every precision policy), or ``dtype``
    where it is wider (float64 tests)."""
    return jnp.promote_types(dtype, jnp.float32)


def gather_targets(embeddings: jax.Array, pair_ids: jax.Array, pair_mask: jax.Array) -> jax.Array:
    """Target vectors of the term pairs: output-embedding rows averaged over each term's subwords.

    Paper §4.2 fn ("multi-token terms are averaged over their subwords"); the reference lists are single ids
    (width 1), where this is a plain row lookup.

    Args:
        embeddings: output embedding matrix ``(V, d)`` (``Family.lm_head(params)``: GPT-2's tied ``wte``).
        pair_ids: ``(P, 2, W)`` int subword ids of t1 (``[:, 0]``) and t2 (``[:, 1]``), right-padded.
        pair_mask: ``(P, 2, W)`` bool/0-1, which of the ``W`` slots are real subwords.

    Returns:
        ``(P, 2, d)`` in float32 (the accumulation dtype of :mod:`rbjax.core.precision`; a wider input dtype is
        kept) whatever the embeddings are stored in: a frozen base stored in bf16 (``--param-dtype bf16``) gives
        its rows upcast, not a bf16 subspace or loss. A term with no real subword gives a zero vector. No
        ``stop_gradient`` here: the losses apply it in reference mode.
    """
    dtype = _loss_dtype(embeddings.dtype)
    m = jnp.asarray(pair_mask, dtype)
    rows = jnp.take(embeddings, jnp.asarray(pair_ids), axis=0).astype(dtype)  # (P, 2, W, d): the rows only upcast
    cnt = jnp.sum(m, axis=-1, keepdims=True)
    return jnp.sum(rows * m[..., None], axis=-2) / jnp.where(cnt > 0, cnt, 1.0)


def attribute_states(h: jax.Array, occ_weights: jax.Array) -> jax.Array:
    """Representation of each attribute occurrence: weighted mean of hidden states over its span.

    Args:
        h: ``(B, L, d)`` (or ``(L, d)``).
        occ_weights: ``(B, N, L)`` (or ``(N, L)``) from the triggers.

    Returns:
        ``(B, N, d)`` (or ``(N, d)`` for unbatched input). Zero rows for zero weights (padding occurrences and the
        reference's failed-window fallback).
    """
    return jnp.einsum("...nl,...ld->...nd", occ_weights.astype(h.dtype), h)


def safe_cosine(x: jax.Array, y: jax.Array) -> jax.Array:
    """Cosine similarity along the last axis, defined as 0 when either vector is zero; NaN-free gradients.

    Uses the "double where": the norms are computed from ``where(n > 0, n, 1)`` so the branch that is not taken
    never divides by zero (masking only the result would still put NaN into the gradient). The gradient at a zero
    vector is 0. Matches ``torch.nn.functional.cosine_similarity`` (which clamps the norm product at 1e-8) for
    non-degenerate vectors and in the zero-vector case.

    Args:
        x, y: arrays broadcastable against each other, last axis ``d``.

    Returns:
        broadcast shape without the last axis.
    """
    xx = jnp.sum(x * x, axis=-1)
    yy = jnp.sum(y * y, axis=-1)
    ok = (xx > 0) & (yy > 0)
    nx = jnp.sqrt(jnp.where(xx > 0, xx, 1.0))
    ny = jnp.sqrt(jnp.where(yy > 0, yy, 1.0))
    dot = jnp.sum(x * y, axis=-1)
    return jnp.where(ok, dot / (nx * ny), 0.0)


# ----------------------------------------------------------------------------------------------------------- LMD
def equalising_loss(
    h: jax.Array,
    targets: jax.Array,
    mask: jax.Array,
    norm: jax.Array | None = None,
    *,
    semantics: str = "paper",
    reduction: str = "mean",
) -> jax.Array:
    """Equalising loss of language-model debiasing, LMD (paper §4.1, eq. 1).

    At a state ``h`` and pair ``(t1, t2)`` the two-term softmax over the logits ``h·e_t1`` and ``h·e_t2`` gives
    ``|log p(t1)/p(t2)| = |h·e_t1 − h·e_t2| = |h·(e_t1 − e_t2)|``. The closed form is used: it is exactly the
    log-ratio of the 2-way softmax and, unlike ``log(p1/p2)`` computed from probabilities, it does not overflow
    when ``|Δlogit| > 88`` in float32.

    ``semantics="paper"`` (eq. 1): for each triggered position ``(b, i)`` (``mask[b, i].sum() > 0``) the loss is the
    mean over the pairs P_t containing the term there, ``(1/|P_t|) Σ_{p∈P_t} |h_{b,i}·(e1_p − e2_p)|``. The triggers
    put the mask on ``h_{i−1}``, the state that predicts the term at ``i`` (see ``triggers.py``); a multi-token
    term is scored with its subword-averaged embedding (§4.2 fn, :func:`gather_targets`). ``reduction``:
    ``"mean"`` (default) averages over triggered positions of the batch, ``"sum"`` sums them. 0 when nothing fires.

    ``semantics="reference"`` (cai modeling_gpt2.py:1113-1167, ``per_sent_targets`` + ``norm_debias_loss``):
    ``L = (1/|P|) Σ_b Σ_p (1/n_b) Σ_i mask[b,i,p] |h_{b,i}·(e1_p − e2_p)|`` with ``n_b = norm[b]`` the number of
    non-pad ids of sentence ``b`` and ``|P|`` the full pair-list length (not the number of pairs that fired).
    The triggers set ``mask[b, :, p]`` on every non-pad, non-"!" position of a sentence containing the id t1_p.
    ``reduction`` is ignored. Targets are read through ``stop_gradient``.

    Args:
        h: ``(B, L, d)`` final hidden states (after ``ln_f``), or ``(L, d)``.
        targets: ``(P, 2, d)`` target vectors (:func:`gather_targets`).
        mask: ``(B, L, P)`` 0/1 (bool or float).
        norm: ``(B,)`` per-sentence token counts n_b; required for ``semantics="reference"``, unused otherwise.
        semantics: ``"paper"`` or ``"reference"`` (static).
        reduction: ``"mean"`` or ``"sum"`` over triggered positions (paper semantics only; static).

    Returns:
        scalar loss (dtype of ``h``), 0 when nothing is triggered.

    Raises:
        ValueError: unknown ``semantics``/``reduction``, bad ``h`` rank, or ``norm`` missing in reference mode.
    """
    _check(semantics, reduction)
    h, mask, norm = _add_batch(h, mask, norm)
    e = _targets(targets, semantics)
    diff = e[:, 0, :] - e[:, 1, :]  # (P, d)
    gap = jnp.abs(jnp.einsum("bld,pd->blp", h, diff))  # |log p1/p2| per (b, i, p)
    m = mask.astype(h.dtype)
    if semantics == "paper":
        cnt = jnp.sum(m, axis=-1)  # |P_t| at each position
        hit = cnt > 0
        per_pos = jnp.sum(m * gap, axis=-1) / jnp.where(hit, cnt, 1.0)
        total = jnp.sum(jnp.where(hit, per_pos, 0.0))
        if reduction == "sum":
            return total
        n = jnp.sum(hit)
        return total / jnp.maximum(n, 1).astype(h.dtype)
    if norm is None:
        raise ValueError("equalising_loss(semantics='reference') needs norm: (B,) non-pad token counts")
    nb = jnp.asarray(norm, h.dtype)
    per_sent_pair = jnp.sum(m * gap, axis=1)  # (B, P)
    per_sent_pair = per_sent_pair / jnp.where(nb > 0, nb, 1.0)[:, None]
    return jnp.sum(per_sent_pair) / targets.shape[0]


# ----------------------------------------------------------------------------------------------------------- ADD
def attribute_distance_loss(
    h: jax.Array,
    targets: jax.Array,
    occ_weights: jax.Array,
    occ_mask: jax.Array,
    *,
    semantics: str = "paper",
    reduction: str = "sum",
) -> jax.Array:
    """Attribute distance debiasing, ADD (paper §4.2, eq. 3).

    ``L = Σ_o Σ_p |cos(h_o, e2_p) − cos(h_o, e1_p)|`` over attribute occurrences ``o`` (``occ_mask``) and pairs
    ``p``, where ``h_o`` is the mean of the final hidden states over the occurrence's span (``occ_weights``) and
    ``cos(0, ·) = 0`` (:func:`safe_cosine`: the reference's zero-vector fallback gives 0 and a zero gradient, no
    NaN). The reference code writes each term as ``|(1 − cos(h,e1)) − (1 − cos(h,e2))|``, the same value.

    The formula is identical in both modes; the modes differ in the triggers (which occurrences, which spans) and
    in the targets: ``reference`` reads them through ``stop_gradient``; ``paper`` lets the gradient reach them.
    ``reduction``: ``"sum"`` (default, eq. 3 and the reference: no normalisation) or ``"mean"`` over occurrences
    (paper semantics only; the reference always sums).

    Args:
        h: ``(B, L, d)`` or ``(L, d)``.
        targets: ``(P, 2, d)``.
        occ_weights: ``(B, N, L)`` span-averaging weights.
        occ_mask: ``(B, N)`` 0/1, real occurrences.
        semantics, reduction: static strings.

    Returns:
        scalar loss, 0 when there is no occurrence.
    """
    _check(semantics, reduction)
    h, occ_weights, occ_mask = _add_batch(h, occ_weights, occ_mask)
    e = _targets(targets, semantics)
    ha = attribute_states(h, occ_weights)  # (B, N, d)
    cos = safe_cosine(ha[:, :, None, None, :], e[None, None])  # (B, N, P, 2)
    per_occ = jnp.sum(jnp.abs(cos[..., 1] - cos[..., 0]), axis=-1)  # (B, N)
    valid = occ_mask.astype(h.dtype)
    total = jnp.sum(valid * per_occ)
    if reduction == "mean" and semantics == "paper":
        return total / jnp.maximum(jnp.sum(valid), 1.0)
    return total


# ------------------------------------------------------------------------------------------------------------ HD
def subspace_mask(singular_values: jax.Array, share: float = 0.5, *, semantics: str = "paper") -> jax.Array:
    """Which leading singular directions form the bias subspace (paper §4.3, HD step 1).

    k is the smallest number of leading directions whose squared singular values reach ``share`` of the total:
    paper "at least 50 %" (``>=``); reference strict ``>`` (cai modeling_gpt2.py:2041-2064).

    Args:
        singular_values: ``(m,)`` in descending order (as ``jnp.linalg.svd`` returns them).
        share: fraction of the squared-singular-value mass to reach (default 0.5).

    Returns:
        ``(m,)`` bool, True for the first k entries (``k = mask.sum()``). All False when every singular value is 0.
    """
    _check(semantics)
    s2 = jnp.square(singular_values)
    total = jnp.sum(s2)
    cum_before = jnp.concatenate([jnp.zeros((1,), s2.dtype), jnp.cumsum(s2)[:-1]])  # mass before entry j
    if semantics == "paper":
        keep = cum_before < share * total  # entry j is needed iff the share was not yet reached (>= rule)
    else:
        keep = cum_before <= share * total  # strict >: a share exactly reached is not enough
    return keep & (total > 0)


def bias_subspace(targets: jax.Array, share: float = 0.5, *, semantics: str = "paper"):
    """Bias subspace of hard debiasing, HD step 1 (paper §4.3, after Bolukbasi et al. 2016).

    Rows ``c_p = (e1_p − e2_p)/2`` (reference: ``(e2_p − e1_p)/2``; the sign does not change the subspace), no
    centring, ``C = U S Vᵀ`` with ``jnp.linalg.svd``; the basis is the first k right singular vectors, k from
    :func:`subspace_mask`. k is data-dependent, so the full ``V`` is returned with a mask, which keeps shapes static
    under ``jit``.

    The subspace is held fixed within a step in **both** modes (``stop_gradient`` on the targets): the reference
    reads detached weights, and the paper identifies the subspace first and neutralises against it (eq. 4 only
    involves ``h``); differentiating an SVD is also ill-conditioned near repeated singular values. Recompute it at
    every step from the current embeddings to follow the reference.

    Args:
        targets: ``(P, 2, d)`` target vectors.
        share: the 50 % threshold.
        semantics: ``"paper"`` (``>=``) or ``"reference"`` (strict ``>``) for k; static.

    The SVD runs in float32 (the precision policy's accumulation dtype; float64 input stays float64): bf16 target
    vectors (a frozen base stored in bf16) are upcast first, as LAPACK has no bf16 SVD and a bf16 one would round
    the subspace.

    Returns:
        ``(basis, basis_mask)``: ``basis`` ``(d, m)`` orthonormal columns b_j in float32, ``m = min(P, d)``;
        ``basis_mask`` ``(m,)`` bool, the first k are True.
    """
    _check(semantics)
    e = jax.lax.stop_gradient(targets).astype(_loss_dtype(targets.dtype))
    c = (e[:, 0] - e[:, 1]) / 2 if semantics == "paper" else (e[:, 1] - e[:, 0]) / 2
    _, s, vt = jnp.linalg.svd(c, full_matrices=False)
    return vt.T, subspace_mask(s, share, semantics=semantics)


def neutralisation_loss(
    h: jax.Array,
    occ_weights: jax.Array,
    occ_mask: jax.Array,
    basis: jax.Array,
    basis_mask: jax.Array,
    *,
    semantics: str = "paper",
    reduction: str = "sum",
) -> jax.Array:
    """Neutralisation loss of hard debiasing, HD step 2 (paper §4.3, eq. 4).

    ``semantics="paper"`` (eq. 4): ``L = Σ_o Σ_{j<k} |<h_o, b_j>|``, the absolute projections of each attribute
    occurrence's state onto the k bias directions. ``reduction="mean"`` divides by the number of occurrences.

    ``semantics="reference"`` (cai modeling_gpt2.py:2067-2090): a running vector ``r`` (d,) starts at 0 for the
    micro-batch; occurrences are taken in order (sentence, then the order of ``occ_weights`` rows, which the
    triggers emit by position, then attribute row); each adds its projection ``B Bᵀ h_o`` to ``r`` and then adds
    ``‖r‖₁`` (L1 over the d coordinates of the projected vector, not over the k coefficients) to the loss:
    ``L = Σ_o ‖Σ_{o'≤o} B Bᵀ h_{o'}‖₁``. A zero-vector occurrence adds nothing to ``r`` but still adds ``‖r‖₁``.
    ``reduction`` is ignored.

    Args:
        h: ``(B, L, d)`` or ``(L, d)``.
        occ_weights: ``(B, N, L)``; occ_mask: ``(B, N)``.
        basis: ``(d, m)`` and basis_mask: ``(m,)`` from :func:`bias_subspace`.

    Returns:
        scalar loss, 0 without occurrences or with an empty subspace.
    """
    _check(semantics, reduction)
    h, occ_weights, occ_mask = _add_batch(h, occ_weights, occ_mask)
    ha = attribute_states(h, occ_weights)  # (B, N, d)
    bm = basis_mask.astype(h.dtype)
    coef = jnp.einsum("bnd,dm->bnm", ha, basis) * bm  # <h_o, b_j> for j < k
    valid = occ_mask.astype(h.dtype)
    if semantics == "paper":
        per_occ = jnp.sum(jnp.abs(coef), axis=-1)
        total = jnp.sum(valid * per_occ)
        if reduction == "mean":
            return total / jnp.maximum(jnp.sum(valid), 1.0)
        return total
    proj = jnp.einsum("bnm,dm->bnd", coef, basis) * valid[..., None]  # B Bᵀ h_o
    d = proj.shape[-1]
    running = jnp.cumsum(proj.reshape(-1, d), axis=0)  # r after each occurrence, in (sentence, occurrence) order
    return jnp.sum(valid.reshape(-1) * jnp.sum(jnp.abs(running), axis=-1))


# --------------------------------------------------------------------------------------------------------- total
def total_loss(lm_loss, debias_loss, lambda_lm, lambda_d, semantics: str = "paper") -> jax.Array:
    """Training objective of the loss-based methods (paper §4.1, eq. 2): ``λ_lm·L_lm + λ_d·L_d``.

    ``lambda_lm`` and ``lambda_d`` may be traced arrays: a hyper-parameter grid reuses one compiled step.

    ``semantics="reference"`` (cai modeling_gpt2.py:1210-1215, 1463-1468, 2100-2104): the weighted sum only when
    ``L_d != 0``; otherwise the *unweighted* ``L_lm`` (a micro-batch with no trigger trains with LM weight 1).

    Args:
        lm_loss, debias_loss: scalars. lambda_lm, lambda_d: scalars (Python floats or arrays).
        semantics: ``"paper"`` or ``"reference"`` (static).

    Returns:
        scalar.
    """
    _check(semantics)
    weighted = lambda_lm * lm_loss + lambda_d * debias_loss
    if semantics == "paper":
        return weighted
    return jnp.where(debias_loss != 0, weighted, lm_loss)
