"""Packed micro-batches: the phrases of a micro-batch side by side in a few rows give the same losses and
updates as the padded layout (dropout off) for every method × semantics, the vmapped grid step and the dialog
tasks; a plan compiles one program per packed shape."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rbjax.debias.config import DebiasRun
from rbjax.debias.data import TrainingData
from rbjax.train.batching import (
    ArrayData,
    BatchPlan,
    _bucket,
    attention_slots,
    choose_packed_shapes,
    choose_rows,
    compile_slots,
    deal_update,
    pack_index,
    pack_micro_batch,
    packed_need,
    update_need,
)
from rbjax.debias.run import debias_trainer, lambda_point
from rbjax.dialog.crg_data import CRGObjective
from rbjax.dialog.state_tracking import DSTObjective, pooled_index
from rbjax.train.config import TrainerConfig
from rbjax.core.mesh import run_mesh
from rbjax.model.handle import ModelHandle
from rbjax.train.loop import Trainer, TrainPoint
from rbjax.train.optim import make_optimizer
from rbjax.train.step import StepSpec, batch_losses, compiled_programs
from rbjax.model.gpt2 import GPT2Config, GPT2LMHeadModel, init_params
from rbjax.train.lm import forward_at, forward_hidden
from tests.conftest import religion1_train_file

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")

LOSS_RTOL = 1e-6  # losses of an update, relative
PARAM_ATOL = 1e-5  # parameters after three updates, absolute (GPT-2 init N(0, 0.02))


# ---------------------------------------------------------------------------------------------- host packing
def test_pack_index_round_trip_and_balanced_rows():
    lengths = np.array([5, 0, 3, 7, 2])
    mask = (np.arange(8)[None] < lengths[:, None]).astype(np.int32)
    assert pack_micro_batch(lengths, 1) == [[0, 2, 3, 4]]  # one row: batch order, filler left out
    assert packed_need(lengths, 1) == (1, 17)
    # longest first into the emptiest row, by hand: 7 → r0, 5 → r1, 3 → r1 (5 < 7), 2 → r0 (7 < 8): loads 9 | 8
    assert pack_micro_batch(lengths, 2) == [[3, 4], [0, 2]]
    assert packed_need(lengths, 2) == (2, 9)
    assert pack_micro_batch(lengths, 9) == [[3], [0], [2], [4]]  # no more rows than examples, none empty
    assert packed_need(lengths, 9) == (9, 7)
    rows = pack_micro_batch(lengths, 3)  # 7 | 5 | 3+2
    assert rows == [[3], [0], [2, 4]] and packed_need(lengths, 3) == (3, 7)
    pack, unpack = pack_index(mask, rows, (len(rows) + 1, 9))
    flat = np.arange(mask.size).reshape(mask.shape)
    # every real token has exactly one slot, and the two indices invert each other
    assert sorted(pack[pack >= 0].tolist()) == flat[mask > 0].tolist()
    assert (unpack[mask == 0] == -1).all()
    assert all(pack.reshape(-1)[unpack[b, i]] == b * 8 + i for b, i in zip(*np.nonzero(mask)))
    with pytest.raises(ValueError, match="packed rows"):
        pack_index(mask, rows, (1, 32))


def test_choose_packed_shapes_covers_every_need_with_at_most_k():
    rng = np.random.default_rng(0)
    needs = [(2, int(n)) for n in rng.integers(40, 140, 200)]
    for attention in (float("inf"), 100.0):
        cost = []
        for k in (1, 2, 3, 4):
            shapes = choose_packed_shapes(needs, [1] * len(needs), k, attention=attention)
            assert len(shapes) <= k and shapes[-1] == max(needs)
            assert all(any(s >= n for s in shapes) for n in needs)
            taken = [min(s for s in shapes if s >= n) for n in needs]  # each update's shape: the smallest that fits
            cost.append(sum(r * c * (1 + c / attention) for r, c in taken))
        assert cost == sorted(cost, reverse=True) and cost[-1] < cost[0]  # more shapes never cost more
        # exhaustive check of the dynamic programme for two shapes: no pair of needs' slots costs less
        best = min(sum(r * c * (1 + c / attention) for r, c in [min(s for s in (x, y) if s >= n) for n in needs])
                   for x in set(needs) for y in set(needs) if max(x, y) == max(needs))
        assert cost[1] == pytest.approx(best)


def test_choose_rows_splits_long_micro_batches_only_where_the_attention_pays():
    rng = np.random.default_rng(1)
    # DST-like micro-batches: 12 turns of 30–110 tokens (≈ 600 a micro-batch); RedditBias-like: 8 phrases of 8–36;
    # short: 4 phrases of 5–10 (≈ 30)
    dst = [rng.integers(30, 110, 12) for _ in range(40)]
    lm = [rng.integers(8, 36, 8) for _ in range(40)]
    short = [rng.integers(5, 10, 4) for _ in range(40)]
    updates = [[i] for i in range(40)]
    A = attention_slots(768)
    assert choose_rows(dst, updates, 4, compile_slots(768), float("inf")) == (1, choose_packed_shapes(
        [packed_need(x, 1) for x in dst], [1] * 40, 4, compile_slots(768)))  # slots alone: one row
    r_dst, shapes = choose_rows(dst, updates, 4, compile_slots(768), A)
    r_lm, _ = choose_rows(lm, updates, 4, compile_slots(768), A)
    r_short, _ = choose_rows(short, updates, 4, compile_slots(768), A)
    assert r_dst >= 3 and r_short <= r_lm < r_dst  # the longer the micro-batches, the more rows
    assert all(s[0] == r_dst for s in shapes)

    def plan_cost(r):
        _, c = _bucket([packed_need(x, r) for x in dst], [1] * 40, 4, compile_slots(768), A)
        return c

    assert plan_cost(r_dst) == min(plan_cost(r) for r in range(1, 13))
    # the chosen rows cost less than one row by the model's own measure, by the attention they save
    assert plan_cost(r_dst) < 0.8 * plan_cost(1)


def test_plan_of_long_micro_batches_packs_them_into_several_rows():
    rng = np.random.default_rng(2)
    n, L = 48, 112
    lengths = rng.integers(30, L, n)
    mask = (np.arange(L)[None] < lengths[:, None]).astype(np.int32)
    data = ArrayData({"input_ids": rng.integers(0, 50, (n, L)).astype(np.int32), "attention_mask": mask,
                      "labels": np.zeros(n, np.float32)}, pad_id=0)
    plan = BatchPlan(data, 12, 2, 1, 0, layout="packed", compile_slots=compile_slots(768),
                     attention_slots=attention_slots(768))
    assert plan.rows > 1 and all(s[0] == plan.rows for s in plan.shapes)
    for u in range(len(plan.plan)):
        b = plan.update_batch(u)
        assert b["pack"].shape[1:] == plan.update_shape(u)
        for a in range(b["pack"].shape[0]):  # every real token in exactly one slot
            real = np.sort(b["pack"][a][b["pack"][a] >= 0])
            np.testing.assert_array_equal(real, np.flatnonzero(b["attention_mask"][a].reshape(-1)))
    one = BatchPlan(data, 12, 2, 1, 0, layout="packed", rows=1)
    assert one.rows == 1 and all(s[0] == 1 for s in one.shapes)
    with pytest.raises(ValueError, match="rows"):
        BatchPlan(data, 12, 2, 1, 0, layout="packed", rows=0)


def test_deal_update_by_hand_and_its_invariants():
    # two micro-batches of two, one row each. Kept as they are: 10+10 | 1+1, need 20. Dealt anew, longest first into
    # the emptiest row with room (the lowest micro-batch on ties): 10 → m0, 10 → m1, 1 → m0, 1 → m1: 11 | 11
    assert deal_update(np.array([10, 10, 1, 1]), 2, 1) == ([[[0, 2]], [[1, 3]]], (1, 11))
    # a full micro-batch takes nothing more, even with the emptiest row: 9 → m0, 1 → m1, 1 → m1 (2 < 9: now
    # full), 1 → m0 (m1's row has 2, but no room)
    assert deal_update(np.array([9, 1, 1, 1]), 2, 1) == ([[[0, 3]], [[1, 2]]], (1, 10))
    rng = np.random.default_rng(0)
    for A, B, R in [(4, 12, 4), (4, 12, 6), (3, 5, 2), (2, 3, 7)]:
        lengths = rng.integers(1, 120, A * B)
        rows, need = deal_update(lengths, A, R)
        assert len(rows) == A and all(len(mb) <= R for mb in rows)
        assert [sum(len(r) for r in mb) for mb in rows] == [B] * A  # every micro-batch stays full
        assert sorted(i for mb in rows for r in mb for i in r) == list(range(A * B))  # each example once
        assert need == (R, max(int(lengths[r].sum()) for mb in rows for r in mb))
    for A, B, R, top in [(4, 12, 4, 120), (4, 12, 6, 5), (3, 6, 2, 3), (2, 3, 3, 2)]:  # small tops: many ties
        lengths = rng.integers(1, top, A * B)
        for mb in deal_update(lengths, A, R)[0]:  # packing a micro-batch's examples gives its dealt rows back
            mine = sorted(i for r in mb for i in r)
            assert [[mine[k] for k in r] for r in pack_micro_batch(lengths[mine], R)] == mb
    # an update keeps its micro-batches unless dealing them anew needs fewer slots (ties keep them)
    two = [np.array([10, 10]), np.array([1, 1])]
    assert update_need(two, [0, 1], 1, deal=True) == ((1, 11), [[[0, 2]], [[1, 3]]])
    assert update_need(two, [0, 1], 1, deal=False) == ((1, 20), None)
    assert update_need([np.array([5, 5]), np.array([5, 5])], [0, 1], 1, deal=True) == ((1, 10), None)
    with pytest.raises(ValueError, match="equal micro-batches"):
        deal_update(np.array([3, 4, 5]), 2, 1)
    with pytest.raises(ValueError, match="token"):
        deal_update(np.array([3, 0]), 2, 1)


def test_exchangeable_plan_deals_each_full_update_anew_and_keeps_its_examples():
    rng = np.random.default_rng(2)
    n, L = 100, 112  # 8 micro-batches of 12 and a short one of 4, 3 updates of 3: the last keeps its micro-batches
    lengths = rng.integers(10, L, n)
    mask = (np.arange(L)[None] < lengths[:, None]).astype(np.int32)
    data = ArrayData({"input_ids": rng.integers(0, 50, (n, L)).astype(np.int32), "attention_mask": mask,
                      "labels": np.arange(n, dtype=np.float32)}, pad_id=0)
    kw = dict(layout="packed", compile_slots=compile_slots(768), attention_slots=attention_slots(768))
    kept = BatchPlan(data, 12, 3, 1, 0, **kw)
    dealt = BatchPlan(data, 12, 3, 1, 0, exchangeable=True, **kw)
    assert kept.dealt() == 0 and 0 < dealt.dealt() <= 6 and dealt.plan == kept.plan
    assert dealt.real_fraction() > kept.real_fraction() + 0.03
    for u, mbs in enumerate(dealt.plan):
        rows = [dealt.batch_rows(e, b) for e, b in mbs]
        assert sorted(np.concatenate(rows)) == sorted(np.concatenate([kept.batch_rows(e, b) for e, b in mbs]))
        assert all(len(r) == 12 for r in rows) or u == len(dealt.plan) - 1
        b = dealt.update_batch(u)
        assert b["pack"].shape[1:] == dealt.update_shape(u)
        examples = np.concatenate([kept.batch_rows(e, b) for e, b in mbs])
        need, deal_rows = update_need([dealt._lengths[kept.batch_rows(e, b)] for e, b in mbs],
                                      list(range(len(mbs))), dealt.rows, u < len(dealt.plan) - 1)
        assert need <= dealt.update_shape(u)
        for a, r in enumerate(rows):  # the micro-batch's own examples, every real token in exactly one slot
            np.testing.assert_array_equal(b["labels"][a][:len(r)], r.astype(np.float32))
            real = np.sort(b["pack"][a][b["pack"][a] >= 0])
            np.testing.assert_array_equal(real, np.flatnonzero(b["attention_mask"][a].reshape(-1)))
            if deal_rows is not None:  # packed in the rows it was dealt into
                packed = [set(r[np.unique(row[row >= 0] // L)].tolist()) for row in b["pack"][a]]
                assert [p for p in packed if p] == [set(examples[row].tolist()) for row in deal_rows[a]]
        assert dealt.tokens(u) == kept.tokens(u)
    for e, b in dealt.plan[-1]:  # the last update holds the epoch's short micro-batch (4 examples): kept as it is
        np.testing.assert_array_equal(dealt.batch_rows(e, b), kept.batch_rows(e, b))
    assert len(dealt.batch_rows(*dealt.plan[-1][-1])) == 4
    assert DSTObjective().exchangeable(data)
    assert not DSTObjective().exchangeable(ArrayData({**data.extra, "input_ids": data.ids, "attention_mask": mask,
                                                      "weights": np.ones(n, np.float32)}, pad_id=0))


# ---------------------------------------------------------------------------------------- packed == padded
@pytest.fixture(scope="module")
def start(tiny_model_dir, tokenizer_dir):
    from rbjax.model.hf import load_pretrained
    from rbjax.model.tokenizer import load_tokenizer

    config, params = load_pretrained(tiny_model_dir)
    return config, params, load_tokenizer(tokenizer_dir, expected_vocab_size=None)


def _run(cfg, start, data, layout, points=None, max_shapes=1):
    config, params, tok = start
    cfg = cfg.replace(layout=layout)
    plan = BatchPlan.of_run(data, cfg.trainer_config, max_shapes=max_shapes)  # 1: one compile per test
    model = ModelHandle.from_params(params, config, tok, name="tiny", digest="tiny")
    tr = debias_trainer(cfg, points=points, model=model, data=data, plan=plan)
    metrics = []
    res = tr.run(checkpoints=False, callback=lambda ev, m=metrics: ev["kind"] == "update" and m.append(ev["metrics"]))
    return tr, res, metrics


def _compare(a, b, keys=("lm_loss", "debias_loss", "total"), loss_rtol=LOSS_RTOL):
    """Losses of every update to ``loss_rtol`` (the first at identical parameters; later ones at parameters that
    already differ by float32 rounding) and the parameters after three updates to ``PARAM_ATOL``."""
    (tr_a, res_a, m_a), (_, res_b, m_b) = a, b
    assert len(m_a) == len(m_b) == 3
    worst_loss = 0.0
    for ua, ub in zip(m_a, m_b):
        for ra, rb in zip(ua if isinstance(ua, list) else [ua], ub if isinstance(ub, list) else [ub]):
            assert ra["tokens"] == rb["tokens"] > 0  # real tokens, whatever the layout
            for k in keys:
                worst_loss = max(worst_loss, abs(ra[k] - rb[k]) / max(abs(ra[k]), 1e-30))
    worst_param = max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
                      for x, y in zip(jax.tree.leaves(jax.device_get(res_a.state.params)),
                                      jax.tree.leaves(jax.device_get(res_b.state.params))))
    moved = max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
                for x, y in zip(jax.tree.leaves(jax.device_get(res_a.state.params)),
                                jax.tree.leaves(jax.device_get(tr_a.init_params))))
    assert moved > 3 * PARAM_ATOL  # the updates did move the parameters
    print(f"packed vs padded: worst loss rel {worst_loss:.2e}, worst param abs {worst_param:.2e}")
    assert worst_loss <= loss_rtol, worst_loss
    assert worst_param <= PARAM_ATOL, worst_param
    return worst_loss, worst_param


@pytest.mark.parametrize("method,semantics", [(m, s) for m in ("lmd", "add", "hd") for s in ("paper", "reference")]
                         + [("cda", "paper"), ("cda", "reference")])
def test_packed_update_equals_padded(start, tokenizer_dir, redditbias_dir, tmp_path, method, semantics):
    f = religion1_train_file(redditbias_dir, tmp_path, 14 if method == "cda" else 28)
    cfg = DebiasRun.from_flat(method=method, semantics=semantics, bias_type="religion1", model="unused",
                      out_dir=str(tmp_path / "run"), train_file=f, batch_size=4, grad_accum=2, max_steps=3,
                      dropout=False, learning_rate=5e-5, export=False, evaluate=False, lmp=False, progress=False)
    data = TrainingData(cfg, start[2], start[0].vocab_size)
    padded, packed = _run(cfg, start, data, "padded"), _run(cfg, start, data, "packed")
    assert packed[0].plan.layout == "packed" and packed[0].plan.real_fraction() > 0.8
    if method in ("lmd", "add", "hd"):
        assert any(abs(u["debias_loss"]) > 0 for u in padded[2])  # the debiasing loss is exercised
    _compare(padded, packed)


def test_packed_grid_step_equals_padded(start, redditbias_dir, tmp_path):
    f = religion1_train_file(redditbias_dir, tmp_path, 28)
    cfg = DebiasRun.from_flat(method="hd", semantics="reference", bias_type="religion1", model="unused",
                      out_dir=str(tmp_path / "run"), train_file=f, batch_size=4, grad_accum=2, max_steps=3,
                      dropout=False, learning_rate=5e-5, export=False, evaluate=False, lmp=False, progress=False)
    data = TrainingData(cfg, start[2], start[0].vocab_size)
    pts = [lambda_point(0.01, 10.0, 5e-5), lambda_point(0.001, 100.0, 2e-5)]
    _compare(_run(cfg, start, data, "padded", pts), _run(cfg, start, data, "packed", pts))


def test_packed_plan_compiles_one_program_per_shape(start, redditbias_dir, tmp_path):
    f = religion1_train_file(redditbias_dir, tmp_path, 64)
    cfg = DebiasRun.from_flat(method="lm", bias_type="religion1", model="unused", out_dir=str(tmp_path / "run"),
                      train_file=f, batch_size=4, grad_accum=1, epochs=1, dropout=True, export=False,
                      evaluate=False, lmp=False, progress=False)
    data = TrainingData(cfg, start[2], start[0].vocab_size)
    before = compiled_programs()
    tr, _, metrics = _run(cfg, start, data, "packed", max_shapes=4)
    used = {tr.plan.update_shape(u) for u in range(tr.t_total)}
    assert 1 < len(tr.plan.shapes) <= 4 and used == set(tr.plan.shapes)
    assert compiled_programs() - before == len(used)  # one program per packed shape, none per batch
    assert all(m["tokens"] == tr.plan.tokens(u) for u, m in enumerate(metrics))


# ------------------------------------------------------------------------------------------------ dialog tasks
CFG = GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=2, bos_token_id=63, eos_token_id=63)


def _dialog_batch(rng, lengths, L=12, with_loss_mask=False):
    B = len(lengths)
    ids = rng.integers(0, 60, (B, L)).astype(np.int32)
    mask = (np.arange(L)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
    batch = {"input_ids": ids, "attention_mask": mask, "labels": (rng.random(B) > 0.5).astype(np.float32)}
    if with_loss_mask:
        batch["loss_mask"] = (mask * (np.arange(L)[None] >= np.asarray(lengths)[:, None] // 2)).astype(np.int32)
    return batch


def _packed(batch, n_rows):
    lengths = batch["attention_mask"].sum(1)
    rows = pack_micro_batch(lengths, n_rows)
    need = packed_need(lengths, n_rows)
    pack, unpack = pack_index(batch["attention_mask"], rows, (need[0] + 1, need[1] + 2))  # room to spare
    return {**batch, "pack": pack, "unpack": unpack}


@pytest.mark.parametrize("n_rows", [0, 1, 3])  # 0: the padded layout
def test_forward_at_equals_the_full_states_at_the_positions(n_rows):
    """``forward_at`` (the DST objective's forward: the last layer at the pooled tokens only) gives
    ``forward_hidden``'s states at those positions, and the same gradients, in either layout; an example without
    tokens reads zeros in the packed layout, as there."""
    rng = np.random.default_rng(5)
    params = init_params(CFG, seed=2)
    batch = _dialog_batch(rng, [12, 9, 7, 0, 11, 3])
    if n_rows:
        batch = _packed(batch, n_rows)
    model = GPT2LMHeadModel(CFG)
    idx = pooled_index(batch["attention_mask"])
    w = jnp.asarray(rng.normal(size=(6, CFG.n_embd)), jnp.float32)

    def full(p):
        return jnp.take_along_axis(forward_hidden(model, p, batch, False, None)[0], idx[:, None, None], axis=1)[:, 0]

    def at(p):
        return forward_at(model, p, batch, False, None, idx)

    np.testing.assert_allclose(np.asarray(at(params)), np.asarray(full(params)), rtol=1e-5, atol=1e-6)
    if n_rows:
        assert not np.any(np.asarray(at(params))[3])
    g_full = jax.grad(lambda p: jnp.sum(full(p) * w))(params)
    g_at = jax.grad(lambda p: jnp.sum(at(p) * w))(params)
    for a, b in zip(jax.tree.leaves(g_full), jax.tree.leaves(g_at)):  # float32 sums in another order
        a, b = np.asarray(a), np.asarray(b)
        assert np.linalg.norm(b - a) <= 1e-5 * np.linalg.norm(a) + 1e-7


@pytest.mark.parametrize("method", ["dst", "crg"])
def test_dialog_task_losses_packed_equal_padded(method):
    rng = np.random.default_rng(3)
    params = init_params(CFG, seed=2)
    if method == "dst":
        from rbjax.dialog.state_tracking import init_head

        params = {"gpt2": params, "head": init_head(CFG, seed=0)}
    spec = StepSpec(config=CFG, objective=DSTObjective() if method == "dst" else CRGObjective(), dropout=False)
    batch = _dialog_batch(rng, [12, 9, 7, 0, 11, 3], with_loss_mask=method == "crg")  # a full row, a filler row
    ref, _ = batch_losses(params, batch, jnp.ones(2), None, spec)
    g_ref = jax.grad(lambda p: batch_losses(p, batch, jnp.ones(2), None, spec)[0])(params)
    for n_rows in (1, 3):  # one row; several rows
        pb = _packed(batch, n_rows)
        got, _ = batch_losses(params, pb, jnp.ones(2), None, spec)
        assert float(got) == pytest.approx(float(ref), rel=LOSS_RTOL)
        g = jax.grad(lambda p: batch_losses(p, pb, jnp.ones(2), None, spec)[0])(params)
        for a, b in zip(jax.tree.leaves(g_ref), jax.tree.leaves(g)):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("method", ["dst", "crg"])
def test_dialog_task_training_packed_equals_padded(tmp_path, method):
    rng = np.random.default_rng(4)
    params = init_params(CFG, seed=2)
    if method == "dst":
        from rbjax.dialog.state_tracking import init_head

        params = {"gpt2": params, "head": init_head(CFG, seed=0)}
    arrays = _dialog_batch(rng, rng.integers(2, 13, 20), with_loss_mask=method == "crg")
    if method == "crg":
        arrays.pop("labels")
    data = ArrayData(arrays, pad_id=63, info={"task": "test"})

    class Tok:  # the trainer only asks a tokenizer for its size and source
        vocab_size, eos_id, source = 64, 63, "test"

    cfg = TrainerConfig(batch_size=4, grad_accum=2, max_steps=3, dropout=False, progress=False, block_size=12)
    model = ModelHandle.from_params(params["gpt2"] if method == "dst" else params, CFG, Tok(), name="test", digest="test")
    runs = []
    for layout in ("padded", "packed"):
        tr = Trainer(cfg.replace(layout=layout), model, DSTObjective() if method == "dst" else CRGObjective(),
                     make_optimizer(), data, mesh=run_mesh(None, batch_size=4), points=TrainPoint({}, 1e-2),
                     params=params)
        metrics = []
        res = tr.run(checkpoints=False,
                     callback=lambda ev, m=metrics: ev["kind"] == "update" and m.append(ev["metrics"]))
        runs.append((tr, res, metrics))
    assert runs[1][0].plan.layout == "packed"
    # DST's updates are dealt anew into their micro-batches (the same examples, other groups): same updates
    assert (runs[1][0].plan.dealt() > 0) == (method == "dst")
    # a run that deals has a key of its own (other micro-batches, other dropout masks); the others keep theirs
    assert [("dealt_updates" in tr.key()["trajectory"]) for tr, _, _ in runs] == [False, method == "dst"]
    _compare(*runs, keys=("bce_loss" if method == "dst" else "lm_loss", "total"))


def test_reference_dst_stays_padded():
    from rbjax.dialog.evaluate import training_layout

    assert training_layout("dst", {"semantics": "reference", "layout": "packed"}) == "padded"
    assert training_layout("dst", {"semantics": "paper", "layout": "packed"}) == "packed"
    assert training_layout("crg", {"semantics": "reference", "layout": "packed"}) == "packed"
    with pytest.raises(ValueError, match="padded layout"):  # and the reference pooling never sees a packed batch
        DSTObjective("reference")({}, {"pack": None}, None, None, None)


def test_layout_settings_are_checked_and_recorded():
    from rbjax.dialog.evaluate import task_settings

    with pytest.raises(ValueError, match="layout must be one of"):
        DebiasRun.from_flat(layout="diagonal")
    with pytest.raises(ValueError, match="layout must be one of"):
        task_settings("dst", {"layout": "diagonal"})
    assert task_settings("crg", {})["layout"] == "packed" and task_settings("dst", {"layout": "padded"})["layout"] == \
        "padded"
    assert DebiasRun.from_flat().trainer_config.trajectory()["layout"] == "packed"  # enters checkpoint and result keys


def test_study_cost_estimate_uses_the_packed_rate():
    from pathlib import Path

    from rbjax.study.config import load_study
    from rbjax.study.run import COSTS, TOKENS_PER_LINE, TRAIN_LINES, estimate_cost

    paper = Path(__file__).resolve().parents[1] / "experiments" / "paper.toml"
    packed = estimate_cost(load_study(paper))
    padded = estimate_cost(load_study(paper, ["training.layout=padded"]))
    assert packed["layout"] == "packed" and padded["layout"] == "padded"
    assert packed["training_tokens"] == padded["training_tokens"]  # real tokens either way
    # packed: real tokens at the packed rate; padded: every 36-token slot at the padded rate
    assert packed["train_hours"] == pytest.approx(packed["training_tokens"] / COSTS["train_tokens_per_s"] / 3600
                                                  * packed["size_ratio"])
    slots = padded["training_tokens"] * 36 / (sum(TOKENS_PER_LINE[b] * TRAIN_LINES[b] for b in TRAIN_LINES) /
                                              sum(TRAIN_LINES.values()))
    assert padded["train_hours"] == pytest.approx(slots / COSTS["train_padded_slots_per_s"] / 3600
                                                  * padded["size_ratio"], rel=0.05)
