"""The optimiser of every training run: global-norm clip + Adam (β 0.9/0.999, ε 1e-8), no weight decay, linear decay
of the learning rate to 0 without warm-up, counted in updates (paper §5.1; the reference's HF Trainer,
docs/debiasing.md "Training"). Pure JAX, no I/O.

* :func:`make_optimizer` builds it from the run's :class:`rbjax.train.config.OptimizerConfig`: a :class:`ClipAdam`,
  a frozen (hashable) value, so that two runs with the same settings share one compiled step.
* **One fused update** (:meth:`ClipAdam.apply`): the clip scale comes from one norm pass over the gradient, then
  each parameter, its gradient and its two moments are read once and the new parameter and moments written once
  (one elementwise pass; the state is donated by the step, so XLA updates the buffers in place). It equals optax's
  ``apply_if_finite(chain(clip_by_global_norm, scale_by_adam))`` followed by ``p − lr·direction``
  (:func:`reference_optimizer`, tests/test_optimizer.py).
* The learning rate is computed in one place, :func:`learning_rate`, from the update count held in the train state
  (not from an optax schedule counter), so the step, the metrics and a resumed run agree on it, also when an update
  was skipped.
* The global gradient norm is computed without overflowing float32 (:func:`global_norm`: a gradient of 1e20
  everywhere has norm 1e21, not ``inf``), and the clip uses it.
* An update whose gradient holds ``inf`` or ``NaN`` (or whose loss is not finite) is skipped: it never reaches the
  parameters or the Adam moments; the skipped updates are counted in the optimiser state (``total_notfinite``, and
  ``notfinite_count`` in a row) and the trainer stops with a clear error after too many in a row.
* HF's AdamW adds ε to √v before folding in the bias correction, optax and rbjax after; the difference is of order
  ε and negligible (docs/debiasing.md).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rbjax.train.config import OptimizerConfig

__all__ = ["learning_rate", "linear_schedule", "global_norm", "clip_by_global_norm", "OptState", "ClipAdam",
           "make_optimizer", "reference_optimizer", "skipped_updates", "consecutive_skipped"]

#: never let optax.apply_if_finite give up and apply a non-finite update; the trainer enforces its own limit
_NEVER = 2 ** 30


def learning_rate(step, peak, t_total) -> jax.Array:
    """Learning rate of the update that follows ``step`` applied updates: ``peak·max(0, 1 − step/t_total)``.

    Update ``u`` (1-based) therefore uses ``peak·(t_total − u + 1)/t_total``, as HF's
    ``get_linear_schedule_with_warmup(0, t_total)``. All arguments may be traced (or plain numbers).
    """
    frac = 1.0 - jnp.asarray(step, jnp.float32) / jnp.maximum(jnp.asarray(t_total, jnp.float32), 1.0)
    return jnp.asarray(peak, jnp.float32) * jnp.clip(frac, 0.0, 1.0)


def linear_schedule(peak, t_total) -> Callable:
    """:func:`learning_rate` as an optax-style schedule ``count -> lr``."""
    return lambda count: learning_rate(count, peak, t_total)


def global_norm(tree) -> jax.Array:
    """L2 norm of all entries of a pytree, without overflowing float32.

    The plain sum of squares is used when it is finite and not tiny (one pass over the entries); otherwise (a
    gradient above ~1e19, or one so small that its squares underflow) the norm is computed as ``m·sqrt(Σ (x/m)²)``
    with ``m = max |x|``. ``inf`` or ``NaN`` entries give a non-finite norm. Returns float32 0 for an all-zero tree.
    """
    leaves = [jnp.asarray(x, jnp.float32) for x in jax.tree.leaves(tree)]
    if not leaves:
        return jnp.zeros((), jnp.float32)
    ss = sum(jnp.sum(jnp.square(x)) for x in leaves)
    ok = jnp.isfinite(ss) & (ss > jnp.float32(1e-30))

    def scaled(_):
        m = jnp.max(jnp.stack([jnp.max(jnp.abs(x)) for x in leaves]))  # NaN and inf propagate
        good = jnp.isfinite(m) & (m > 0)
        safe = jnp.where(good, m, 1.0)
        s = sum(jnp.sum(jnp.square(x / safe)) for x in leaves)
        return jnp.where(good, m * jnp.sqrt(s), jnp.where(m == 0, 0.0, m))

    return jax.lax.cond(ok, lambda _: jnp.sqrt(ss), scaled, None)


def _clip_scale(norm, max_norm):
    return jnp.where(norm > max_norm, max_norm / jnp.where(norm > 0, norm, 1.0), 1.0)


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
    """Scale the gradient by ``min(1, max_norm/‖g‖)`` with the overflow-free :func:`global_norm` (an optax
    transformation, for :func:`reference_optimizer`)."""

    def update(updates, state, params=None):
        del params
        scale = _clip_scale(global_norm(updates), max_norm)
        return jax.tree.map(lambda g: (g * scale).astype(g.dtype), updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


class OptState(NamedTuple):
    """The optimiser state: ``count`` (int32, updates applied — the bias correction's exponent), ``mu``/``nu`` (Adam's
    first and second moments, float32, the parameters' tree), ``notfinite_count`` (int32, updates skipped in a row)
    and ``total_notfinite`` (int32, updates skipped in all)."""

    count: jax.Array
    mu: Any
    nu: Any
    notfinite_count: jax.Array
    total_notfinite: jax.Array


@dataclasses.dataclass(frozen=True)
class ClipAdam:
    """Global-norm clip, then Adam, then ``p − lr·m̂/(√v̂ + ε)``, as one fused update (module docstring).

    Hashable (a static argument of the compiled step): two runs with equal settings share one program.

    Attributes:
        b1, b2, eps: Adam's β1, β2, ε. max_grad_norm: the clip.
    """

    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    max_grad_norm: float = 1.0

    def describe(self) -> dict:
        """The settings, by their :class:`rbjax.train.config.OptimizerConfig` names (for a run's key)."""
        return {"adam_b1": self.b1, "adam_b2": self.b2, "adam_eps": self.eps, "max_grad_norm": self.max_grad_norm}

    def init(self, params, xp=jnp) -> OptState:
        """A fresh state: zero moments (float32) shaped as ``params``, counts 0; ``xp=numpy`` builds it on the host
        (no device program)."""
        zeros = lambda: jax.tree.map(lambda p: xp.zeros(np.shape(p), xp.float32), params)  # noqa: E731
        count = lambda: xp.zeros((), xp.int32)  # noqa: E731 (a buffer each: the step donates the state)
        return OptState(count=count(), mu=zeros(), nu=zeros(), notfinite_count=count(), total_notfinite=count())

    def apply(self, params, grads, state: OptState, lr, *, finite_loss=True):
        """One update. ``grads`` (the parameters' tree, any float dtype), ``lr`` the learning rate of this update,
        ``finite_loss`` (a traced bool) false to skip it whatever the gradient.

        Returns:
            ``(params, state, grad_norm, skipped)``: the new parameters (their own dtypes) and state, the global norm
            of ``grads`` before clipping (float32) and 1.0 when the update was skipped (a non-finite gradient or
            loss: parameters and moments unchanged, the skip counted), else 0.0.
        """
        gnorm = global_norm(grads)
        finite = jnp.isfinite(gnorm) & jnp.asarray(finite_loss)
        scale = _clip_scale(gnorm, self.max_grad_norm)
        count = state.count + finite.astype(jnp.int32)
        c = count.astype(jnp.float32)
        # bias corrections of the update that is applied (count >= 1 then; a skipped update uses none of them)
        bc1 = 1.0 - jnp.float32(self.b1) ** jnp.maximum(c, 1.0)
        bc2 = 1.0 - jnp.float32(self.b2) ** jnp.maximum(c, 1.0)
        # a skipped update is the identity through its scalars (moments' decay 1, gradient and learning rate 0), not
        # a select between old and new arrays: selects split the pass into one fusion per output on XLA CPU, each
        # reading the inputs again (4× slower at the DialoGPT-small size; benchmarks/RESULTS.md)
        lr = jnp.where(finite, jnp.asarray(lr, jnp.float32), 0.0)
        b1, b2, eps = jnp.float32(self.b1), jnp.float32(self.b2), jnp.float32(self.eps)
        a1, k1 = jnp.where(finite, b1, 1.0), jnp.where(finite, 1.0 - b1, 0.0)
        a2, k2 = jnp.where(finite, b2, 1.0), jnp.where(finite, 1.0 - b2, 0.0)

        def leaf(p, g, m, v):  # one elementwise pass: p, g, m, v in; p, m, v out
            g = jnp.where(finite, g.astype(jnp.float32), 0.0) * scale  # (a non-finite gradient is not read)
            m2 = a1 * m + k1 * g
            v2 = a2 * v + k2 * (g * g)
            d = (m2 / bc1) / (jnp.sqrt(v2 / bc2) + eps)
            return (p.astype(jnp.float32) - lr * d).astype(p.dtype), m2, v2

        out = jax.tree.map(leaf, params, grads, state.mu, state.nu)
        treedef = jax.tree.structure(params)
        flat = treedef.flatten_up_to(out)
        new_p = treedef.unflatten([t[0] for t in flat])
        mu = treedef.unflatten([t[1] for t in flat])
        nu = treedef.unflatten([t[2] for t in flat])
        bad = jnp.logical_not(finite).astype(jnp.int32)
        new_state = OptState(count=count, mu=mu, nu=nu, notfinite_count=(state.notfinite_count + bad) * bad,
                             total_notfinite=state.total_notfinite + bad)
        return new_p, new_state, gnorm, bad.astype(jnp.float32)


def make_optimizer(cfg: OptimizerConfig | None = None) -> ClipAdam:
    """The optimiser of a run's settings (:class:`rbjax.train.config.OptimizerConfig`; default: the paper's). The
    peak learning rate is not part of it: it lives in the train state (a grid's points may differ in it)."""
    cfg = cfg or OptimizerConfig()
    return ClipAdam(b1=cfg.adam_b1, b2=cfg.adam_b2, eps=cfg.adam_eps, max_grad_norm=cfg.max_grad_norm)


def reference_optimizer(opt: ClipAdam | None = None) -> optax.GradientTransformation:
    """optax's ``apply_if_finite(chain(clip_by_global_norm, scale_by_adam))`` with the settings of ``opt``: the Adam
    *direction* ``m̂/(√v̂ + ε)`` (the step is ``p − lr·direction``). :meth:`ClipAdam.apply` equals it; kept as the
    independent reference of that test."""
    opt = opt or ClipAdam()
    inner = optax.chain(clip_by_global_norm(opt.max_grad_norm),
                        optax.scale_by_adam(b1=opt.b1, b2=opt.b2, eps=opt.eps))
    return optax.apply_if_finite(inner, max_consecutive_errors=_NEVER)


def skipped_updates(opt_state) -> jax.Array:
    """Updates skipped so far for a non-finite gradient or loss (int32; per point for a stacked state)."""
    return opt_state.total_notfinite


def consecutive_skipped(opt_state) -> jax.Array:
    """Updates skipped in a row up to now (int32; per point for a stacked state)."""
    return opt_state.notfinite_count
