"""Device meshes: the mesh shapes :func:`rbjax.core.mesh.grid_mesh` picks, and training on 8 simulated
CPU devices equal to training on one.

The multi-device checks run in a subprocess (``tests/mesh_checks.py``) started with
``XLA_FLAGS=--xla_force_host_platform_device_count=8``: JAX reads the flag once, when its CPU backend starts, and
this pytest process has already started it with one device.

Tolerances. Sharding changes the order of float32 sums (a micro-batch's gradient becomes a sum of per-device
partial gradients, all-reduced), so results agree to rounding, not bit for bit:

* per-update losses and gradient norms: relative difference ≤ :data:`METRICS_RTOL` (3e-5; seen: the LM loss ≤ 3e-7,
  gradient norms ≤ 2e-6, the debiasing loss and the total ≤ 1.3e-5: a sum of terms that nearly cancel, whose
  relative rounding depends on the dropout masks' draw — 7.6e-6 with the earlier Philox masks, 1.2e-5 with
  today's; the masks themselves are equal on the mesh and on one device);
* parameters: ‖Δ‖₂ over all weights ≤ :data:`MOVEMENT_RTOL` (1e-3; seen: ≤ 8e-5) of how far training moved them,
  and every single weight within :data:`WEIGHT_ATOL_LR` (0.25; seen: ≤ 0.17) of one update's size ``lr``. Adam
  divides each gradient entry by its own running RMS, so an entry whose gradients nearly cancel between two updates
  turns a rounding difference into a visible fraction of a step; a quarter step stays far below what separates two
  grid points here (several steps).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rbjax.core.mesh import grid_mesh, padded_points
from tests.conftest import simulated_devices_env

ROOT = Path(__file__).resolve().parents[1]

METRICS_RTOL = 3e-5
MOVEMENT_RTOL = 1e-3
WEIGHT_ATOL_LR = 0.25


class FakeDevice:
    """Enough of a jax Device for :class:`jax.sharding.Mesh` to hold it (grid_mesh only arranges devices)."""

    def __init__(self, i: int):
        self.id = i
        self.platform = "cpu"
        self.process_index = 0

    def __repr__(self):
        return f"dev{self.id}"


def _devs(n):
    return [FakeDevice(i) for i in range(n)]


@pytest.mark.parametrize("n_dev,n_points,batch,expect", [
    (8, 1, 8, (1, 8)),    # one run: all devices split its batch
    (8, 6, 4, (4, 2)),    # the paper's 6 λ points at batch 4: 4 × 2, padded to 8 points
    (8, 54, 4, (8, 1)),   # many points: one per device row, no data split needed
    (8, 3, 16, (2, 4)),   # ties go to the grid axis (no communication between points)
    (8, 1, 3, (1, 1)),    # a batch of 3 splits over no power of two: one device (visible in mesh.devices)
    (8, 2, 1, (2, 1)),    # batch 1 cannot be split: the grid axis only
    (6, 6, 4, (6, 1)),
    (1, 54, 16, (1, 1)),
])
def test_grid_mesh_shapes(n_dev, n_points, batch, expect):
    devs = _devs(n_dev)
    m = grid_mesh(n_points, batch, devs)
    assert m.axis_names == ("grid", "data")
    assert (m.shape["grid"], m.shape["data"]) == expect
    g, d = expect
    assert m.devices.flatten().tolist() == devs[:g * d]  # in the given order: data neighbours are device neighbours
    assert padded_points(n_points, m) % g == 0 and n_points <= padded_points(n_points, m) < n_points + g


@pytest.mark.parametrize("n_dev", [1, 2, 4, 6, 8, 16])
def test_grid_mesh_uses_as_many_devices_as_any_valid_shape(n_dev):
    """Against a brute force over every (g, d) with g dividing the device count, g ≤ points, d dividing the batch
    and g·d ≤ devices: no valid shape uses more devices; the chosen one is valid; among equals, the most grid."""
    devs = _devs(n_dev)
    for n_points in (1, 2, 3, 5, 6, 9, 54):
        for batch in (1, 2, 3, 4, 8, 16):
            m = grid_mesh(n_points, batch, devs)
            g, d = m.shape["grid"], m.shape["data"]
            assert n_dev % g == 0 and g <= n_points and batch % d == 0 and g * d <= n_dev, (n_points, batch, g, d)
            valid = [(gg, dd) for gg in range(1, n_dev + 1) for dd in range(1, n_dev + 1)
                     if n_dev % gg == 0 and gg <= n_points and batch % dd == 0 and gg * dd <= n_dev
                     and (n_dev // gg) % dd == 0]
            best = max(gg * dd for gg, dd in valid)
            assert g * d == best, (n_points, batch, g, d, best)
            assert g == max(gg for gg, dd in valid if gg * dd == best)


@pytest.fixture(scope="module")
def mesh_checks(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path_factory):
    """The 8-device checks of tests/mesh_checks.py, run once in one subprocess (JSON per check)."""
    env = simulated_devices_env(8)
    work = tmp_path_factory.mktemp("mesh_checks")
    cmd = [sys.executable, str(ROOT / "tests" / "mesh_checks.py"), "--model", str(tiny_model_dir), "--tokenizer",
           str(tokenizer_dir), "--data-dir", str(redditbias_dir), "--work", str(work),
           "data_parallel", "grid_chunk", "sweep_compiles", "scorer_ahead", "dropout_masks", "self_debias"]
    p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, f"mesh_checks.py failed:\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    out = {}
    for ln in p.stdout.splitlines():
        if ln.startswith("{"):
            r = json.loads(ln)
            out[r["check"]] = r
    return out


def test_scorer_programs_compiled_ahead_on_8_devices(mesh_checks):
    """The scorer's programs compiled from the parameters' shapes alone, with the rows split over 8 devices, are the
    ones a scorer of the real parameters runs: scoring then builds none."""
    r = mesh_checks["scorer_ahead"]
    assert r["n_devices"] == 8 and r["programs"] >= 1 and r["built_ahead"] >= r["programs"]
    assert r["used"] == r["planned"] and r["built_scoring"] == 0


def test_self_debias_scoring_on_8_devices_and_split_parameters(mesh_checks):
    """Self-Debias pair scoring (2 prefixes) with the rows split over 8 devices — its programs compiled ahead from
    the parameters' shapes, none built while scoring — and with the parameters split on data=2,fsdp=2,tensor=2:
    equal to one device to float32 rounding (seen ~2e-8), far below the rescaling's own effect (seen 7.6e-4)."""
    r = mesh_checks["self_debias"]
    assert r["n_devices"] == 8 and r["programs"] >= 1 and r["built_ahead"] >= r["programs"], r
    assert r["used"] == r["planned"] and r["built_scoring"] == 0, r
    assert r["rows_rel"] <= 1e-6 and r["split_rel"] <= 1e-6, r
    assert r["vs_plain_rel"] > 1e-4 and r["scored"] > 100, r
    assert "P('tensor', 'fsdp')" in r["param_specs"], r


def test_dropout_masks_equal_on_the_mesh_and_on_one_device(mesh_checks):
    """A dropout mask whose rows are split over ``data`` (and vmapped over ``grid`` points sharing the key) is the
    one-device mask element for element: what lets the mesh runs below agree with one device to rounding."""
    r = mesh_checks["dropout_masks"]
    assert r["rows_equal"] and r["points_equal"], r
    assert 0.85 < r["kept"] < 0.95, r


def _assert_close(r):
    assert r["metrics_rel"] <= METRICS_RTOL, r
    assert r["rel_to_movement"] <= MOVEMENT_RTOL, r
    assert r["max_abs_over_lr"] <= WEIGHT_ATOL_LR, r
    assert r["movement"] > 0.01, r  # training moved the weights: the comparison is not of two untouched models


def test_data_parallel_step_equals_one_device(mesh_checks):
    """One run (batch 8, accumulation 2, dropout on, 3 updates) on a 1 × 8 mesh: each micro-batch's rows on 8
    devices (gradients all-reduced by XLA), parameters replicated; equal to the same run on one device."""
    r = mesh_checks["data_parallel"]
    assert r["mesh"] == {"grid": 1, "data": 8}
    assert r["batch_spec"] == "P(None, 'data')" and r["batch_devices"] == 8
    assert r["batch_shape"] == [2, 8, 36] and r["batch_shard_shape"] == [2, 1, 36]  # one row per device
    assert r["param_specs"] == ["P()"]
    assert r["ids_spec_data4"] == "P(None, 'data')" and r["rng_spec_data4"] == "P()"  # dropout keys stay whole
    assert r["updates"] == 3
    _assert_close(r)


def test_grid_chunk_on_grid_by_data_mesh_equals_one_device(mesh_checks):
    """A chunk of 6 grid points (batch 4, different λ and learning rates) on the mesh grid_mesh picks for 8 devices
    (4 grid × 2 data, padded to 8 points), state split over the grid axis; equal to the chunk on one device."""
    r = mesh_checks["grid_chunk"]
    assert r["mesh"] == {"grid": 4, "data": 2} and r["n_padded"] == 8 and r["n_points"] == 6
    assert r["param_specs"] == ["P('grid',)"]
    assert r["updates"] == 3
    _assert_close(r)
    # the points really differ, by far more than the tolerance: a mix-up of points would be caught
    assert r["closest_points_max_abs"] > 4 * WEIGHT_ATOL_LR * 5e-4


def test_sweep_compiles_one_program_per_batch_plan_on_8_devices(mesh_checks):
    """A sweep of 2 batch plans × 4 λ points in chunks of 2 (4 chunks) on all 8 devices: 2 training programs."""
    r = mesh_checks["sweep_compiles"]
    assert r["n_devices"] == 8 and r["n_runs"] == 8 and len(r["chunks"]) == 4
    assert r["programs"] == r["batch_plans"] == 2
    assert r["meshes"] == ["{'grid': 2, 'data': 2}", "{'grid': 2, 'data': 4}"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_process_sweep_equals_one_process(tiny_model_dir, tokenizer_dir, redditbias_dir, tmp_path):
    """Multi-host on one machine: two processes (2 simulated CPU devices each) join with ``rbjax sweep
    --distributed`` (jax.distributed.initialize, coordinator on localhost); the chunk of 4 grid points is split over
    the 4 devices of both processes (grid axis across hosts). The records equal a one-process run's, and only one
    process appended them (no duplicate lines)."""
    from rbjax.cli import main
    from tests.conftest import religion1_train_file

    train = religion1_train_file(redditbias_dir, tmp_path, 16)

    def argv(out):
        return ["sweep", "--method", "lmd", "--bias", "religion1", "--model", str(tiny_model_dir), "--tokenizer",
                str(tokenizer_dir), "--data-dir", str(redditbias_dir), "--out", str(out), "--train-file", str(train),
                "--max-steps", "2", "--batch-sizes", "4", "--grad-accums", "1", "--lambda-lms", "0.01",
                "--lambda-ds", "10,20,50,100", "--grid-chunk", "4", "--n-bootstrap", "0", "--dev-max-pairs", "6",
                "--no-lmp", "--no-progress"]

    port = _free_port()
    procs = []
    for i in range(2):
        env = simulated_devices_env(2, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
                                    JAX_PROCESS_ID=str(i))
        procs.append(subprocess.Popen([sys.executable, "-m", "rbjax.cli", *argv(tmp_path / "mh"), "--distributed"],
                                      env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=600)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for i, (p, o) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, o[-4000:]
        assert f"process {i} of 2 of a distributed job: 4 devices in all, 2 here" in o
    multi = [json.loads(x) for x in (tmp_path / "mh" / "sweep.jsonl").read_text().splitlines()]
    assert len(multi) == 4 and len({r["id"] for r in multi}) == 4  # appended once, by process 0
    metrics = (tmp_path / "mh" / "chunks").glob("*/metrics.jsonl")
    assert [len(m.read_text().splitlines()) for m in metrics] == [2 * 4]  # 2 updates × 4 points, written once
    assert main(argv(tmp_path / "one")) == 0  # the same sweep in this process, on one device
    one = {r["id"]: r for r in (json.loads(x) for x in (tmp_path / "one" / "sweep.jsonl").read_text().splitlines())}
    for r in multi:
        o = one[r["id"]]
        assert r["updates"] == o["updates"] == 2
        for k in ("lm_loss", "debias_loss", "total", "grad_norm"):
            assert r["last"][k] == pytest.approx(o["last"][k], rel=METRICS_RTOL)
        assert r["dev"]["t_value"] == pytest.approx(o["dev"]["t_value"], rel=1e-4, abs=1e-4)
