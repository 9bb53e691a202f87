"""LMB statistics against independent numpy/scipy computations and hand values."""
import csv

import numpy as np
import pytest
from scipy import stats as sps

from rbjax.lmb import stats


def test_outlier_rule_population_std_either_side():
    rng = np.random.default_rng(3)
    b = rng.lognormal(6, 1, size=200)
    c = rng.lognormal(6, 1, size=200)
    b[7], c[11] = 1e6, 2e6
    got = stats.outlier_pairs(b, c)
    # independent: |x - mean| > 3 * population std, per list, pair goes if either side is out
    ob = np.abs(b - b.mean()) > 3 * np.sqrt(np.mean((b - b.mean()) ** 2))
    oc = np.abs(c - c.mean()) > 3 * np.sqrt(np.mean((c - c.mean()) ** 2))
    np.testing.assert_array_equal(got, ob | oc)
    assert got[7] and got[11]
    # sample std (ddof=1) is a wider interval: never more outliers
    assert stats.outlier_pairs(b, c, ddof=1).sum() <= got.sum()


def test_outlier_rule_hand_values():
    # values 0 x9 and 10: mean 1, population std 3 -> bound 10 exactly: strict '>' keeps it
    v = np.array([0.0] * 9 + [10.0])
    assert not stats.outliers(v).any()
    v2 = np.array([0.0] * 19 + [10.0])  # mean .5, std ~2.179 -> 10 > 7.04: outlier
    assert list(np.nonzero(stats.outliers(v2))[0]) == [19]


def test_paired_welch_cohen_against_scipy():
    rng = np.random.default_rng(0)
    a = rng.lognormal(6, 0.5, 50)
    b = a * rng.lognormal(0.1, 0.2, 50)
    p = stats.paired_ttest(a, b)
    r = sps.ttest_rel(a, b)
    assert p["t_value"] == pytest.approx(r.statistic) and p["p_value"] == pytest.approx(r.pvalue) and p["status"] == "ok"
    w = stats.welch_ttest(a, b)
    rw = sps.ttest_ind(a, b, equal_var=False)
    assert w["t_value"] == pytest.approx(rw.statistic) and w["p_value"] == pytest.approx(rw.pvalue)
    d = a - b
    assert stats.cohens_d_paired(a, b) == pytest.approx(d.mean() / d.std(ddof=1))
    # d_z * sqrt(n) is the paired t
    assert stats.cohens_d_paired(a, b) * np.sqrt(50) == pytest.approx(r.statistic)


def test_degenerate_paired_tests():
    t1 = np.array([120.0, 85.0, 310.0, 48.0])
    same = stats.paired_ttest(t1, t1)
    assert np.isnan(sps.ttest_rel(t1, t1).statistic)  # what scipy says
    assert same["status"] == "undefined: every paired difference is zero" and same["t_value"] is None
    shifted = stats.paired_ttest(t1, t1 + 10)
    assert sps.ttest_rel(t1, t1 + 10).statistic == -np.inf
    assert shifted["status"] == "zero variance of the differences" and shifted["p_value"] is None
    r = stats.lmb_statistics(t1, t1 + 10, n_bootstrap=100)
    assert r["significant"] is False and r["status"] == "zero variance of the differences"
    assert r["cohens_d_paired"] is None and r["mean_log_ppl_diff_ci"] is not None
    r0 = stats.lmb_statistics(t1, t1, n_bootstrap=100)
    assert r0["significant"] is False and r0["mean_log_ppl_diff_ci"] is None


def test_bootstrap_ci_seeded_and_sensible():
    rng = np.random.default_rng(1)
    d = rng.normal(0.3, 1.0, 300)
    ci1 = stats.bootstrap_ci(d, seed=5)
    assert ci1 == stats.bootstrap_ci(d, seed=5)
    lo, hi = ci1
    se = d.std(ddof=1) / np.sqrt(d.size)
    assert lo < d.mean() < hi
    assert (hi - lo) == pytest.approx(2 * 1.96 * se, rel=0.15)  # close to the normal-theory width


def test_multiple_comparison_correction_by_hand():
    ps = [0.01, 0.04, None, 0.03, 0.2]
    adj = stats.adjust_pvalues(ps)
    assert adj["bonferroni"] == [pytest.approx(0.04), pytest.approx(0.16), None, pytest.approx(0.12), pytest.approx(0.8)]
    # BH by hand, m=4: sorted .01,.03,.04,.2 -> .04, .04*... : q_i = min_{j>=i} p_j m / j
    # .01*4/1=.04, .03*4/2=.06, .04*4/3=.0533, .2*4/4=.2 -> cummin from top: .04, .0533, .0533, .2
    assert adj["benjamini_hochberg"] == [pytest.approx(0.04), pytest.approx(0.16 / 3), None, pytest.approx(0.16 / 3), pytest.approx(0.2)]


def _col(path, name):
    with open(path, newline="") as f:
        return [float(r[name]) for r in csv.DictReader(f)]


# t-values from docs/reference-data.md §8 (scipy on the released perplexity columns)
PAPER_TEST_T = {"religion1": -3.575, "religion2": -5.339, "race": 1.165, "gender": -1.367, "queerness": 1.692}


def test_stored_perplexities_all_five_types(redditbias_dir, tmp_path):
    from rbjax.lmb.measure import measure_bias
    from rbjax.specs import GROUPS, UPSTREAM_NAME

    recs = measure_bias(stored_perplexities=True, bias_types="all", data_dir=redditbias_dir, out_dir=tmp_path,
                        progress=False, n_bootstrap=500)
    by = {r["bias_type"]: r for r in recs}
    for bt, (g1, g2) in GROUPS.items():
        up = UPSTREAM_NAME[bt]
        b = np.array(_col(redditbias_dir / f"data/{up}/reddit_comments_{up}_{g1}_biased_test_reduced.csv", "perplexity"))
        c = np.array(_col(redditbias_dir / f"data/{up}/reddit_comments_{up}_{g2}_biased_test_reduced.csv", "perplexity"))
        ref = sps.ttest_rel(b, c)
        r = by[bt]
        # released files are already reduced with these values: auto mode does not remove outliers again
        assert r["n_pairs"] == r["n_pairs_after_outliers"] == len(b)
        assert r["t_value"] == pytest.approx(ref.statistic) and r["p_value"] == pytest.approx(ref.pvalue)
        assert r["t_value"] == pytest.approx(PAPER_TEST_T[bt], abs=1e-3)
        assert r["reference"]["t_value"] == pytest.approx(ref.statistic)
        w = sps.ttest_ind(b, c, equal_var=False)
        assert r["welch"]["t_value"] == pytest.approx(w.statistic)
        assert r["significant"] == (bt in ("religion1", "religion2"))  # the paper's baseline finding
    # with a second outlier pass forced on, the primary test is on the filtered pairs
    recs2 = measure_bias(stored_perplexities=True, bias_types="religion1", data_dir=redditbias_dir,
                         progress=False, n_bootstrap=200, outlier_removal=True)
    b = np.array(_col(redditbias_dir / "data/religion1/reddit_comments_religion1_jews_biased_test_reduced.csv", "perplexity"))
    c = np.array(_col(redditbias_dir / "data/religion1/reddit_comments_religion1_christians_biased_test_reduced.csv", "perplexity"))
    keep = ~((np.abs(b - b.mean()) > 3 * b.std()) | (np.abs(c - c.mean()) > 3 * c.std()))
    assert recs2[0]["n_pairs_after_outliers"] == keep.sum() == 238 - 7 - 1  # 7 T1 + 5 T2 outliers, 4 shared
    assert recs2[0]["t_value"] == pytest.approx(sps.ttest_rel(b[keep], c[keep]).statistic)
