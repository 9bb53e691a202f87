"""Debiasing trainer: schedule/accumulation accounting, optimizer-state checkpoints, loss decrease per method,
kill-and-resume, HF export parity with PyTorch, and a CLI smoke run (tiny random GPT-2, CPU)."""
import hashlib
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rbjax.train.checkpoint import Checkpointer
from rbjax.train.batching import update_plan
from rbjax.train.optim import learning_rate, linear_schedule, make_optimizer, reference_optimizer
from rbjax.train.step import TrainState
from rbjax.debias.run import debias_trainer
from tests.conftest import religion1_train_file
from tests.conftest import small_train_config as _cfg

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")


def _fingerprint(params) -> str:
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(jax.device_get(params)):
        h.update(np.ascontiguousarray(leaf).tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------- plan, schedule
def test_update_plan_counts_updates_not_micro_batches():
    plan, t_total = update_plan(n_batches=40, grad_accum=4, epochs=1)
    assert t_total == 10 and len(plan) == 10
    assert [[b for _, b in p] for p in plan] == [list(range(4 * u, 4 * u + 4)) for u in range(10)]
    sched = linear_schedule(5e-5, t_total)
    for u in range(1, 11):  # update u is applied with the schedule at count u-1
        assert float(sched(u - 1)) == pytest.approx(5e-5 * (11 - u) / 10, rel=1e-6)


def test_update_plan_leftovers_drop_and_carry():
    drop, t = update_plan(n_batches=6, grad_accum=4, epochs=3, leftover="drop")
    assert t == 3 and drop == [[(e, b) for b in range(4)] for e in range(3)]
    carry, t = update_plan(n_batches=6, grad_accum=4, epochs=3, leftover="carry")
    assert t == 3
    assert carry[0] == [(0, b) for b in range(4)]
    assert carry[1] == [(0, 4), (0, 5)] + [(1, b) for b in range(4)]  # reference Trainer: no zero_grad at epoch end
    assert carry[2] == [(1, 4), (1, 5)] + [(2, b) for b in range(4)]  # the last epoch's leftovers are discarded
    capped, t = update_plan(n_batches=6, grad_accum=4, epochs=1, max_steps=5)
    assert t == 5 and len(capped) == 5 and capped[-1][0][0] == 4  # max_steps: more epochs, schedule over 5
    with pytest.raises(ValueError, match="grad_accum"):
        update_plan(n_batches=3, grad_accum=5, epochs=2)


# the near-epsilon elements' tolerance (1e-6·lr) is the float32 rounding of XLA's default code generation
@pytest.mark.xla_default_codegen
def test_failure_case_accumulation_vs_schedule(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path):
    """40 micro-batches, accumulation 4, 1 epoch, lr 5e-5 linear to 0, no warm-up: the parameters change exactly 10
    times (after micro-batches 4, 8, …, 40); update u uses 5e-5·(11−u)/10 and the mean of its 4 micro-gradients."""
    f = religion1_train_file(redditbias_dir, tmp_path, 40)
    cfg = _cfg(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path / "run", method="lm", train_file=f,
               batch_size=1, grad_accum=4, epochs=1, max_steps=None, dropout=False, learning_rate=5e-5)
    tr = debias_trainer(cfg)
    assert tr.n_batches == 40 and tr.t_total == 10

    prints, before, rows = [], {}, {}
    final = {}

    def cb(ev):
        if ev["kind"] == "micro":
            prints.append(_fingerprint(ev["params"]))
            rows.setdefault(ev["update"], []).append(np.array(ev["rows"]))
            if ev["micro_batch"] == 0:
                before[ev["update"]] = jax.device_get(ev["params"])
        else:
            assert ev["lr"] == pytest.approx(5e-5 * (11 - ev["update"]) / 10, rel=1e-6)  # the float32 lr used
            final[ev["update"]] = jax.device_get(ev["params"])

    res = tr.run(callback=cb, checkpoints=False)
    assert res.updates_done == 10 and len(prints) == 40
    changes = [k for k in range(1, 40) if prints[k] != prints[k - 1]]  # micro-batch k+1 sees new params
    assert changes == [4, 8, 12, 16, 20, 24, 28, 32, 36]  # changed after micro-batches 4, 8, ..., 36
    assert _fingerprint(res.params) != prints[-1]  # ... and after micro-batch 40: 10 changes in all

    # an independent Adam (clip 1.0, b 0.9/0.999, eps 1e-8) with lr 5e-5·(11−u)/10 reproduces every update
    m_state = v_state = None
    for u in range(1, 11):
        p_before = before[u]
        g = jax.tree.map(lambda *x: np.mean(np.stack([np.asarray(y, np.float64) for y in x]), axis=0),
                         *[tr.grads(jax.device_put(p_before), tr.make_batch(r, tr.plan.update_shape(u - 1)))
                           for r in rows[u]])  # the update's shape: the same computation as the trainer's
        norm = np.sqrt(sum(float(np.sum(x * x)) for x in jax.tree.leaves(g)))
        if norm > 1.0:
            g = jax.tree.map(lambda x: x / norm, g)
        if m_state is None:
            m_state = jax.tree.map(np.zeros_like, g)
            v_state = jax.tree.map(np.zeros_like, g)
        m_state = jax.tree.map(lambda m, x: 0.9 * m + 0.1 * x, m_state, g)
        v_state = jax.tree.map(lambda v, x: 0.999 * v + 0.001 * x * x, v_state, g)
        lr = 5e-5 * (11 - u) / 10
        step = jax.tree.map(lambda m, v: lr * (m / (1 - 0.9 ** u)) / (np.sqrt(v / (1 - 0.999 ** u)) + 1e-8),
                            m_state, v_state)
        after = final[u]
        for pb, pa, s in zip(jax.tree.leaves(p_before), jax.tree.leaves(after), jax.tree.leaves(step)):
            got = np.asarray(pb, np.float64) - np.asarray(pa, np.float64)
            # + 1e-6·lr: an element whose gradient is near Adam's ε (update ≪ lr) moves with float32 rounding of
            # its (cancelling) gradient sum, which depends on the summation order (scan vs one micro-batch at a time)
            tol = 1e-3 * np.abs(s) + 4 * np.spacing(np.abs(np.asarray(pb, np.float32))).astype(np.float64) + 1e-6 * lr
            bad = np.abs(got - s) > tol
            assert not bad.any(), (f"update {u} does not use lr 5e-5·(11−u)/10 on the mean gradient", int(bad.sum()),
                                   got[bad][:5], s[bad][:5], tol[bad][:5])


# ------------------------------------------------------------------------------------- optimizer-state restore
def _same_containers(a, b, path="state"):
    assert type(a) is type(b), f"{path}: {type(a).__name__} restored as {type(b).__name__}"
    if isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for i, (x, y) in enumerate(zip(a, b)):
            _same_containers(x, y, f"{path}[{i}]")
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same_containers(a[k], b[k], f"{path}.{k}")


def _adam_states(state):
    out = []

    def walk(x):
        if isinstance(x, optax.ScaleByAdamState):
            out.append(x)
        elif isinstance(x, (tuple, list)):
            for y in x:
                walk(y)
        elif isinstance(x, dict):
            for y in x.values():
                walk(y)

    walk(state)
    return out


@pytest.mark.parametrize("multisteps", [False, True], ids=["clip-adam", "optax-adam-in-MultiSteps"])
def test_failure_case_restored_optimizer_state(tmp_path, multisteps):
    """Train 3 updates, save with orbax, restore, train 1 more: the restored state has the structure of a fresh
    init (tuples and namedtuples), Adam's count is 3, and update 4 is bit-identical to an uninterrupted run. For the
    trainer's own optimiser (:class:`ClipAdam`) and for optax's reference chain inside ``optax.MultiSteps``."""
    params = {"w": jnp.arange(12.0).reshape(3, 4) / 10, "b": {"c": jnp.ones(4)}}
    opt = make_optimizer()
    k = 2 if multisteps else 1
    tx = optax.MultiSteps(reference_optimizer(opt), every_k_schedule=k) if multisteps else None

    def fresh_state():
        return TrainState(params=params, opt_state=tx.init(params) if multisteps else opt.init(params),
                          step=jnp.zeros((), jnp.int32), hparams=jnp.ones(2), lr=jnp.float32(5e-5),
                          t_total=jnp.float32(10))

    @jax.jit
    def step(st, i):
        g = jax.tree.map(lambda x: jnp.sin(x * (i + 1.0)) + 0.1 * i, st.params)
        lr = learning_rate(st.step, st.lr, st.t_total)
        if not multisteps:
            p, s, _, _ = opt.apply(st.params, g, st.opt_state, lr)
            return st.replace(params=p, opt_state=s, step=st.step + 1)
        d, s = tx.update(g, st.opt_state, st.params)
        return st.replace(params=jax.tree.map(lambda p, u: p - lr * u, st.params, d), opt_state=s, step=st.step + 1)

    st = fresh_state()
    for i in range(4 * k):
        st = step(st, i)
    p_full = st.params

    st = fresh_state()
    for i in range(3 * k):
        st = step(st, i)
    ck = Checkpointer(tmp_path / "ckpt")
    ck.save(3, st, {"update": 3})
    ck.close()

    ck = Checkpointer(tmp_path / "ckpt")
    like = fresh_state()
    st2, meta = ck.restore(ck.latest_step(), like)
    ck.close()
    assert meta["update"] == 3 and int(st2.step) == 3 * k
    assert jax.tree.structure(st2.opt_state) == jax.tree.structure(like.opt_state)
    _same_containers(like.opt_state, st2.opt_state)
    counts = [a.count for a in _adam_states(st2.opt_state)] if multisteps else [st2.opt_state.count]
    assert [int(c) for c in counts] == [3]
    for i in range(3 * k, 4 * k):
        st2 = step(st2, i)
    for a, b in zip(jax.tree.leaves(p_full), jax.tree.leaves(st2.params)):
        assert np.array_equal(np.asarray(a), np.asarray(b))


# --------------------------------------------------------------------------------------- loss decrease per method
@pytest.mark.parametrize("method,semantics", [("lmd", "paper"), ("add", "paper"), ("hd", "paper"), ("cda", "paper"),
                                              ("hd", "reference")])
def test_few_steps_reduce_the_method_loss(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path, method, semantics):
    f = religion1_train_file(redditbias_dir, tmp_path, 8)
    cfg = _cfg(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path / "run", method=method, semantics=semantics,
               train_file=f, max_steps=6, dropout=False, learning_rate=1e-4, lambda_lm=0.001, lambda_d=100.0)
    tr = debias_trainer(cfg)
    assert tr.n_examples == (16 if method == "cda" else 8)  # CDA: the phrases and their swapped copies
    batches = [tr.make_batch(tr.batch_rows(0, i)) for i in range(tr.n_batches)]

    def loss(p, key):
        return np.mean([tr.losses(p, b)[key] for b in batches])

    key = "lm_loss" if method == "cda" else "debias_loss"
    before = loss(tr.init_params, key)
    res = tr.run(checkpoints=False)
    after = loss(res.params, key)
    assert before > 0
    if method == "cda":  # plain LM loss of a random model: starts near log(V) and falls slowly
        assert after < before - 0.01, (before, after)
    else:
        assert after < 0.95 * before, (before, after)


# ---------------------------------------------------------------------------------------------- kill and resume
def _read_metrics(out):
    return [json.loads(ln) for ln in (Path(out) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    # the packed layout (the users' default): resuming in the middle of a packed batch plan
    cfg = _cfg(tiny_model_dir, tokenizer_dir, redditbias_dir, out, grad_accum=2, max_steps=5, save_every=2,
               layout="packed")
    tr = debias_trainer(cfg)
    return cfg, tr, tr.run()


def test_kill_and_resume_equals_uninterrupted(uninterrupted, tmp_path):
    cfg_a, _, res_a = uninterrupted
    cfg = cfg_a.replace(out_dir=str(tmp_path / "killed"))
    stopped = debias_trainer(cfg).run(stop_after=3)  # "killed" after update 3 (checkpoints at 2 and 3)
    assert stopped.updates_done == 3 and not stopped.finished
    resumed = debias_trainer(cfg).run()  # a fresh process would do the same: restore update 3, go on
    assert resumed.resumed_from == 3 and resumed.finished
    for a, b in zip(jax.tree.leaves(res_a.params), jax.tree.leaves(resumed.params)):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    steps = [m["step"] for m in _read_metrics(cfg.out_dir)]
    assert steps == [1, 2, 3, 4, 5]
    assert _read_metrics(cfg.out_dir)[-1]["total"] == _read_metrics(cfg_a.out_dir)[-1]["total"]
    # a different run may not resume from these checkpoints
    with pytest.raises(ValueError, match="different run"):
        debias_trainer(cfg.replace(lambda_d=50.0)).run()


def test_a_user_hook_sees_every_update_and_can_stop_the_run(uninterrupted, tmp_path):
    """A hook handed to the run sees each update with the metric line metrics.jsonl gets; when it asks to stop
    after update 3, the run ends there with a checkpoint of update 3 (save_every is 2: only the stop saves it; not
    finished, ``stopped_by`` saying why), and the rerun resumes from it to the uninterrupted run's parameters; a
    function added with ``every=2`` sees update 4 only (4 and 5 are the rerun's)."""
    from rbjax.core.io import to_json
    from rbjax.train.hooks import Hook

    cfg_a, _, res_a = uninterrupted
    cfg = cfg_a.replace(out_dir=str(tmp_path / "hooked"))
    seen = []

    class StopAtTwo(Hook):
        def on_update(self, run, info):
            seen.append(info.metrics)
            assert info.update == run.done and info.state is run.state
            if info.update == 3:
                info.stop("the test's hook")

    res = debias_trainer(cfg).run(hooks=[StopAtTwo()])
    assert res.updates_done == 3 and not res.finished and res.summary["stopped_by"] == "the test's hook"
    assert [m["step"] for m in seen] == [1, 2, 3]
    lines = _read_metrics(cfg.out_dir)
    assert [json.loads(to_json(m)) for m in seen] == lines  # the very lines written
    same = ("step", "epoch", "total", "lm_loss", "debias_loss", "lr", "grad_norm", "skipped", "tokens")
    assert [[ln[k] for k in same] for ln in lines] == \
        [[ln[k] for k in same] for ln in _read_metrics(cfg_a.out_dir)[:3]]  # the hook changed no update
    assert (tmp_path / "hooked" / "checkpoints" / "3").is_dir()

    tr = debias_trainer(cfg)
    every_second = []
    tr.add_hook(lambda info: every_second.append(info.update), every=2)
    resumed = tr.run()
    assert resumed.resumed_from == 3 and resumed.finished and every_second == [4]
    assert "stopped_by" not in resumed.summary
    for a, b in zip(jax.tree.leaves(res_a.params), jax.tree.leaves(resumed.params)):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_every_hook_ends_even_when_one_fails():
    """on_end runs for every hook, last added first, even after one raised; its error is raised afterwards when the
    run itself ended normally, and the run's own error wins otherwise (a Ctrl-C's Interrupted, say)."""
    from rbjax.train.hooks import Hook, end_hooks

    ended = []

    class H(Hook):
        def __init__(self, name, fail=False):
            self.name, self.fail = name, fail

        def on_end(self, run, error):
            ended.append((self.name, error))
            if self.fail:
                raise RuntimeError(self.name)

    hooks = [H("a"), H("b", fail=True), H("c", fail=True)]
    with pytest.raises(RuntimeError, match="^c$"):
        end_hooks(hooks, None, None)
    assert ended == [("c", None), ("b", None), ("a", None)]
    ended.clear()
    own = ValueError("the run's")
    end_hooks(hooks, None, own)  # the caller re-raises its own error
    assert ended == [("c", own), ("b", own), ("a", own)]


def test_kill_and_resume_across_epochs_with_reference_leftovers(tiny_model_dir, tokenizer_dir, redditbias_dir,
                                                                 tmp_path):
    f = religion1_train_file(redditbias_dir, tmp_path, 22)
    cfg = _cfg(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path / "a", method="lmd", semantics="reference",
               train_file=f, grad_accum=4, epochs=3, max_steps=None, save_every=1, layout="packed")
    tr = debias_trainer(cfg)
    assert tr.n_batches == 6 and tr.t_total == 3 and cfg.trainer_config.resolved_leftover == "carry"
    assert len(tr.plan.plan[1]) == 6  # 2 leftovers of epoch 0 + 4 micro-batches of epoch 1
    full = tr.run()
    cfg_b = cfg.replace(out_dir=str(tmp_path / "b"))
    debias_trainer(cfg_b).run(stop_after=1)
    res = debias_trainer(cfg_b).run()
    assert res.resumed_from == 1
    for a, b in zip(jax.tree.leaves(full.params), jax.tree.leaves(res.params)):
        assert np.array_equal(np.asarray(a), np.asarray(b))


# --------------------------------------------------------------------------------------------------- export
def test_export_loads_in_pytorch_with_same_logits(uninterrupted, tokenizer_dir, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from rbjax.model.gpt2 import GPT2LMHeadModel
    from rbjax.model.hf import save_pretrained

    _, tr, res = uninterrupted
    params = jax.device_get(res.params)
    out = save_pretrained(params, tr.config, tmp_path / "model", tokenizer_dir=tokenizer_dir)
    assert (out / "vocab.json").exists() and (out / "merges.txt").exists()
    pt = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    ids = np.asarray([tr.tokenizer.encode("jews are greedy and christians are generous people")], np.int64)
    with torch.no_grad():
        ref = pt(torch.from_numpy(ids)).logits.numpy()
    ours, _ = GPT2LMHeadModel(tr.config).apply({"params": params}, jnp.asarray(ids, jnp.int32))
    np.testing.assert_allclose(np.asarray(ours), ref, atol=2e-4, rtol=1e-4)
    # the trained weights, not the starting ones, were exported
    assert not np.array_equal(params["wte"]["embedding"], tr.init_params["wte"]["embedding"])


# ------------------------------------------------------------------------------------------------------- CLI
def test_cli_debias_smoke_then_measure(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path, capsys):
    from rbjax.cli import main

    out = tmp_path / "run"
    argv = ["debias", "--method", "lmd", "--bias", "religion1", "--model", str(tiny_model_dir),
            "--tokenizer", str(tokenizer_dir), "--data-dir", str(redditbias_dir), "--out", str(out),
            "--max-steps", "3", "--batch-size", "4", "--eval-bias", "religion1", "--lmp-max-lines", "64",
            "--no-progress"]
    assert main(argv) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["status"] == "done" and res["training"]["updates"] == 3
    assert res["lmb_valid"]["debiased_type"]["bias_type"] == "religion1"
    assert res["lmb_valid"]["debiased_type"]["t_value"] is not None
    assert res["lmp"]["n_lines"] == 64 and res["lmp"]["perplexity"] > 1
    assert res["config"]["method"] == "lmd" and "jax" in res["versions"]
    assert (out / "lmb_valid" / "lmb.json").exists() and (out / "config.json").exists()
    assert [m["step"] for m in _read_metrics(out)] == [1, 2, 3]
    assert {"lm_loss", "debias_loss", "total", "lr", "tokens_per_s"} <= set(_read_metrics(out)[0])
    assert (out / "model" / "model.safetensors").exists() and (out / "model" / "vocab.json").exists()
    assert "LMB (valid split" in capsys.readouterr().out
    # `rbjax measure` works on the exported model
    assert main(["measure", "--model", str(out / "model"), "--bias", "religion1", "--split", "valid",
                 "--data-dir", str(redditbias_dir), "--out", str(tmp_path / "m"), "--n-bootstrap", "200",
                 "--no-progress"]) == 0
    assert (tmp_path / "m" / "lmb.json").exists()


def test_cli_reports_bad_settings(tiny_model_dir, tmp_path, capsys):
    from rbjax.cli import main

    assert main(["debias", "--method", "hd", "--bias", "religion3", "--model", str(tiny_model_dir),
                 "--out", str(tmp_path / "x")]) == 1
    assert "unknown bias type" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------------ sweep
def _rec(i, ref_p, t, lmp):
    return {"id": f"p{i}", "point": {"batch_size": 4, "grad_accum": 1, "lambda_lm": 0.01, "lambda_d": 10.0 * i},
            "dev": {"t_value": t, "p_value": 0.5, "reference": {"t_value": t, "p_value": ref_p}},
            "lmp": {"perplexity": lmp}}


def test_selection_rules():
    from rbjax.debias.sweep import select

    recs = [_rec(0, 0.9, -0.2, 200.0), _rec(1, 0.5, 0.5, 105.0), _rec(2, 0.3, -0.4, 108.0)]
    sel = select(recs, baseline_lmp=100.0, lmp_tolerance=0.10)
    assert sel["reference"]["id"] == "p0"  # highest dev p-value, whatever it does to the LM
    assert sel["default"]["id"] == "p2" and sel["default"]["constraint_met"]  # least |t| within the LMP budget
    fallback = select(recs, baseline_lmp=100.0, lmp_tolerance=0.0)
    assert fallback["default"]["id"] == "p1" and not fallback["default"]["constraint_met"]


def test_grid_has_54_points_and_cda_collapses():
    from rbjax.debias.sweep import grid_points

    pts = grid_points("hd")
    assert len(pts) == 54 and len({p.id for p in pts}) == 54
    assert [p.batch_size for p in pts] == sorted(p.batch_size for p in pts)  # batch size outermost
    assert len(grid_points("cda")) == 9
