"""The one next-token NLL (rbjax.model.nll): value and gradient equal the full-logits cross-entropy."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rbjax.model import nll
from rbjax.model.nll import _chunks, chunked_logsumexp, mean_next_token_nll, next_token_nll, nll_from_hidden


def _full_loss(hidden, emb, ids, mask):
    """The textbook LM loss: full (B, L, V) logits, jax.nn.logsumexp, mean over real targets."""
    lg = jnp.einsum("bld,vd->blv", hidden, emb, precision="highest")[:, :-1]
    tgt = ids[:, 1:]
    m = (mask[:, 1:] * mask[:, :-1]).astype(jnp.float32)
    nll = jax.nn.logsumexp(lg, -1) - jnp.take_along_axis(lg, tgt[..., None], -1)[..., 0]
    return jnp.sum(nll * m) / jnp.maximum(jnp.sum(m), 1.0)


@pytest.mark.parametrize("grad_bytes", [None, 0], ids=["one-step-gradient", "streamed-gradient"])
@pytest.mark.parametrize("V,chunk", [(50, 16), (50, 50), (97, 8), (64, 16)], ids=["overlap", "one", "many", "even"])
def test_value_and_gradient_equal_full_logits(V, chunk, grad_bytes, monkeypatch):
    """Both ways of differentiating the log-sum-exp: all columns in one step (a training micro-batch, within
    HEAD_GRAD_BYTES) and streamed over chunks (a budget of 0 bytes), against the full logits."""
    if grad_bytes is not None:
        monkeypatch.setattr(nll, "HEAD_GRAD_BYTES", grad_bytes)
    assert _chunks(50257, 8192) == (7, 7180)
    rng = np.random.default_rng(0)
    B, L, d = 3, 7, 16
    hidden = jnp.asarray(rng.normal(size=(B, L, d)) * 2, jnp.float32)
    emb = jnp.asarray(rng.normal(size=(V, d)), jnp.float32)
    ids = jnp.asarray(rng.integers(0, V, size=(B, L)), jnp.int32)
    mask = jnp.asarray([[1] * 7, [1] * 4 + [0] * 3, [0] * 2 + [1] * 5], jnp.int32)  # full, right-, left-padded
    ours = lambda h, e: mean_next_token_nll(h, e, ids, mask, chunk=chunk)  # noqa: E731
    ref = lambda h, e: _full_loss(h, e, ids, mask)  # noqa: E731
    with jax.default_matmul_precision("highest"):
        v1, (gh1, ge1) = jax.value_and_grad(ours, argnums=(0, 1))(hidden, emb)
        v2, (gh2, ge2) = jax.value_and_grad(ref, argnums=(0, 1))(hidden, emb)
        v3, (gh3, ge3) = jax.jit(jax.value_and_grad(ours, argnums=(0, 1)))(hidden, emb)
    assert float(v1) == pytest.approx(float(v2), rel=1e-6)
    np.testing.assert_allclose(np.asarray(gh1), np.asarray(gh2), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(ge1), np.asarray(ge2), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(ge3), np.asarray(ge2), rtol=1e-5, atol=1e-7)
    assert float(v3) == pytest.approx(float(v2), rel=1e-6)
    n_chunks = 1 if grad_bytes is None else _chunks(V, chunk)[0]  # the way taken: one step, or the chunks
    lengths = re.findall(r"length=(\d+)", str(jax.make_jaxpr(jax.grad(ours))(hidden, emb)))
    assert lengths == [str(n_chunks)] * 2, lengths  # the forward's scan and the backward's
    # padded targets get no gradient: position 4.. of row 1 predicts nothing
    assert float(jnp.abs(gh1[1, 4:]).max()) == 0.0 and float(jnp.abs(gh1[2, :2]).max()) == 0.0


def test_per_position_values_and_multiple_targets():
    rng = np.random.default_rng(1)
    V, d = 40, 8
    h = jnp.asarray(rng.normal(size=(5, d)), jnp.float32)
    emb = jnp.asarray(rng.normal(size=(V, d)), jnp.float32)
    t = jnp.asarray(rng.integers(0, V, size=(5, 2)), jnp.int32)
    full = jax.nn.log_softmax(jnp.dot(h, emb.T, precision="highest"), -1)
    want = -jnp.take_along_axis(full, t, -1)
    with jax.default_matmul_precision("highest"):
        np.testing.assert_allclose(np.asarray(nll_from_hidden(h, emb, t, chunk=16)), np.asarray(want), rtol=1e-5)
        np.testing.assert_allclose(np.asarray(nll_from_hidden(h, emb, t[:, 0], chunk=7)), np.asarray(want[:, 0]),
                                   rtol=1e-5)
        np.testing.assert_allclose(np.asarray(chunked_logsumexp(h, emb, 9)),
                                   np.asarray(jax.nn.logsumexp(jnp.dot(h, emb.T, precision="highest"), -1)), rtol=1e-6)


def test_bf16_compute_is_close_and_float32_out():
    rng = np.random.default_rng(2)
    h = jnp.asarray(rng.normal(size=(2, 6, 32)), jnp.float32)
    emb = jnp.asarray(rng.normal(size=(300, 32)) * 0.1, jnp.float32)
    ids = jnp.asarray(rng.integers(0, 300, size=(2, 6)), jnp.int32)
    mask = jnp.ones((2, 6), jnp.int32)
    a, m = next_token_nll(h, emb, ids, mask)
    b, _ = next_token_nll(h, emb, ids, mask, compute_dtype=jnp.bfloat16)
    assert b.dtype == jnp.float32 and m.shape == (2, 5)
    rel = float(jnp.max(jnp.abs(a - b) / jnp.abs(a)))
    assert 0 < rel < 2e-2

