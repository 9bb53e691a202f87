"""Debiasing losses (paper §4.1-§4.3): hand values, invariances, gradients, jit, batching. Pure JAX: no PyTorch.

The PyTorch parity tests (reference semantics from token ids, the trainer's LM loss) are in test_losses_torch.py.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from rbjax.debias import losses as L

jax.config.update("jax_enable_x64", False)
SEM = ("paper", "reference")


def _rng(seed=0):
    return np.random.default_rng(seed)


# ----------------------------------------------------------------------------------------------------- LMD
def test_lmd_paper_hand_values():
    # one sentence, 3 positions, d = 2, two pairs
    h = jnp.array([[[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]]])
    targets = jnp.array([[[1.0, 0.0], [0.0, 1.0]],  # pair 0: diff (1, -1)
                         [[2.0, 1.0], [1.0, 1.0]]])  # pair 1: diff (1, 0)
    mask = jnp.zeros((1, 3, 2)).at[0, 0, 0].set(1).at[0, 1, 0].set(1).at[0, 1, 1].set(1)
    # position 0: pair 0 only: |1 - 2| = 1
    # position 1: pairs 0 and 1: (|3 + 1| + |3|) / 2 = 3.5 ; position 2: not triggered
    assert float(L.equalising_loss(h, targets, mask)) == pytest.approx((1 + 3.5) / 2)
    assert float(L.equalising_loss(h, targets, mask, reduction="sum")) == pytest.approx(4.5)
    # two-term softmax form: |log p1/p2| with p = softmax(h.e1, h.e2)
    l1, l2 = 3.0, -1.0  # h_1 . e_t1, h_1 . e_t2 for pair 0
    p1 = math.exp(l1) / (math.exp(l1) + math.exp(l2))
    assert abs(math.log(p1 / (1 - p1))) == pytest.approx(4.0)


def test_lmd_reference_hand_values():
    h = jnp.array([[[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]],
                   [[1.0, 1.0], [2.0, 0.0], [0.0, 0.0]]])
    targets = jnp.array([[[1.0, 0.0], [0.0, 1.0]], [[2.0, 1.0], [1.0, 1.0]], [[0.0, 0.0], [1.0, 0.0]]])
    mask = np.zeros((2, 3, 3))
    mask[0, :, 0] = 1  # pair 0 fired in sentence 0, all 3 positions
    mask[1, :2, 1] = 1  # pair 1 fired in sentence 1, 2 real positions
    norm = jnp.array([3.0, 2.0])
    # sentence 0 pair 0: (|1-2| + |3+1| + |0|) / 3 = 5/3 ; sentence 1 pair 1: (|1| + |2|)/2 = 3/2 ; / |P| = 3
    want = (5 / 3 + 3 / 2) / 3
    got = L.equalising_loss(h, targets, jnp.asarray(mask), norm, semantics="reference")
    assert float(got) == pytest.approx(want)
    with pytest.raises(ValueError):
        L.equalising_loss(h, targets, jnp.asarray(mask), semantics="reference")


@pytest.mark.parametrize("semantics", SEM)
def test_lmd_zero_when_logits_equal(semantics):
    r = _rng(1)
    h = jnp.asarray(r.normal(size=(2, 4, 3)), jnp.float32)
    e = jnp.asarray(r.normal(size=(2, 1, 3)), jnp.float32)
    targets = jnp.concatenate([e, e], axis=1)  # e_t1 == e_t2 -> equal logits everywhere
    mask = jnp.ones((2, 4, 2))
    assert float(L.equalising_loss(h, targets, mask, jnp.array([4.0, 4.0]), semantics=semantics)) == 0.0
    # h orthogonal to e_t1 - e_t2: equal logits although the targets differ
    targets = jnp.array([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    hh = jnp.array([[[1.0, 1.0, 5.0], [2.0, 2.0, -1.0]]])
    assert float(L.equalising_loss(hh, targets, jnp.ones((1, 2, 1)), jnp.array([2.0]), semantics=semantics)) == 0.0


def test_lmd_no_trigger_is_zero():
    h = jnp.ones((2, 3, 2))
    t = jnp.ones((1, 2, 2))
    assert float(L.equalising_loss(h, t, jnp.zeros((2, 3, 1)))) == 0.0
    assert float(L.equalising_loss(h, t, jnp.zeros((2, 3, 1)), jnp.zeros(2), semantics="reference")) == 0.0


def test_lmd_no_overflow_for_large_logit_gap():
    h = jnp.array([[[100.0, 0.0]]])
    t = jnp.array([[[1.0, 0.0], [-1.0, 0.0]]])  # gap 200: log(p1/p2) from probabilities would be inf in fp32
    assert float(L.equalising_loss(h, t, jnp.ones((1, 1, 1)))) == pytest.approx(200.0)


# ----------------------------------------------------------------------------------------------------- ADD
def test_add_zero_vector_failure_case():
    # Field failure: cosine on a zero vector. Expected loss 1/3, grads [0,0,0] and [-10/27, 7/27, -2/27], no NaN.
    h = jnp.array([[[0.0, 0.0, 0.0], [1.0, 2.0, 2.0]]])
    targets = jnp.array([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    w = jnp.eye(2)[None]  # each row one occurrence at its own position
    m = jnp.ones((1, 2))
    for semantics in SEM:
        f = lambda hh: L.attribute_distance_loss(hh, targets, w, m, semantics=semantics)  # noqa: E731
        eager = semantics == "paper"  # the no-jit path once; jit for both semantics
        for fn in (f, jax.jit(f)) if eager else (jax.jit(f),):
            assert float(fn(h)) == pytest.approx(1 / 3, abs=1e-6)
        for g in (jax.grad(f)(h), jax.jit(jax.grad(f))(h)) if eager else (jax.jit(jax.grad(f))(h),):
            g = np.asarray(g)
            assert np.all(np.isfinite(g))
            np.testing.assert_allclose(g[0, 0], [0, 0, 0], atol=0)
            np.testing.assert_allclose(g[0, 1], [-10 / 27, 7 / 27, -2 / 27], rtol=1e-5)
    # the reference's failed-window fallback: an occurrence with all-zero weights is a zero vector
    w0 = jnp.zeros((1, 2, 2)).at[0, 1, 1].set(1.0)
    f = lambda hh: L.attribute_distance_loss(hh, targets, w0, m, semantics="reference")  # noqa: E731
    assert float(f(h)) == pytest.approx(1 / 3, abs=1e-6)
    assert np.all(np.isfinite(np.asarray(jax.jit(jax.grad(f))(h + 1.0))))
    # zero target vector too
    t0 = targets.at[0, 0].set(0.0)
    g = jax.jit(jax.grad(lambda tt: L.attribute_distance_loss(h, tt, w, m)))(t0)
    assert np.all(np.isfinite(np.asarray(g)))


def test_safe_cosine_values():
    x = jnp.array([[0.0, 0.0], [3.0, 4.0], [1.0, 0.0]])
    y = jnp.array([[1.0, 0.0], [4.0, 3.0], [0.0, 0.0]])
    np.testing.assert_allclose(L.safe_cosine(x, y), [0.0, 24 / 25, 0.0], rtol=1e-6)


def test_add_hand_values_and_span_mean():
    # occurrence 0: mean of positions 0 and 1 = (1, 1); occurrence 1: position 2 = (0, 2)
    h = jnp.array([[[2.0, 0.0], [0.0, 2.0], [0.0, 2.0]]])
    w = jnp.array([[[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]]])
    m = jnp.array([[1.0, 1.0]])
    targets = jnp.array([[[1.0, 0.0], [1.0, 1.0]]])
    # occ 0: cos((1,1),(1,0)) = 1/sqrt2, cos((1,1),(1,1)) = 1 -> 1 - 1/sqrt2
    # occ 1: cos((0,2),(1,0)) = 0, cos((0,2),(1,1)) = 1/sqrt2 -> 1/sqrt2 ; total = 1
    assert float(L.attribute_distance_loss(h, targets, w, m)) == pytest.approx(1.0, rel=1e-6)
    assert float(L.attribute_distance_loss(h, targets, w, m, reduction="mean")) == pytest.approx(0.5, rel=1e-6)
    # a padding occurrence (mask 0) contributes nothing
    m2 = jnp.array([[1.0, 0.0]])
    assert float(L.attribute_distance_loss(h, targets, w, m2)) == pytest.approx(1 - 1 / math.sqrt(2), rel=1e-6)


@pytest.mark.parametrize("semantics", SEM)
def test_add_zero_when_equidistant(semantics):
    targets = jnp.array([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], [[0.0, 0.0, 2.0], [0.0, 0.0, -2.0]]])
    h = jnp.array([[[1.0, 1.0, 0.0], [3.0, 3.0, 0.0]]])  # equal angle to (1,0,0) and (0,1,0); orthogonal to z
    w = jnp.eye(2)[None]
    assert float(L.attribute_distance_loss(h, targets, w, jnp.ones((1, 2)), semantics=semantics)) == pytest.approx(
        0.0, abs=1e-7)


# ------------------------------------------------------------------------------------------------------ HD
def test_subspace_k_rule_on_crafted_singular_values():
    s = jnp.array([2.0, 1.0, 1.0, 1.0, 1.0])  # s^2 = 4,1,1,1,1 ; total 8 ; first share exactly 0.5
    assert int(L.subspace_mask(s, semantics="paper").sum()) == 1  # >= 50 %
    assert int(L.subspace_mask(s, semantics="reference").sum()) == 2  # > 50 % (strict)
    s = jnp.array([3.0, 2.0, 1.0, 1.0])  # 9,4,1,1 ; total 15 ; 9/15 = 0.6
    assert int(L.subspace_mask(s, semantics="paper").sum()) == 1
    assert int(L.subspace_mask(s, semantics="reference").sum()) == 1
    s = jnp.array([1.0, 1.0, 1.0, 1.0])  # 0.25, 0.5, ...
    assert int(L.subspace_mask(s, semantics="paper").sum()) == 2
    assert int(L.subspace_mask(s, semantics="reference").sum()) == 3
    assert int(L.subspace_mask(jnp.zeros(3)).sum()) == 0
    np.testing.assert_array_equal(L.subspace_mask(jnp.array([1.0, 1.0, 1.0, 1.0])), [True, True, False, False])


def test_bias_subspace_crafted_pairs():
    # pair diffs (e1 - e2)/2 = 2 x_0, 1 x_1, 1 x_2, 1 x_3, 1 x_4 (orthogonal) -> singular values 2,1,1,1,1
    d = 6
    c = np.zeros((5, d), np.float32)
    for j, v in enumerate([2.0, 1, 1, 1, 1]):
        c[j, j] = v
    targets = jnp.asarray(np.stack([c, -c], axis=1))  # (e1 - e2)/2 = c
    basis, bm = L.bias_subspace(targets)
    assert basis.shape == (d, 5) and bm.shape == (5,)
    assert int(bm.sum()) == 1
    np.testing.assert_allclose(np.abs(np.asarray(basis[:, 0])), np.eye(d)[0], atol=1e-6)
    _, bm_ref = L.bias_subspace(targets, semantics="reference")
    assert int(bm_ref.sum()) == 2
    # orthonormal columns
    np.testing.assert_allclose(np.asarray(basis.T @ basis), np.eye(5), atol=1e-5)


def test_bias_subspace_is_held_fixed():
    r = _rng(3)
    t = jnp.asarray(r.normal(size=(3, 2, 4)), jnp.float32)
    g = jax.jit(jax.grad(lambda tt: jnp.sum(L.bias_subspace(tt)[0] ** 3)))(t)
    assert np.all(np.asarray(g) == 0)


@pytest.mark.parametrize("semantics", SEM)
def test_hd_zero_for_states_orthogonal_to_subspace(semantics):
    basis = jnp.eye(4)[:, :2]  # subspace span(x0, x1)
    bm = jnp.array([True, True])
    h = jnp.array([[[0.0, 0.0, 1.0, 2.0], [0.0, 0.0, -3.0, 1.0], [0.0, 0.0, 5.0, 5.0]]])
    w = jnp.array([[[1.0, 0, 0], [0, 0.5, 0.5], [0, 0, 1.0]]])
    assert float(L.neutralisation_loss(h, w, jnp.ones((1, 3)), basis, bm, semantics=semantics)) == 0.0


def test_hd_hand_values():
    basis = jnp.array([[0.6, 0.0], [0.8, 0.0], [0.0, 1.0]])  # b0 = (.6,.8,0), b1 = (0,0,1)
    h = jnp.array([[[1.0, 2.0, 3.0], [2.0, -1.0, 0.0]]])
    w = jnp.eye(2)[None]
    m = jnp.ones((1, 2))
    # k = 1 (mask [T, F]): paper Σ_o |<h_o,b0>| = |0.6+1.6| + |1.2-0.8| = 2.2 + 0.4
    bm = jnp.array([True, False])
    assert float(L.neutralisation_loss(h, w, m, basis, bm)) == pytest.approx(2.6, rel=1e-6)
    # k = 2: + |3| + |0|
    bm2 = jnp.array([True, True])
    assert float(L.neutralisation_loss(h, w, m, basis, bm2)) == pytest.approx(5.6, rel=1e-6)
    assert float(L.neutralisation_loss(h, w, m, basis, bm2, reduction="mean")) == pytest.approx(2.8, rel=1e-6)
    # reference, k = 1: proj_0 = 2.2 b0 = (1.32, 1.76, 0), ||r_0||_1 = 3.08
    #                   proj_1 = 0.4 b0 = (.24, .32, 0), r_1 = (1.56, 2.08, 0), ||r_1||_1 = 3.64
    assert float(L.neutralisation_loss(h, w, m, basis, bm, semantics="reference")) == pytest.approx(6.72, rel=1e-6)
    # reference running sum spans sentences of the micro-batch, in order; a padding occurrence does not count;
    # a zero-vector occurrence (valid, zero weights) adds ||r||_1 once more
    h2 = jnp.concatenate([h[:, :1], h[:, 1:]], axis=0)  # two sentences of one position each
    w2 = jnp.array([[[1.0], [0.0]], [[1.0], [0.0]]])  # sentence rows: occurrence, then a second row
    m2 = jnp.array([[1.0, 0.0], [1.0, 0.0]])
    assert float(L.neutralisation_loss(h2, w2, m2, basis, bm, semantics="reference")) == pytest.approx(6.72, rel=1e-6)
    m3 = jnp.array([[1.0, 1.0], [1.0, 0.0]])  # sentence 0 gets a zero-vector occurrence: + 3.08
    assert float(L.neutralisation_loss(h2, w2, m3, basis, bm, semantics="reference")) == pytest.approx(
        6.72 + 3.08, rel=1e-6)


# --------------------------------------------------------------------------------------------------- total
def test_total_loss_semantics_and_no_recompile():
    assert float(L.total_loss(2.0, 3.0, 0.01, 10.0)) == pytest.approx(30.02)
    assert float(L.total_loss(2.0, 0.0, 0.01, 10.0)) == pytest.approx(0.02)
    assert float(L.total_loss(2.0, 0.0, 0.01, 10.0, "reference")) == pytest.approx(2.0)
    assert float(L.total_loss(2.0, 3.0, 0.01, 10.0, "reference")) == pytest.approx(30.02)
    traces = []

    @jax.jit
    def f(lm, d, a, b):
        traces.append(1)
        return L.total_loss(lm, d, a, b, "reference")

    for a in (0.001, 0.01):
        for b in (10.0, 50.0, 100.0):
            f(jnp.float32(1.0), jnp.float32(2.0), jnp.float32(a), jnp.float32(b))
    assert len(traces) == 1
    g = jax.grad(lambda lm, d: L.total_loss(lm, d, 0.01, 10.0, "reference"), argnums=(0, 1))(2.0, 0.0)
    assert float(g[0]) == 1.0


# ------------------------------------------------------------------------- generic: grads, jit, batching
def _random_case(seed, B=2, Lx=5, d=4, P=3, N=3):
    r = _rng(seed)
    h = jnp.asarray(r.normal(size=(B, Lx, d)), jnp.float32)
    targets = jnp.asarray(r.normal(size=(P, 2, d)), jnp.float32)
    mask = jnp.asarray(r.random((B, Lx, P)) < 0.5, jnp.float32)
    norm = jnp.asarray(r.integers(2, Lx + 1, size=B), jnp.float32)
    w = np.zeros((B, N, Lx), np.float32)
    for b in range(B):
        for n in range(N):
            s = r.integers(0, Lx - 1)
            span = r.integers(1, 3)
            w[b, n, s:s + span] = 1.0 / len(range(s, min(s + span, Lx)))
    occ_mask = jnp.asarray(r.random((B, N)) < 0.8, jnp.float32)
    return h, targets, mask, norm, jnp.asarray(w), occ_mask


def _all_losses(semantics, reduction=None):
    """name -> f(h, targets, mask, norm, w, occ_mask)."""
    red = {} if reduction is None else {"reduction": reduction}

    def lmd(h, t, m, n, w, om):
        return L.equalising_loss(h, t, m, n, semantics=semantics, **red)

    def add(h, t, m, n, w, om):
        return L.attribute_distance_loss(h, t, w, om, semantics=semantics, **red)

    def hd(h, t, m, n, w, om):
        basis, bm = L.bias_subspace(t, semantics=semantics)
        return L.neutralisation_loss(h, w, om, basis, bm, semantics=semantics, **red)

    return {"lmd": lmd, "add": add, "hd": hd}


@pytest.mark.parametrize("semantics", SEM)
@pytest.mark.parametrize("name", ["lmd", "add", "hd"])
def test_check_grads(semantics, name):
    h, t, m, n, w, om = _random_case(11)
    f = _all_losses(semantics)[name]
    fh = jax.jit(lambda hh: f(hh, t, m, n, w, om))
    check_grads(fh, (h,), order=1, modes=("rev",), atol=5e-2, rtol=5e-2, eps=1e-3)
    ft = jax.jit(lambda tt: f(h, tt, m, n, w, om))
    if name != "hd" and semantics == "paper":
        check_grads(ft, (t,), order=1, modes=("rev",), atol=5e-2, rtol=5e-2, eps=1e-3)
    if name != "hd":
        gt = jax.jit(jax.grad(ft))(t)
        assert (np.abs(np.asarray(gt)).sum() == 0) == (semantics == "reference")  # detached targets


@pytest.mark.parametrize("semantics", SEM)
@pytest.mark.parametrize("name", ["lmd", "add", "hd"])
def test_jit_equals_nojit_and_batch_of_one(semantics, name):
    h, t, m, n, w, om = _random_case(5)
    f = _all_losses(semantics)[name]
    a = f(h, t, m, n, w, om)
    b = jax.jit(f)(h, t, m, n, w, om)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert np.isfinite(float(a)) and float(a) > 0
    one = f(h[:1], t, m[:1], n[:1], w[:1], om[:1])
    unb = f(h[0], t, m[0], n[0], w[0], om[0])
    np.testing.assert_allclose(np.asarray(one), np.asarray(unb), rtol=1e-6)


@pytest.mark.parametrize("name", ["lmd", "add", "hd"])
def test_vmap_of_sum_losses_adds_up(name):
    # paper semantics with reduction="sum" is additive over sentences: vmap over the batch, then sum
    h, t, m, n, w, om = _random_case(7, B=3)
    f = _all_losses("paper", "sum")[name]
    per = jax.jit(jax.vmap(lambda hh, mm, nn, ww, oo: f(hh, t, mm, nn, ww, oo)))(h, m, n, w, om)
    assert per.shape == (3,)
    np.testing.assert_allclose(float(per.sum()), float(jax.jit(f)(h, t, m, n, w, om)), rtol=1e-5)


def test_gather_targets_averages_subwords():
    emb = jnp.arange(12.0).reshape(6, 2)
    ids = jnp.array([[[1, 2], [3, 0]]])
    mask = jnp.array([[[True, True], [True, False]]])
    got = L.gather_targets(emb, ids, mask)
    np.testing.assert_allclose(got, [[[(2 + 4) / 2, (3 + 5) / 2], [6.0, 7.0]]])


def test_bf16_embeddings_give_float32_targets_and_subspace():
    """A frozen base stored in bf16 (--param-dtype bf16): the target vectors and the HD subspace are computed in
    float32 from the bf16 values upcast (LAPACK has no bf16 SVD), under jit as in training."""
    emb = jnp.asarray(_rng(5).normal(size=(20, 8)), jnp.bfloat16)
    ids = jnp.asarray(_rng(6).integers(0, 20, (6, 2, 3)))
    mask = jnp.asarray(_rng(7).random((6, 2, 3)) > 0.3).at[:, :, 0].set(True)
    t16 = jax.jit(L.gather_targets)(emb, ids, mask)
    t32 = L.gather_targets(emb.astype(jnp.float32), ids, mask)
    assert t16.dtype == jnp.float32
    np.testing.assert_array_equal(t16, t32)
    for semantics in SEM:
        got = jax.jit(L.bias_subspace, static_argnames="semantics")(t16.astype(jnp.bfloat16), semantics=semantics)
        want = L.bias_subspace(t16.astype(jnp.bfloat16).astype(jnp.float32), semantics=semantics)
        assert got[0].dtype == jnp.float32
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_allclose(got[0], want[0], atol=1e-6)


def test_bad_arguments():
    h = jnp.ones((1, 2, 2))
    t = jnp.ones((1, 2, 2))
    with pytest.raises(ValueError):
        L.equalising_loss(h, t, jnp.ones((1, 2, 1)), semantics="code")
    with pytest.raises(ValueError):
        L.attribute_distance_loss(h, t, jnp.ones((1, 1, 2)), jnp.ones((1, 1)), reduction="max")
    with pytest.raises(ValueError):
        L.equalising_loss(jnp.ones((2,)), t, jnp.ones((1, 2, 1)))
