"""The optimiser of the debiasing runs: global-norm clip 1.0 + Adam (β 0.9/0.999, ε 1e-8), no weight decay, linear
decay of the learning rate to 0 without warm-up, counted in updates (paper §5.1; the reference's HF Trainer,
reference-debias.md §7). Pure JAX/optax, no I/O.

* The learning rate is computed in one place, :func:`learning_rate`, from the update count held in the train state
  (not from an optax schedule counter), so the step, the metrics and a resumed run agree on it, also when an update
  was skipped.
* The global gradient norm is computed without overflowing float32 (:func:`global_norm` scales by the largest
  entry first: a gradient of 1e20 everywhere has norm 1e21, not ``inf``), and the clip uses it.
* An update whose gradient holds ``inf`` or ``NaN`` is skipped: it never reaches the parameters or the Adam moments
  (``optax.apply_if_finite``; the step also hands it a NaN gradient when the total loss is not finite); the skipped
  updates are counted in the optimiser state (``total_notfinite``) and the trainer stops with a clear error after too many in a row.
* HF's AdamW adds ε to √v before folding in the bias correction, optax after; the difference is of order ε and
  negligible (reference-debias.md §7).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

__all__ = ["learning_rate", "linear_schedule", "global_norm", "clip_by_global_norm", "make_optimizer",
           "skipped_updates", "consecutive_skipped"]

#: never let optax.apply_if_finite give up and apply a non-finite update; the trainer enforces its own limit
_NEVER = 2 ** 30


def learning_rate(step, peak, t_total) -> jax.Array:
    """Learning rate of the update that follows ``step`` applied updates: ``peak·max(0, 1 − step/t_total)``.

    Update ``u`` (1-based) therefore uses ``peak·(t_total − u + 1)/t_total``, as HF's
    ``get_linear_schedule_with_warmup(0, t_total)``. All arguments may be traced.
    """
    frac = 1.0 - jnp.asarray(step, jnp.float32) / jnp.maximum(jnp.asarray(t_total, jnp.float32), 1.0)
    return jnp.asarray(peak, jnp.float32) * jnp.clip(frac, 0.0, 1.0)


def linear_schedule(peak, t_total) -> Callable:
    """:func:`learning_rate` as an optax-style schedule ``count -> lr``."""
    return lambda count: learning_rate(count, peak, t_total)


def global_norm(tree) -> jax.Array:
    """L2 norm of all entries of a pytree, computed as ``m·sqrt(Σ (x/m)²)`` with ``m = max |x|``.

    ``optax.global_norm`` squares first, so gradients above ~1e19 overflow float32 to ``inf``; this does not
    (``inf`` or ``NaN`` entries still give a non-finite norm). Returns float32 0 for an all-zero tree.
    """
    leaves = [jnp.asarray(x, jnp.float32) for x in jax.tree.leaves(tree)]
    if not leaves:
        return jnp.zeros((), jnp.float32)
    m = jnp.max(jnp.stack([jnp.max(jnp.abs(x)) for x in leaves]))  # NaN and inf propagate
    ok = jnp.isfinite(m) & (m > 0)
    safe = jnp.where(ok, m, 1.0)
    ss = sum(jnp.sum(jnp.square(x / safe)) for x in leaves)
    return jnp.where(ok, m * jnp.sqrt(ss), jnp.where(m == 0, 0.0, m))


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
    """Scale the gradient by ``min(1, max_norm/‖g‖)`` with the overflow-free :func:`global_norm`."""

    def update(updates, state, params=None):
        del params
        norm = global_norm(updates)
        scale = jnp.where(norm > max_norm, max_norm / jnp.where(norm > 0, norm, 1.0), 1.0)
        return jax.tree.map(lambda g: (g * scale).astype(g.dtype), updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def make_optimizer(*, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                   max_grad_norm: float = 1.0) -> optax.GradientTransformation:
    """``apply_if_finite(chain(clip_by_global_norm(max_grad_norm), scale_by_adam(b1, b2, eps)))``.

    The result is the Adam *direction* ``m̂/(√v̂ + ε)``; the step multiplies it by ``−learning_rate(step, …)``.
    A non-finite gradient leaves the parameters and the moments untouched (the direction is zero) and is counted.
    """
    inner = optax.chain(clip_by_global_norm(max_grad_norm), optax.scale_by_adam(b1=b1, b2=b2, eps=eps))
    return optax.apply_if_finite(inner, max_consecutive_errors=_NEVER)


def skipped_updates(opt_state) -> jax.Array:
    """Updates skipped so far for a non-finite gradient (int32; per point for a stacked state)."""
    return opt_state.total_notfinite


def consecutive_skipped(opt_state) -> jax.Array:
    """Updates skipped in a row up to now (int32; per point for a stacked state)."""
    return opt_state.notfinite_count
