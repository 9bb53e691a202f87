"""The trainer's fused clip + Adam update (:class:`rbjax.train.optim.ClipAdam`) against optax's chain
``apply_if_finite(chain(clip_by_global_norm, scale_by_adam))`` followed by ``p − lr·direction`` — the independent
reference (:func:`rbjax.train.optim.reference_optimizer`)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rbjax.train.config import OptimizerConfig
from rbjax.train.optim import learning_rate, make_optimizer, reference_optimizer


def _tree(seed: int):
    rng = np.random.default_rng(seed)
    return {"wte": jnp.asarray(rng.normal(size=(50, 16)), jnp.float32),
            "h": [{"w": jnp.asarray(rng.normal(size=(16, 48)), jnp.float32), "b": jnp.asarray(rng.normal(size=48),
                                                                                             jnp.float32)}]}


def _close(a, b, rel=1e-6):
    """``‖a − b‖ ≤ rel·‖b‖`` (float32 rounding of a different operation order stays far below; an entry near 0
    makes an elementwise relative test meaningless)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.linalg.norm(a - b) <= rel * np.linalg.norm(b), (np.linalg.norm(a - b), np.linalg.norm(b))


def _grads(i: int, scale: float):
    """The gradient of update ``i`` (the same for both optimisers, whatever their parameters)."""
    return jax.tree.map(lambda p: scale * (jnp.sin(p * (i + 1.0)) + 0.05 * i), _tree(7))


@pytest.mark.parametrize("scale", [0.01, 30.0], ids=["below-the-clip", "clipped"])
def test_fused_update_equals_optax_chain_after_three_updates(scale):
    """Three updates with a decaying learning rate: parameters, both moments and the update count equal optax's
    within 1e-6 relative (the clip is active in the second case: global norm ≫ 1)."""
    cfg = OptimizerConfig(learning_rate=1e-3, adam_b1=0.8, adam_b2=0.99, adam_eps=1e-6, max_grad_norm=1.0)
    opt = make_optimizer(cfg)
    ref = reference_optimizer(opt)
    p_ours = p_ref = _tree(0)
    s_ours, s_ref = opt.init(p_ours), ref.init(p_ref)
    apply = jax.jit(opt.apply)

    @jax.jit
    def ref_step(p, g, s, lr):
        d, s = ref.update(g, s, p)
        return jax.tree.map(lambda x, u: x - lr * u, p, d), s

    for i in range(3):
        lr = learning_rate(i, cfg.learning_rate, 3)
        g = _grads(i, scale)
        p_ours, s_ours, gnorm, skipped = apply(p_ours, g, s_ours, lr)
        p_ref, s_ref = ref_step(p_ref, g, s_ref, lr)
        assert float(skipped) == 0.0 and float(gnorm) > 0
    adam = s_ref.inner_state[1]
    for a, b in zip(jax.tree.leaves((p_ours, s_ours.mu, s_ours.nu)), jax.tree.leaves((p_ref, adam.mu, adam.nu))):
        _close(a, b)
    # and the parameters moved: the comparison is of three real updates
    assert max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(p_ours), jax.tree.leaves(_tree(0)))) > 1e-4
    assert int(s_ours.count) == int(adam.count) == 3
    assert int(s_ours.total_notfinite) == int(s_ref.total_notfinite) == 0


def test_a_skipped_update_leaves_everything_as_optax_does():
    """A NaN gradient at update 2 of 3: our parameters, moments and counters equal optax's (which skips it too)."""
    opt = make_optimizer()
    ref = reference_optimizer(opt)
    p_ours = p_ref = _tree(1)
    s_ours, s_ref = opt.init(p_ours), ref.init(p_ref)
    for i in range(3):
        g = _grads(i, 1.0)
        if i == 1:
            g = jax.tree.map(lambda x: x.at[(0,) * x.ndim].set(jnp.nan), g)
        p_ours, s_ours, _, skipped = opt.apply(p_ours, g, s_ours, 1e-3)
        d, s_ref = ref.update(g, s_ref, p_ref)
        p_ref = jax.tree.map(lambda x, u: x - 1e-3 * u, p_ref, d)
        assert float(skipped) == (1.0 if i == 1 else 0.0)
    for a, b in zip(jax.tree.leaves(p_ours), jax.tree.leaves(p_ref)):
        _close(a, b)
    assert (int(s_ours.count), int(s_ours.total_notfinite), int(s_ours.notfinite_count)) == \
        (int(s_ref.inner_state[1].count), int(s_ref.total_notfinite), int(s_ref.notfinite_count)) == (2, 1, 0)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("bad", ["nan-gradient", "inf-gradient", "non-finite-loss"])
def test_a_skipped_update_changes_no_bit(dtype, bad):
    """A skipped update is the identity through its scalars (no select between old and new arrays): parameters (of
    their own dtype) and moments come out bit for bit, only the skip counters move."""
    opt = make_optimizer()
    p = jax.tree.map(lambda x: x.astype(dtype), _tree(1))
    s = opt.init(p)
    for i in range(2):
        p, s, _, _ = opt.apply(p, _grads(i, 1.0), s, 1e-3)
    g = _grads(2, 1.0)
    if bad != "non-finite-loss":
        g = jax.tree.map(lambda x: x.at[(0,) * x.ndim].set(jnp.nan if bad == "nan-gradient" else jnp.inf), g)
    p2, s2, _, skipped = jax.jit(opt.apply)(p, g, s, 1e-3, finite_loss=bad != "non-finite-loss")
    assert float(skipped) == 1.0
    for a, b in zip(jax.tree.leaves((p, s.mu, s.nu, s.count)), jax.tree.leaves((p2, s2.mu, s2.nu, s2.count))):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
    assert (int(s2.total_notfinite), int(s2.notfinite_count)) == (1, 1)


def test_equal_settings_give_one_hashable_optimizer():
    """Two runs with equal settings share one compiled step: the optimiser is a value, equal and of equal hash."""
    a, b = make_optimizer(OptimizerConfig(adam_eps=1e-7)), make_optimizer(OptimizerConfig(adam_eps=1e-7))
    assert a == b and hash(a) == hash(b) and a != make_optimizer()
