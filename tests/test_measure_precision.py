"""`rbjax measure --precision bf16` works end to end and records its precision; fp32 stays the default."""
import json

import pytest

from rbjax.cli import main
from rbjax.lmb.measure import measure_bias


def test_measure_precision_is_recorded(tiny_model_dir, redditbias_dir, tmp_path, capsys):
    out16 = tmp_path / "bf16"
    rc = main(["measure", "--model", str(tiny_model_dir), "--bias", "religion1", "--data-dir", str(redditbias_dir),
               "--out", str(out16), "--no-progress", "--n-bootstrap", "0", "--precision", "bf16"])
    assert rc == 0
    r16 = json.loads((out16 / "lmb.json").read_text())[0]
    assert r16["settings"]["precision"] == "bf16"
    r32 = measure_bias(tiny_model_dir, "religion1", data_dir=redditbias_dir, n_bootstrap=0, progress=False)[0]
    assert r32["settings"]["precision"] == "fp32"
    # same model, same pairs: bf16 moves the t-value only slightly (docs/lmb.md)
    assert r16["n_pairs"] == r32["n_pairs"] == 238
    assert r16["t_value"] == pytest.approx(r32["t_value"], abs=0.05)
    stored = measure_bias(None, "religion1", data_dir=redditbias_dir, stored_perplexities=True, n_bootstrap=0,
                          progress=False, plot=False)[0]
    assert stored["settings"]["precision"] is None
    with pytest.raises(ValueError, match="precision"):
        measure_bias(tiny_model_dir, "religion1", data_dir=redditbias_dir, precision="fp16")
