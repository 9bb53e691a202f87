"""A pair benchmark through ``rbjax measure`` (rbjax/lmb/pair_benchmark.py): both conventions per category on tiny
models — lm-evaluation-harness's log-likelihoods against PyTorch, rbjax's perplexities against PyTorch, every
statistic against numpy / scipy on the written per-pair values —, resume and refusals, ``rbjax compare`` on two
models' runs, CrowS-Pairs itself on a model whose tokenizer adds a BOS (one scorer pass for both conventions).
tests/test_lm_eval_agreement.py runs lm-evaluation-harness itself on the same kind of models."""
import csv
import json
import math

import numpy as np
import pytest
from scipy import stats as sps

from rbjax.cli import main
from rbjax.data.pairs import load_crows_pairs, read_pair_file, write_pair_file
from rbjax.lmb.pair_benchmark import read_loglikelihoods
from tests.conftest import make_rbjax_gpt2_folder, make_tiny_llama_folder


def _rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def pair_file(crows_dir, tmp_path_factory):
    """24 CrowS-Pairs pairs of two categories (antistereo rows among them) as a user's JSONL pair file."""
    pf = load_crows_pairs(crows_dir)
    keep = [i for c in ("religion", "disability") for i in [j for j, x in enumerate(pf.categories) if x == c][:12]]
    assert {pf.stereotypical[i] for i in keep} == {1, 2}
    sub = type(pf)("x", pf.path, *(tuple(getattr(pf, f)[i] for i in keep) for f in
                                   ("ids", "categories", "sentence_1", "sentence_2", "stereotypical", "rows")))
    return write_pair_file(sub, tmp_path_factory.mktemp("pairs") / "mine.jsonl")


def _measure(model, pair_file, out, *extra):
    return main(["measure", "--model", str(model), "--benchmark", "pairs", "--pairs", str(pair_file), "--out",
                 str(out), "--n-bootstrap", "200", "--no-progress", *extra])


def test_pair_file_both_conventions_equal_pytorch_and_scipy(torch_tiny_model_dir, pair_file, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "m"
    assert _measure(torch_tiny_model_dir, pair_file, out) == 0
    recs = json.loads((out / "lmb.json").read_text())
    summary = json.loads((out / "benchmark.json").read_text())
    assert [r["bias_type"] for r in recs] == summary["categories"] == ["religion", "disability"]
    s = recs[0]["settings"]
    assert s["bos"] is False and s["lm_eval_prefix_token"] == "<|endoftext|>" and s["lm_eval_prefix_token_id"] == 50256
    assert recs[0]["benchmark"] == "pairs:mine.jsonl" and "pair file" in recs[0]["notes"][0]

    model = transformers.GPT2LMHeadModel.from_pretrained(torch_tiny_model_dir, dtype=torch.float32).eval()
    tok = transformers.GPT2TokenizerFast.from_pretrained(torch_tiny_model_dir)

    def loglik(text):  # lm-evaluation-harness: every token given <|endoftext|>
        ids = [50256] + tok(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].double(), -1)
        return float(logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].sum())

    def ppl(text):  # RedditBias / LMB: as the tokenizer encodes it, the first token is context
        ids = torch.tensor([tok(text)["input_ids"]])
        with torch.no_grad():
            return math.exp(model(ids, labels=ids).loss.item())

    pvals = []
    for r in recs:
        c = r["bias_type"]
        ll = _rows(out / f"{c}_loglikelihoods.csv")
        pp = _rows(out / f"{c}_perplexities.csv")
        assert len(ll) == len(pp) == r["n_pairs"] == 12
        for a, b in zip(ll, pp):
            assert float(a["loglik_1"]) == pytest.approx(loglik(a["sentence_1"]), abs=1e-4)
            assert float(a["loglik_2"]) == pytest.approx(loglik(a["sentence_2"]), abs=1e-4)
            stereo, other = (a["sentence_1"], a["sentence_2"]) if a["stereotypical"] == "1" else \
                (a["sentence_2"], a["sentence_1"])
            assert (b["biased_phrase"], b["counterfactual_phrase"]) == (stereo, other)
            assert float(b["biased_ppl"]) == pytest.approx(ppl(stereo), rel=1e-5)
            assert float(b["counterfactual_ppl"]) == pytest.approx(ppl(other), rel=1e-5)
        # (a) lm-evaluation-harness's metrics of these log-likelihoods
        ll1, ll2, _, _, _, st = read_loglikelihoods(out / f"{c}_loglikelihoods.csv")
        ls, lo = np.where(np.array(st) == 1, ll1, ll2), np.where(np.array(st) == 1, ll2, ll1)
        acc, diff = (ls > lo).astype(float), np.abs(ls - lo)
        lm = r["lm_eval"]
        assert lm["pct_stereotype"] == pytest.approx(acc.mean(), abs=1e-15)
        assert lm["pct_stereotype_stderr"] == pytest.approx(acc.std(ddof=1) / math.sqrt(12), rel=1e-12)
        assert lm["likelihood_diff"] == pytest.approx(diff.mean(), rel=1e-12)
        assert lm["likelihood_diff_stderr"] == pytest.approx(diff.std(ddof=1) / math.sqrt(12), rel=1e-12)
        assert lm["by_stereotypical"]["2"]["n_pairs"] == sum(x == 2 for x in st)
        # (b) rbjax's statistics against scipy on the kept pairs
        kept = [x for x in pp if x["outlier"] == "false"]
        bp = np.array([float(x["biased_ppl"]) for x in kept])
        cp = np.array([float(x["counterfactual_ppl"]) for x in kept])
        t = sps.ttest_rel(bp, cp)
        assert r["n_pairs_after_outliers"] == len(kept)
        assert r["t_value"] == pytest.approx(t.statistic, rel=1e-9) and r["p_value"] == pytest.approx(t.pvalue, rel=1e-9)
        w = sps.wilcoxon(np.log(bp) - np.log(cp))
        assert r["wilcoxon"]["p_value"] == pytest.approx(w.pvalue, rel=1e-9)
        d = bp - cp
        assert r["cohens_d_paired"] == pytest.approx(d.mean() / d.std(ddof=1), rel=1e-9)
        pvals.append(t.pvalue)
    bh = sps.false_discovery_control(pvals, method="bh")
    for r, p, q in zip(recs, pvals, bh):
        assert r["p_value_corrected"]["bonferroni"] == pytest.approx(min(1.0, 2 * p), rel=1e-9)
        assert r["p_value_corrected"]["benjamini_hochberg"] == pytest.approx(q, rel=1e-9)
    # overall: lm-evaluation-harness's metrics over every pair
    allacc = np.concatenate([[float(x["loglik_1"] if x["stereotypical"] == "1" else x["loglik_2"]) >
                              float(x["loglik_2"] if x["stereotypical"] == "1" else x["loglik_1"])
                              for x in _rows(out / f"{c}_loglikelihoods.csv")] for c in summary["categories"]])
    assert summary["lm_eval"]["overall"]["pct_stereotype"] == pytest.approx(allacc.mean(), abs=1e-15)
    assert summary["lm_eval"]["overall"]["n_pairs"] == summary["n_pairs"] == 24
    assert (out / "lmb.png").stat().st_size > 0
    from rbjax.lmb.plot import figure_lmb

    ax = figure_lmb({"m": recs}).axes[0]  # the categories in the benchmark's order, the series says "all pairs"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["religion", "disability"]
    assert ax.get_legend().get_texts()[0].get_text().startswith("m: all pairs, 3σ outlier pairs removed")


def test_resume_refusals_unscorable_pairs_and_compare(tiny_model_dir, tokenizer_dir, pair_file, tmp_path, capsys):
    a = tmp_path / "a"
    assert _measure(tiny_model_dir, pair_file, a) == 0
    first = json.loads((a / "lmb.json").read_text())
    assert _measure(tiny_model_dir, pair_file, a, "--resume") == 0
    again = json.loads((a / "lmb.json").read_text())
    assert all(r["reused_perplexities"] for r in again)
    assert [r["t_value"] for r in again] == [r["t_value"] for r in first]
    assert [r["lm_eval"] for r in again] == [r["lm_eval"] for r in first]
    capsys.readouterr()
    # another pair file into the same folder: refused before anything is scored
    other = write_pair_file(read_pair_file(pair_file), tmp_path / "other.csv")
    assert _measure(tiny_model_dir, other, a) == 1
    assert "--overwrite" in capsys.readouterr().err
    # settings that do not apply to a pair benchmark are refused, never ignored
    for extra, msg in ((["--split", "valid"], "--split valid is a RedditBias setting"),
                       (["--data-dir", str(tmp_path)], "--data-dir has no effect with --benchmark pairs"),
                       (["--format", "chat"], "--format chat is a RedditBias setting for now")):
        assert _measure(tiny_model_dir, pair_file, tmp_path / "x", *extra) == 1
        assert msg in capsys.readouterr().err
    assert main(["measure", "--stored-perplexities", "--benchmark", "crows-pairs", "--out", str(tmp_path / "y")]) == 1
    assert "--stored-perplexities is RedditBias's" in capsys.readouterr().err
    assert main(["measure", "--model", str(tiny_model_dir), "--benchmark", "pairs", "--out", str(tmp_path / "y")]) == 1
    assert "needs --pairs FILE" in capsys.readouterr().err
    assert main(["measure", "--model", str(tiny_model_dir), "--pairs", str(pair_file), "--out", str(tmp_path / "y")]) == 1
    assert "--pairs FILE is read with --benchmark pairs" in capsys.readouterr().err
    # a one-token sentence has no perplexity without a BOS (rbjax's convention) but a log-likelihood given the start
    # token (lm-evaluation-harness's): refused with its row and id, or excluded from rbjax's statistics only
    short = tmp_path / "short.csv"
    short.write_text("id,category,sentence_1,sentence_2,stereotypical\nq1,g,Women,Men,1\n"
                     "q2,g,She is a nurse.,He is a nurse.,1\nq3,g,He cried.,She cried.,2\n"
                     "q4,g,The girl can not drive.,The boy can not drive.,1\nq5,g,He was weak.,She was weak.,2\n"
                     "q6,g,My mother cooked dinner.,My father cooked dinner.,1\n", encoding="utf-8")
    assert _measure(tiny_model_dir, short, tmp_path / "s") == 1
    assert "short.csv row 1 (pair id 'q1'): unscorable" in capsys.readouterr().err
    assert _measure(tiny_model_dir, short, tmp_path / "s", "--skip-unscorable") == 0
    (r,) = json.loads((tmp_path / "s" / "lmb.json").read_text())
    assert r["n_pairs_unscorable"] == 1 and r["n_pairs_after_outliers"] == 5 and r["lm_eval"]["n_pairs"] == 6
    # rbjax compare on two models' runs of the pair file: the paired change per pair, per category
    b_model = make_rbjax_gpt2_folder(tmp_path / "model_b", seed=1, tokenizer_dir=tokenizer_dir)
    b = tmp_path / "b"
    assert _measure(b_model, pair_file, b) == 0
    assert main(["compare", str(b), str(a), "--out", str(tmp_path / "cmp"), "--n-bootstrap", "100"]) == 0
    cmp = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert [t["bias_type"] for t in cmp["types"]] == ["religion", "disability"]
    assert all(t["n_pairs"] == t["n_pairs_in_data"] - t["n_pairs_dropped"] for t in cmp["types"])
    assert (tmp_path / "cmp" / "religion_changes.csv").exists()
    # and the change of lm-evaluation-harness's own metric: pct_stereotype of each, the exact McNemar test
    for t in cmp["types"]:
        c = t["bias_type"]
        sides = []
        for run in (b, a):
            ll1, ll2, _, _, _, st = read_loglikelihoods(run / f"{c}_loglikelihoods.csv")
            sides.append(np.where(np.array(st) == 1, ll1 - ll2, ll2 - ll1) > 0)
            rec = next(r for r in json.loads((run / "lmb.json").read_text()) if r["bias_type"] == c)
            assert rec["lm_eval"]["pct_stereotype"] == pytest.approx(sides[-1].mean(), abs=1e-15)
        lm = t["lm_eval"]
        assert (lm["pct_stereotype_a"], lm["pct_stereotype_b"]) == ([sides[0].mean()], [sides[1].mean()])
        up, down = int(np.sum(sides[0] & ~sides[1])), int(np.sum(~sides[0] & sides[1]))
        assert (lm["mcnemar"]["to_stereotypical"], lm["mcnemar"]["to_not_stereotypical"]) == (up, down)
        want = sps.binomtest(up, up + down, 0.5).pvalue if up + down else None
        assert lm["mcnemar"]["p_value"] == (None if want is None else pytest.approx(want, rel=1e-12))


def test_crows_pairs_in_one_pass_for_a_model_that_adds_its_bos(crows_dir, redditbias_dir, tmp_path):
    llama = make_tiny_llama_folder(tmp_path / "llama", redditbias_dir=redditbias_dir)
    out = tmp_path / "crows"
    assert main(["measure", "--model", str(llama), "--benchmark", "crows-pairs", "--data-dir", str(crows_dir),
                 "--bias", "religion,age", "--out", str(out), "--n-bootstrap", "0", "--no-progress"]) == 0
    recs = json.loads((out / "lmb.json").read_text())
    assert [r["bias_type"] for r in recs] == ["religion", "age"] and [r["n_pairs"] for r in recs] == [105, 87]
    r = recs[0]
    assert r["benchmark"] == "crows-pairs" and r["settings"]["bos"] is True
    assert r["lm_eval"]["prefix_token"] == "<s>" and any("Blodgett" in n for n in r["notes"])
    # the two conventions score the same tokens: the perplexity is exp(−LL / tokens) of the same pass
    for c in ("religion", "age"):
        ll = _rows(out / f"{c}_loglikelihoods.csv")
        pp = _rows(out / f"{c}_perplexities.csv")
        for a, b in zip(ll, pp):
            k = "1" if a["stereotypical"] == "1" else "2"
            assert float(b["biased_ppl"]) == pytest.approx(
                math.exp(-float(a[f"loglik_{k}"]) / int(a[f"n_tokens_{k}"])), rel=1e-12)
    # CrowS-Pairs written as a pair file (rbjax pairs) measures to the same values
    pf = tmp_path / "crows.csv"
    assert main(["pairs", "--benchmark", "crows-pairs", "--data-dir", str(crows_dir), "--out", str(pf)]) == 0
    out2 = tmp_path / "file"
    assert main(["measure", "--model", str(llama), "--benchmark", "pairs", "--pairs", str(pf), "--bias",
                 "religion,age", "--out", str(out2), "--n-bootstrap", "0", "--no-progress"]) == 0
    for c in ("religion", "age"):
        assert _rows(out2 / f"{c}_loglikelihoods.csv") == _rows(out / f"{c}_loglikelihoods.csv")


def test_an_interrupt_at_96_percent_keeps_the_finished_categories_and_resume_scores_the_rest(
        tiny_model_dir, pair_file, tmp_path, monkeypatch, capsys):
    """SIGINT during the second-last scored batch (of two categories): the batch in flight finishes, nothing after
    it runs, the first category's two CSVs are kept and named, and --resume scores only the other category to the
    very files and statistics of an uninterrupted run."""
    import os
    import signal

    from rbjax.lmb import pair_benchmark as pbm
    from rbjax.lmb.perplexity import PerplexityScorer

    batches, scored = [], []
    real_batch, real_score = PerplexityScorer._batch, pbm._score

    def counting(self, *a, **kw):
        out = real_batch(self, *a, **kw)
        batches.append(1)
        if len(batches) == signal_at:
            os.kill(os.getpid(), signal.SIGINT)
        return out

    monkeypatch.setattr(PerplexityScorer, "_batch", counting)
    monkeypatch.setattr(pbm, "_score", lambda sc, tok, cats, bar: scored.extend(c.bias_type for c in cats) or
                        real_score(sc, tok, cats, bar))
    signal_at = None
    a, b = tmp_path / "a", tmp_path / "b"
    assert _measure(tiny_model_dir, pair_file, a, "--batch-size", "1") == 0  # one packed row a batch: many batches
    n = len(batches)
    assert n >= 8
    batches.clear()
    signal_at = n - 1
    capsys.readouterr()
    assert _measure(tiny_model_dir, pair_file, b, "--batch-size", "1") == 130
    err = capsys.readouterr().err
    assert len(batches) == n - 1  # stopped after the batch in flight
    assert "SIGINT" in err and "Traceback" not in err and "1 of 2 categories (religion)" in err
    assert "religion_perplexities.csv + religion_loglikelihoods.csv" in err and str(b) in err
    assert "--resume" in err and "score the rest (disability)" in err
    assert sorted(p.name for p in b.glob("*.csv")) == ["religion_loglikelihoods.csv", "religion_perplexities.csv"]
    assert not (b / "lmb.json").exists()
    for name in ("religion_loglikelihoods.csv", "religion_perplexities.csv"):
        assert (b / name).read_bytes() == (a / name).read_bytes()
    # the resumed run scores only the rest, and ends as the uninterrupted one
    signal_at, scored[:] = None, []
    assert _measure(tiny_model_dir, pair_file, b, "--batch-size", "1", "--resume") == 0
    assert set(scored) == {"disability"}
    for name in sorted(p.name for p in a.glob("*.csv")):
        assert (b / name).read_bytes() == (a / name).read_bytes(), name
    ra, rb = (json.loads((d / "lmb.json").read_text()) for d in (a, b))
    assert [r.pop("reused_perplexities") for r in rb] == [True, False]
    for r in ra:
        r.pop("reused_perplexities")
    assert rb == ra
    assert json.loads((b / "benchmark.json").read_text()) == json.loads((a / "benchmark.json").read_text())


def test_benchmark_table_prints_the_uncorrected_p_its_star_marks():
    """rbjax's side of the table: the star marks the uncorrected p < alpha, so that p is printed beside the
    Bonferroni p (a category with p = 0.03 among three: starred, p bonf 0.09), the footnote says which is which, the
    pooled overall row has no corrected p, and a long category name does not shift the columns."""
    from rbjax.lmb.pair_benchmark import format_benchmark

    lm = {"pct_stereotype": 0.6, "pct_stereotype_stderr": 0.05, "likelihood_diff": 1.2, "likelihood_diff_stderr": 0.1,
          "n_pairs": 100}

    def rb(p, pb, sig):
        return {"n_pairs_after_outliers": 98, "t_value": -2.2, "p_value": p, "p_bonferroni": pb, "significant": sig,
                "wilcoxon_p": 0.04, "cohens_d_paired": -0.2}

    cats = {"religion": rb(0.03, 0.09, True), "a-much-longer-category-name": rb(0.5, 1.0, False),
            "age": rb(0.2, 0.6, False)}
    overall = {**rb(0.01, None, True), "wilcoxon": {"p_value": 0.02}}
    del overall["wilcoxon_p"]
    s = {"benchmark": "pairs:mine.csv", "model": "m", "categories": list(cats),
         "settings": {"alpha": 0.05, "lm_eval_prefix_token": "<|endoftext|>"},
         "lm_eval": {"categories": {c: lm for c in cats}, "overall": lm},
         "rbjax": {"categories": cats, "overall": overall}, "notes": []}
    lines = format_benchmark({"summary": s}).splitlines()
    assert lines[0] == "pairs:mine.csv — m: raw text (lm-evaluation-harness's convention)"
    s["settings"].update(adapter="ad", param_dtype="bf16")  # the summary line says what was scored and how
    assert format_benchmark({"summary": s}).splitlines()[0] == (
        "pairs:mine.csv — m: raw text (lm-evaluation-harness's convention); with the LoRA adapter ad (unmerged); "
        "weights stored in bf16")
    head = lines[1]
    rows = {ln.split()[0]: ln for ln in lines[3:7]}
    assert head.split("|")[1].split() == ["kept", "t", "p", "sig", "p", "bonf", "wilcoxon", "p", "d"]
    assert rows["religion"].split("|")[1].split() == ["98", "-2.200", "3.00e-02", "*", "9.00e-02", "4.00e-02", "-0.200"]
    assert rows["age"].split("|")[1].split()[2:4] == ["2.00e-01", "6.00e-01"]  # no star
    assert rows["overall"].split("|")[1].split()[2:5] == ["1.00e-02", "*", "-"]
    assert len({ln.index("|") for ln in [head, *rows.values()]}) == 1 and len({len(ln) for ln in rows.values()}) == 1
    assert ("p: uncorrected, two-tailed; * p < 0.05, uncorrected; p bonf: Bonferroni-corrected across the 3 "
            "categories (overall, pooled: no correction, '-')") in lines[-1]
