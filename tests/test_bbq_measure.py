"""``rbjax measure --benchmark bbq``: the files it writes, --resume, and a bad file refused with its row before
anything in --out is touched."""
import json

import pytest

from rbjax.cli import main
from rbjax.lmb.bbq import CSV_HEADER, read_bbq_csv


@pytest.fixture()
def small(bbq_dir, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for c in ("Religion", "Age"):
        rows = (bbq_dir / f"{c}.jsonl").read_text(encoding="utf-8").splitlines()[:8]
        (data / f"{c}.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return data


def _measure(model, data, out, *extra):
    return main(["measure", "--model", str(model), "--benchmark", "bbq", "--data-dir", str(data), "--out", str(out),
                 "--n-bootstrap", "50", "--no-progress", *extra])


def test_measure_writes_resumes_and_refuses_a_bad_file(tiny_model_dir, small, tmp_path, capsys):
    out = tmp_path / "out"
    assert _measure(tiny_model_dir, small, out) == 0
    text = capsys.readouterr().out
    assert "lm_eval" in text and "paper" in text and "overall" in text
    s = json.loads((out / "benchmark.json").read_text())
    assert s["categories"] == ["Age", "Religion"] and s["n_rows"] == 16
    assert s["paper"]["overall"]["n_rows"] == 16 and s["lm_eval"]["categories"]["Age"]["n_rows"] == 8
    assert s["data"]["Age"]["verified_upstream"] is False  # a local subset, not the upstream file
    ids, ll = read_bbq_csv(out / "Age_bbq.csv")
    assert ll.shape == (8, 13) and (out / "Age_bbq.csv").read_text().splitlines()[0] == ",".join(CSV_HEADER)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    # --resume reuses the rows: the same files
    assert _measure(tiny_model_dir, small, out, "--resume") == 0
    assert "reusing the scored rows of Age, Religion" in capsys.readouterr().err
    assert read_bbq_csv(out / "Age_bbq.csv")[1].tolist() == ll.tolist()
    # a bad row: refused with file and line, nothing in --out touched
    lines = (small / "Religion.jsonl").read_text().splitlines()
    bad = json.loads(lines[3])
    bad["label"] = 5
    lines[3] = json.dumps(bad)
    (small / "Religion.jsonl").write_text("\n".join(lines) + "\n")
    assert _measure(tiny_model_dir, small, out, "--resume") != 0
    assert "Religion.jsonl line 4 (example_id 3): label 5 out of range" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_compare_two_bbq_runs(tiny_model_dir, small, tmp_path, capsys):
    """McNemar on per-row correctness and paired-bootstrap changes of the bias scores, per category; a run against
    itself changes nothing."""
    from tests.conftest import make_rbjax_gpt2_folder

    other = make_rbjax_gpt2_folder(tmp_path / "other", seed=5, tokenizer_dir=tiny_model_dir)
    a, b = tmp_path / "a", tmp_path / "b"
    assert _measure(tiny_model_dir, small, a) == 0 and _measure(other, small, b) == 0
    assert main(["compare", str(a), str(a), "--out", str(tmp_path / "same"), "--n-bootstrap", "200"]) == 0
    same = json.loads((tmp_path / "same" / "compare_bbq.json").read_text())
    for blk in same["categories"].values():
        for cv in ("lm_eval", "paper"):
            assert blk[cv]["mcnemar"]["p_value"] is None and blk[cv]["acc"]["change"] == 0
            assert blk[cv]["acc"]["change_ci"] == [0.0, 0.0]
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "ab"), "--n-bootstrap", "200"]) == 0
    res = json.loads((tmp_path / "ab" / "compare_bbq.json").read_text())
    sa, sb = (json.loads((x / "benchmark.json").read_text()) for x in (a, b))
    for c, blk in res["categories"].items():
        for cv in ("lm_eval", "paper"):
            for m in ("acc", "disamb_bias_score"):
                va, vb = sa[cv]["categories"][c][m], sb[cv]["categories"][c][m]
                assert blk[cv][m]["a"] == va and blk[cv][m]["b"] == vb
            assert blk[cv]["mcnemar"]["n_tests"] == 2
    assert "BBQ: A − B" in capsys.readouterr().out
