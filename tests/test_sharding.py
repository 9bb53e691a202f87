"""Models split over ``fsdp`` / ``tensor`` mesh axes and the memory plan.

The 8-device checks run in one subprocess (``tests/sharding_checks.py``, ``XLA_FLAGS=
--xla_force_host_platform_device_count=8``; JAX reads the flag once). Tolerances: sharding changes the order of
float32 sums (partial matmuls over ``fsdp``/``tensor`` slices, all-reduced), so results agree to rounding:

* losses / perplexities: relative difference ≤ :data:`METRICS_RTOL` (1e-5; seen ≤ 3e-7);
* trained parameters: ‖Δ‖₂ ≤ :data:`MOVEMENT_RTOL` (1e-3; seen ≤ 3e-5) of how far training moved them, and every
  weight within :data:`WEIGHT_ATOL_LR` (0.25; seen ≤ 0.03) of one update's size (tests/test_mesh.py explains why Adam
  turns rounding into a fraction of a step);
* greedy generation: the same tokens;
* a checkpoint restored on another mesh: bit for bit.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import jax
import pytest

from rbjax.core.mesh import AXES, DEFAULT_RULES, logical_spec, mesh_label, mesh_product, parse_mesh
from rbjax.model import registry
from rbjax.model.handle import ModelHandle
from rbjax.model.memory import PlanError, plan_for_model, plan_memory
from rbjax.model.partition import LOGICAL_AXES, logical_axes_of_family
from tests.conftest import simulated_devices_env

ROOT = Path(__file__).resolve().parents[1]
LLAMA3_8B = ROOT / "tests" / "fixtures" / "llama3_8b"

METRICS_RTOL = 1e-5
MOVEMENT_RTOL = 1e-3
WEIGHT_ATOL_LR = 0.25


# ------------------------------------------------------------------------------------------------ --mesh parser
def test_parse_mesh():
    assert parse_mesh("data=2,fsdp=4", 8) == {"grid": 1, "data": 2, "fsdp": 4, "tensor": 1}
    assert parse_mesh(" fsdp = 4 , tensor=2 ", 8) == {"grid": 1, "data": 1, "fsdp": 4, "tensor": 2}
    assert parse_mesh("fsdp=-1,tensor=2", 8)["fsdp"] == 4
    assert parse_mesh(None, 8) is None and parse_mesh("", 8) is None and parse_mesh("auto", 8) is None
    assert mesh_label(parse_mesh("grid=2,fsdp=4", 8)) == "grid=2,data=1,fsdp=4,tensor=1"
    assert mesh_product("data=2,fsdp=4") == 8


@pytest.mark.parametrize("text,msg", [
    ("data=2,fsdp=2", "multiply to 4, but there are 8 devices"),
    ("model=8", "unknown axis 'model'"),
    ("fsdp=8,fsdp=1", "given twice"),
    ("fsdp=0,data=8", "positive integer"),
    ("fsdp", "not AXIS=SIZE"),
    ("fsdp=3,data=-1", "does not divide"),
])
def test_parse_mesh_errors(text, msg):
    with pytest.raises(ValueError, match="--mesh") as e:
        parse_mesh(text, 8)
    assert msg in str(e.value)


# ------------------------------------------------------------------------------------------------ logical axes
class _Sizes:
    def __init__(self, **kw):
        self.shape = {a: kw.get(a, 1) for a in AXES}
        self.axis_names = AXES


def test_logical_spec_rules():
    m = _Sizes(fsdp=4, tensor=2)
    assert tuple(logical_spec(("vocab", "embed"), (96, 32), m)) == ("tensor", "fsdp")
    assert tuple(logical_spec(("embed", "mlp"), (32, 128), m)) == ("fsdp", "tensor")
    assert tuple(logical_spec((None,), (32,), m)) == (None,)  # norms stay whole
    # embed does not divide by fsdp=4: the largest other dimension it divides takes fsdp
    assert tuple(logical_spec(("embed", None), (30, 128), m)) == (None, "fsdp")
    assert tuple(logical_spec(("embed", "mlp"), (30, 128), m)) == (None, "tensor")  # a dimension takes one axis
    # a tensor axis that does not divide the heads' columns is dropped, never an uneven split
    assert tuple(logical_spec(("embed", "heads"), (32, 9), m)) == ("fsdp", None)
    assert tuple(logical_spec(("embed", "mlp"), (4, 32, 128), m, lead=("grid",))) == ("grid", "fsdp", "tensor")
    assert DEFAULT_RULES["embed"] == "fsdp" and DEFAULT_RULES["heads"] == "tensor"


@pytest.mark.parametrize("family", sorted(registry.FAMILIES))
def test_every_parameter_of_every_family_has_logical_axes(family):
    """Each family's table names every parameter of a model with all its options (biases, untied head); every
    matrix gets fsdp and tensor on a 4 × 2 mesh (nothing large silently replicated)."""
    from tests.sharding_checks import _tiny_configs

    assert family in LOGICAL_AXES
    cfg = _tiny_configs()[family]
    shapes = jax.eval_shape(lambda: registry.FAMILIES[family].init_params(cfg, 0))
    axes = logical_axes_of_family(family)
    m = _Sizes(fsdp=4, tensor=2)
    n_mat = 0
    for path, x in jax.tree_util.tree_leaves_with_path(shapes):
        keys = tuple(str(k.key) for k in path)
        names = axes(keys, x.shape)
        assert len(names) == len(x.shape)
        spec = tuple(logical_spec(names, x.shape, m))
        if len(x.shape) == 2:
            n_mat += 1
            assert "fsdp" in spec and ("tensor" in spec or "position" in str(names) or names[0] is None), (keys, spec)
    assert n_mat >= 5
    with pytest.raises(KeyError, match="no logical axes"):
        axes(("h_0", "new_thing", "weight"), (4, 4))


# ------------------------------------------------------------------------------------------------ memory plan
def test_plan_llama3_8b_parameter_count_and_bytes():
    """Llama-3-8B (the real hyper-parameters, tests/fixtures/llama3_8b/config.json; no weights): 8,030,261,248
    parameters (Meta's model card: 8.03B), from jax.eval_shape of the family's init; fp32 training on fsdp=8 holds
    1/8 of the parameters, as much gradient and twice that in Adam moments per device."""
    p = plan_for_model(ModelHandle.open(LLAMA3_8B), mesh="fsdp=8", training=True, batch_size=8, seq_len=36, n_devices=8,
                       device_memory_gb=16)
    assert p.n_params == 8_030_261_248
    norms = (2 * 32 + 1) * 4096  # two RMSNorm scales per layer and the final one: replicated, all else split 8 ways
    assert p.parts["parameters"] == ((8_030_261_248 - norms) // 8 + norms) * 4
    assert p.parts["gradients"] == p.parts["parameters"] and p.parts["optimizer"] == 2 * p.parts["parameters"]
    assert p.totals["optimizer"] == 8 * 8_030_261_248
    assert not p.fits and p.largest == "optimizer"
    with pytest.raises(PlanError, match="largest part is optimizer") as e:
        p.check()
    assert "at least 9 devices" in str(e.value)  # 128.5 GB of state / 14.4 GB usable
    s = plan_for_model(ModelHandle.open(LLAMA3_8B), mesh="data=8", training=False, batch_size=16, seq_len=64, n_devices=8,
                       device_memory_gb=16)
    assert not s.fits and s.largest == "parameters" and "--mesh fsdp=8" in s.suggestion  # 32 GB fp32 weights
    b = plan_for_model(ModelHandle.open(LLAMA3_8B), mesh="data=8", training=False, batch_size=16, seq_len=64, n_devices=8,
                       device_memory_gb=24, param_dtype="bf16")
    assert b.parts["parameters"] == 8_030_261_248 * 2 and b.fits  # 16 GB of bf16 weights on a 24 GB device
    assert "DOES NOT FIT" in p.format() and "fits" in b.format()


def test_plan_tensor_split_of_kv_cache_and_activations():
    from tests.sharding_checks import _tiny_configs

    cfg = _tiny_configs()["llama"]
    one = plan_memory(cfg, training=False, batch_size=8, seq_len=16, kv_cache=(8, 32))
    split = plan_memory(cfg, mesh={"data": 2, "tensor": 2}, training=False, batch_size=8, seq_len=16, kv_cache=(8, 32))
    # 2 (k, v) × 2 layers × 8 rows × 32 slots × 2 kv heads × 8 head_dim × 4 bytes
    assert one.parts["kv_cache"] == 2 * 2 * 8 * 32 * 2 * 8 * 4
    assert split.parts["kv_cache"] == one.parts["kv_cache"] // 4
    assert split.parts["activations"] < one.parts["activations"]


def test_debias_dry_run_and_refusal_before_loading(tmp_path, capsys):
    """``rbjax debias --dry-run`` prints the plan of a folder holding only config.json; without --dry-run a plan
    that cannot fit stops with the plan's error (not a missing-weights error: nothing was loaded)."""
    from rbjax.cli import main

    base = ["debias", "--method", "lmd", "--bias", "religion1", "--model", str(LLAMA3_8B), "--out",
            str(tmp_path / "out")]
    # a plan that does not fit: printed, then an error and a non-zero exit (a script can tell)
    assert main(base + ["--mesh", "fsdp=8", "--dry-run", "--device-memory-gb", "16"]) == 1
    cap = capsys.readouterr()
    assert "8.03B parameters" in cap.out and "fsdp=8" in cap.out and "DOES NOT FIT" in cap.out and "optimizer" in cap.out
    assert "largest part is optimizer" in cap.err and "(the plan above)" in cap.err
    assert main(base + ["--device-memory-gb", "16"]) != 0
    err = capsys.readouterr().err
    assert "largest part is optimizer" in err and "weights" not in err.lower().replace("weights'", "")
    assert not (tmp_path / "out").exists()
    assert main(["measure", "--model", str(LLAMA3_8B), "--mesh", "fsdp=8", "--dry-run", "--device-memory-gb",
                 "16"]) == 0
    assert "scoring" in capsys.readouterr().out
    assert main(["measure", "--model", str(LLAMA3_8B), "--mesh", "fsdp=8", "--dry-run", "--device-memory-gb",
                 "4"]) == 1
    cap = capsys.readouterr()
    assert "scoring" in cap.out and "DOES NOT FIT" in cap.out and "largest part is parameters" in cap.err


def test_dry_run_plan_says_what_per_device_and_whole_run_mean(capsys):
    """The plan's columns: one device's bytes, the whole run's (each slice once), and how many devices hold a
    slice, so per device × devices ≈ whole run × devices per slice (data=2,fsdp=4: parameters on 2 devices each)."""
    from rbjax.cli import main
    from rbjax.model.memory import plan_for_model

    assert main(["measure", "--model", str(LLAMA3_8B), "--mesh", "data=2,fsdp=4", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "(8 devices)" in out and "per device" in out and "whole run" in out
    plan = plan_for_model(ModelHandle.open(LLAMA3_8B), mesh="data=2,fsdp=4", training=False, batch_size=16, seq_len=64,
                          n_devices=8)
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("parameters"))
    assert line.split()[1:] == [f"{plan.parts['parameters'] / 1e9:.3f}", "GB", f"{plan.totals['parameters'] / 1e9:.3f}",
                                "GB", "2", "devices", "per", "slice"]
    # (not exactly: small parameters that are not split, the norms, are on every device)
    assert plan.parts["parameters"] * 8 == pytest.approx(plan.totals["parameters"] * 2, rel=1e-3)


# ------------------------------------------------------------------------------------------------ 8 devices
@pytest.fixture(scope="module")
def sharding_checks(tiny_model_dir, tokenizer_dir, redditbias_dir, shared_dir, tmp_path_factory):
    env = simulated_devices_env(8, TF_CPP_MIN_LOG_LEVEL="2")  # no XLA SPMD performance warnings
    work = tmp_path_factory.mktemp("sharding_checks")
    cmd = [sys.executable, str(ROOT / "tests" / "sharding_checks.py"), "--model", str(tiny_model_dir), "--tokenizer",
           str(tokenizer_dir), "--data-dir", str(redditbias_dir), "--work", str(work),
           "--multiwoz", str(shared_dir / "dialog-data" / "multiwoz"),
           "families", "train", "grid", "score", "resume", "generate", "evaluate", "load", "memory", "adapters"]
    p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    assert p.returncode == 0, f"sharding_checks.py failed:\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    return {r.pop("check"): r for r in (json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{"))}


def _assert_trained_close(r, lr):
    assert r["rel_to_movement"] <= MOVEMENT_RTOL, r
    assert r["max_abs"] / lr <= WEIGHT_ATOL_LR, r
    assert r["movement"] > 0.01, r


def test_families_adam_updates_sharded_equal_one_device(sharding_checks):
    """Llama, GPT-NeoX and Gemma 2 (GPT-2: the trainer and scorer tests below): 2 Adam updates on
    data=2,fsdp=2,tensor=2 equal one device; parameters and moments really split (device 0 holds about a quarter of
    the bytes)."""
    r = sharding_checks["families"]
    assert set(r) == {"llama", "gpt_neox", "gemma2"}
    for name, f in r.items():
        assert f["losses_rel"] <= METRICS_RTOL, (name, f)
        _assert_trained_close(f, f["lr"])
        assert "P('fsdp', 'tensor')" in f["specs"] and "P('tensor', 'fsdp')" in f["specs"], (name, f["specs"])
        assert f["adam_mu_specs"] == f["specs"]
        assert f["param_bytes_dev0"] < 0.35 * f["param_bytes"], (name, f)


def test_debias_run_on_fsdp_equals_one_device(sharding_checks):
    """HD (its SVD bias subspace from fsdp-split embeddings) on data=2,fsdp=4: 3 updates equal one device."""
    r = sharding_checks["train"]
    assert r["updates"] == 3 and r["batch_spec"] == "P(None, ('data', 'fsdp'))"
    assert "P('fsdp', None)" in r["param_specs"] and "P('fsdp', None)" in r["adam_specs"]
    assert r["metrics_rel"] <= METRICS_RTOL
    assert r["rel_to_movement"] <= MOVEMENT_RTOL and r["max_abs_over_lr"] <= WEIGHT_ATOL_LR and r["movement"] > 0.01


def test_grid_chunk_on_grid_fsdp_tensor_equals_one_device(sharding_checks):
    r = sharding_checks["grid"]
    assert r["updates"] == 3 and r["n_padded"] == 4
    assert "P('grid', 'fsdp', 'tensor')" in r["param_specs"]
    assert r["metrics_rel"] <= METRICS_RTOL
    assert r["rel_to_movement"] <= MOVEMENT_RTOL and r["max_abs_over_lr"] <= WEIGHT_ATOL_LR and r["movement"] > 0.01


def test_scoring_sharded_equals_one_device_and_bf16_storage(sharding_checks):
    r = sharding_checks["score"]
    for label in ("fsdp=4,tensor=2",):
        assert r[label]["ppl_rel"] <= METRICS_RTOL, r[label]
        assert any("fsdp" in s for s in r[label]["param_specs"])
    bf = r["bf16"]
    assert bf["dtypes"] == ["bfloat16"]
    # bf16 storage is exactly fp32 computation on weights rounded to bf16
    assert bf["vs_rounded_rel"] <= METRICS_RTOL
    assert 0 < bf["log_ppl_max_abs"] < 0.05


def test_checkpoint_written_on_8_devices_resumes_on_4(sharding_checks):
    r = sharding_checks["resume"]
    assert r["restored_max_abs"] == 0.0 and r["restored_devices"] == 4
    assert "P('fsdp', None)" in r["specs8"] or "P(None, 'fsdp')" in r["specs8"]
    assert r["resumed_from"] == 2 and r["updates"] == 3
    _assert_trained_close(r, r["lr"])


def test_greedy_generation_with_sharded_kv_cache(sharding_checks):
    r = sharding_checks["generate"]
    assert r["same_tokens"] and r["n_tokens"] > 0


def test_evaluate_on_a_mesh_equals_the_default_layout(sharding_checks):
    """rbjax evaluate --mesh data=2,fsdp=2,tensor=2: LMP, DST fine-tuning and test pairs, CRG greedy generation give
    the default layout's numbers; the mesh is recorded in each result and is not part of its key."""
    r = sharding_checks["evaluate"]
    assert r["lmp_rel"] <= 1e-5, r
    assert r["dst_updates"] == [2, 2] and r["dst_loss_rel"] <= 1e-5, r
    assert r["dst_prob_abs"] <= 1e-5 and r["dst_same_confusion"], r
    assert r["crg_same_responses"] and r["crg_n"] == 8, r
    assert r["same_keys"], r
    assert all(m == [None, "data=2,fsdp=2,tensor=2"] for m in r["meshes"].values()), r


def test_safetensors_are_read_slice_by_slice_into_the_device_layout(sharding_checks):
    """load_pretrained(mesh=fsdp=4,tensor=2) reads each device's slice of every weight from the file (one file, a
    sharded index, bf16 storage; GPT-2 and an untied Llama, whose Linear weights are transposed slices): the values
    equal the host loader's exactly, every leaf has the family's layout, and no split weight is read whole."""
    r = sharding_checks["load"]
    assert set(r) == {f"{f}_{k}" for f in ("gpt2", "llama") for k in ("one_file", "index", "bf16")}
    for label, x in r.items():
        assert x["max_abs_diff"] == 0.0 and x["same_layout"] and x["all_jax_arrays"], (label, x)
        assert x["host_path_lazy_reads"] == 0, (label, x)  # without a mesh nothing changes
        # each read is one device's slice (devices holding the same slice share a read): no more elements are read
        # than the devices hold, and the only whole reads are of the weights the layout replicates
        assert x["elements_read"] <= x["elements_on_devices"], (label, x)
        assert x["reads"] - x["reads_of_a_slice"] == x["replicated_leaves"] < x["leaves"], (label, x)
    assert r["gpt2_index"]["files"] > 1 and r["llama_index"]["files"] > 1  # really sharded
    assert r["gpt2_one_file"]["files"] == 1


def test_plan_bytes_equal_allocated_arrays(sharding_checks):
    for label, r in sharding_checks["memory"].items():
        assert r["plan_params"] == r["actual_params"], (label, r)
        assert r["plan_optimizer"] == r["actual_optimizer"], (label, r)
        assert r["plan_params"] < r["plan_params_total"] / 3


# ------------------------------------------------------------------------------------------------ HF export
def test_export_writes_sharded_safetensors_with_index(tmp_path):
    """A model over ``max_shard_size`` is exported as several safetensors files and an index (transformers' layout);
    it loads back equal through the one loader; sizes are parsed or refused by name."""
    import numpy as np

    from rbjax.model.hf import load_pretrained, parse_size, save_pretrained
    from tests.sharding_checks import _tiny_configs

    cfg = _tiny_configs()["llama"]
    params = jax.device_get(registry.FAMILIES["llama"].init_params(cfg, 0))
    out = save_pretrained(params, cfg, tmp_path / "m", max_shard_size="40KB")
    idx = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(files) >= 3 and not (out / "model.safetensors").exists()
    assert sorted(set(idx["weight_map"].values())) == files
    assert all(p.stat().st_size <= 40_000 + 4096 for p in out.glob("*.safetensors"))  # + the safetensors header
    assert idx["metadata"]["total_size"] == sum(np.asarray(x).nbytes for x in jax.tree.leaves(params))
    cfg2, back = load_pretrained(out)
    assert cfg2 == cfg
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, b)
    assert (save_pretrained(params, cfg, tmp_path / "one") / "model.safetensors").exists()  # 5 GB default: one file
    assert parse_size("5GB") == 5 * 10**9 and parse_size(1000) == 1000 and parse_size("1.5MB") == 1_500_000
    with pytest.raises(ValueError, match="max_shard_size 'big'"):
        parse_size("big")


def test_study_file_mesh_key(tmp_path, monkeypatch):
    """``[study] mesh`` reaches every training config and is checked when the file is read (file and key named)."""
    from rbjax.study.config import StudyConfig

    ok = StudyConfig({"study": {"mesh": "data=2,fsdp=4"}}, tmp_path / "s.toml")
    assert ok.mesh == "data=2,fsdp=4"
    bad = StudyConfig({"study": {"mesh": "data=2,pipeline=4"}}, tmp_path / "s.toml")
    with pytest.raises(ValueError, match=r"s\.toml: \[study\] mesh .*unknown axis 'pipeline'"):
        bad.validate()
    # the dialog stages run on [study] mesh too; a mesh of their own is refused by name
    own = StudyConfig({"study": {"model": "gpt2"}, "dialog": {"tasks": ["lmp"], "lmp": {"mesh": "fsdp=8"}}},
                      tmp_path / "s.toml")
    with pytest.raises(ValueError, match=r"dialog\.lmp\.mesh: the device mesh of every stage is \[study\] mesh"):
        own.validate()
    from rbjax.study import run as study_run

    seen = []
    monkeypatch.setattr(study_run, "evaluate", lambda task, model, out, **kw: seen.append((task, kw["mesh"])) or {})
    study_run._Study(ok, tmp_path, progress=False)._dialog(tmp_path, tmp_path / "dialog")
    assert seen == [(t, "data=2,fsdp=4") for t in ("lmp", "dst", "crg")]


def test_measure_records_mesh_and_param_dtype(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path):
    """``rbjax measure --mesh --param-dtype`` records both in lmb.json; bf16 storage is part of the resume key (an
    fp32 rerun with --resume scores again instead of reusing the bf16 perplexities)."""
    from rbjax.cli import main

    out = tmp_path / "m"
    base = ["measure", "--model", str(tiny_model_dir), "--bias", "religion1", "--data-dir", str(redditbias_dir),
            "--out", str(out), "--n-bootstrap", "0", "--no-progress", "--resume", "--skip-unscorable"]
    assert main(base + ["--mesh", "data=1", "--param-dtype", "bf16"]) == 0
    rec = json.loads((out / "lmb.json").read_text())[0]
    assert rec["settings"]["param_dtype"] == "bf16" and rec["settings"]["mesh"] == "grid=1,data=1,fsdp=1,tensor=1"
    t_bf16 = rec["t_value"]
    assert main(base + ["--overwrite"]) == 0  # another run's results in --out: replaced only when asked
    rec = json.loads((out / "lmb.json").read_text())[0]
    assert rec["settings"]["param_dtype"] == "fp32" and rec["settings"]["mesh"] is None
    assert rec["t_value"] != t_bf16  # scored again with fp32 weights, not relabelled
    assert main(base + ["--overwrite", "--mesh", "data=2"]) != 0  # 2 devices named, 1 here


def test_two_process_fsdp_debias_equals_one_process(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path):
    """Two processes × 2 simulated CPU devices joined by ``jax.distributed`` (``RBJAX_DISTRIBUTED=1``, coordinator
    on localhost) train one run with ``--mesh fsdp=4``: every weight split over both processes' devices. The
    per-update losses (written once, by process 0) equal a one-process run on one device.

    In the default suite (about 12 s): a program over the split weights that one process runs and the other does
    not (the finiteness check compiled before the first update once ran on process 0 only) hangs both processes
    at the collective; gloo gives up after 30 s and the run fails."""
    from rbjax.cli import main
    from tests.conftest import religion1_train_file
    from tests.test_mesh import _free_port

    train = religion1_train_file(redditbias_dir, tmp_path, 16)

    def argv(out):
        return ["debias", "--method", "lmd", "--bias", "religion1", "--model", str(tiny_model_dir), "--tokenizer",
                str(tokenizer_dir), "--data-dir", str(redditbias_dir), "--out", str(out), "--train-file", str(train),
                "--max-steps", "2", "--batch-size", "4", "--no-export", "--no-eval", "--no-lmp", "--no-progress"]

    port = _free_port()
    procs = []
    for i in range(2):
        env = simulated_devices_env(2, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
                                    JAX_PROCESS_ID=str(i), RBJAX_DISTRIBUTED="1", TF_CPP_MIN_LOG_LEVEL="2")
        procs.append(subprocess.Popen([sys.executable, "-m", "rbjax.cli", *argv(tmp_path / "mh"), "--mesh", "fsdp=4"],
                                      env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    deadline = time.monotonic() + 300  # the run takes about 12 s; a hung collective holds both for 5 min or more
    for p in procs:
        try:
            outs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            tails = "\n".join(f"--- process {i}:\n{q.communicate()[0][-2000:]}" for i, q in enumerate(procs))
            pytest.fail(f"the two processes did not finish in 300 s (a collective that one process never reached?)\n"
                        f"{tails}")
    for p, o in zip(procs, outs):
        assert p.returncode == 0, o[-4000:]
    multi = [json.loads(x) for x in (tmp_path / "mh" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in multi] == [1, 2]  # written once
    assert json.loads((tmp_path / "mh" / "config.json").read_text())["config"]["mesh"] == "fsdp=4"
    assert main(argv(tmp_path / "one")) == 0
    one = [json.loads(x) for x in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    for a, b in zip(multi, one):
        for k in ("lm_loss", "debias_loss", "total", "grad_norm"):
            assert a[k] == pytest.approx(b[k], rel=METRICS_RTOL), (k, a, b)


def test_adapters_on_a_mesh_equal_one_device_and_their_plan(sharding_checks):
    """Low-rank adapters: an HD run with the frozen base split over data=2,fsdp=2,tensor=2 and a 4-point adapter
    chunk on grid=2,fsdp=2,tensor=2 equal one device; the base is split and never stacked (one base for the chunk),
    the adapters split only by fsdp; the plan's per-device bytes are what device 0 holds (the adapters' scale
    scalars aside: 4 bytes a module)."""
    r, g = sharding_checks["adapters"]["run"], sharding_checks["adapters"]["grid"]
    assert "P('fsdp', 'tensor')" in r["frozen_specs"] and "P('tensor', 'fsdp')" in r["frozen_specs"]
    assert all("tensor" not in s for s in r["adapter_specs"])
    for x in (r, g):
        assert x["updates"] == 3 and x["metrics_rel"] <= METRICS_RTOL, x
        assert x["rel_to_movement"] <= MOVEMENT_RTOL and x["max_abs_over_lr"] <= WEIGHT_ATOL_LR, x
        assert x["movement"] > 0.01, x
    assert g["frozen_unstacked"] and all(s.startswith("P('grid'") for s in g["adapter_specs"])
    assert 0 <= r["actual_params"] - r["plan_params"] <= 4 * 8  # 8 adapted modules' scale
    assert r["actual_optimizer"] == r["plan_optimizer"]
