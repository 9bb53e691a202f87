"""The paper's outlier rule on paired values (§3.1): a pair is dropped when either side lies outside
mean ± 3·std of its own list.

It lives in the data layer because it serves both the benchmark's construction (the splits of §2.3 are reduced
with the baseline model's perplexities, :mod:`rbjax.data.splits`) and the LMB statistics (:mod:`rbjax.lmb.stats`).
"""
from __future__ import annotations

import numpy as np

#: The reference code's std convention for the outlier rule (``np.std``, population).
DEFAULT_DDOF = 0

#: Values whose spread is at most ``ROUNDING_ULPS · eps · scale`` (float64 ``eps``, ``scale`` the largest magnitude
#: of the inputs they were computed from) are constant up to rounding: a difference ``a − b`` carries an error of
#: about ``eps·max(|a|, |b|)``, so a spread of that size is rounding, not data. 32 is above scipy's own
#: precision-loss threshold (10·eps relative to the mean, which is at most ``2·max|x|``), so every input on which
#: scipy would warn "catastrophic cancellation" is caught as degenerate first.
ROUNDING_ULPS = 32


def constant_up_to_rounding(values, scale: float | None = None) -> bool:
    """Whether ``values`` are all equal up to float64 rounding of inputs of magnitude ``scale``.

    Args:
        values: (N,) floats (e.g. paired differences ``a − b``).
        scale: magnitude of the numbers ``values`` were computed from (e.g. ``max(|a|, |b|)``); default
            ``max|values|``.
    Returns:
        True when ``max|values − mean(values)| <= ROUNDING_ULPS · eps · scale`` (always for N <= 1).
    """
    v = np.asarray(values, dtype=np.float64)
    if v.size <= 1:
        return True
    if scale is None:
        scale = float(np.max(np.abs(v)))
    spread = float(np.max(np.abs(v - v.mean())))
    return spread <= ROUNDING_ULPS * np.finfo(np.float64).eps * scale


def outliers(values: np.ndarray, n_std: float = 3.0, ddof: int = DEFAULT_DDOF) -> np.ndarray:
    """Mask of values outside ``mean ± n_std·std`` (strict), std with ``ddof`` (0 = population).

    Values that are constant up to rounding (:func:`constant_up_to_rounding`) have no outlier.

    Args:
        values: (N,) finite floats.
    Returns:
        bool (N,), True = outlier.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0 or constant_up_to_rounding(v):  # a rounding-level spread would make outliers of noise
        return np.zeros(v.shape, dtype=bool)
    m, s = v.mean(), v.std(ddof=ddof) if v.size > ddof else 0.0
    return (v > m + n_std * s) | (v < m - n_std * s)


def outlier_pairs(biased_ppl, counter_ppl, n_std: float = 3.0, ddof: int = DEFAULT_DDOF) -> np.ndarray:
    """Pairs to drop (paper §3.1): either side lies outside mean ± n_std·std of *its own* list.

    Unlike the reference script, pairs are dropped by position, not by matching the
    perplexity value (which also drops unrelated rows with an equal value).

    Args:
        biased_ppl, counter_ppl: (N,) perplexities of the biased phrases and their counterfactuals.
        n_std: width of the interval in standard deviations (3 in the paper).
        ddof: 0 = population std (reference code, default), 1 = sample std.
    Returns:
        bool (N,), True = the pair is an outlier and is removed.
    Raises:
        ValueError: the lists differ in length.
    """
    b, c = np.asarray(biased_ppl, dtype=np.float64), np.asarray(counter_ppl, dtype=np.float64)
    if b.shape != c.shape:
        raise ValueError(f"biased and counterfactual lists differ in length ({b.size} vs {c.size})")
    return outliers(b, n_std, ddof) | outliers(c, n_std, ddof)
