"""Compute precision of training: ``TrainerConfig.precision`` = ``fp32`` (default) or ``bf16``
(bf16 activations and matmuls; parameters, optimiser state and losses in fp32).

Tolerance of bf16 vs fp32: bfloat16 keeps 8 significant bits (relative rounding 2⁻⁹ ≈ 0.2 %), so activations, and
the losses computed from them, differ by a few tenths of a percent per update. At the paper's learning rate (5e-5)
and 4 updates every loss and gradient norm stays within :data:`BF16_RTOL` (2 %) of fp32's (seen: ≤ 0.5 %). At 10× the learning rate the
trajectories of HD drift apart by tens of percent within 4 updates in either precision's rounding, so the test
stays at the paper's rate.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rbjax.debias.config import DebiasRun
from rbjax.debias.run import debias_trainer
from rbjax.train.batching import BatchPlan
from tests.conftest import religion1_train_file

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")

BF16_RTOL = 2e-2


def _run(cfg):
    rows = []

    def cb(ev):
        if ev["kind"] == "update":
            m = ev["metrics"]
            rows.append([m["lm_loss"], m["debias_loss"], m["total"], m["grad_norm"]])

    tr = debias_trainer(cfg)
    if cfg.trainer.layout == "packed":  # one packed shape for the 4 updates: one compiled program instead of up to four
        tr = debias_trainer(cfg, data=tr.data, plan=BatchPlan.of_run(tr.data, cfg.trainer_config, max_shapes=1))
    return tr, tr.run(checkpoints=False, callback=cb), np.asarray(rows, np.float64)


@pytest.mark.parametrize("method", ["lmd", "hd"])
def test_bf16_training_runs_close_to_fp32(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path, method):
    """A few bf16 updates run, give finite losses within 2 % of fp32's, and keep parameters and Adam state fp32."""
    cfg = DebiasRun.from_flat(method=method, bias_type="religion1", model=str(tiny_model_dir), tokenizer=str(tokenizer_dir),
                      data_dir=str(redditbias_dir), out_dir=str(tmp_path / "o"),
                      train_file=religion1_train_file(redditbias_dir, tmp_path, 16), batch_size=4, max_steps=4,
                      dropout=False, export=False, evaluate=False, lmp=False, progress=False,
                      # LMD in the users' default packed layout, HD padded (one compiled program per run)
                      layout="packed" if method == "lmd" else "padded")
    tr32, r32, m32 = _run(cfg)
    tr16, r16, m16 = _run(cfg.replace(precision="bf16"))
    assert tr16.spec.compute_dtype == jnp.bfloat16 and tr32.spec.compute_dtype == jnp.float32
    assert m16.shape == m32.shape == (4, 4)
    assert np.isfinite(m16).all() and m16[:, 1].min() > 0  # the debiasing loss is there and finite
    rel = np.abs(m16 - m32) / np.abs(m32)
    assert rel.max() <= BF16_RTOL, rel
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(r16.params))
    floats = [x for x in jax.tree.leaves(r16.state.opt_state) if jnp.issubdtype(x.dtype, jnp.floating)]
    assert floats and all(x.dtype == jnp.float32 for x in floats)  # Adam's moments
    moved = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                for a, b in zip(jax.tree.leaves(r16.params), jax.tree.leaves(tr16.init_params)))
    assert moved > 1e-5  # bf16 updates were applied
    assert not np.array_equal(m16, m32)  # and the precision setting reached the computation


def _dot_dtypes(jaxpr) -> list[str]:
    """Input dtypes of every dot_general in a jaxpr (descending into sub-jaxprs)."""
    from jax.extend.core import jaxprs_in_params

    out = []
    for e in jaxpr.eqns:
        if e.primitive.name == "dot_general":
            out.append(str(e.invars[0].aval.dtype))
        for sub in jaxprs_in_params(e.params):
            out.extend(_dot_dtypes(sub))
    return out


def test_bf16_matmuls_run_in_bf16():
    """With precision bf16 the transformer's matmuls (attention and MLP: 6 per layer) take bf16 inputs."""
    from rbjax.debias.objective import DebiasObjective
    from rbjax.train.step import StepSpec, batch_losses
    from rbjax.model.gpt2 import GPT2Config, init_params

    config = GPT2Config(vocab_size=512, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    params = init_params(config, 0)
    batch = {"input_ids": jnp.ones((2, 8), jnp.int32), "attention_mask": jnp.ones((2, 8), jnp.int32)}
    lam = jnp.asarray([1.0, 0.0])
    dts = {}
    for prec in ("fp32", "bf16"):
        spec = StepSpec(config=config, objective=DebiasObjective("lm"), precision=prec)
        jp = jax.make_jaxpr(lambda p: batch_losses(p, batch, lam, None, spec, dropout=False)[0])(params)
        dts[prec] = _dot_dtypes(jp.jaxpr)
    assert len(dts["fp32"]) == len(dts["bf16"]) >= 6 * config.n_layer + 1  # + the LM head
    assert all(d == "float32" for d in dts["fp32"])
    assert dts["bf16"].count("bfloat16") >= 6 * config.n_layer, dts["bf16"]
