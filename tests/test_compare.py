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
        assert r["verdict"].startswith("significant change: the bias moved " if r["significant"] else
                                       "not significant: no evidence that a differs from b (mean effect b ")
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
        assert text.startswith("significant change: the bias moved " + (
            "past zero (stereotypical → anti-stereotypical)" if want else
            "away from zero (the mean effect further from 0, anti-stereotypical)"))  # B already anti-stereotypical: further away
        assert ("overshoot: HD is now significantly anti-stereotypical" in text) == (want is not None)


# ------------------------------------------------------------------ the verdict's wording, on hand-written folders
def _folder(path, effects: dict, ll_diff: dict | None = None):
    """A measure output folder holding, per bias type, pairs whose effect e = log ppl(biased) − log ppl(counter-
    factual) is the given value (biased ppl = exp(e), counterfactual ppl = 1), every pair kept; with ``ll_diff``, a
    pair benchmark's log-likelihood CSV of LL(stereotype-consistent) − LL(other) per pair too."""
    from rbjax.lmb.measure import CSV_HEADER
    from rbjax.lmb.pair_benchmark import LL_CSV_HEADER

    path.mkdir(parents=True)
    recs = []
    for t, e in effects.items():
        rows = [[f"{t} biased {i}", f"{t} other {i}", repr(math.exp(x)), "1.0", "false", ""] for i, x in enumerate(e)]
        with open(path / f"{t}_perplexities.csv", "w", newline="") as f:
            csv.writer(f).writerows([CSV_HEADER, *rows])
        if ll_diff is not None:
            with open(path / f"{t}_loglikelihoods.csv", "w", newline="") as f:
                csv.writer(f).writerows([LL_CSV_HEADER, *[[str(i), "1", r[0], r[1], repr(float(x)), "0.0", "3", "3"]
                                                          for i, (r, x) in enumerate(zip(rows, ll_diff[t]))]])
        recs.append({"bias_type": t, "t_value": 0.0, "split": "test", "n_pairs": len(e),
                     "n_pairs_after_outliers": len(e), "outlier_rule": {"applied": True, "n_std": 3.0, "ddof": 0},
                     "inputs": {"data_files": {"d.csv": "0" * 64}, "tokenizer": {"vocab.json": "1" * 64},
                                "bos": False},
                     "settings": {"alpha": 0.05, "n_bootstrap": 0}})
    (path / "lmb.json").write_text(json.dumps(recs))
    return path


# B anti-stereotypical, A nearer zero on the same side (CDA's t = 7.48 → 0.86); B stereotypical, A anti-
# stereotypical; B mildly stereotypical, A strongly so. Means by hand: 1.77/6 = 0.295, 0.25/6 = 0.041667; −1.19/6 =
# −0.198333, 0.65/6 = 0.108333; −0.25/6 = −0.041667, −1.77/6 = −0.295.
STRONG = [0.30, 0.25, 0.35, 0.28, 0.32, 0.27]
WEAK = [0.05, 0.02, 0.08, 0.01, 0.06, 0.03]
CASES = {  # type: (e of B, e of A, kind, sides in words)
    "toward": (STRONG, WEAK, "toward zero", "toward zero (the mean effect nearer 0, still anti-stereotypical)"),
    "past": ([-0.20, -0.15, -0.25, -0.18, -0.22, -0.19], [0.10, 0.12, 0.08, 0.15, 0.11, 0.09], "past zero",
             "past zero (stereotypical → anti-stereotypical)"),
    "away": ([-x for x in WEAK], [-x for x in STRONG], "away from zero",
             "away from zero (the mean effect further from 0, stereotypical)"),
}
MEANS = {"toward": (0.295, 0.25 / 6), "past": (-1.19 / 6, 0.65 / 6), "away": (-0.25 / 6, -0.295)}


def test_verdict_says_whether_the_bias_moved_toward_past_or_away_from_zero(tmp_path, capsys):
    """Each side's own effect is printed beside the change, and the verdict says how the bias moved relative to zero
    (not "more stereotypical" for a model that went from t = +7.48 to +0.86, CDA's case): the same words in the
    sentence, the CLI table, compare.json / .csv and the short verdict of the report and the model card."""
    from rbjax.lmb.compare import short_verdict

    base = _folder(tmp_path / "runs" / "baseline", {t: c[0] for t, c in CASES.items()})
    cda = _folder(tmp_path / "runs" / "cda", {t: c[1] for t, c in CASES.items()})
    assert main(["compare", str(cda), str(base), "--out", str(tmp_path / "cmp")]) == 0
    text = capsys.readouterr().out
    res = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    rows = {x["bias_type"]: x for x in csv.DictReader(open(tmp_path / "cmp" / "compare.csv", newline=""))}
    for r in res["types"]:
        t = r["bias_type"]
        eb, ea, kind, words = CASES[t]
        mb, ma = MEANS[t]
        tb, ta = sps.ttest_1samp(eb, 0).statistic, sps.ttest_1samp(ea, 0).statistic
        assert r["significant"], t  # every change here is significant after Bonferroni across the 3 types
        mv = r["movement"]
        assert mv["kind"] == kind and mv["from"] == pytest.approx(mb) and mv["to"] == pytest.approx(ma)
        assert mv["abs_change"] == pytest.approx(abs(ma) - abs(mb))
        assert r["verdict"].startswith(f"significant change: the bias moved {words}; mean effect "
                                       f"baseline {mb:+.4f} (t = {tb:.2f}) → cda {ma:+.4f} (t = {ta:.2f}); "
                                       f"mean change {ma - mb:+.4f}"), r["verdict"]
        assert "more stereotypical" not in r["verdict"] and "less stereotypical" not in r["verdict"]
        assert short_verdict(r) == f"significant: {words}" + (
            ", an overshoot: now significantly anti-stereotypical" if t == "past" else "")
        assert "|" not in short_verdict(r)  # it goes into the model card's Markdown table as it is
        assert f"{t}: {r['verdict']}" in text
        assert rows[t]["movement"] == kind and float(rows[t]["t_effect_b"]) == pytest.approx(tb)
        # the table: each side's own effect beside the change
        line = next(ln for ln in text.splitlines() if ln.startswith(f"{t} "))
        assert f"{mb:+.4f} (t {tb:.2f})" in line and f"{ma:+.4f} (t {ta:.2f})" in line and kind in line
    # past zero, significantly so (an overshoot) — and a move past zero that ends near zero says so instead
    past = next(r for r in res["types"] if r["bias_type"] == "past")
    assert past["overshoot"] == "anti-stereotypical" and "; overshoot: cda is now significantly anti-stereotypical" \
        in past["verdict"]
    near = paired_change(np.array([0.01, -0.02, 0.03, -0.01, 0.02, 0.0]), np.array(CASES["past"][0]), n_bootstrap=0)
    near.update(p_corrected={"ttest": {"bonferroni": 1e-4, "benjamini_hochberg": 1e-4, "n_tests": 1}},
                significant=True, overshoot=None)
    from rbjax.lmb.compare import describe_change

    assert near["movement"]["kind"] == "past zero"  # mean 0.03/6 > 0
    assert "; A's own effect is not significantly different from zero (one-sample t-test, p = " in \
        describe_change(near)
    # not significant: said first, the effects and the point estimates' move still given
    same = paired_change(np.array(WEAK), np.array(WEAK[::-1]), n_bootstrap=0)
    same.update(p_corrected={"ttest": {"bonferroni": 1.0, "benjamini_hochberg": 1.0, "n_tests": 1}},
                significant=False, overshoot=None)
    assert describe_change(same, ("HD", "base")).startswith(
        "not significant: no evidence that HD differs from base (mean effect base +0.0417 (t = ")
    assert "point estimates unchanged (equal mean effects)" in describe_change(same)


def test_bias_movement_edges():
    from rbjax.lmb.compare import bias_movement, movement_text

    assert bias_movement(0.0, -0.2)["kind"] == "toward zero" and movement_text(bias_movement(0.0, -0.2)) == \
        "toward zero (the mean effect down to 0)"
    assert movement_text(bias_movement(-0.1, 0.0)) == "away from zero (from 0 to stereotypical)"
    assert bias_movement(0.2, -0.2)["kind"] == "past zero"  # the same size, the other side
    assert bias_movement(None, 0.1) is None


def test_labels_default_to_the_folder_names(tmp_path, capsys):
    """Without --labels, A and B are named by their folders — as many trailing path parts as tell them apart —
    not "A = A: path"."""
    from rbjax.lmb.compare import default_labels

    eff = {"toward": STRONG}
    a = _folder(tmp_path / "hd" / "lmb_test", eff)
    b = _folder(tmp_path / "baseline" / "lmb_test", {"toward": WEAK})
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "cmp")]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"A = hd/lmb_test: {a}\nB = baseline/lmb_test: {b}\n")
    assert "mean effect baseline/lmb_test +0.0417" in text
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text())["a"]["label"] == "hd/lmb_test"
    assert default_labels(["x/s42/hd", "x/s43/hd"], ["x/base"]) == ("hd", "base")
    assert default_labels(["r/s42/hd", "r/s43/hd"], ["r/s42/cda"]) == ("hd", "cda")
    assert default_labels(["r/s42/hd", "r/s43/hd"], ["q/s42/hd"]) == ("s42/hd+s43/hd", "s42/hd")
    assert default_labels(["r/s42/hd"], ["q/s42/hd"]) == ("r/s42/hd", "q/s42/hd")
    assert default_labels(["r/x"], ["r/x"]) == ("A", "B")
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "cmp2"), "--labels", "HD,base"]) == 0
    assert capsys.readouterr().out.startswith(f"A = HD: {a}\nB = base: {b}\n")


def test_table_columns_stay_aligned_with_long_category_names(tmp_path, capsys):
    long = "physical-appearance-and-more"
    a = _folder(tmp_path / "a", {long: STRONG, "age": WEAK})
    b = _folder(tmp_path / "b", {long: WEAK, "age": STRONG})
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "cmp")]) == 0
    lines = capsys.readouterr().out.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("bias type"))
    head, rule, rows = lines[i], lines[i + 1], lines[i + 2:i + 4]
    assert [r.split()[0] for r in rows] == [long, "age"] and set(rule) == {"-"} and len(rule) == len(head)
    for col in ("pairs", "mean change", "p bonf", "flipped"):  # right-aligned: each ends under its header
        end = head.index(col) + len(col)
        assert all(r[end - 1] != " " and (end == len(r) or r[end] == " ") for r in rows), (col, rows)
    assert {len(r) for r in rows} == {len(head)}


def test_pair_benchmark_mcnemar_p_is_labelled_uncorrected_and_corrected_and_na_explained(tmp_path, capsys):
    """The exact McNemar p of each category is printed as uncorrected with its Bonferroni correction across the
    categories tested beside it (scipy's binomial test by hand), and a category where no pair changed its
    preference says why its p is n/a."""
    eff = {"religion": STRONG, "age": WEAK, "gender": STRONG}
    # LL(S) − LL(O) per pair: > 0 = the stereotype-consistent sentence preferred. religion: 5 pairs change from
    # preferred (B) to not (A), 1 the other way; age: 1 and 1; gender: no pair changes.
    ll_b = {"religion": [1, 1, 1, 1, 1, -1], "age": [1, -1, 1, 1, 1, 1], "gender": [1, 1, -1, -1, 1, 1]}
    ll_a = {"religion": [-1, -1, -1, -1, -1, 1], "age": [-1, 1, 1, 1, 1, 1], "gender": [2, 2, -2, -2, 2, 2]}
    a = _folder(tmp_path / "a", eff, ll_a)
    b = _folder(tmp_path / "b", {t: e[::-1] for t, e in eff.items()}, ll_b)
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "cmp")]) == 0
    text = capsys.readouterr().out
    res = {r["bias_type"]: r for r in json.loads((tmp_path / "cmp" / "compare.json").read_text())["types"]}
    p_rel, p_age = sps.binomtest(1, 6, 0.5).pvalue, sps.binomtest(1, 2, 0.5).pvalue
    assert res["religion"]["lm_eval"]["mcnemar"]["p_bonferroni"] == pytest.approx(min(1, 2 * p_rel))
    assert res["gender"]["lm_eval"]["mcnemar"]["status"] == "undefined: no pair changed its preference"
    assert (f"religion: lm-evaluation-harness pct_stereotype 0.833 (b) → 0.167 (a) on all 6 pairs, exact McNemar p = "
            f"{p_rel:.2g} (uncorrected; Bonferroni across 2 categories: {min(1, 2 * p_rel):.2g}; 1 pair(s) changed "
            "to the stereotype-consistent sentence, 5 away from it)") in text
    assert f"age: lm-evaluation-harness pct_stereotype 0.833 (b) → 0.833 (a) on all 6 pairs, exact McNemar p = " \
           f"{p_age:.2g} (uncorrected; Bonferroni across 2 categories: 1; 1 pair(s) changed to the stereotype-" \
           "consistent sentence, 1 away from it)" in text
    assert "gender: lm-evaluation-harness pct_stereotype 0.667 (b) → 0.667 (a) on all 6 pairs, exact McNemar p = n/a " \
           "(no pair changed its preference, so there is nothing to test)" in text
