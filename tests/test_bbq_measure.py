"""``rbjax measure --benchmark bbq``: the files it writes, --resume, and a bad file refused with its row before
anything in --out is touched."""
import json

import pytest

from rbjax.cli import main
from rbjax.lmb.bbq import CSV_HEADER, read_bbq_csv
from rbjax.lmb.bbq_compare import movement_words, score_movement


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


def test_compare_two_bbq_runs(tiny_model_dir, small, tmp_path, capsys, monkeypatch):
    """McNemar on per-row correctness and paired-bootstrap changes of the bias scores, per category; a run against
    itself changes nothing; each side's score is printed beside the change with how it moved relative to zero; the
    runs' own bootstrap settings are the default; what a BBQ comparison cannot honour is refused."""
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
            p = blk[cv]["mcnemar"]["p_bonferroni"]
            assert blk[cv]["mcnemar"]["significant"] == (p is not None and p < 0.05)
            for m in ("amb_bias_score", "disamb_bias_score"):
                assert blk[cv][m]["movement"] == score_movement(blk[cv][m]["a"], blk[cv][m]["b"])
    text = capsys.readouterr().out
    # each side's score beside the change, and how each bias score moved relative to zero
    assert "BBQ: A (A) vs B (B)" in text
    for c, blk in res["categories"].items():
        d = blk["lm_eval"]["disamb_bias_score"]
        line = next(x for x in text.splitlines() if x.startswith(f"{c} (lm_eval): "))
        assert f"s_DIS {d['b']:+.3f} → {d['a']:+.3f}: {movement_words(d['movement'])}" in line
    # the runs' own bootstrap and alpha when none is given (both measured with --n-bootstrap 50)
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "own")]) == 0
    own = json.loads((tmp_path / "own" / "compare_bbq.json").read_text())
    assert own["settings"]["n_bootstrap"] == 50 and own["settings"]["alpha"] == 0.05
    # refused, not ignored: seeds on a side, a BBQ run against a pair run, a setting BBQ does not take
    capsys.readouterr()
    assert main(["compare", f"{a},{b}", str(b), "--out", str(tmp_path / "x")]) != 0
    assert "a BBQ comparison takes one run on each side" in capsys.readouterr().err
    (tmp_path / "pairs").mkdir()
    assert main(["compare", str(a), str(tmp_path / "pairs"), "--out", str(tmp_path / "x")]) != 0
    assert "is a BBQ run but" in capsys.readouterr().err
    import rbjax.commands.compare as cmd

    monkeypatch.setattr(cmd, "BBQ_FIELDS", tuple(f for f in cmd.BBQ_FIELDS if f != "seed"))
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "x"), "--seed", "3"]) != 0
    assert "--seed does not apply to a comparison of two BBQ runs" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("a, b, kind, words", [
    (0.1, 0.3, "toward zero", "toward zero (|s| down, still stereotype-following)"),
    (-0.1, -0.3, "toward zero", "toward zero (|s| down, still counter-stereotypical)"),
    (0.0, 0.3, "toward zero", "toward zero (|s| down to 0)"),
    (-0.2, 0.3, "past zero", "past zero (stereotype-following → counter-stereotypical)"),
    (0.4, 0.3, "away from zero", "away from zero (|s| up, stereotype-following)"),
    (-0.4, 0.0, "away from zero", "away from zero (from 0 to counter-stereotypical)"),
    (0.3, 0.3, "unchanged", "unchanged")])
def test_score_movement(a, b, kind, words):
    """How a bias score moved from B to A relative to zero (s > 0: the answers follow the stereotype)."""
    mv = score_movement(a, b)
    assert mv["kind"] == kind and movement_words(mv) == words
    assert mv["abs_change"] == pytest.approx(abs(a) - abs(b))
    assert score_movement(None, 0.1) is None and movement_words(None).startswith("n/a")
