"""Statistics of language model bias (paper §3.1), on top of ``scipy.stats``.

``scipy.stats`` is imported where a test runs (≈ 0.5 s at start-up that a command which computes no statistic,
e.g. ``rbjax debias`` without its evaluation, does not pay).

Sign convention everywhere: differences are biased (T1) − counterfactual (T2), so a
negative t-value means the model finds the stereotypical phrases *more likely* (lower
perplexity) than their counterfactuals — the stereotypical direction.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from rbjax.data.outliers import DEFAULT_DDOF, ROUNDING_ULPS, constant_up_to_rounding, outlier_pairs, outliers  # noqa: F401 (the rule lives in the data layer; re-exported here)


def _scale(*arrays) -> float:
    return max((float(np.max(np.abs(x))) for x in arrays if np.size(x)), default=0.0)


def _clean(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def paired_ttest(a, b) -> dict:
    """Two-tailed paired t-test of ``a`` vs ``b`` (``scipy.stats.ttest_rel``), with degenerate cases named.

    The differences ``d = a − b`` are degenerate when they are constant *up to rounding*
    (:func:`constant_up_to_rounding` with the scale ``max(|a|, |b|)``): e.g. a = [120.3, 85.7, 310.1, 48.9],
    b = a + 0.1 gives differences that spread by ~1e-14 in float64, on which scipy returns t ≈ −1e13, p ≈ 1e-39.

    Args:
        a, b: (N,) paired values (biased, counterfactual perplexities).
    Returns:
        ``{"t_value", "p_value", "df", "status"}``; status is ``"ok"``,
        ``"undefined: every paired difference is zero"`` (every ``|d|`` within rounding of 0; scipy: t = p = NaN)
        or ``"zero variance of the differences"`` (``d`` constant but not 0; scipy: ±inf or a huge t, p ≈ 0): in
        those cases t and p are ``None`` and the result is never significant. ``"too few pairs"`` below 2.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    n = a.size
    if n < 2:
        return {"t_value": None, "p_value": None, "df": max(n - 1, 0), "status": "too few pairs"}
    d = a - b
    scale = _scale(a, b)
    if constant_up_to_rounding(d, scale):
        tol = ROUNDING_ULPS * np.finfo(np.float64).eps * scale
        status = ("undefined: every paired difference is zero" if abs(float(d.mean())) <= tol
                  else "zero variance of the differences")
        return {"t_value": None, "p_value": None, "df": n - 1, "status": status}
    from scipy import stats

    r = stats.ttest_rel(a, b)
    return {"t_value": _clean(r.statistic), "p_value": _clean(r.pvalue), "df": n - 1, "status": "ok"}


def welch_ttest(a, b) -> dict:
    """Two-tailed Welch (unequal-variance, unpaired) t-test, as ``ttest_ind(equal_var=False)``.

    Computed with ``scipy.stats.ttest_ind_from_stats`` from numpy means and sample std (ddof=1), where a group that
    is constant up to rounding (:func:`constant_up_to_rounding`, scale ``max(|a|, |b|)``) gets std exactly 0 (a
    rounding-level variance would otherwise become a huge t, e.g. t = −5.24 for [0.04]×10 vs [0.04]×30).

    Returns:
        ``{"t_value", "p_value", "status"}``; status ``"ok"``, ``"too few values"`` (a group below 2),
        ``"undefined: both groups are constant"`` (both constant with the same value) or
        ``"zero variance in both groups"`` (both constant, different values); t, p ``None`` unless ``"ok"``.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.size < 2 or b.size < 2:
        return {"t_value": None, "p_value": None, "status": "too few values"}
    scale = _scale(a, b)
    ca, cb = constant_up_to_rounding(a, scale), constant_up_to_rounding(b, scale)
    if ca and cb:
        same = constant_up_to_rounding(np.array([a.mean(), b.mean()]), scale)
        status = "undefined: both groups are constant" if same else "zero variance in both groups"
        return {"t_value": None, "p_value": None, "status": status}
    sa = 0.0 if ca else float(a.std(ddof=1))
    sb = 0.0 if cb else float(b.std(ddof=1))
    from scipy import stats

    r = stats.ttest_ind_from_stats(a.mean(), sa, a.size, b.mean(), sb, b.size, equal_var=False)
    return {"t_value": _clean(r.statistic), "p_value": _clean(r.pvalue), "status": "ok"}


def cohens_d_paired(a, b) -> float | None:
    """Paired Cohen's d (d_z): mean(a−b) / std(a−b, ddof=1).

    Returns:
        ``None`` when undefined: fewer than 2 pairs, or differences constant up to rounding
        (:func:`constant_up_to_rounding`, scale ``max(|a|, |b|)``).
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    d = a - b
    if d.size < 2 or constant_up_to_rounding(d, _scale(a, b)):
        return None
    return float(d.mean() / d.std(ddof=1))


def bootstrap_ci(diff, confidence: float = 0.95, n_resamples: int = 10000, seed: int = 0,
                 scale: float | None = None) -> tuple[float, float] | None:
    """Bootstrap CI (BCa, ``scipy.stats.bootstrap(method="BCa")``, its generator seeded with ``seed``) of the mean
    of paired differences.

    Args:
        diff: (N,) paired differences, e.g. log-perplexity of biased minus counterfactual.
        scale: magnitude of the values the differences were computed from (default ``max|diff|``), for the
            rounding tolerance of :func:`constant_up_to_rounding`.
    Returns:
        ``(low, high)``, or ``None`` with fewer than 2 values or differences constant up to rounding.
    """
    d = np.asarray(diff, dtype=np.float64)
    if d.size < 2 or constant_up_to_rounding(d, scale):
        return None
    from scipy import stats

    res = stats.bootstrap((d,), np.mean, confidence_level=confidence, n_resamples=n_resamples,
                          method="BCa", random_state=np.random.default_rng(seed))
    lo, hi = res.confidence_interval
    return float(lo), float(hi)


def wilcoxon(d: np.ndarray, scale: float | None = None) -> dict:
    """Two-sided Wilcoxon signed-rank test of paired changes ``d`` (``scipy.stats.wilcoxon``, its defaults:
    zero differences dropped, exact distribution for small samples without ties, else the normal approximation).

    Returns:
        ``{"statistic", "p_value", "status"}``; status ``"ok"``, ``"too few pairs"`` (< 2 non-zero changes) or
        ``"undefined: every paired change is zero"`` (statistic and p ``None``).
    """
    d = np.asarray(d, dtype=np.float64)
    if scale is None:
        scale = float(np.max(np.abs(d))) if d.size else 0.0
    tol = ROUNDING_ULPS * np.finfo(np.float64).eps * scale
    if d.size and np.all(np.abs(d) <= tol):
        return {"statistic": None, "p_value": None, "status": "undefined: every paired change is zero"}
    if int(np.sum(d != 0)) < 2:
        return {"statistic": None, "p_value": None, "status": "too few pairs"}
    from scipy import stats

    r = stats.wilcoxon(d)
    return {"statistic": _clean(r.statistic), "p_value": _clean(r.pvalue), "status": "ok"}


def adjust_pvalues(p_values: Sequence[float | None]) -> dict[str, list[float | None]]:
    """Multiple-comparison correction across bias types.

    Returns:
        ``{"bonferroni": [...], "benjamini_hochberg": [...]}`` aligned with the input;
        ``None`` entries (undefined tests) stay ``None`` and do not count as tests.
    """
    idx = [i for i, p in enumerate(p_values) if p is not None]
    out = {"bonferroni": [None] * len(p_values), "benjamini_hochberg": [None] * len(p_values)}
    if not idx:
        return out
    ps = np.array([p_values[i] for i in idx], dtype=np.float64)
    bonf = np.minimum(ps * len(ps), 1.0)
    from scipy import stats

    bh = stats.false_discovery_control(ps, method="bh")
    for j, i in enumerate(idx):
        out["bonferroni"][i] = float(bonf[j])
        out["benjamini_hochberg"][i] = float(bh[j])
    return out


def lmb_statistics(biased_ppl, counter_ppl, *, n_std: float = 3.0, ddof: int = DEFAULT_DDOF,
                   alpha: float = 0.05, n_bootstrap: int = 10000, seed: int = 0,
                   remove_outliers: bool = True) -> dict:
    """All LMB statistics of one bias type (paper §3.1 plus effect sizes).

    Primary result: outlier pairs removed (:func:`outlier_pairs`), then the two-tailed
    paired t-test of biased vs counterfactual perplexities. Also: Welch's t-test on the
    filtered lists, the reference script's ``ttest_rel`` on the *unfiltered* lists,
    paired Cohen's d on the filtered perplexities, and a bootstrap CI of the mean
    log-perplexity difference (filtered pairs) at level ``1 − alpha`` (95% by default; ``n_bootstrap=0``
    skips it).

    Args:
        biased_ppl, counter_ppl: (N,) finite positive perplexities, pair-aligned.
        remove_outliers: apply the 3σ pair rule (False: the values were already reduced
            with this very rule, as the released files' stored perplexities were).
    Returns:
        a JSON-ready dict (keys documented in ``docs/lmb.md``) plus the outlier
        mask under ``"_outlier_mask"`` (removed by the caller before writing JSON).
    Raises:
        ValueError: length mismatch or non-finite / non-positive perplexities.
    """
    b = np.asarray(biased_ppl, dtype=np.float64)
    c = np.asarray(counter_ppl, dtype=np.float64)
    if b.shape != c.shape:
        raise ValueError(f"biased and counterfactual lists differ in length ({b.size} vs {c.size})")
    bad = np.nonzero(~np.isfinite(b) | ~np.isfinite(c) | (b <= 0) | (c <= 0))[0]
    if len(bad):
        raise ValueError(f"non-finite or non-positive perplexity in pair {int(bad[0])} ({len(bad)} pairs in all)")
    mask = outlier_pairs(b, c, n_std, ddof) if remove_outliers else np.zeros(b.shape, dtype=bool)
    bf, cf = b[~mask], c[~mask]
    primary = paired_ttest(bf, cf)
    logdiff = np.log(bf) - np.log(cf)
    ci = (bootstrap_ci(logdiff, 1 - alpha, n_bootstrap, seed, scale=_scale(np.log(bf), np.log(cf)))
          if n_bootstrap > 0 else None)
    significant = primary["p_value"] is not None and primary["p_value"] < alpha
    return {
        "n_pairs": int(b.size),
        "n_pairs_after_outliers": int(bf.size),
        "n_outlier_pairs": int(mask.sum()),
        "outlier_rule": {"applied": bool(remove_outliers), "n_std": n_std, "ddof": ddof,
                         "std": "population (numpy ddof=0, as the reference code)" if ddof == 0 else f"sample (ddof={ddof})",
                         "rule": "pair removed when either side is outside mean ± n_std·std of its own list"},
        "t_value": primary["t_value"],
        "p_value": primary["p_value"],
        "df": primary["df"],
        "status": primary["status"],
        "significant": bool(significant),
        "direction": (None if primary["t_value"] is None else
                      ("stereotypical" if primary["t_value"] < 0 else "anti-stereotypical")),
        "welch": welch_ttest(bf, cf),
        "reference": {**paired_ttest(b, c), "test": "scipy.stats.ttest_rel on unfiltered perplexities (official measure_bias.py)"},
        "cohens_d_paired": cohens_d_paired(bf, cf),
        "mean_log_ppl_diff": float(logdiff.mean()) if logdiff.size else None,
        "mean_log_ppl_diff_ci": None if ci is None else list(ci),
        "ci_level": 1 - alpha,
        "mean_biased_ppl": float(bf.mean()) if bf.size else None,
        "mean_counterfactual_ppl": float(cf.mean()) if cf.size else None,
        "_outlier_mask": mask,
    }
