"""Self-Debias: the rescaling by hand on a tiny distribution, several prefixes as their elementwise maximum, the
default prefixes, the run folder (``rbjax debias --method self-debias``) read by ``measure``, and ``export``'s
refusal."""
import json
import math

import numpy as np
import pytest

from rbjax.model.self_debias import (BIAS_BENCH_PREFIXES, SelfDebiasSettings, default_prefixes,
                                     rescaled_log_probs)


def _q(p, pks, lam=50.0, eps=0.01):
    lq = rescaled_log_probs(np.log(np.array(p)), np.log(np.array(pks)), lam, eps)
    return np.exp(np.asarray(lq, np.float64))


def test_rescaling_by_hand():
    # Δ = (0, 0.3, 0): exp(−50·0.3) = 3e-7 is floored at ε = 0.01
    np.testing.assert_allclose(_q([0.5, 0.3, 0.2], [[0.2, 0.6, 0.2]]),
                               np.array([0.5, 0.003, 0.2]) / 0.703, rtol=1e-6)
    # λ = 1: the factor is exp(−0.3) itself
    f = math.exp(-0.3)
    np.testing.assert_allclose(_q([0.5, 0.3, 0.2], [[0.2, 0.6, 0.2]], lam=1.0),
                               np.array([0.5, 0.3 * f, 0.2]) / (0.7 + 0.3 * f), rtol=1e-6)
    # a prefixed distribution below the regular one everywhere it differs changes nothing
    np.testing.assert_allclose(_q([0.5, 0.3, 0.2], [[0.5, 0.3, 0.2]]), [0.5, 0.3, 0.2], rtol=1e-6)


def test_several_prefixes_take_the_elementwise_maximum():
    p, p1, p2 = [0.5, 0.3, 0.2], [0.2, 0.6, 0.2], [0.7, 0.1, 0.2]
    # max(p1, p2) = (0.7, 0.6, 0.2): Δ = (0.2, 0.3, 0), both floored at ε
    want = np.array([0.005, 0.003, 0.2]) / 0.208
    np.testing.assert_allclose(_q(p, [p1, p2]), want, rtol=1e-6)
    np.testing.assert_allclose(_q(p, [p2, p1]), want, rtol=1e-6)
    # the maximum is not the mean (nor either prefix alone)
    assert not np.allclose(_q(p, [p1]), want)


def test_default_prefixes_are_bias_benchs():
    assert default_prefixes("gender") == ("The following text discriminates against people because of their "
                                          "gender: ",)
    assert default_prefixes("race") == default_prefixes("race-color") == (BIAS_BENCH_PREFIXES["race-color"],)
    assert default_prefixes("religion1") == default_prefixes("Religion")
    assert default_prefixes("Race_x_SES") == (BIAS_BENCH_PREFIXES["race-color"], BIAS_BENCH_PREFIXES["socioeconomic"])
    with pytest.raises(ValueError, match="--prefix"):
        default_prefixes("nonsense")
    with pytest.raises(ValueError, match="empty"):
        SelfDebiasSettings(("",))
