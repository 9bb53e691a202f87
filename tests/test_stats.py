"""LMB statistics against independent numpy/scipy computations and hand values."""
import csv
import json
import warnings

import numpy as np
import pytest
from scipy import stats as sps

from rbjax.lmb import stats


def _quiet(fn, *args, **kw):
    """What scipy itself says, without its precision-loss warnings (the suite turns RuntimeWarnings into errors)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return fn(*args, **kw)


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


def test_outlier_rule_population_not_sample_std():
    # mean 1; population std sqrt(90/11) = 2.86 -> bound 9.58 < 10: one outlier.
    # sample std sqrt(90/10) = 3 -> bound exactly 10: strict '>' keeps it: none.
    v = np.array([0.0] * 9 + [10.0, 1.0])
    assert list(np.nonzero(stats.outliers(v))[0]) == [9]  # the default is the reference's np.std (ddof=0)
    assert not stats.outliers(v, ddof=1).any()
    flat = np.full(v.size, 5.0)
    assert list(np.nonzero(stats.outlier_pairs(v, flat))[0]) == [9]
    assert not stats.outlier_pairs(v, flat, ddof=1).any()
    r = stats.lmb_statistics(v + 1.0, np.linspace(1.0, 2.0, v.size), n_bootstrap=0)
    assert r["n_outlier_pairs"] == 1 and r["n_pairs_after_outliers"] == 10 and r["outlier_rule"]["ddof"] == 0


def test_outliers_of_values_constant_up_to_rounding():
    # one value 1 ulp off: its z-score is sqrt(19) > 3, but the spread is rounding, not an outlier
    v = np.array([1.0] * 19 + [np.nextafter(1.0, 2.0)])
    assert np.abs(v - v.mean()).max() > 3 * v.std()  # the plain rule would drop it
    assert not stats.outliers(v).any()
    assert stats.constant_up_to_rounding(v) and not stats.constant_up_to_rounding(v + np.arange(20) * 1e-9)


def test_direction_label():
    b = np.array([10.0, 12.0, 11.0, 13.0, 9.5])
    r = stats.lmb_statistics(b, b + np.array([1.0, 2.0, 1.5, 2.5, 1.0]), n_bootstrap=0)
    assert r["t_value"] < 0 and r["direction"] == "stereotypical"  # biased phrases more likely (lower ppl)
    r = stats.lmb_statistics(b + np.array([1.0, 2.0, 1.5, 2.5, 1.0]), b, n_bootstrap=0)
    assert r["t_value"] > 0 and r["direction"] == "anti-stereotypical"
    assert stats.lmb_statistics(b, b, n_bootstrap=0)["direction"] is None


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
    assert np.isnan(_quiet(sps.ttest_rel, t1, t1).statistic)  # what scipy says
    assert same["status"] == "undefined: every paired difference is zero" and same["t_value"] is None
    shifted = stats.paired_ttest(t1, t1 + 10)
    assert _quiet(sps.ttest_rel, t1, t1 + 10).statistic == -np.inf
    assert shifted["status"] == "zero variance of the differences" and shifted["p_value"] is None
    r = stats.lmb_statistics(t1, t1 + 10, n_bootstrap=100)
    assert r["significant"] is False and r["status"] == "zero variance of the differences"
    assert r["cohens_d_paired"] is None and r["mean_log_ppl_diff_ci"] is not None  # the log ratios do vary
    r0 = stats.lmb_statistics(t1, t1, n_bootstrap=100)
    assert r0["significant"] is False and r0["mean_log_ppl_diff_ci"] is None


# Field case: differences constant up to rounding (every difference is -0.1 in exact arithmetic).
FIELD_T1 = [120.3, 85.7, 310.1, 48.9]
FIELD_T2 = [120.4, 85.8, 310.2, 49.0]


def test_field_case_differences_constant_up_to_rounding():
    a, b = np.array(FIELD_T1), np.array(FIELD_T2)
    d = a - b
    assert len(set(d.tolist())) > 1  # float64 spreads them (by ~1e-14) ...
    sc = sps.ttest_rel(a, b)
    assert sc.statistic < -1e12 and sc.pvalue < 1e-30  # ... and scipy calls it overwhelmingly significant
    p = stats.paired_ttest(a, b)
    assert p["status"] == "zero variance of the differences" and p["t_value"] is None and p["p_value"] is None
    assert stats.cohens_d_paired(a, b) is None
    assert stats.bootstrap_ci(d, n_resamples=200, scale=310.2) is None  # scale: the values d came from
    r = stats.lmb_statistics(a, b, n_bootstrap=200)
    assert r["significant"] is False and r["direction"] is None and r["status"] == "zero variance of the differences"
    assert r["reference"]["status"] == "zero variance of the differences" and r["reference"]["t_value"] is None
    assert r["cohens_d_paired"] is None
    # the tolerance follows the scale of the inputs, not exact equality
    for k in (1e-3, 0.37, 1e5):
        assert stats.paired_ttest(a * k, b * k)["status"] == "zero variance of the differences"
    # differences that are zero up to rounding: 0.1 + 0.2 != 0.3 in float64
    z = stats.paired_ttest(np.array([0.1, 1.1, 2.1, 5.1]) + 0.2, np.array([0.3, 1.3, 2.3, 5.3]))
    assert z["status"] == "undefined: every paired difference is zero"
    # a real spread far below the values but far above rounding is data: scipy's answer
    e = np.array([0.0, 1e-9, 2e-9, 4e-9])
    ok = stats.paired_ttest(a, b + e)
    assert ok["status"] == "ok" and ok["t_value"] == pytest.approx(sps.ttest_rel(a, b + e).statistic)


def test_field_case_welch_both_groups_constant():
    a, b = np.full(10, 0.04), np.full(30, 0.04)
    assert _quiet(sps.ttest_ind, a, b, equal_var=False).pvalue < 1e-3  # scipy: t = -5.24 from rounding alone
    w = stats.welch_ttest(a, b)
    assert w == {"t_value": None, "p_value": None, "status": "undefined: both groups are constant"}
    assert stats.welch_ttest(np.full(10, 0.04), np.full(30, 0.05))["status"] == "zero variance in both groups"
    # one constant group: a defined test; the constant group's variance is exactly 0
    c = np.array([0.01, 0.05, 0.03, 0.08])
    w = stats.welch_ttest(a, c)
    m, v = c.mean(), c.var(ddof=1) / c.size
    assert w["status"] == "ok" and w["t_value"] == pytest.approx((0.04 - m) / np.sqrt(v), rel=1e-9)
    assert w["p_value"] == pytest.approx(_quiet(sps.ttest_ind, a, c, equal_var=False).pvalue, rel=1e-6)
    # and inside lmb_statistics (outlier rule off: nothing to remove from constant lists)
    r = stats.lmb_statistics(a + 1, b[:10] + 1, n_bootstrap=100)
    assert r["welch"]["status"] == "undefined: both groups are constant" and r["significant"] is False


def test_bootstrap_ci_is_scipy_bca_at_the_same_seed():
    rng = np.random.default_rng(4)
    d = rng.lognormal(0, 1, 60) - 1.2  # skewed: BCa and percentile intervals differ
    for seed in (0, 7):
        got = stats.bootstrap_ci(d, confidence=0.9, n_resamples=2000, seed=seed)
        ref = sps.bootstrap((d,), np.mean, confidence_level=0.9, n_resamples=2000, method="BCa",
                            random_state=np.random.default_rng(seed)).confidence_interval
        assert got == (pytest.approx(ref.low, rel=1e-12), pytest.approx(ref.high, rel=1e-12))
    pct = sps.bootstrap((d,), np.mean, confidence_level=0.9, n_resamples=2000, method="percentile",
                        random_state=np.random.default_rng(0)).confidence_interval
    assert abs(pct.low - stats.bootstrap_ci(d, 0.9, 2000, 0)[0]) > 1e-3  # the test can tell the methods apart


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


# t-values of scipy on the released perplexity columns (docs/lmb.md, "Reference values")
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
    # every record written to lmb.json carries the direction label of its t-value's sign
    written = json.loads((tmp_path / "lmb.json").read_text())
    assert [w["bias_type"] for w in written] == [r["bias_type"] for r in recs]
    for w in written:
        assert w["direction"] == ("stereotypical" if w["t_value"] < 0 else "anti-stereotypical")
        assert w["split"] == "test" and w["outlier_rule"]["applied"] is False
    assert {w["bias_type"]: w["direction"] for w in written} == {  # the paper's Table 2 signs (DialoGPT-small)
        "religion1": "stereotypical", "religion2": "stereotypical", "race": "anti-stereotypical",
        "gender": "stereotypical", "queerness": "anti-stereotypical"}
    # with a second outlier pass forced on, the primary test is on the filtered pairs
    recs2 = measure_bias(stored_perplexities=True, bias_types="religion1", data_dir=redditbias_dir,
                         progress=False, n_bootstrap=200, outlier_removal=True)
    b = np.array(_col(redditbias_dir / "data/religion1/reddit_comments_religion1_jews_biased_test_reduced.csv", "perplexity"))
    c = np.array(_col(redditbias_dir / "data/religion1/reddit_comments_religion1_christians_biased_test_reduced.csv", "perplexity"))
    keep = ~((np.abs(b - b.mean()) > 3 * b.std()) | (np.abs(c - c.mean()) > 3 * c.std()))
    assert recs2[0]["n_pairs_after_outliers"] == keep.sum() == 238 - 7 - 1  # 7 T1 + 5 T2 outliers, 4 shared
    assert recs2[0]["t_value"] == pytest.approx(sps.ttest_rel(b[keep], c[keep]).statistic)
