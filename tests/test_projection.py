"""The maths of debiasing without training (rbjax.debias.projection) on synthetic data, against scikit-learn / scipy
and by hand."""
import numpy as np
import pytest
import scipy.linalg
from sklearn.decomposition import PCA
from sklearn.linear_model import LogisticRegression

from rbjax.debias import projection as pr


def _pairs(rng, n=40, d=12, scale=0.05):
    """(2, n, d) pairs that differ mostly along a known unit direction."""
    v = rng.normal(size=d)
    v /= np.linalg.norm(v)
    base = rng.normal(size=(n, d))
    shift = rng.uniform(0.5, 1.5, size=(n, 1)) * v
    a = base + shift + scale * rng.normal(size=(n, d))
    b = base - shift + scale * rng.normal(size=(n, d))
    return np.stack([a, b]), v


def test_sentence_debias_subspace_is_the_first_principal_component():
    rng = np.random.default_rng(0)
    groups, v = _pairs(rng)
    got = pr.sentence_debias_subspace(groups, k=1)
    # by hand: centre each pair on its mean, stack, sklearn's PCA (bias-bench's procedure)
    mean = groups.mean(axis=0)
    stacked = np.concatenate([groups[0] - mean, groups[1] - mean])
    ref = PCA(n_components=1).fit(stacked).components_[0]
    assert got.shape == (1, 12)
    assert min(np.abs(got[0] - ref).max(), np.abs(got[0] + ref).max()) < 1e-10
    assert abs(abs(got[0] @ v) - 1) < 1e-2  # the planted direction
    k3 = pr.sentence_debias_subspace(np.concatenate([groups, groups[:1] * 0.5]), k=3)  # three groups
    np.testing.assert_allclose(k3 @ k3.T, np.eye(3), atol=1e-12)


def test_sentence_debias_subspace_refuses_what_it_cannot_fit():
    rng = np.random.default_rng(1)
    same = np.stack([rng.normal(size=(4, 5))] * 2)
    with pytest.raises(ValueError, match="span 0"):
        pr.sentence_debias_subspace(same)
    with pytest.raises(ValueError, match="G ≥ 2"):
        pr.sentence_debias_subspace(rng.normal(size=(1, 4, 5)))
    groups, _ = _pairs(rng, n=2, d=5)
    with pytest.raises(ValueError, match="k=5"):
        pr.sentence_debias_subspace(groups, k=5)


def test_subspace_projection_removes_the_directions():
    rng = np.random.default_rng(2)
    v = np.linalg.qr(rng.normal(size=(6, 2)))[0].T  # (2, 6) orthonormal
    p = pr.subspace_projection(v)
    h = rng.normal(size=6)
    np.testing.assert_allclose(p @ h, h - (h @ v[0]) * v[0] - (h @ v[1]) * v[1], atol=1e-12)
    pr.check_projection(p)


def test_rowspace_projection_matches_scipy_orth():
    rng = np.random.default_rng(3)
    w = rng.normal(size=(3, 8))
    w[2] = w[0] + w[1]  # rank 2
    basis = scipy.linalg.orth(w.T)
    np.testing.assert_allclose(pr.rowspace_projection(w), basis @ basis.T, atol=1e-12)
    assert np.array_equal(pr.rowspace_projection(np.zeros((1, 4))), np.zeros((4, 4)))


def test_binary_classifier_matches_sklearn_logistic_regression():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(120, 6))
    y = (x @ rng.normal(size=6) + 0.5 * rng.normal(size=120) > 0).astype(int)
    w = pr.fit_linear_classifier(x, y, 2, l2=1.0)
    ref = LogisticRegression(C=1.0, fit_intercept=False, tol=1e-10, max_iter=10_000).fit(x, y).coef_
    assert w.shape == (1, 6)
    np.testing.assert_allclose(w, ref, atol=2e-4)


def _binary_data(seed, n=300, d=10):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    x = rng.normal(size=(n, d))
    s = 2 * y - 1
    x[:, 0] += 2.0 * s
    x[:, 1] += 1.0 * s
    x[:, 2] += 0.5 * s
    return x, y


def test_inlp_projection_is_a_projection_whose_rank_drops_by_one_per_binary_classifier():
    x, y = _binary_data(5)
    res = pr.inlp_projection(x[:200], y[:200], x[200:], y[200:], iterations=8, epsilon=0.02)
    p = res.projection
    assert np.abs(p - p.T).max() < 1e-12 and np.abs(p @ p - p).max() < 1e-10
    kept = [h for h in res.history if h["kept"]]
    assert len(kept) >= 2  # the planted signal takes more than one direction to remove
    assert [h["rank"] for h in kept] == [10 - i for i in range(1, len(kept) + 1)]
    assert np.linalg.matrix_rank(p, tol=1e-8) == 10 - len(res.classifiers)
    for w in res.classifiers:  # every removed direction is in P's nullspace
        assert np.abs(w @ p).max() < 1e-8
    # it stopped because the last classifier was at chance on the held-out rows, and that one was not kept
    assert res.stopped == "chance"
    last = res.history[-1]
    assert not last["kept"] and last["dev_accuracy"] <= last["chance"] + 0.02
    assert all(h["dev_accuracy"] > h["chance"] + 0.02 for h in kept)


def test_inlp_three_classes_remove_two_directions_per_classifier():
    rng = np.random.default_rng(6)
    y = rng.integers(0, 3, 300)
    x = rng.normal(size=(300, 9))
    x[np.arange(300), y] += 3.0
    res = pr.inlp_projection(x[:200], y[:200], x[200:], y[200:], iterations=1)
    assert res.classifiers[0].shape == (2, 9)
    assert res.history[0]["rank"] == 7 and res.stopped == "iterations"


def test_inlp_is_deterministic_and_checks_its_input():
    x, y = _binary_data(7)
    a = pr.inlp_projection(x[:200], y[:200], x[200:], y[200:], iterations=3)
    b = pr.inlp_projection(x[:200], y[:200], x[200:], y[200:], iterations=3)
    assert np.array_equal(a.projection, b.projection)
    with pytest.raises(ValueError, match="single class"):
        pr.inlp_projection(x[:10], np.zeros(10, int), x[10:20], y[10:20])
    with pytest.raises(ValueError, match="labels"):
        pr.inlp_projection(x[:10], y[:10] + 5, x[10:20], y[10:20], n_classes=2)


def test_split_groups_keeps_sets_apart_and_is_seeded():
    tr, dv = pr.split_groups(10, 0.3, seed=0)
    assert len(dv) == 3 and len(tr) == 7 and not set(tr) & set(dv)
    assert np.array_equal(pr.split_groups(10, 0.3, seed=0)[1], dv)
    with pytest.raises(ValueError, match="at least 2"):
        pr.split_groups(1, 0.3, seed=0)


def test_fold_into_head_gives_the_logits_of_the_projected_state():
    rng = np.random.default_rng(8)
    v = rng.normal(size=(1, 7))
    v /= np.linalg.norm(v)
    p = pr.subspace_projection(v)
    w = rng.normal(size=(11, 7))
    h = rng.normal(size=(3, 7))
    np.testing.assert_allclose(h @ pr.fold_into_head(w, p).T, (h @ p) @ w.T, atol=1e-5)
    with pytest.raises(ValueError, match="not symmetric"):
        pr.fold_into_head(w, p + np.triu(np.ones((7, 7)), 1))
    with pytest.raises(ValueError, match="not idempotent"):
        pr.fold_into_head(w, 2 * p)


def test_nullspace_of_stacked_bases_equals_the_intersection_of_projections():
    # the INLP update without a (d, d) SVD per iteration: the same projection and rank as nullspace_intersection's
    # sum of row-space projections, for nearly parallel rows too (the rule keeps the same directions)
    rng = np.random.default_rng(8)
    ws = [rng.normal(size=(1, 12)), rng.normal(size=(2, 12))]
    ws.append(ws[0] + 1e-3 * rng.normal(size=(1, 12)))
    ws.append(ws[1][:1] * 3.0)  # inside an earlier row space: removes nothing new
    p, k = pr.nullspace_of_bases([pr.rowspace_basis(w) for w in ws], 12)
    ref = pr.nullspace_intersection([pr.rowspace_projection(w) for w in ws], 12)
    np.testing.assert_allclose(p, ref, atol=1e-10)
    assert k == 4 == 12 - np.linalg.matrix_rank(ref, tol=1e-8)
    o = scipy.linalg.null_space(np.concatenate(ws))  # by scipy: the common nullspace of all the rows
    np.testing.assert_allclose(p, o @ o.T, atol=1e-8)
    assert pr.nullspace_of_bases([], 5)[1] == 0 and np.array_equal(pr.nullspace_of_bases([], 5)[0], np.eye(5))
