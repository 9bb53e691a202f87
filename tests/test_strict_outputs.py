"""Field failures: a non-finite loss with a finite gradient is skipped and counted (it was applied), and
every file rbjax writes is strict JSON (a skipped update wrote bare ``NaN`` into ``metrics.jsonl``)."""
import json
import math
from pathlib import Path

import jax
import numpy as np
import pytest

from rbjax.core.io import to_json

from tests.conftest import small_train_config

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")


def _strict(text: str, where: str):
    def refuse(c):
        raise ValueError(f"{where}: non-standard JSON constant {c}")

    return json.loads(text, parse_constant=refuse)


def strict_json_files(folder: Path) -> int:
    """Parse every ``*.json`` / ``*.jsonl`` file under ``folder`` refusing NaN/Infinity; returns how many."""
    n = 0
    for p in sorted(folder.rglob("*")):
        if p.suffix == ".json":
            _strict(p.read_text(encoding="utf-8"), str(p))
        elif p.suffix == ".jsonl":
            for i, ln in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
                _strict(ln, f"{p}:{i}")
        else:
            continue
        n += 1
    return n


def test_to_json_writes_non_finite_numbers_as_null():
    text = to_json({"a": float("nan"), "b": [float("inf"), -float("inf"), 1.5], "c": np.float32("nan"),
                    "d": np.array([1.0, np.nan]), "e": Path("x")})
    assert _strict(text, "to_json") == {"a": None, "b": [None, None, 1.5], "c": None, "d": [1.0, None], "e": "x"}


def test_nan_loss_with_finite_gradient_is_skipped_and_every_file_is_strict_json(tiny_model_dir, tokenizer_dir,
                                                                                 redditbias_dir, tmp_path):
    """λ_D = NaN on phrases that trigger no debiasing term (LMD, paper semantics): total = λ_LM·L_LM + NaN·0 = NaN
    while the gradient (the LM term's; the masked debias term contributes exact zeros) is finite. The update used to be
    applied and not counted; now it is skipped and counted, the model is exported unchanged, and every JSON/JSONL
    file of the run (config, metrics, results, LMB, checkpoints' metadata) parses as strict JSON."""
    from rbjax.debias.run import debias
    from rbjax.model.hf import load_pretrained

    # one phrase with a religion1 target term (the run is refused without any), 15 without: one epoch of 4 updates
    # of 4 phrases, three of which have no debiasing term
    plain = tmp_path / "plain.txt"
    plain.write_text("the jews are so greedy\n" + "the weather is nice today\nwe walked to the park after lunch\n" * 7
                     + "see you tomorrow\n", encoding="utf-8")
    out = tmp_path / "run"
    cfg = small_train_config(tiny_model_dir, tokenizer_dir, redditbias_dir, out, method="lmd", train_file=str(plain),
                             max_steps=4, dropout=False, export=True, evaluate=True, eval_bias="religion1", lmp=True,
                             lmp_max_lines=4)
    with pytest.raises(ValueError, match="lambda_d must be a finite number, got nan"):
        cfg.replace(lambda_d=float("nan"))  # the config refuses it (the CLI: --lambda-d) ...
    object.__setattr__(cfg.debias, "lambda_d", float("nan"))  # ... so plant it past validation, to reach the step's guard
    res = debias(cfg)
    lines = [_strict(ln, "metrics.jsonl") for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3, 4]
    for r in lines:
        assert r["skipped"] is True and r["total"] is None  # NaN written as null
        assert math.isfinite(r["lm_loss"])
    no_term = [r for r in lines if r["debias_loss"] == 0.0]
    assert len(no_term) == 3
    for r in no_term:  # the field failure: a finite gradient under a NaN total (applied before, not counted)
        assert math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0
    assert res["training"]["skipped_updates"] in (4, [4])
    _, start = load_pretrained(tiny_model_dir)
    _, end = load_pretrained(out / "model")
    for a, b in zip(jax.tree.leaves(start), jax.tree.leaves(end)):
        assert np.array_equal(np.asarray(a), np.asarray(b))  # no update reached the parameters
    assert strict_json_files(out) >= 4  # config.json, metrics.jsonl, results.json, lmb_valid/*.json, ...
