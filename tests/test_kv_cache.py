"""KV cache of the Flax GPT-2: incremental decoding equals recomputing the whole sequence, with left padding."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rbjax.model.gpt2 import GPT2Config, GPT2LMHeadModel, init_cache, init_params

CFG = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2)


@pytest.fixture(scope="module")
def params():
    return init_params(CFG, seed=3)


def _left_pad(rows, P):
    ids = np.zeros((len(rows), P), np.int32)
    mask = np.zeros((len(rows), P), np.int32)
    for r, s in enumerate(rows):
        ids[r, P - len(s):], mask[r, P - len(s):] = s, 1
    return ids, mask


def test_token_by_token_decoding_equals_full_recompute(params):
    """Each decode step's logits equal a full forward over everything so far (recomputed at every step, in a
    fixed-size right-padded buffer so that one program serves all steps), and equal the row's own unpadded
    sequence: the left padding of the batch changes nothing."""
    model = GPT2LMHeadModel(CFG)
    step = jax.jit(lambda p, i, m, c: model.apply({"params": p}, i, m, cache=c))
    full = jax.jit(lambda p, i, m: model.apply({"params": p}, i, attention_mask=m)[0])
    prompts = [[5, 9, 17, 3, 8], [11, 2], [40, 41, 42]]
    P, T = 6, 7
    ids, mask = _left_pad(prompts, P)
    rng = np.random.default_rng(0)
    new = rng.integers(0, CFG.vocab_size, size=(3, T)).astype(np.int32)
    new_mask = np.ones((3, T), np.int32)
    new_mask[1, 4:] = 0  # row 1 "finished" after 4 tokens: padding from then on (holes in the cache)
    all_ids = np.concatenate([ids, new], 1)
    cache = init_cache(CFG, 3, P + T)
    with jax.default_matmul_precision("highest"):
        lg, h, cache = step(params, jnp.asarray(ids), jnp.asarray(mask), cache)
        ref = full(params, jnp.asarray(ids), jnp.asarray(mask))
        np.testing.assert_allclose(np.asarray(lg)[mask > 0], np.asarray(ref)[mask > 0], rtol=1e-5, atol=1e-5)
        for t in range(T):
            step_lg, _, cache = step(params, jnp.asarray(new[:, t:t + 1]), jnp.asarray(new_mask[:, t:t + 1]), cache)
            so_far = np.concatenate([mask, new_mask[:, :t + 1], np.zeros((3, T - t - 1), np.int32)], 1)
            ref = full(params, jnp.asarray(all_ids), jnp.asarray(so_far))
            solo_ids = np.zeros((3, P + T), np.int32)
            solo_mask = np.zeros((3, P + T), np.int32)
            for r in range(3):
                own = prompts[r] + [int(x) for x, m in zip(new[r, :t + 1], new_mask[r, :t + 1]) if m]
                solo_ids[r, :len(own)], solo_mask[r, :len(own)] = own, 1
            solo = full(params, jnp.asarray(solo_ids), jnp.asarray(solo_mask))
            for r in range(3):
                if new_mask[r, t]:
                    np.testing.assert_allclose(np.asarray(step_lg[r, 0]), np.asarray(ref[r, P + t]), rtol=1e-5,
                                               atol=1e-5)
                    np.testing.assert_allclose(np.asarray(step_lg[r, 0]), np.asarray(solo[r, solo_mask[r].sum() - 1]),
                                               rtol=1e-5, atol=1e-5)
    assert int(cache.index) == P + T
    assert np.asarray(cache.mask).sum(1).tolist() == [5 + T, 2 + 4, 3 + T]


def test_prefill_in_blocks_equals_one_block(params):
    model = GPT2LMHeadModel(CFG)
    step = jax.jit(lambda p, i, m, c: model.apply({"params": p}, i, m, cache=c))
    ids, mask = _left_pad([[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11]], 8)
    c1 = init_cache(CFG, 2, 8)
    lg1, _, c1 = step(params, jnp.asarray(ids), jnp.asarray(mask), c1)
    c2 = init_cache(CFG, 2, 8)
    a, _, c2 = step(params, jnp.asarray(ids[:, :4]), jnp.asarray(mask[:, :4]), c2)
    b, _, c2 = step(params, jnp.asarray(ids[:, 4:]), jnp.asarray(mask[:, 4:]), c2)
    np.testing.assert_allclose(np.asarray(jnp.concatenate([a, b], 1))[mask > 0], np.asarray(lg1)[mask > 0],
                               rtol=1e-5, atol=1e-5)
    for k1, k2 in zip(c1.keys, c2.keys):
        np.testing.assert_allclose(np.asarray(k1)[mask > 0], np.asarray(k2)[mask > 0], rtol=1e-5, atol=1e-6)


def test_cache_works_under_jit_and_in_bf16(params):
    model = GPT2LMHeadModel(CFG, dtype=jnp.bfloat16)
    step = jax.jit(lambda p, i, m, c: model.apply({"params": p}, i, m, cache=c))
    ids, mask = _left_pad([[3, 4, 5], [6]], 3)
    cache = init_cache(CFG, 2, 5, jnp.bfloat16)
    lg, _, cache = step(params, jnp.asarray(ids), jnp.asarray(mask), cache)
    lg2, _, cache = step(params, jnp.asarray([[7, 8], [9, 10]]), jnp.ones((2, 2), jnp.int32), cache)
    assert lg.dtype == jnp.float32 and cache.keys[0].dtype == jnp.bfloat16
    ref, _ = jax.jit(GPT2LMHeadModel(CFG).apply)({"params": params}, jnp.asarray([[3, 4, 5, 7, 8]]))
    assert float(jnp.max(jnp.abs(lg2[0, -1] - ref[0, -1]))) < 0.05


def test_three_dimensional_mask_needs_positions(params):
    with pytest.raises(ValueError, match="position_ids"):
        GPT2LMHeadModel(CFG).apply({"params": params}, jnp.zeros((1, 3), jnp.int32),
                                   attention_mask=jnp.ones((1, 3, 3), bool))
