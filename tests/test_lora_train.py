"""Training with low-rank adapters (rbjax.train.frozen, the trainer's frozen base; dropout off where results are
compared):

* the train state holds the adapters only (no base parameter, no base optimizer state); the base is not moved, the
  target embeddings of the debiasing losses are the frozen ones; every loss method and CDA train adapters;
* packed = padded for LoRA updates (losses 1e-6 relative, adapters 1e-5 absolute);
* a vmapped chunk of grid points shares one unbatched base and equals each point trained alone (1e-5);
* a killed and resumed run ends with bit-identical adapters; its checkpoints hold the adapter state only;
* ``param_dtype`` bf16 stores the frozen base in bf16, the adapters and their Adam moments stay fp32; every method
  runs an update on an fp32 and a bf16 base (and a vmapped HD chunk on a bf16 base: its subspace in float32);
* DST (adapters + its classifier head) and CRG fine-tune adapters through the tasks' ``fine_tune``.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rbjax.core.errors import SettingError
from rbjax.debias.config import DebiasRun
from rbjax.debias.data import TrainingData
from rbjax.debias.run import debias_trainer, lambda_point
from rbjax.dialog.crg_data import CRGObjective
from rbjax.dialog.state_tracking import DSTObjective, init_head
from rbjax.dialog.tasks.common import fine_tune
from rbjax.dialog.tasks.crg import CRGSettings
from rbjax.dialog.tasks.dst import DSTSettings
from rbjax.model import lora
from rbjax.model.gpt2 import GPT2Config, init_params
from rbjax.model.handle import ModelHandle
from rbjax.train.batching import ArrayData, BatchPlan
from rbjax.train.config import AdapterConfig
from tests.conftest import religion1_train_file

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")

LORA = dict(adapter="lora", lora_rank=4, lora_alpha=8.0, lora_dropout=0.0)


@pytest.fixture(scope="module")
def start(tiny_model_dir, tokenizer_dir):
    from rbjax.model.hf import load_pretrained
    from rbjax.model.tokenizer import load_tokenizer

    config, params = load_pretrained(tiny_model_dir)
    return config, params, load_tokenizer(tokenizer_dir, expected_vocab_size=None)


def _cfg(tmp_path, redditbias_dir, **kw):
    # the learning rate of tests/test_packed.py: larger steps let Adam's normalised updates amplify float32 rounding
    base = dict(method="lmd", semantics="paper", bias_type="religion1", model="unused", out_dir=str(tmp_path / "run"),
                train_file=religion1_train_file(redditbias_dir, tmp_path, 28), batch_size=4, grad_accum=2,
                max_steps=3, dropout=False, learning_rate=5e-5, export=False, evaluate=False, lmp=False,
                progress=False, layout="padded", **LORA)
    base.update(kw)
    return DebiasRun.from_flat(base)


def _trainer(cfg, start, points=None, data=None):
    config, params, tok = start
    data = data or TrainingData(cfg, tok, config.vocab_size)
    model = ModelHandle.from_params(params, config, tok, name="tiny", digest="tiny")
    plan = BatchPlan.of_run(data, cfg.trainer_config, max_shapes=1)
    return debias_trainer(cfg, model=model, points=points, data=data, plan=plan)


def _run(tr, **kw):
    metrics = []
    res = tr.run(checkpoints=kw.pop("checkpoints", False),
                 callback=lambda ev, m=metrics: ev["kind"] == "update" and m.append(ev["metrics"]), **kw)
    return res, metrics


def _leaves(tree):
    return {tuple(str(getattr(k, "key", getattr(k, "idx", k))) for k in p): np.asarray(x)
            for p, x in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.fixture(scope="module")
def lmd(start, tmp_path_factory, redditbias_dir):
    """One LMD adapter run (padded, 3 updates) that several tests compare with: ``(cfg, data, result, metrics)``."""
    cfg = _cfg(tmp_path_factory.mktemp("lmd"), redditbias_dir)
    data = TrainingData(cfg, start[2], start[0].vocab_size)
    return (cfg, data) + _run(_trainer(cfg, start, data=data))


def test_state_holds_adapters_only_and_the_base_stays(start, lmd, tmp_path, redditbias_dir):
    config, params, _ = start
    _, _, res, metrics = lmd
    trained = _leaves(res.state.params)
    assert trained and all(lora.is_adapter_param(p) for p in trained)  # no base weight in the state ...
    assert all(lora.is_adapter_param(p) for p in _leaves(res.state.opt_state.mu))  # ... nor in Adam's moments
    assert max(np.abs(v).max() for p, v in trained.items() if p[-1] == "B") > 3e-5  # B moved from zero
    assert all(np.isfinite(m["total"]) and m["debias_loss"] != 0 for m in metrics)
    full = _leaves(res.params)
    for p, v in _leaves(params).items():  # every base weight is the start model's, bit for bit
        np.testing.assert_array_equal(full[p], v)
    with pytest.raises(SettingError, match="lora_rank"):
        DebiasRun.from_flat(lora_rank=4)  # an adapter setting without --adapter lora would do nothing
    with pytest.raises(SettingError, match="lora_targets"):
        _trainer(_cfg(tmp_path, redditbias_dir, lora_targets="q_proj"), start)  # not a GPT-2 module


def _same_updates(ma, mb, ra, rb):
    for ua, ub in zip(ma, mb):
        assert ua["tokens"] == ub["tokens"] > 0
        for k in ("lm_loss", "debias_loss", "total"):
            assert ua[k] == pytest.approx(ub[k], rel=1e-6, abs=1e-30)
    a, b = _leaves(ra.state.params), _leaves(rb.state.params)
    for p in a:
        np.testing.assert_allclose(a[p], b[p], atol=1e-5)


def test_packed_lora_update_equals_padded(start, lmd):
    cfg, data, ra, ma = lmd
    rb, mb = _run(_trainer(cfg.replace(layout="packed"), start, data=data))
    _same_updates(ma, mb, ra, rb)


@pytest.mark.slow
@pytest.mark.parametrize("method,semantics", [("add", "reference"), ("hd", "paper"), ("cda", "reference")])
def test_packed_lora_update_equals_padded_more_methods(start, tmp_path, redditbias_dir, method, semantics):
    cfg = _cfg(tmp_path, redditbias_dir, method=method, semantics=semantics)
    data = TrainingData(cfg, start[2], start[0].vocab_size)
    (ra, ma), (rb, mb) = (_run(_trainer(cfg.replace(layout=lay), start, data=data)) for lay in ("padded", "packed"))
    _same_updates(ma, mb, ra, rb)


def test_vmapped_adapter_grid_shares_one_base_and_equals_points_alone(start, lmd):
    cfg, data, first, m_first = lmd  # point 0 alone: the fixture's run (λ 0.01, 10; lr 5e-5)
    pts = [lambda_point(0.01, 10.0, 5e-5), lambda_point(0.001, 100.0, 2e-5)]
    res, metrics = _run(_trainer(cfg, start, points=pts, data=data))
    # one base: the frozen tree carries no point axis; the stacked state holds the adapters only
    base = _leaves(start[1])
    for p, v in _leaves(res.frozen).items():
        assert v.shape == base[p].shape if p in base else v.ndim == 0  # (an adapter's scale: a scalar)
    assert all(v.shape[0] == 2 and lora.is_adapter_param(p) for p, v in _leaves(res.state.params).items())
    second = _run(_trainer(cfg.replace(lambda_lm=0.001, lambda_d=100.0, learning_rate=2e-5), start, data=data))
    for i, (alone, m1) in enumerate(((first, m_first), second)):
        for u in range(3):
            assert metrics[u][i]["total"] == pytest.approx(m1[u]["total"], rel=1e-5)
        got, want = _leaves(res.point_params(i)), _leaves(alone.params)
        for p in want:
            np.testing.assert_allclose(got[p], want[p], rtol=1e-5, atol=1e-6)


def test_resumed_adapter_run_is_bit_identical_and_checkpoints_hold_adapters_only(start, lmd, tmp_path):
    cfg, data, whole, _ = lmd
    cfg = cfg.replace(out_dir=str(tmp_path / "cut"), save_every=1)
    tr = _trainer(cfg, start, data=data)
    first, _ = _run(tr, checkpoints=True, out_dir=tmp_path / "cut", stop_after=2)
    assert not first.finished
    again, _ = _run(_trainer(cfg, start, data=data), checkpoints=True, out_dir=tmp_path / "cut")
    assert again.resumed_from == 2
    for p, v in _leaves(whole.state.params).items():
        np.testing.assert_array_equal(_leaves(again.state.params)[p], v)
    ckpt = sum(f.stat().st_size for f in (tmp_path / "cut" / "checkpoints").rglob("*") if f.is_file())
    base = sum(v.nbytes for v in _leaves(start[1]).values())
    assert ckpt < base / 4  # adapters (and their moments) only: the 6.6 MB base is referenced by its key
    assert tr.key()["trajectory"]["adapter"]["lora_rank"] == 4
    other = _trainer(cfg.replace(lora_rank=2), start, data=data)
    with pytest.raises(ValueError, match="different run"):
        other.run(tmp_path / "cut")


def test_bf16_base_keeps_fp32_adapters(start, lmd):
    cfg, data, r32, m32 = lmd
    r16, m16 = _run(_trainer(cfg.replace(param_dtype="bf16"), start, data=data))
    bf16 = np.dtype(jnp.bfloat16)
    assert {v.dtype for p, v in _leaves(r16.frozen).items() if p[-1] in ("kernel", "embedding")} == {bf16}
    assert {v.dtype for v in _leaves((r16.state.params, r16.state.opt_state.mu)).values()} == {np.dtype(np.float32)}
    for a, b in zip(m32, m16):  # the base rounded to bf16: close, not equal
        assert b["total"] == pytest.approx(a["total"], rel=2e-2)
        assert b["total"] != a["total"]


@pytest.mark.parametrize("param_dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("method", ["lmd", "add", "hd", "cda", "lm"])
def test_every_method_runs_an_update_on_every_base_dtype(start, tmp_path, redditbias_dir, method, param_dtype):
    """``rbjax debias --adapter lora --param-dtype bf16`` with every method (HD's bias-subspace SVD was
    handed the bf16 embeddings and LAPACK refused them): one update of 2 phrases, a finite loss; the debiasing loss
    of LMD, ADD and HD is computed (not 0) from the frozen base's embeddings upcast to float32."""
    cfg = _cfg(tmp_path, redditbias_dir, method=method, param_dtype=param_dtype, batch_size=2, grad_accum=1,
               max_steps=1, train_file=religion1_train_file(redditbias_dir, tmp_path, 2))
    res, metrics = _run(_trainer(cfg, start))
    assert len(metrics) == 1 and np.isfinite(metrics[0]["total"]) and np.isfinite(metrics[0]["lm_loss"])
    assert (metrics[0]["debias_loss"] != 0) == (method in ("lmd", "add", "hd"))
    want = np.dtype(jnp.bfloat16 if param_dtype == "bf16" else np.float32)
    assert {v.dtype for p, v in _leaves(res.frozen).items() if p[-1] in ("kernel", "embedding")} == {want}


def test_hd_grid_chunk_on_a_bf16_base(start, tmp_path, redditbias_dir):
    """``rbjax sweep --method hd --adapter lora --param-dtype bf16``: a vmapped chunk of two points on one bf16 base
    runs its update, each point's loss finite."""
    cfg = _cfg(tmp_path, redditbias_dir, method="hd", param_dtype="bf16", batch_size=2, grad_accum=1, max_steps=1,
               train_file=religion1_train_file(redditbias_dir, tmp_path, 2))
    _, metrics = _run(_trainer(cfg, start, points=[lambda_point(0.01, 10.0, 5e-5), lambda_point(1.0, 1.0, 5e-5)]))
    assert len(metrics) == 1 and len(metrics[0]) == 2
    assert all(np.isfinite(m["total"]) and m["debias_loss"] > 0 for m in metrics[0])


CFG = GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=2, bos_token_id=63, eos_token_id=63)


@pytest.mark.parametrize("method", ["dst", "crg"])
def test_dialog_tasks_train_adapters(method, tmp_path):
    rng = np.random.default_rng(4)
    body = init_params(CFG, seed=2)
    L, B = 12, 20
    lengths = rng.integers(2, L + 1, B)
    mask = (np.arange(L)[None] < lengths[:, None]).astype(np.int32)
    arrays = {"input_ids": rng.integers(0, 60, (B, L)).astype(np.int32), "attention_mask": mask}
    if method == "dst":
        arrays["labels"] = (rng.random(B) > 0.5).astype(np.float32)
    else:
        arrays["loss_mask"] = (mask * (np.arange(L)[None] >= lengths[:, None] // 2)).astype(np.int32)
    data = ArrayData(arrays, pad_id=63, info={"task": "test"})

    class Tok:  # the trainer only asks a tokenizer for its size and source
        vocab_size, eos_id, source = 64, 63, "test"

    start = {"gpt2": body, "head": init_head(CFG, seed=0)} if method == "dst" else body
    model = ModelHandle.from_params(body, CFG, Tok(), name="test", digest="test")
    settings = (DSTSettings if method == "dst" else CRGSettings).from_settings(
        {"adapter": "lora", "lora_rank": 2, "lora_dropout": 0.1, "batch_size": 4, "max_steps": 2, "block_size": L,
         "layout": "padded", "progress": False})
    assert settings.key_settings()["lora_rank"] == 2
    trained, record, _ = fine_tune(method, DSTObjective() if method == "dst" else CRGObjective(), model, tmp_path,
                                   settings, start, data, what="test")
    assert record["updates"] == 2 and np.isfinite(record["final_loss"])
    full, start_leaves = _leaves(trained), _leaves(start)
    adapters = [p for p in full if lora.is_adapter_param(p)]
    assert adapters and all(p[0] == "gpt2" for p in adapters) == (method == "dst")
    for p, v in start_leaves.items():  # the body is frozen; DST's classifier head is trained
        if p[0] == "head":
            assert not np.array_equal(full[p], v)
        else:
            np.testing.assert_array_equal(full[p], v)


def test_memory_plan_of_adapters_counts_the_base_once(start):
    """By hand, the tiny GPT-2 (width 32, 2 layers, MLP 128) with rank-4 adapters on every linear layer: per layer
    4·(32+96) + 4·(32+32) + 4·(32+128) + 4·(128+32) = 2,048 adapter numbers, 4,096 in all; a 3-point chunk holds the
    base once (bf16: 2 bytes a weight) and per point the adapters, their gradient and two Adam moments (fp32)."""
    from rbjax.model.memory import plan_memory

    config, params, _ = start
    n_base = sum(int(np.prod(np.shape(x))) for x in jax.tree.leaves(params))
    spec = AdapterConfig(adapter="lora", lora_rank=4).lora_spec()
    assert lora.adapter_param_count(config, spec) == 4096
    p = plan_memory(config, training=True, batch_size=8, seq_len=36, n_points=3, adapter=spec, param_dtype="bf16")
    assert p.parts["parameters"] == n_base * 2 + 3 * 4096 * 4
    assert p.parts["gradients"] == 3 * 4096 * 4 and p.parts["optimizer"] == 3 * 4096 * 8
    full = plan_memory(config, training=True, batch_size=8, seq_len=36, n_points=3)
    assert full.parts["parameters"] == 3 * n_base * 4 and p.parts["activations"] == full.parts["activations"]
    assert "LoRA rank 4 on all-linear: 4,096 trained parameters per point" in p.format()
