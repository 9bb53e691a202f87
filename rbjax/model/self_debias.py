"""Self-Debias (Schick, Udupa & Schütze, TACL 2021) as bias-bench's GPT-2 wrapper computes it: the rescaling of a
next-token distribution by the same distribution under self-debiasing prefixes (docs/debiasing.md, "Self-Debias").

For one position, ``p`` the model's next-token distribution on the text and ``p_k`` the distribution with prefix
``k`` prepended (the prefix tokenised on its own, its ids put before the text's — after a leading BOS)::

    Δ = max(0, max_k p_k − p)                    (elementwise over the vocabulary)
    q ∝ p · max(ε, exp(−λ·Δ))                    (renormalised)

λ (``decay_constant``) = 50 and ε (``epsilon``) = 0.01 by default, bias-bench's. This module holds the formula
(:func:`rescaled_log_probs`), the settings (:class:`SelfDebiasSettings`) and bias-bench's prefix texts
(:data:`BIAS_BENCH_PREFIXES`) with the categories of RedditBias, CrowS-Pairs and BBQ they stand for
(:data:`CATEGORY_PREFIXES`, :func:`default_prefixes`). Scoring: :mod:`rbjax.lmb.self_debias`.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

__all__ = ["BIAS_BENCH_PREFIXES", "CATEGORY_PREFIXES", "DECAY_CONSTANT", "EPSILON", "SelfDebiasSettings",
           "default_prefixes", "rescaled_log_probs", "target_log_probs"]

DECAY_CONSTANT = 50.0
EPSILON = 0.01

#: bias-bench's self-debiasing prefixes (benchmark/crows/crows.py ``DEBIASING_PREFIXES``), verbatim — "orientiation"
#: misspelt as there, and each with its trailing space
BIAS_BENCH_PREFIXES = {
    "race-color": "The following text discriminates against people because of their race/color: ",
    "gender": "The following text discriminates against people because of their gender: ",
    "socioeconomic": "The following text discriminates against people because of their socioeconomic status/"
                     "occupation: ",
    "sexual-orientation": "The following text discriminates against people because of their sexual orientiation: ",
    "religion": "The following text discriminates against people because of their religion: ",
    "age": "The following text discriminates against people because of their age: ",
    "nationality": "The following text discriminates against people because of their nationality: ",
    "disability": "The following text discriminates against people because of their disability: ",
    "physical-appearance": "The following text discriminates against people because of their physical appearance: ",
}

#: the bias-bench prefixes of each category name of RedditBias (gender, race, religion1, religion2, queerness),
#: CrowS-Pairs (its nine ``bias_type`` values, ``race`` and ``race-color`` both) and BBQ (its eleven categories;
#: the intersectional ones take both prefixes)
CATEGORY_PREFIXES: dict[str, tuple[str, ...]] = {
    # RedditBias
    "gender": ("gender",), "race": ("race-color",), "religion1": ("religion",), "religion2": ("religion",),
    "queerness": ("sexual-orientation",),
    # CrowS-Pairs
    "race-color": ("race-color",), "socioeconomic": ("socioeconomic",), "sexual-orientation": ("sexual-orientation",),
    "religion": ("religion",), "age": ("age",), "nationality": ("nationality",), "disability": ("disability",),
    "physical-appearance": ("physical-appearance",),
    # BBQ
    "Age": ("age",), "Disability_status": ("disability",), "Gender_identity": ("gender",),
    "Nationality": ("nationality",), "Physical_appearance": ("physical-appearance",),
    "Race_ethnicity": ("race-color",), "Race_x_SES": ("race-color", "socioeconomic"),
    "Race_x_gender": ("race-color", "gender"), "Religion": ("religion",), "SES": ("socioeconomic",),
    "Sexual_orientation": ("sexual-orientation",),
}


def default_prefixes(category: str) -> tuple[str, ...]:
    """bias-bench's prefix texts for a RedditBias, CrowS-Pairs or BBQ category (:data:`CATEGORY_PREFIXES`).

    Raises:
        ValueError: a category without default prefixes (name them with ``--prefix``).
    """
    if category not in CATEGORY_PREFIXES:
        raise ValueError(f"no default self-debiasing prefix for the category {category!r} (known: "
                         f"{', '.join(sorted(CATEGORY_PREFIXES))}); give your own with --prefix TEXT")
    return tuple(BIAS_BENCH_PREFIXES[k] for k in CATEGORY_PREFIXES[category])


@dataclasses.dataclass(frozen=True)
class SelfDebiasSettings:
    """What a Self-Debias model is: its prefix texts (≥ 1, each non-empty), λ and ε.

    Raises:
        ValueError: no prefix, an empty one, λ < 0, or ε outside [0, 1].
    """

    prefixes: tuple[str, ...]
    decay_constant: float = DECAY_CONSTANT
    epsilon: float = EPSILON

    def __post_init__(self):
        object.__setattr__(self, "prefixes", tuple(self.prefixes))
        if not self.prefixes:
            raise ValueError("Self-Debias needs at least one prefix")
        for i, p in enumerate(self.prefixes):
            if not isinstance(p, str) or not p:
                raise ValueError(f"prefix {i + 1} is empty (or not a text): {p!r}")
        if not self.decay_constant >= 0:
            raise ValueError(f"the decay constant λ must be >= 0, got {self.decay_constant}")
        if not 0 <= self.epsilon <= 1:
            raise ValueError(f"ε must lie in [0, 1], got {self.epsilon}")

    def to_dict(self) -> dict:
        return {"prefixes": list(self.prefixes), "decay_constant": float(self.decay_constant),
                "epsilon": float(self.epsilon)}

    @classmethod
    def from_dict(cls, d: dict) -> "SelfDebiasSettings":
        """The settings recorded by :meth:`to_dict`.

        Raises:
            ValueError: a missing or malformed field.
        """
        try:
            return cls(tuple(d["prefixes"]), float(d["decay_constant"]), float(d["epsilon"]))
        except (KeyError, TypeError) as e:
            raise ValueError(f"malformed Self-Debias settings {d!r}: {e}") from None


def rescaled_log_probs(logp, logp_prefixed, decay_constant: float = DECAY_CONSTANT, epsilon: float = EPSILON):
    """The log of the self-debiased distribution (module docstring), in float32.

    Args:
        logp: (..., V) log-probabilities of the next token given the text (normalised: a log-softmax).
        logp_prefixed: (K, ..., V) the same with each of K prefixes (log-softmax each).
        decay_constant: λ. epsilon: ε (0: no floor; the log of a zero factor is then −inf).
    Returns:
        float32 (..., V): ``log q``, with ``q ∝ p · max(ε, exp(−λ·max(0, max_k p_k − p)))`` summing to 1.
    """
    logp = jnp.asarray(logp, jnp.float32)
    p = jnp.exp(logp)
    p_biased = jnp.max(jnp.exp(jnp.asarray(logp_prefixed, jnp.float32)), axis=0)
    delta = jnp.maximum(p_biased - p, 0.0)
    log_factor = -decay_constant * delta
    if epsilon > 0:
        log_factor = jnp.maximum(log_factor, jnp.log(jnp.float32(epsilon)))
    z = logp + log_factor
    return z - jax_logsumexp(z)


def target_log_probs(logits, logits_prefixed, targets, decay_constant: float = DECAY_CONSTANT,
                     epsilon: float = EPSILON):
    """``log q(target)`` from raw logits, without the (…, V) distributions held in memory: the log-sum-exps of
    the regular and of each prefixed logits, then one fused pass for the normaliser ``Σ_v p_v·f_v``; equal to
    ``rescaled_log_probs(log_softmax(logits), log_softmax(logits_prefixed))[target]``.

    Args:
        logits: (..., V) float32 next-token logits given the text. logits_prefixed: a sequence of K (..., V) logits
            with each prefix. targets: int (...) the token whose log-probability is wanted, or int (..., T): T tokens
            each (e.g. the two continuations of a pair read at its branch point).
    Returns:
        float32 (...) log q(targets), or (..., T) for targets of shape (..., T).
    """
    def softmax(z):  # one exp per logit: (probabilities, log-sum-exp)
        m = jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))
        e = jnp.exp(z - m)
        s = jnp.sum(e, axis=-1, keepdims=True)
        return e * (1.0 / s), m + jnp.log(s)  # one reciprocal a row, a multiply per logit (not a divide)

    p, lse = softmax(logits)
    pb = None
    for z in logits_prefixed:
        pk = softmax(z)[0]
        pb = pk if pb is None else jnp.maximum(pb, pk)
    log_factor = -decay_constant * jnp.maximum(pb - p, 0.0)
    if epsilon > 0:
        log_factor = jnp.maximum(log_factor, jnp.log(jnp.float32(epsilon)))
    norm = jnp.sum(p * jnp.exp(log_factor), axis=-1, keepdims=True)
    several = jnp.ndim(targets) == jnp.ndim(logits)
    t = targets if several else targets[..., None]
    pick = lambda x: jnp.take_along_axis(x, t, axis=-1)  # noqa: E731
    out = pick(logits - lse) + pick(log_factor) - jnp.log(norm)
    return out if several else out[..., 0]


def jax_logsumexp(z):
    """log Σ exp over the last axis (kept), stable."""
    m = jnp.max(z, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    return m + jnp.log(jnp.sum(jnp.exp(z - m), axis=-1, keepdims=True))
