"""`rbjax compare`: the paired change of the bias effect between two measured models, checked against scipy on hand
data and on two real `rbjax measure` folders (values recomputed from their CSVs), and the refusal of runs whose pairs
differ (split, outlier handling, BOS, tokenizer, pair phrases), each with its reason."""
import csv
import json
import math
import shutil

import numpy as np
import pytest
from scipy import stats as sps

from rbjax.cli import main
from rbjax.lmb.compare import MismatchError, compare_models, paired_change
from tests.conftest import make_rbjax_gpt2_folder

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")


def test_paired_change_equals_scipy_on_hand_data():
    ea = np.array([-0.30, 0.12, -0.05, 0.40, 0.22, -0.18, 0.09, 0.31, -0.02, 0.15])
    eb = np.array([-0.45, -0.20, -0.10, 0.05, 0.30, -0.40, -0.15, 0.10, -0.08, -0.33])
    r = paired_change(ea, eb, alpha=0.05, n_bootstrap=500, seed=1)
    d = ea - eb
    t = sps.ttest_rel(ea, eb)
    w = sps.wilcoxon(d)
    assert r["n_pairs"] == 10
    assert r["mean_change"] == pytest.approx(d.mean(), rel=1e-12)
    assert r["ttest"]["t_value"] == pytest.approx(t.statistic, rel=1e-10)
    assert r["ttest"]["p_value"] == pytest.approx(t.pvalue, rel=1e-10)
    assert r["wilcoxon"]["statistic"] == pytest.approx(w.statistic) and r["wilcoxon"]["p_value"] == pytest.approx(w.pvalue)
    # by hand: the sign of the effect flips from − (B) to + (A) in pairs 2, 7 and 10; none from + to −
    assert r["sign_flip"]["n_flipped"] == 3 and r["sign_flip"]["share"] == 0.3
    assert r["sign_flip"]["to_anti_stereotypical"] == 3 and r["sign_flip"]["to_stereotypical"] == 0
    boot = sps.bootstrap((d,), np.mean, confidence_level=0.95, n_resamples=500, method="BCa",
                         random_state=np.random.default_rng(1)).confidence_interval
    assert r["mean_change_ci"] == pytest.approx([boot.low, boot.high])
    one = sps.ttest_1samp(ea, 0.0)
    assert r["effect_a"]["t_value"] == pytest.approx(one.statistic) and r["effect_a"]["p_value"] == pytest.approx(one.pvalue)


def test_no_change_is_undefined_not_significant():
    e = np.array([-0.3, 0.1, 0.2, -0.05])
    r = paired_change(e, e.copy(), n_bootstrap=0)
    assert r["ttest"]["t_value"] is None and r["wilcoxon"]["status"].startswith("undefined")
    assert r["mean_change_ci"] is None and r["sign_flip"]["share"] == 0.0


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, tiny_model_dir, tokenizer_dir, redditbias_dir):
    """religion1 and race (test split) measured under two seeded random tiny GPT-2s."""
    from rbjax.lmb.measure import measure_bias

    root = tmp_path_factory.mktemp("cmp")
    other = make_rbjax_gpt2_folder(root / "other_model", seed=7, tokenizer_dir=tokenizer_dir)
    kw = dict(bias_types="religion1,race", data_dir=redditbias_dir, n_bootstrap=200, progress=False, plot=False)
    measure_bias(model=other, out_dir=root / "a", **kw)
    measure_bias(model=tiny_model_dir, out_dir=root / "b", **kw)
    return root


def _effects(folder, bias_type):
    with open(folder / f"{bias_type}_perplexities.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    e = np.array([math.log(float(r["biased_ppl"])) - math.log(float(r["counterfactual_ppl"])) for r in rows])
    return e, np.array([r["outlier"] == "false" for r in rows])


def test_compare_two_measured_models_equals_scipy_on_their_csvs(two_runs, capsys):
    out = two_runs / "cmp"
    assert main(["compare", str(two_runs / "a"), str(two_runs / "b"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    res = json.loads((out / "compare.json").read_text())
    assert [r["bias_type"] for r in res["types"]] == ["religion1", "race"]
    ps = []
    for r in res["types"]:
        ea, ka = _effects(two_runs / "a", r["bias_type"])
        eb, kb = _effects(two_runs / "b", r["bias_type"])
        keep = ka & kb
        t = sps.ttest_rel(ea[keep], eb[keep])
        w = sps.wilcoxon(ea[keep] - eb[keep])
        assert r["n_pairs"] == int(keep.sum()) and r["n_pairs_dropped"] == len(keep) - int(keep.sum())
        assert r["mean_change"] == pytest.approx(np.mean(ea[keep] - eb[keep]), rel=1e-9)
        assert r["ttest"]["t_value"] == pytest.approx(t.statistic, rel=1e-9)
        assert r["wilcoxon"]["p_value"] == pytest.approx(w.pvalue, rel=1e-9)
        assert r["sign_flip"]["share"] == pytest.approx(np.mean(np.sign(ea[keep]) != np.sign(eb[keep])))
        lo, hi = r["mean_change_ci"]
        assert lo < r["mean_change"] < hi
        ps.append(t.pvalue)
        per_pair = list(csv.DictReader(open(out / f"{r['bias_type']}_changes.csv", newline="")))
        assert len(per_pair) == r["n_pairs"]
        assert float(per_pair[0]["change"]) == pytest.approx(ea[keep][0] - eb[keep][0])
    for r, p in zip(res["types"], ps):  # Bonferroni across the two types compared
        assert r["p_corrected"]["ttest"]["bonferroni"] == pytest.approx(min(1.0, 2 * p), rel=1e-9)
        assert r["significant"] == (min(1.0, 2 * p) < 0.05)
        assert r["verdict"].startswith("significant change" if r["significant"] else "not significant")
    # the CI beside each verdict is at the verdict's family-wise level: 1 − 0.05/2 for two types (scipy's BCa at 97.5 %)
    assert res["ci_level"] == pytest.approx(0.975) and "97.5% CI, Bonferroni-adjusted for 2 types" in text
    for r in res["types"]:
        ea, ka = _effects(two_runs / "a", r["bias_type"])
        eb, kb = _effects(two_runs / "b", r["bias_type"])
        d = (ea - eb)[ka & kb]
        boot = sps.bootstrap((d,), np.mean, confidence_level=0.975, n_resamples=200, method="BCa",
                             random_state=np.random.default_rng(0)).confidence_interval
        assert r["ci_level"] == pytest.approx(0.975) and r["mean_change_ci"] == pytest.approx([boot.low, boot.high])
        assert "(97.5% CI, Bonferroni-adjusted for 2 types)" in r["verdict"] and "2 types," in r["verdict"]
    rows = list(csv.DictReader(open(out / "compare.csv", newline="")))
    assert [float(x["ci_level"]) for x in rows] == pytest.approx([0.975, 0.975])
    assert [x["bias_type"] for x in rows] == ["religion1", "race"]
    assert float(rows[0]["t_value"]) == pytest.approx(res["types"][0]["ttest"]["t_value"])
    assert (out / "compare.png").stat().st_size > 5000
    assert "religion1:" in text and "mean change" in text


def test_compare_api_with_seeds_averages_effects(two_runs):
    """Two runs on side A (seeds): per-pair effects averaged, per-seed mean changes beside the result."""
    import rbjax

    res = rbjax.compare_models([two_runs / "a", two_runs / "b"], two_runs / "b", bias_types=["race"],
                               n_bootstrap=0)
    (r,) = res["types"]
    ea, ka = _effects(two_runs / "a", "race")
    eb, kb = _effects(two_runs / "b", "race")
    keep = ka & kb
    assert r["mean_change"] == pytest.approx(np.mean((ea[keep] + eb[keep]) / 2 - eb[keep]), rel=1e-9)
    assert r["seeds"]["per_seed_mean_change"] == pytest.approx([np.mean(ea[keep] - eb[keep]), 0.0], abs=1e-12)
    assert r["seeds"]["sd"] == pytest.approx(np.std(r["seeds"]["per_seed_mean_change"], ddof=1))
    # one type compared: no correction, so the CI is at 1 − alpha, labelled as such; "1 type", not "1 types"
    assert res["ci_level"] == pytest.approx(0.95) and r["ci_level"] == pytest.approx(0.95)
    assert "(1 type, bonferroni p" in r["verdict"] and "1 types" not in r["verdict"] and "CI" not in r["verdict"]
    (r,) = rbjax.compare_models(two_runs / "a", two_runs / "b", bias_types=["race"], n_bootstrap=50)["types"]
    assert r["ci_level"] == pytest.approx(0.95) and "] (95% CI), t = " in r["verdict"]


def _copy(src, dst, edit_record=None, edit_csv=None):
    shutil.copytree(src, dst)
    if edit_record:
        recs = json.loads((dst / "lmb.json").read_text())
        for r in recs:
            edit_record(r)
        (dst / "lmb.json").write_text(json.dumps(recs))
    if edit_csv:
        p = dst / "religion1_perplexities.csv"
        p.write_text(edit_csv(p.read_text()))
    return dst


def test_runs_with_different_pairs_are_refused_with_the_reason(two_runs, tmp_path, tiny_model_dir, redditbias_dir,
                                                               capsys):
    from rbjax.lmb.measure import measure_bias

    a = two_runs / "a"
    cases = {
        "split: 'valid' vs 'test'": _copy(a, tmp_path / "s", lambda r: r.update(split="valid")),
        "outlier handling: no outlier removal vs 3σ pair rule, ddof=0": _copy(
            a, tmp_path / "o", lambda r: r["outlier_rule"].update(applied=False)),
        "BOS token: True vs False": _copy(a, tmp_path / "bos", lambda r: r["inputs"].update(bos=True)),
        "tokenizer files (sha256): vocab.json differ": _copy(
            a, tmp_path / "tok", lambda r: r["inputs"]["tokenizer"].update({"vocab.json": "0" * 64})),
        "the pair phrases differ (first difference at CSV row 1": _copy(
            a, tmp_path / "ph", edit_csv=lambda s: s.replace("\n", "\nX", 1)),
    }
    for why, folder in cases.items():
        with pytest.raises(MismatchError, match="not measured on the same pairs") as e:
            compare_models(folder, two_runs / "b", n_bootstrap=0)
        assert why in str(e.value), (why, str(e.value))
    # a real measurement of another split: refused on the CLI with the reason, nothing written
    measure_bias(model=tiny_model_dir, out_dir=tmp_path / "valid", bias_types="religion1", split="valid",
                 data_dir=redditbias_dir, n_bootstrap=0, progress=False, plot=False)
    assert main(["compare", str(tmp_path / "valid"), str(two_runs / "b"), "--out", str(tmp_path / "x"),
                 "--bias", "religion1"]) == 1
    err = capsys.readouterr().err
    assert "split: 'valid' vs 'test'" in err and "the pair phrases differ" in err
    assert not (tmp_path / "x" / "compare.json").exists()
    with pytest.raises(ValueError, match=r"bias type\(s\) \['gender'\] not measured by every run"):
        compare_models(a, two_runs / "b", bias_types=["gender"])


def test_overshoot_is_a_significant_change_past_zero(tmp_path):
    """Hand data through the whole per-type path: B stereotypical (e < 0), A significantly anti-stereotypical → an
    overshoot, said in words; the same A against a B already on the anti-stereotypical side → no overshoot."""
    from rbjax.lmb.compare import _overshoot, describe_change

    ea = np.array([0.21, 0.35, 0.18, 0.40, 0.27, 0.33, 0.25, 0.30])
    for eb, want in ((np.array([-0.10, -0.05, -0.12, 0.02, -0.08, -0.03, -0.06, -0.09]), "anti-stereotypical"),
                     (np.array([0.10, 0.15, 0.02, 0.12, 0.08, 0.13, 0.06, 0.09]), None)):
        r = paired_change(ea, eb, n_bootstrap=0)
        p = sps.ttest_rel(ea, eb).pvalue
        r.update(p_corrected={"ttest": {"bonferroni": p, "benjamini_hochberg": p, "n_tests": 1}}, significant=p < 0.05)
        assert r["significant"] and sps.ttest_1samp(ea, 0).pvalue < 0.05
        r["overshoot"] = _overshoot(r)
        assert r["overshoot"] == want
        text = describe_change(r, ("HD", "baseline"))
        assert text.startswith("significant change towards the anti-stereotypical side")
        assert ("overshoot: HD went past zero" in text) == (want is not None)
