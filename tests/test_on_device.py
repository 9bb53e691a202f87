"""The prepared GPU script (benchmarks/on_device.sh → benchmarks/on_device.py) parses and dry-runs on the CPU:
tiny shapes, every section (parity against transformers, LMB scoring, one HD update, one LoRA update against
PyTorch/PEFT), one JSON written. Its figures on a GPU are recorded in benchmarks/RESULTS.md when a session has one."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("torch")
pytest.importorskip("peft")


def test_on_device_script_dry_runs_on_cpu(tmp_path, shared_dir):
    script = ROOT / "benchmarks" / "on_device.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    out = tmp_path / "on_device.json"
    env = {**os.environ, "PYTHON": sys.executable, "RBJAX_SHARED": str(shared_dir)}
    r = subprocess.run(["bash", str(script), "--dry-run", "--out", str(out)], env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "would install with:" in r.stderr and "jax[cuda12]==" in r.stderr  # the install step, not run
    res = json.loads(out.read_text())
    assert res["dry_run"] and res["torch_device"] == "cpu"
    assert [p["model_type"] for p in res["parity"]] == ["gpt2", "llama"]
    for p in res["parity"]:  # the same function on the same weights, in two frameworks
        assert p["relative"] < 1e-4
    assert res["scoring"]["max_abs_mean_nll_diff"] < 1e-4
    # each ratio kept, or set aside as void when the host had foreign CPU load (the suite runs beside other jobs)
    load = {s["name"]: s for s in res["load"]["sections"]}
    for k in ("scoring", "debias_update", "lora_update"):
        assert len(res[k]["times_s"]["rbjax"]) == len(res[k]["times_s"]["torch"]) > 0
        key = "void_ratio" if load[k]["void"] else "ratio"
        assert res[k][key] > 0 and ({"ratio", "void_ratio"} - {key}).isdisjoint(res[k])
        assert (res.get("void_ratios", {}) if load[k]["void"] else res["ratios"])[k] == res[k][key]
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(last["ratios"]) | set(last.get("void_ratios", {})) == {"scoring", "debias_update", "lora_update"}
    assert last["load"] == res["load"]
