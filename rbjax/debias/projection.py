"""Debiasing without training: a projection of the final hidden state (docs/debiasing.md, "Debiasing without
training").

Two methods fit a (d, d) projection ``P`` from sentence representations; the debiased model replaces the final
hidden state ``h`` (after the final norm, before the LM head) by ``P h`` at every position.

* **SentenceDebias** (Liang et al., ACL 2020): each counterfactual group of representations (a sentence and its
  target-swapped twins) is centred on its own mean, the centred vectors of every group are stacked and the top-``k``
  principal directions are the bias subspace (:func:`sentence_debias_subspace`); ``P = I − VᵀV``
  (:func:`subspace_projection`).
* **INLP** (Ravfogel et al., ACL 2020): a linear classifier of the group label is fitted, the data are projected onto
  the intersection of the nullspaces of every classifier fitted so far, and again, until the held-out accuracy is
  within ε of chance (:func:`inlp_projection`). The classifier is multinomial logistic regression without intercept,
  fitted by L-BFGS (optax) on the whole training set, from zero: deterministic given the split's seed.

Because ``P`` is symmetric, ``(P h)·w = h·(P w)``: the debiased model is the base model with its LM head ``W`` (V, d)
replaced by ``W P`` (:func:`fold_into_head`), untied from the input embedding where it was tied. Scoring, every
benchmark, generation and the Hugging Face export then need nothing of their own; Gemma 2's final-logit soft-cap
is applied after the head, so it comes after the projection as it should.

Every function here takes and returns float64 numpy arrays (the fitting is small: N × d with d ≤ a few thousand);
only the classifier fit runs in JAX.
"""
from __future__ import annotations

import contextlib
import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rbjax.model.registry import family_of_config

__all__ = ["sentence_debias_subspace", "subspace_projection", "rowspace_projection", "rowspace_basis",
           "nullspace_intersection", "nullspace_of_bases",
           "InlpResult", "inlp_projection", "fit_linear_classifier", "split_groups", "check_projection",
           "fold_into_head", "projected_model"]


def _as_2d(x, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (rows, d), got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} holds non-finite values")
    return a


def sentence_debias_subspace(groups, k: int = 1) -> np.ndarray:
    """The SentenceDebias bias subspace: (k, d) orthonormal rows, the top-``k`` principal directions.

    Args:
        groups: (G, N, d) array: ``groups[g, i]`` is the representation of counterfactual ``i`` in group ``g`` (G ≥ 2
            groups, e.g. the two sides of a pair; N sets). Each set ``groups[:, i]`` is centred on its own mean, the
            G·N centred vectors are stacked and their principal directions taken (as a PCA does: the stack is
            centred on its mean too, which after the per-set centring is zero).
        k: number of directions (bias-bench: 1).
    Returns:
        (k, d) float64, orthonormal rows in decreasing order of explained variance; each row's sign is fixed so that
        its largest-magnitude entry is positive (a principal direction is defined up to sign).
    Raises:
        ValueError: fewer than 2 groups, no sets, non-finite values, or ``k`` outside [1, rank of the stack].
    """
    g = np.asarray(groups, dtype=np.float64)
    if g.ndim != 3 or g.shape[0] < 2 or g.shape[1] < 1:
        raise ValueError(f"groups must be (G ≥ 2, N ≥ 1, d), got shape {g.shape}")
    if not np.all(np.isfinite(g)):
        raise ValueError("groups hold non-finite values")
    centred = g - g.mean(axis=0, keepdims=True)
    stack = centred.reshape(-1, g.shape[2])
    stack = stack - stack.mean(axis=0, keepdims=True)
    _, s, vt = np.linalg.svd(stack, full_matrices=False)
    rank = int(np.sum(s > s[0] * max(stack.shape) * np.finfo(np.float64).eps)) if s.size and s[0] > 0 else 0
    if not 1 <= k <= rank:
        raise ValueError(f"k={k} principal directions asked, but the centred representations span {rank} "
                         "dimension(s) (identical counterfactuals span none)")
    v = vt[:k]
    idx = np.argmax(np.abs(v), axis=1)
    return v * np.sign(v[np.arange(k), idx])[:, None]


def subspace_projection(directions) -> np.ndarray:
    """``I − QQᵀ``, (d, d), for an orthonormal basis ``Q`` of the span of ``directions`` ((k, d) rows); removes that
    span: ``h ← h − Σ (h·v) v`` for orthonormal rows ``v`` (SentenceDebias)."""
    d = _as_2d(directions, "directions")
    return np.eye(d.shape[1]) - rowspace_projection(d)


def rowspace_projection(w) -> np.ndarray:
    """The orthogonal projection onto the row space of ``w`` ((r, d)), (d, d) float64; zero for a zero ``w``. The
    basis is the left singular vectors of ``wᵀ`` above ``max(shape)·eps·σ_max`` (``scipy.linalg.orth``'s rule)."""
    basis = rowspace_basis(w)
    return basis.T @ basis


def rowspace_basis(w) -> np.ndarray:
    """(k, d) orthonormal rows spanning the row space of ``w`` ((r, d)): :func:`rowspace_projection`'s basis
    (``scipy.linalg.orth``'s rule), none for a zero ``w``."""
    w = _as_2d(w, "w")
    u, s, _ = np.linalg.svd(w.T, full_matrices=False)
    if not s.size or s[0] == 0:
        return np.zeros((0, w.shape[1]))
    return u[:, s > s[0] * max(w.shape) * np.finfo(np.float64).eps].T


def nullspace_of_bases(bases, d: int) -> tuple[np.ndarray, int]:
    """``(P, k)``: :func:`nullspace_intersection` of the row spaces whose orthonormal bases are given (each (k_i, d),
    :func:`rowspace_basis`), and the dimension k removed, computed from the stacked bases B ((Σk_i, d)) instead of
    the (d, d) sum of projections: the sum is BᵀB, whose eigenvalues are B's squared singular values, so the same
    rule (keep λ > d·eps·λ_max) keeps the same directions, and ``P = I − QQᵀ`` for Q B's kept right singular
    vectors. An SVD of Σk_i × d instead of d × d: INLP fits one basis per iteration (docs/debiasing.md, "Cost")."""
    q = _removed_basis(bases, d)
    return np.eye(d) - q.T @ q, int(q.shape[0])


def _removed_basis(bases, d: int) -> np.ndarray:
    """(k, d) orthonormal rows spanning the removed directions (:func:`nullspace_of_bases`: ``P = I − QᵀQ``)."""
    bases = [np.asarray(b, dtype=np.float64) for b in bases if len(b)]
    if not bases:
        return np.zeros((0, d))
    _, s, vt = np.linalg.svd(np.concatenate(bases), full_matrices=False)
    if not s.size or s[0] == 0:
        return np.zeros((0, d))
    return vt[s ** 2 > s[0] ** 2 * d * np.finfo(np.float64).eps]


def nullspace_intersection(rowspace_projections, d: int) -> np.ndarray:
    """The projection onto the intersection of the nullspaces whose row-space projections are given:
    ``I − P_R(Σ P_i)`` (Ben-Israel: ∩ N(w_i) = N(Σ P_R(w_i))). (d, d) float64; the identity for none."""
    if not len(rowspace_projections):
        return np.eye(d)
    return np.eye(d) - rowspace_projection(np.sum(np.asarray(rowspace_projections, dtype=np.float64), axis=0))


def check_projection(p, tol: float = 1e-6) -> np.ndarray:
    """``p`` as float64 after checking it is a (d, d) orthogonal projection: symmetric and idempotent within ``tol``
    (max abs entry). Raises ValueError saying which property fails."""
    p = _as_2d(p, "projection")
    if p.shape[0] != p.shape[1]:
        raise ValueError(f"a projection must be square, got shape {p.shape}")
    asym = float(np.max(np.abs(p - p.T)))
    if asym > tol:
        raise ValueError(f"the projection is not symmetric (max |P − Pᵀ| = {asym:.3g} > {tol:g})")
    idem = float(np.max(np.abs(p @ p - p)))
    if idem > tol:
        raise ValueError(f"the projection is not idempotent (max |P² − P| = {idem:.3g} > {tol:g})")
    return p


# ------------------------------------------------------------------------------------------------------- INLP

def fit_linear_classifier(x, y, n_classes: int, *, l2: float = 1.0, max_iter: int = 500,
                          tol: float = 1e-6) -> np.ndarray:
    """Multinomial logistic regression without intercept, fitted by L-BFGS (optax) from zero.

    Class 0's logit is fixed at 0 (softmax depends only on logit differences), so the weights are (C − 1, d): a
    binary classifier has one direction. The loss is the mean cross-entropy plus ``l2 / (2 N) · ‖W‖²``
    (scikit-learn's ``LogisticRegression(C=1/l2)`` objective divided by N).

    Args:
        x: (N, d) float features. y: (N,) int labels in [0, n_classes). n_classes: C ≥ 2.
        l2: the ridge penalty (> 0 makes the fit unique, so the result is deterministic and finite on separable
            data). max_iter: L-BFGS steps at most. tol: stop once the gradient's norm is below it.
    Returns:
        (C − 1, d) float64 weights.
    """
    x = jnp.asarray(_as_2d(x, "x"), jnp.float32)
    y = jnp.asarray(np.asarray(y), jnp.int32)
    n, d = x.shape
    w = _fit_lbfgs(x, y, int(n_classes), float(l2) / (2.0 * n), int(max_iter), float(tol),
                   jnp.zeros((n_classes - 1, d), jnp.float32))
    return np.asarray(w, dtype=np.float64)


def _logits(w, x):
    z = x @ w.T
    return jnp.concatenate([jnp.zeros((x.shape[0], 1), z.dtype), z], axis=1)


@jax.jit
def _accuracy(w, x, y):
    return jnp.mean((jnp.argmax(_logits(w, x), axis=1) == y).astype(jnp.float32))


@partial(jax.jit, static_argnames=("n_classes", "max_iter"))
def _fit_lbfgs(x, y, n_classes, reg, max_iter, tol, w0):
    def loss(w):
        lp = jax.nn.log_softmax(_logits(w, x), axis=1)
        return -jnp.mean(jnp.take_along_axis(lp, y[:, None], axis=1)) + reg * jnp.sum(w * w)

    opt = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(loss)

    def step(carry):
        w, state, _, i = carry
        value, grad = value_and_grad(w, state=state)
        updates, state = opt.update(grad, state, w, value=value, grad=grad, value_fn=loss)
        return optax.apply_updates(w, updates), state, optax.tree_utils.tree_norm(grad), i + 1

    def go_on(carry):
        _, _, gnorm, i = carry
        return (i < max_iter) & (gnorm >= tol)

    w, *_ = jax.lax.while_loop(go_on, step, (w0, opt.init(w0), jnp.float32(jnp.inf), 0))
    return w


def split_groups(n_sets: int, dev_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(train, dev)`` index arrays of ``n_sets`` counterfactual sets, a seeded random split: ``dev_fraction`` of the
    sets (at least one, and at least one left for training) are held out. A set's members stay together (a sentence
    and its swapped twin on both sides would leak the held-out rows into the fit).

    Raises:
        ValueError: fewer than 2 sets, or ``dev_fraction`` outside (0, 1).
    """
    if not 0.0 < dev_fraction < 1.0:
        raise ValueError(f"the held-out fraction must lie in (0, 1), got {dev_fraction}")
    if n_sets < 2:
        raise ValueError(f"INLP needs at least 2 counterfactual sets (one to fit, one held out), got {n_sets}")
    perm = np.random.default_rng(seed).permutation(n_sets)
    n_dev = min(max(1, int(round(dev_fraction * n_sets))), n_sets - 1)
    return np.sort(perm[n_dev:]), np.sort(perm[:n_dev])


@dataclasses.dataclass
class InlpResult:
    """What :func:`inlp_projection` found.

    Attributes:
        projection: (d, d) float64, the projection onto the intersection of the kept classifiers' nullspaces.
        classifiers: the kept classifiers' weights, each (C − 1, d).
        history: one record per classifier fitted: ``iteration`` (from 1), ``train_accuracy``, ``dev_accuracy``,
            ``chance`` (the held-out rows' majority-class rate), ``kept`` (False for the last one when it was at
            chance) and ``rank`` (of the projection after it).
        stopped: ``"chance"`` (the last classifier's held-out accuracy was within ε of chance) or ``"iterations"``.
    """

    projection: np.ndarray
    classifiers: list
    history: list
    stopped: str


def inlp_projection(x_train, y_train, x_dev, y_dev, *, n_classes: int | None = None, iterations: int = 80,
                    epsilon: float = 0.01, l2: float = 1.0, max_iter: int = 500) -> InlpResult:
    """Iterative nullspace projection (Ravfogel et al. 2020) with logistic-regression classifiers.

    Iteration ``i`` fits :func:`fit_linear_classifier` to ``P x_train`` (``P``: the projection of the classifiers
    kept so far, the identity at first) and measures its accuracy on ``P x_dev``. When that accuracy is at most
    chance + ``epsilon`` (chance: the majority-class rate of ``y_dev``) the classifier is dropped and the loop stops;
    otherwise its row space joins the removed ones and ``P`` becomes the projection onto the intersection of every
    kept classifier's nullspace (:func:`nullspace_intersection`'s rule, recomputed from all of them, not a product,
    by :func:`nullspace_of_bases` from their stacked bases). A
    C-class classifier has C − 1 directions, so each kept iteration lowers the rank of ``P`` by up to C − 1 (one for
    a binary one).

    Args:
        x_train, x_dev: (N, d), (M, d) features. y_train, y_dev: int labels in [0, C).
        n_classes: C (default: 1 + the largest label). iterations: at most this many classifiers (bias-bench: 80).
        epsilon: the chance margin. l2, max_iter: of each fit.
    Returns:
        :class:`InlpResult`.
    Raises:
        ValueError: mismatched shapes, labels outside [0, C), or fewer than 2 classes in the training rows.
    """
    with _one_blas_thread():
        return _inlp(x_train, y_train, x_dev, y_dev, n_classes, iterations, epsilon, l2, max_iter)


def _one_blas_thread():
    """numpy's BLAS/LAPACK on one thread, where ``threadpoolctl`` is installed: INLP alternates an XLA fit with small
    host SVDs, and right after an XLA computation its idle threads still spin, so a multi-threaded LAPACK call, whose
    threads meet at a barrier after every BLAS step, waited up to a hundred times longer than on one thread (an SVD of
    54 × 768: 0.3 s instead of 3 ms on 2 cores; docs/debiasing.md, "Cost")."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - installed with scikit-learn; without it only slower
        return contextlib.nullcontext()
    return threadpool_limits(1, user_api="blas")


def _inlp(x_train, y_train, x_dev, y_dev, n_classes, iterations, epsilon, l2, max_iter) -> InlpResult:
    xt, xd = _as_2d(x_train, "x_train"), _as_2d(x_dev, "x_dev")
    yt, yd = np.asarray(y_train, dtype=np.int64), np.asarray(y_dev, dtype=np.int64)
    if xt.shape[1] != xd.shape[1] or len(yt) != len(xt) or len(yd) != len(xd) or not len(xd):
        raise ValueError(f"INLP: features {xt.shape}/{xd.shape} and labels {yt.shape}/{yd.shape} do not match")
    c = int(n_classes if n_classes is not None else 1 + max(yt.max(), yd.max()))
    if min(yt.min(), yd.min()) < 0 or max(yt.max(), yd.max()) >= c:
        raise ValueError(f"INLP: labels must lie in [0, {c})")
    if len(np.unique(yt)) < 2:
        raise ValueError("INLP: the training rows hold a single class; nothing to classify")
    d = xt.shape[1]
    chance = float(np.bincount(yd, minlength=c).max() / len(yd))
    q, kept, bases, history, stopped = np.zeros((0, d)), [], [], [], "iterations"
    # P x = x − (x Qᵀ) Q with Q the removed directions (nullspace_of_bases): N·d·k a product, not N·d², and no (d, d)
    # SVD per iteration; P itself is formed once, at the end
    for i in range(1, iterations + 1):
        xt_p, xd_p = xt - (xt @ q.T) @ q, xd - (xd @ q.T) @ q
        w = fit_linear_classifier(xt_p, yt, c, l2=l2, max_iter=max_iter)
        w_j = jnp.asarray(w, jnp.float32)
        tr = float(_accuracy(w_j, jnp.asarray(xt_p, jnp.float32), jnp.asarray(yt)))
        dv = float(_accuracy(w_j, jnp.asarray(xd_p, jnp.float32), jnp.asarray(yd)))
        at_chance = dv <= chance + epsilon
        if not at_chance:
            kept.append(w)
            bases.append(rowspace_basis(w))
            q = _removed_basis(bases, d)
        history.append({"iteration": i, "train_accuracy": tr, "dev_accuracy": dv, "chance": chance,
                        "kept": not at_chance, "rank": d - int(q.shape[0])})
        if at_chance:
            stopped = "chance"
            break
    return InlpResult(projection=np.eye(d) - q.T @ q, classifiers=kept, history=history, stopped=stopped)


# -------------------------------------------------------------------------------------------------- folding

def fold_into_head(head, projection) -> np.ndarray:
    """The LM head of the projected model: ``W P`` for a (V, d) head ``W`` and a symmetric (d, d) ``P``, so that
    ``h (W P)ᵀ = (P h) Wᵀ``. Computed in float64, returned float32.

    Raises:
        ValueError: shapes that do not match, or a ``P`` that is not a symmetric idempotent projection.
    """
    p = check_projection(projection)
    w = np.asarray(head, dtype=np.float64)
    if w.ndim != 2 or w.shape[1] != p.shape[0]:
        raise ValueError(f"the LM head {w.shape} does not match the projection {p.shape}")
    return (w @ p).astype(np.float32)


def projected_model(params: dict, config, projection) -> tuple[dict, object]:
    """``(params, config)`` of the debiased model: the base's with the LM head ``W`` replaced by ``W P``
    (:func:`fold_into_head`) as a head of its own (``tie_word_embeddings`` false: the input embedding is unchanged),
    for any registered family. Gemma 2's final-logit soft-cap stays after the head, so it applies to the projected
    logits. The input ``params`` are not modified (a new top-level dict; other leaves are shared).

    Raises:
        ValueError: as :func:`fold_into_head`.
    """
    fam = family_of_config(config)
    head = fold_into_head(np.asarray(fam.lm_head(params), dtype=np.float32), projection)
    out = dict(params)
    out[fam.head] = {"embedding": head}
    return out, dataclasses.replace(config, tie_word_embeddings=False)
