"""The dialog fine-tuning tasks on the shared trainer: CRG's loss scores the response only, DST's BCE on the pooled
state ignores filler rows, and both train with the same loop (schedule, checkpoints, resume)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rbjax.train.batching import ArrayData
from rbjax.dialog.crg_data import CRGObjective
from rbjax.dialog.state_tracking import DSTObjective
from rbjax.train.config import TrainerConfig
from rbjax.core.mesh import run_mesh
from rbjax.model.handle import ModelHandle
from rbjax.train.loop import Trainer, TrainPoint
from rbjax.train.optim import make_optimizer
from rbjax.train.step import StepSpec, batch_losses
from rbjax.model.gpt2 import GPT2Config, GPT2LMHeadModel, init_params

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")

CFG = GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=2, bos_token_id=63, eos_token_id=63)


def _manual_nll(params, ids, first, last):
    """Σ −log p(ids[j] | ids[<j]) for j in [first, last], from the full logits (float64)."""
    logits, _ = GPT2LMHeadModel(CFG).apply({"params": params}, jnp.asarray(ids)[None])
    lg = np.asarray(logits[0], np.float64)
    lse = np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1)
    return sum(lse[j - 1] - lg[j - 1, ids[j]] for j in range(first, last + 1)), last - first + 1


def test_crg_loss_scores_the_response_only():
    """ids = context + <eos> + response + <eos>: the loss is the mean NLL of the response tokens and the final
    <eos>, each predicted from everything before it; context tokens are never targets."""
    params = init_params(CFG, seed=1)
    eos = 63
    ctx, resp = [5, 9, 17, 3, 8], [11, 12, 13]
    ids = ctx + [eos] + resp + [eos]
    L = 16
    row = np.full(L, eos, np.int32)
    row[:len(ids)] = ids
    am = np.zeros(L, np.int32)
    am[:len(ids)] = 1
    lm = np.zeros(L, np.int32)
    lm[len(ctx) + 1:len(ids)] = 1  # response + final eos
    batch = {"input_ids": row[None], "attention_mask": am[None], "loss_mask": lm[None]}
    spec = StepSpec(config=CFG, objective=CRGObjective(), dropout=False)
    total, aux = batch_losses(params, batch, jnp.ones(2), None, spec)
    loss = aux["lm_loss"]
    s, n = _manual_nll(params, ids, len(ctx) + 1, len(ids) - 1)
    assert float(loss) == pytest.approx(s / n, rel=1e-5) and float(total) == float(loss)
    s_all, n_all = _manual_nll(params, ids, 1, len(ids) - 1)
    assert abs(s_all / n_all - s / n) > 1e-3  # the test can tell a loss that also scores the context
    # the context still conditions the response: another context, another loss
    row2 = row.copy()
    row2[0] = 40
    loss2 = batch_losses(params, {**batch, "input_ids": row2[None]}, jnp.ones(2), None, spec)[1]["lm_loss"]
    assert float(loss2) != float(loss)


def test_dst_loss_ignores_filler_rows_and_trains(tmp_path, tokenizer_dir):
    from rbjax.dialog.state_tracking import dst_logits, dst_loss, init_head

    params = {"gpt2": init_params(CFG, seed=2), "head": init_head(CFG, seed=0)}
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 60, (6, 12)).astype(np.int32)
    mask = np.zeros((6, 12), np.int32)
    for i, n in enumerate([12, 9, 7, 5, 11, 3]):
        mask[i, :n] = 1
    labels = np.array([1, 0, 1, 0, 1, 0], np.float32)
    spec = StepSpec(config=CFG, objective=DSTObjective(), dropout=False)
    full, _ = batch_losses(params, {"input_ids": ids, "attention_mask": mask, "labels": labels}, jnp.ones(2), None,
                           spec)
    padded = {"input_ids": np.concatenate([ids, np.full((2, 12), 63, np.int32)]),
              "attention_mask": np.concatenate([mask, np.zeros((2, 12), np.int32)]),
              "labels": np.concatenate([labels, np.zeros(2, np.float32)])}
    with_filler, _ = batch_losses(params, padded, jnp.ones(2), None, spec)
    assert float(with_filler) == pytest.approx(float(full), rel=1e-6)
    ref = dst_loss(dst_logits(params["gpt2"], params["head"], ids, mask, CFG), labels)
    assert float(full) == pytest.approx(float(ref), rel=1e-6)
    # a few updates with the shared trainer lower the training BCE, and a killed run resumes bit-identically
    data = ArrayData({"input_ids": ids, "attention_mask": mask, "labels": labels}, pad_id=63, info={"task": "test"})

    class Tok:  # the trainer only asks a tokenizer for its size and source
        vocab_size, eos_id, source = 64, 63, "test"

    cfg = TrainerConfig(batch_size=4, grad_accum=1, epochs=6, dropout=False, progress=False, block_size=12,
                        save_every=3, layout="padded")  # one compiled program (DST's packed rows: tests/test_packed.py)
    model = ModelHandle.from_params(params["gpt2"], CFG, Tok(), name="test", digest="test")

    def trainer(out):
        return Trainer(cfg, model, DSTObjective(), make_optimizer(), data, mesh=run_mesh(None, batch_size=4),
                       points=TrainPoint({}, 2e-2), params=params, out_dir=out)

    tr = trainer(tmp_path / "dst")
    res = tr.run()
    after, _ = batch_losses(res.params, {"input_ids": ids, "attention_mask": mask, "labels": labels}, jnp.ones(2),
                            None, spec)
    assert float(after) < 0.7 * float(full)
    trainer(tmp_path / "dst_b").run(stop_after=5)
    res_b = trainer(tmp_path / "dst_b").run()
    assert res_b.resumed_from == 5
    for a, b in zip(jax.tree.leaves(res.params), jax.tree.leaves(res_b.params)):
        assert np.array_equal(np.asarray(a), np.asarray(b))
