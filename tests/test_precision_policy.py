"""One precision policy (rbjax/core/precision.py): fp32 means full fp32 matmuls on every path and
every backend, whatever the process-wide ``jax_default_matmul_precision`` says.

On this CPU an fp32 dot computes the same whatever its precision flag, so equal numbers alone would not show that the
policy holds on a TPU (one bf16 pass by default) or an A100/H100 (TF32). The tests therefore also read the programs
JAX lowers: with the global default set to ``bfloat16``, every ``dot_general`` of the training step, the scorer, the
sampler and the DST classifier still carries ``HIGHEST``.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rbjax.core.precision import DTYPES, PRECISIONS, get_policy
from rbjax.debias.objective import DebiasObjective
from rbjax.train.step import StepSpec, init_state, micro_batch_grads, micro_batch_losses, train_step_jit
from rbjax.dialog import state_tracking
from rbjax.lmb.perplexity import PerplexityScorer, token_nll
from rbjax.model import generate as gen
from rbjax.model.gpt2 import GPT2Config, init_params

CFG = GPT2Config(vocab_size=97, n_positions=32, n_embd=16, n_layer=2, n_head=2)


@pytest.fixture
def global_bf16_matmuls():
    old = jax.config.jax_default_matmul_precision
    jax.config.update("jax_default_matmul_precision", "bfloat16")
    try:
        yield
    finally:
        jax.config.update("jax_default_matmul_precision", old)


def _dot_precisions(hlo_text: str) -> list[str]:
    """The precision of every dot_general in a lowered StableHLO module (``DEFAULT`` when none is written)."""
    out = []
    for line in hlo_text.splitlines():
        if "dot_general" in line:
            m = re.search(r"precision = \[(\w+), (\w+)\]", line)
            out.append(m.group(1) if m else "DEFAULT")
    return out


def _batch(rng, B=3, L=9):
    ids = rng.integers(0, CFG.vocab_size, (B, L)).astype(np.int32)
    mask = np.ones((B, L), np.int32)
    mask[1, 6:] = 0
    return ids, mask


def test_policy_table():
    assert set(DTYPES) == {"fp32", "bf16"} and PRECISIONS == ("fp32", "bf16")
    assert get_policy("fp32").compute_dtype == jnp.float32 and get_policy("bf16").compute_dtype == jnp.bfloat16
    for p in map(get_policy, PRECISIONS):  # parameters, optimiser state and accumulation are fp32 in every policy
        assert p.param_dtype == jnp.float32 and p.accum_dtype == jnp.float32 and p.matmul_precision == "highest"
    with pytest.raises(ValueError, match=r"precision must be one of \['fp32', 'bf16'\], got 'fp16'"):
        get_policy("fp16")


def test_policy_owns_parameter_storage_and_byte_sizes():
    """The policy of a scorer with --param-dtype bf16 stores bf16 parameters (float leaves only; fp32 storage leaves
    the tree as it is) and computes in its own precision; byte sizes are the dtypes' (numpy's itemsize)."""
    bf = get_policy("fp32", "bf16")
    assert bf.compute_dtype == jnp.float32 and bf.param_dtype == jnp.bfloat16 and bf.accum_dtype == jnp.float32
    assert (bf.compute_bytes, bf.param_bytes, bf.accum_bytes) == (4, 2, 4)
    assert (get_policy("bf16").compute_bytes, get_policy("bf16").param_bytes) == (2, 4)
    assert bf == get_policy("fp32", "bf16") and hash(bf) == hash(get_policy("fp32", "bf16"))  # a static jit argument
    with pytest.raises(ValueError, match=r"param_dtype must be one of \['fp32', 'bf16'\], got 'fp16'"):
        get_policy("fp32", "fp16")
    tree = {"w": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3), "ids": np.arange(3, dtype=np.int32)}
    stored = bf.cast_for_storage(tree)
    assert stored["w"].dtype == jnp.bfloat16 and stored["ids"].dtype == np.int32
    np.testing.assert_array_equal(np.asarray(stored["w"], np.float32), np.asarray(jnp.asarray(tree["w"], jnp.bfloat16),
                                                                                 np.float32))
    assert get_policy("fp32").cast_for_storage(tree) is tree


def test_fp32_training_update_ignores_global_matmul_default(global_bf16_matmuls):
    params = init_params(CFG, 0)
    ids, mask = _batch(np.random.default_rng(0))
    spec = StepSpec(config=CFG, objective=DebiasObjective("lm"), dropout=False)
    batch = {"input_ids": ids, "attention_mask": mask}
    lam = jnp.asarray([1.0, 0.0], jnp.float32)
    lowered = micro_batch_losses.lower(params, batch, lam, spec).as_text()
    precs = _dot_precisions(lowered)
    assert precs and set(precs) == {"HIGHEST"}, precs

    def update():
        st = init_state(jax.tree.map(jnp.array, params), spec, hparams={}, lr=1e-3, t_total=10)
        micro = {"input_ids": ids[None], "attention_mask": mask[None], "rng": np.zeros((1, 4), np.uint32)}
        st, m = train_step_jit(st, micro, spec=spec)
        return jax.tree.map(np.asarray, st.params), {k: float(v) for k, v in m.items()}

    p_bf, m_bf = update()
    jax.config.update("jax_default_matmul_precision", None)
    p_32, m_32 = update()
    assert m_bf == m_32
    for a, b in zip(jax.tree.leaves(p_bf), jax.tree.leaves(p_32)):
        np.testing.assert_array_equal(a, b)



@pytest.mark.parametrize("method", ["lm", "hd"])
def test_fp32_update_backward_ignores_global_matmul_default(global_bf16_matmuls, method):
    """The whole update, backward included, is traced under the policy: the LM head's gradient is a custom VJP
    whose matmuls are traced when the gradient is taken, not when the loss is. Traced outside the context they would
    carry the global default (bf16 on a TPU, TF32 on an A100) and, on every backend, differ from the forward's
    logits so that XLA computed the (positions × V) logits twice."""
    params = init_params(CFG, 2)
    ids, mask = _batch(np.random.default_rng(2))
    spec = StepSpec(config=CFG, objective=DebiasObjective(method), dropout=True)
    st = init_state(params, spec, hparams=np.ones(len(spec.objective.hparam_names), np.float32), lr=1e-3,
                    t_total=10)
    micro = {"input_ids": ids, "attention_mask": mask}
    shared = {}
    if method == "hd":  # the neutralisation loss: occurrence weights per example, target pairs shared by the update
        occ = np.zeros((ids.shape[0], 1, ids.shape[1]), np.float32)
        occ[:, 0, 2] = 1.0
        micro.update(occ_weights=occ, occ_mask=np.ones((ids.shape[0], 1), np.float32))
        shared = {"pair_ids": np.array([[[5], [6]], [[7], [8]]], np.int32), "pair_mask": np.ones((2, 2, 1), np.int32)}
    stacked = {**{k: v[None] for k, v in micro.items()}, "rng": np.zeros((1, 4), np.uint32), **shared}
    precs = _dot_precisions(train_step_jit.lower(st, stacked, spec=spec).as_text())
    assert precs and set(precs) == {"HIGHEST"}, precs
    precs = _dot_precisions(micro_batch_grads.lower(params, {**micro, **shared}, st.hparams, None, spec).as_text())
    assert precs and set(precs) == {"HIGHEST"}, precs


def test_fp32_scoring_sampling_and_dst_ignore_global_matmul_default(global_bf16_matmuls):
    params = init_params(CFG, 1)
    ids, mask = _batch(np.random.default_rng(1))
    precs = _dot_precisions(token_nll.lower(params, ids, mask, CFG, "fp32").as_text())
    assert precs and set(precs) == {"HIGHEST"}, precs
    head = state_tracking.init_head(CFG, 0)
    precs = _dot_precisions(state_tracking._probs.lower(params, head, ids, mask, CFG, "last").as_text())
    assert precs and set(precs) == {"HIGHEST"}, precs
    P = 4
    args = (params, ids[:, :P], np.ones((3, P), np.int32), np.full(3, 2, np.int32), np.arange(3, dtype=np.int32),
            np.uint32(0), np.float32(1.0), np.float32(1.0))
    kw = dict(config=CFG, max_new=2, top_k=0, greedy=True, precision="fp32", eos_id=96, pad_id=96)
    precs = _dot_precisions(gen._decode.lower(*args, **kw).as_text())
    assert precs and set(precs) == {"HIGHEST"}, precs

    phrases = [[5, 7, 9, 11], [3, 4, 5], [8, 8, 9, 10, 12]]
    with_bf = PerplexityScorer(params, CFG, batch_size=4).score_ids(phrases).nll_sum
    jax.config.update("jax_default_matmul_precision", None)
    without = PerplexityScorer(params, CFG, batch_size=4).score_ids(phrases).nll_sum
    np.testing.assert_array_equal(with_bf, without)
