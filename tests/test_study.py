"""`rbjax run`: the tiny study end to end (every stage, the report's tables and figure, the numbers equal the stage
files), reruns skip unchanged stages, a changed setting reruns only what depends on it, a study killed during a
sweep resumes without redoing finished work, and the paper study's dry run."""
import json
import re
import shutil
from pathlib import Path

import pytest

from rbjax.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "experiments" / "tiny.toml"
PAPER = ROOT / "experiments" / "paper.toml"

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")


def _offline(shared_dir):
    return ["--set", f"study.tokenizer={shared_dir / 'tokenizers' / 'gpt2'}",
            "--set", f"study.data_dir={shared_dir / 'redditbias'}",
            "--set", f"dialog.dst.multiwoz={shared_dir / 'dialog-data' / 'multiwoz'}"]


# the tiny study's token layout: one compiled training program per method instead of up to four packed shapes
PADDED = ["--set", "training.layout=padded", "--set", "dialog.dst.layout=padded"]


def _stages(out):
    return json.loads((Path(out) / "stages.json").read_text())["stages"]


#: the tiny study's bias types here: two of the five (a Table 3 of several columns, a cross-type table with an
#: off-diagonal effect), each measuring stage scores 2/5 of the pairs of the file's five
TYPES = ["--set", 'study.bias_types=["religion1", "race"]']


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory, shared_dir):
    """experiments/tiny.toml (2 seeds, 4 methods, every dialog check) with local data paths, two bias types
    (:data:`TYPES`) — and the padded token layout: one compiled training program per method instead of up to four
    packed shapes, which halves the fixture's time (packed = padded is tests/test_packed.py's subject, not this
    orchestration test's)."""
    out = tmp_path_factory.mktemp("study") / "tiny"
    assert main(["run", str(TINY), "--out", str(out), "--no-progress", *_offline(shared_dir), *PADDED, *TYPES]) == 0
    return out


def test_tiny_study_report_holds_every_table_and_figure(tiny_study):
    out = tiny_study
    st = _stages(out)
    assert all(v["status"] == "done" for v in st.values())
    names = set(st)
    assert {"model", "baseline/lmb_test", "baseline/dialog", "seed42/sweeps", "seed43/sweeps",
            "seed42/religion1/cda/run"} <= names
    for seed in (42, 43):
        for m in ("lmd", "add", "hd", "cda"):
            assert f"seed{seed}/religion1/{m}/lmb_test" in names and f"seed{seed}/religion1/{m}/dialog" in names
    md = (out / "report.md").read_text()
    # the header names the study and its model
    assert "Study: tiny study (random GPT-2, a few steps). Model: a random GPT-2 (see the data notes). " in md
    for section in ("## Figure 1", "## LMB per bias type (Table 3 shape)", "## Effect sizes", "## Cross-type effects",
                    "### HD", "## Anti-stereotypical overshoots", "## Dialog quality", "## Data notes",
                    "## Settings and versions"):
        assert section in md, section
    assert "standing in for the train split" in md  # the MultiWOZ val split standing in for train is said
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 1 and "<table>" in html and "src='figure1.png'" not in html
    assert (out / "figure1.png").stat().st_size > 10_000


def test_report_numbers_equal_the_stage_files(tiny_study):
    """Table 3's baseline cells and the cross-type means are the t-values of the stage lmb.json files."""
    import statistics

    out = tiny_study
    from rbjax.study.report import write_report

    rep = write_report([out], out / "rebuilt")
    head, rows = rep["tables"]["table3"]
    base = {r["bias_type"]: r for r in json.loads((out / "baseline/lmb_test/lmb.json").read_text())}
    for col, b in enumerate(head[1:], start=1):
        assert rows[0][col].startswith(f"{base[b]['t_value']:.2f} (p ")
    hd = [json.loads((out / f"seed{s}/religion1/hd/lmb_test/lmb.json").read_text()) for s in (42, 43)]
    hd_rows = next(rows for m, h, rows in rep["tables"]["cross"] if m == "HD")
    for b in head[1:]:
        ts = [next(r["t_value"] for r in recs if r["bias_type"] == b) for recs in hd]
        cell = hd_rows[0][head.index(b)]  # the model debiased for religion1, measured on b
        assert cell.startswith(f"{statistics.fmean(ts):.2f} ± {statistics.stdev(ts):.2f}"), (b, cell, ts)
    # the selected grid points are those of each sweep's selection.json
    sel_head, sel_rows = rep["tables"]["selections"]
    assert len(sel_rows) == 6  # lmd, add, hd × 2 seeds (CDA has no grid)
    assert [r[0] for r in sel_rows] == ["LMD", "LMD", "ADD", "ADD", "HD", "HD"]  # LMD, ADD, HD, CDA everywhere
    for row in sel_rows:
        method, seed = row[0].lower(), row[2]
        chosen = json.loads((out / f"seed{seed}/religion1/{method}/sweep/selection.json").read_text())["default"]
        assert row[sel_head.index("λ_D")] == f"{chosen['point']['lambda_d']:g}"
        assert row[sel_head.index("dev t")] == f"{chosen['dev']['t_value']:.2f}"
    assert "## Selected grid points" in (out / "rebuilt" / "report.md").read_text()
    dia_head, dia_rows = rep["tables"]["dialog"]
    lmp = json.loads((out / "baseline/dialog/lmp.json").read_text())["metrics"]["perplexity"]
    assert dia_rows[0][dia_head.index("LMP")] == f"{lmp:.3f}"
    # `rbjax report` rebuilds the same report from the folder
    assert main(["report", str(out), "--out", str(out / "again")]) == 0
    assert (out / "again" / "report.md").read_text() == (out / "rebuilt" / "report.md").read_text()


def test_rerun_skips_and_a_changed_setting_reruns_only_its_stages(tiny_study, shared_dir, tmp_path, capsys):
    out = tmp_path / "copy"
    shutil.copytree(tiny_study, out)
    before = _stages(out)
    capsys.readouterr()
    assert main(["run", str(TINY), "--out", str(out), "--no-progress", *_offline(shared_dir), *PADDED, *TYPES]) == 0
    assert f"0 stage(s) ran, {len(before)} unchanged" in capsys.readouterr().out
    assert main(["run", str(TINY), "--out", str(out), "--no-progress", *_offline(shared_dir), *PADDED, *TYPES,
                 "--set", "dialog.lmp.lmp_max_lines=32"]) == 0
    text = capsys.readouterr()
    ran = set(re.findall(r"\[\d+/\d+\] (\S+) \.\.\.", text.err))
    assert ran == {n for n in before if n.endswith("/dialog")}, ran  # only the dialog checks read that setting
    lmp = json.loads((out / "baseline/dialog/lmp.json").read_text())
    assert lmp["metrics"]["n_scored_lines"] <= 32


def test_killed_study_resumes_without_redoing_finished_work(shared_dir, tmp_path, monkeypatch, capsys):
    """Ctrl-C in the second chunk of a sweep: the rerun skips the finished stages and the finished chunk."""
    from rbjax.debias import sweep

    out = tmp_path / "k"
    args = ["run", str(TINY), "--out", str(out), "--no-progress", *_offline(shared_dir), *PADDED,
            "--set", "study.seeds=[42]", "--set", "study.methods=[\"hd\"]", "--set", "dialog.tasks=[]",
            "--set", "sweep.grid_chunk=1", "--no-report"]
    real = sweep.run_chunk
    calls = []

    def dies_on_second(task, **kw):
        calls.append(task["chunk_id"])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(task, **kw)

    monkeypatch.setattr(sweep, "run_chunk", dies_on_second)
    assert main(args) == 130
    err = capsys.readouterr().err
    assert "interrupted in stage seed42/sweeps" in err and "run the same command again" in err
    done = _stages(out)
    assert {"model", "baseline/lmb_test"} <= set(done) and "seed42/sweeps" not in done
    recs = (out / "seed42/religion1/hd/sweep/sweep.jsonl").read_text().splitlines()
    assert len(recs) == 1
    monkeypatch.setattr(sweep, "run_chunk", lambda task, **kw: (calls.append(task["chunk_id"]), real(task, **kw))[1])
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "model: unchanged, skipped" in err and "baseline/lmb_test: unchanged, skipped" in err
    assert calls[2:] == calls[1:2]  # only the unfinished chunk ran again
    assert len((out / "seed42/religion1/hd/sweep/sweep.jsonl").read_text().splitlines()) == 2


def test_paper_study_dry_run_prints_the_plan_and_its_cost(capsys):
    assert main(["run", str(PAPER), "--out", "/nonexistent/runs/paper", "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "training runs: 830" in text  # 5 types × (3 grid methods × (54 points + the retrained selection) + CDA)
    assert "seed42/sweeps" in text and "seed42/queerness/cda/dialog" in text and "estimated cost" in text
    assert main(["run", str(PAPER), "--out", "/nonexistent/x", "--dry-run", "--seeds", "3"]) == 0
    assert "training runs: 2490" in capsys.readouterr().out


def test_qwen_study_dry_run_cost_is_scaled_to_the_model_size(capsys):
    """The Qwen2.5-0.5B-Instruct study file, its model replaced by the real hyper-parameters (config.json only, no
    weights): the cost is the DialoGPT-small figure × the ratio of forward matmul FLOPs per token. By hand: Qwen2.5
    24 layers × (q 896² + k, v 896·128 each + o 896² + gate, up, down 896·4864 each) + the tied head 896·151,936 =
    493,961,216 weights per token; DialoGPT-small 12 × (768·2304 + 768² + 2·768·3072) + 768·50,257 = 123,532,032."""
    from rbjax.study.config import load_study
    from rbjax.study.run import estimate_cost

    qwen = ROOT / "tests" / "fixtures" / "qwen2.5_0.5b_instruct"
    study = ROOT / "experiments" / "qwen2.5-0.5b-instruct.toml"
    assert main(["run", str(study), "--out", "/nonexistent/q", "--dry-run", "--set", f"study.model='{qwen}'"]) == 0
    text = capsys.readouterr().out
    ratio = 493_961_216 / 123_532_032
    assert f"at this model's size ({ratio:.3g}× DialoGPT-small's matmul FLOPs per token)" in text
    scaled = estimate_cost(load_study(study, [f"study.model='{qwen}'"]))
    base = estimate_cost(load_study(PAPER))
    assert scaled["size_ratio"] == pytest.approx(ratio, rel=1e-12) and base["size_ratio"] == 1.0
    assert scaled["training_tokens"] == base["training_tokens"]  # the same protocol, the same (GPT-2) token counts
    assert scaled["train_hours"] == pytest.approx(base["train_hours"] * ratio)
    assert scaled["score_hours"] == pytest.approx(base["score_hours"] * ratio)


def test_bad_study_files_are_clear_errors(tmp_path, capsys):
    bad = tmp_path / "s.toml"
    bad.write_text('[study]\nmodel = "m"\nmethods = ["xyz"]\n')
    assert main(["run", str(bad), "--out", str(tmp_path / "o"), "--dry-run"]) == 1
    assert "unknown method(s) ['xyz']" in capsys.readouterr().err
    bad.write_text('[study]\nmodel = "m"\n[sweeps]\n')
    assert main(["run", str(bad), "--out", str(tmp_path / "o"), "--dry-run"]) == 1
    assert "unknown section [sweeps]" in capsys.readouterr().err
    # a bad --set names the --set, not the (innocent) study file
    assert main(["run", str(PAPER), "--out", str(tmp_path / "o"), "--dry-run", "--set", "training.epochs=two"]) == 1
    assert "--set 'training.epochs=two': training.epochs must be an integer, got 'two'" in capsys.readouterr().err
    assert main(["run", str(PAPER), "--out", str(tmp_path / "o"), "--dry-run", "--set", "study.bogus=1"]) == 1
    assert "--set 'study.bogus=1': unknown field 'bogus' in [study]" in capsys.readouterr().err
    bad.write_text('[study\n')
    assert main(["run", str(bad), "--out", str(tmp_path / "o"), "--dry-run"]) == 1
    assert "not valid TOML" in capsys.readouterr().err


def test_report_renders_in_a_real_browser(tiny_study, tmp_path):
    """report.html in headless Chromium (Debian's package; no network): the tables are in the DOM, the one embedded
    figure is drawn (its bars' colour is on the screenshot). Runs where chromium is installed; elsewhere run
    `python scripts/check_report_browser.py runs/tiny/report.html` after `apt-get install chromium`."""
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    from check_report_browser import check, chromium

    if chromium() is None:
        pytest.skip("chromium is not installed (apt-get install chromium); see scripts/check_report_browser.py")
    res = check(tiny_study / "report.html", tmp_path / "shot.png")
    assert res["ok"], res
    assert res["tables"] >= 7 and res["images"] == 1


# ------------------------------------------------------------------ the report's comparisons are paired tests
def _effects(folder, bias_type):
    import csv
    import math

    import numpy as np

    with open(Path(folder) / f"{bias_type}_perplexities.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    e = np.array([math.log(float(r["biased_ppl"])) - math.log(float(r["counterfactual_ppl"])) for r in rows])
    return e, np.array([r["outlier"] == "false" for r in rows])


def test_report_changes_are_paired_tests_on_the_same_pairs(tiny_study, tmp_path):
    """Every "changed from the baseline" and "method vs method" row is the paired test on the same pairs, the seeds
    averaged per pair (values recomputed here with scipy from the stages' CSVs); the Δt wording is gone; a verdict
    says "not significant" first; overshoots are the comparisons' overshoots."""
    import numpy as np
    from scipy import stats as sps

    from rbjax.lmb.compare import effects_text, short_verdict
    from rbjax.study.report import write_report

    out = tiny_study
    rep = write_report([out], tmp_path / "r")
    md = (tmp_path / "r" / "report.md").read_text()
    assert "Δt" not in md and "seed noise" not in md and "## Change from the baseline" in md
    comp = json.loads((tmp_path / "r" / "comparisons.json").read_text())
    head, rows = rep["tables"]["change"]
    types = [r["bias_type"] for r in json.loads((out / "baseline/lmb_test/lmb.json").read_text())]
    assert len(rows) == 4 * len(types)  # 4 methods × every measured type
    eb, kb = zip(*[_effects(out / "baseline/lmb_test", t) for t in types])
    for m in ("lmd", "hd"):
        res = next(c for c in comp["vs_baseline"] if c["method"] == m)
        ps = []
        for i, t in enumerate(types):
            e42, k42 = _effects(out / f"seed42/religion1/{m}/lmb_test", t)
            e43, k43 = _effects(out / f"seed43/religion1/{m}/lmb_test", t)
            keep = k42 & k43 & kb[i]
            ea = (e42[keep] + e43[keep]) / 2
            ref = sps.ttest_rel(ea, eb[i][keep])
            r = next(x for x in res["types"] if x["bias_type"] == t)
            assert r["n_pairs"] == int(keep.sum())
            assert r["ttest"]["t_value"] == pytest.approx(ref.statistic, rel=1e-9)
            assert r["mean_change"] == pytest.approx(np.mean(ea - eb[i][keep]), rel=1e-9)
            assert r["wilcoxon"]["p_value"] == pytest.approx(sps.wilcoxon(ea - eb[i][keep]).pvalue, rel=1e-9)
            assert r["seeds"]["per_seed_mean_change"] == pytest.approx(
                [np.mean(e42[keep] - eb[i][keep]), np.mean(e43[keep] - eb[i][keep])], rel=1e-9)
            ps.append(ref.pvalue)
            row = next(x for x in rows if x[1] == m.upper() and x[3] == t)
            assert row[head.index("t")] == f"{ref.statistic:.2f}"
        for r, p in zip(res["types"], ps):  # Bonferroni across the measured types
            assert r["p_corrected"]["ttest"]["bonferroni"] == pytest.approx(min(1.0, p * len(types)), rel=1e-9)
    for row in rows:
        r = next(x for c in comp["vs_baseline"] if c["method"].upper() == row[1] for x in c["types"]
                 if x["bias_type"] == row[3])
        assert row[0].startswith("significant" if r["significant"] else "not significant"), row
        # the model card's wording; each side's own effect beside the change (baseline → model)
        assert row[0] == short_verdict(r) and row[head.index("mean effect e (t): baseline → model")] == \
            effects_text(r, ("", ""))
    over = [f"{c['method']}:{r['bias_type']}" for c in comp["vs_baseline"] for r in c["types"]
            if r["overshoot"] == "anti-stereotypical"]
    assert len(rep["tables"]["overshoots"]) == len(over)
    # method vs method: the 6 pairs of LMD, ADD, HD, CDA on religion1, in that order
    mh, mrows = rep["tables"]["method_vs_method"]
    assert [(r[1], r[2]) for r in mrows] == [("LMD", "ADD"), ("LMD", "HD"), ("LMD", "CDA"), ("ADD", "HD"),
                                             ("ADD", "CDA"), ("HD", "CDA")]
    ea, ka = zip(*[_effects(out / f"seed{s}/religion1/hd/lmb_test", "religion1") for s in (42, 43)])
    ec, kc = zip(*[_effects(out / f"seed{s}/religion1/cda/lmb_test", "religion1") for s in (42, 43)])
    keep = ka[0] & ka[1] & kc[0] & kc[1]
    ref = sps.ttest_rel((ea[0][keep] + ea[1][keep]) / 2, (ec[0][keep] + ec[1][keep]) / 2)
    assert mrows[-1][mh.index("t")] == f"{ref.statistic:.2f}"
    assert "mean effect e (t): B → A" in mh


def test_report_cut_downs_order_and_figure(tiny_study, tmp_path):
    """The data notes name every cut-down setting of the tiny study; Figure 1's n/a says what it means, its stars sit
    beyond the error-bar caps and its legend lies under the plot."""
    from rbjax.study.report import _cell, _figure1, collect, write_report

    rep = write_report([tiny_study], tmp_path / "r")
    notes = "\n".join(rep["tables"]["notes"])
    for want in ("max_steps = 2", "first 48 valid pairs", "reduced grid: batch_size [4] (paper [4, 8, 16])",
                 "lambda_d [10.0, 100.0]", "debiased only for religion1", "random GPT-2",
                 "LMP cut down: lmp_max_lines = 64", "DST cut down: max_steps = 2, max_examples = 24",
                 "CRG cut down: max_examples = 4, max_new_tokens = 8"):
        assert want in notes, want
    assert rep["incomplete"] == [] and "INCOMPLETE" not in (tmp_path / "r" / "report.md").read_text()
    fig = _figure1(collect([tiny_study]))
    (ax,) = fig.axes
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert texts[:5] == ["baseline", "LMD (debiased per type)", "ADD (debiased per type)", "HD (debiased per type)",
                         "CDA (debiased per type)"]
    assert any(t.startswith("n/a: no model was debiased for this type") for t in texts)
    assert not any("type not measured" in t for t in texts)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    assert ax.get_legend().get_window_extent(r).y1 <= ax.get_window_extent(r).y0  # under the axes
    from tests.test_plot import overlapping_texts

    assert overlapping_texts(fig) == []  # no two labels touch (tick labels, title, y label, legend, marks)
    data = collect([tiny_study])
    checked = 0
    for star in (a for a in ax.texts if (a.get_gid() or "").startswith("star:")):
        _, label, bt = star.get_gid().split(":")
        if label == "baseline":
            continue
        c = _cell(data, label.split()[0].lower(), bt, bt)
        t, sd = c["t"]["mean"], c["t"]["sd"] or 0.0
        assert star.xy[1] == pytest.approx(t + (sd if t > 0 else -sd))  # the error bar's end, not the bar's
        checked += sd > 0
    assert checked, "no starred bar with a seed spread in the tiny study"


def test_report_of_a_copied_run_counts_it_once_and_of_an_incomplete_study_says_so(tiny_study, tmp_path, capsys):
    from rbjax.study.report import write_report

    copy = tmp_path / "copy"
    shutil.copytree(tiny_study, copy)
    rep = write_report([tiny_study, copy], tmp_path / "both")
    assert len(rep["duplicates"]) == 8  # 4 methods × 2 seeds, each counted once
    assert "Seeds pooled: 2 " in (tmp_path / "both" / "report.md").read_text()
    assert "counted once" in capsys.readouterr().err
    single = write_report([tiny_study], tmp_path / "one")
    assert rep["tables"]["cross"] == single["tables"]["cross"]  # the spread is that of 2 seeds, not 4
    # a stage that did not finish: said at the top, listed
    st = json.loads((copy / "stages.json").read_text())
    del st["stages"]["seed43/religion1/cda/lmb_test"]
    (copy / "stages.json").write_text(json.dumps(st))
    shutil.rmtree(copy / "seed43/religion1/cda/lmb_test")
    assert main(["report", str(copy), "--out", str(tmp_path / "inc")]) == 0
    md = (tmp_path / "inc" / "report.md").read_text()
    top = md.split("## Figure 1")[0]
    assert "INCOMPLETE STUDY" in top and "seed43/religion1/cda/lmb_test" in top
    # another baseline cannot be pooled
    st["stages"]["baseline/lmb_test"]["key"] = "0" * 64
    (copy / "stages.json").write_text(json.dumps(st))
    assert main(["report", str(tiny_study), str(copy), "--out", str(tmp_path / "x")]) == 1
    assert "its baseline (baseline/lmb_test) is not the one of" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ release-ready models
def _front_matter(card: str) -> dict:
    import yaml

    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def test_export_of_a_study_method_carries_a_card_checkable_against_the_run(tiny_study, tmp_path, capsys):
    from rbjax.core.io import sha256_file

    out = tmp_path / "hd"
    assert main(["export", str(tiny_study / "seed42/religion1/hd"), "--out", str(out), "--license", "mit"]) == 0
    capsys.readouterr()
    run = tiny_study / "seed42/religion1/hd/sweep/selected_default"
    for f in (run / "model").iterdir():  # the model files, byte for byte
        assert sha256_file(out / f.name) == sha256_file(f)
    card = (out / "README.md").read_text()
    meta = _front_matter(card)
    assert meta["license"] == "mit" and meta["library_name"] == "transformers"
    assert {"debiasing-hd", "bias-religion1", "rbjax"} <= set(meta["tags"])
    assert "base_model" not in meta  # a local random model is no hub id: named in the text instead
    assert "random GPT-2" in card
    assert "- **Format**: debiased on raw text (the paper's format); LMB measured as raw text (the paper's format)" \
        in card  # the format the model was debiased and measured in
    # the grid point and rule of selection.json
    sel = json.loads((tiny_study / "seed42/religion1/hd/sweep/selection.json").read_text())["default"]
    assert sel["rule"] in card and f"t = {sel['dev']['t_value']:.2f}" in card
    assert f"| {sel['point']['batch_size']} | {sel['point']['grad_accum']} | {sel['point']['lambda_lm']:g} | " \
           f"{sel['point']['lambda_d']:g} |" in card
    # training data with its sha256
    cfg = json.loads((run / "config.json").read_text())
    for f in cfg["data"]["files"]:
        assert f"`{f}`: sha256 `{sha256_file(f)}`" in card
    # LMB before (study baseline) and after (the method's lmb_test) on every type, and the paired change
    before = {r["bias_type"]: r for r in json.loads((tiny_study / "baseline/lmb_test/lmb.json").read_text())}
    after = {r["bias_type"]: r for r in json.loads((tiny_study / "seed42/religion1/hd/lmb_test/lmb.json").read_text())}
    comp = json.loads((out / "evidence" / "compare.json").read_text())
    from rbjax.lmb.compare import compare_runs, effects_text, fmt_change, short_verdict

    ref = compare_runs(tiny_study / "seed42/religion1/hd/lmb_test", tiny_study / "baseline/lmb_test")
    assert "| bias type | before | after | mean e (t): before → after | change [" in card
    for t in before:
        line = next(ln for ln in card.splitlines() if ln.startswith(f"| {t}"))
        assert f"t = {before[t]['t_value']:.2f}, p = {before[t]['p_value']:.2g}" in line.split("|")[2]
        assert f"t = {after[t]['t_value']:.2f}, p = {after[t]['p_value']:.2g}" in line.split("|")[3]
        c = next(r for r in comp["types"] if r["bias_type"] == t)
        r = next(r for r in ref["types"] if r["bias_type"] == t)
        assert c["mean_change"] == pytest.approx(r["mean_change"]) and fmt_change(r["mean_change"]) in line
        cells = [x.strip() for x in line.split("|")]
        # each model's own effect beside the change, and the report's wording of the verdict (toward / past / away
        # from zero)
        assert cells[4] == effects_text(r, ("", "")) and cells[7] == short_verdict(r)
        assert cells[7].startswith("significant: " if r["significant"] else "not significant")
    # dialog checks of the model and of the base model
    lmp = json.loads((tiny_study / "seed42/religion1/hd/dialog/lmp.json").read_text())["metrics"]["perplexity"]
    base_lmp = json.loads((tiny_study / "baseline/dialog/lmp.json").read_text())["metrics"]["perplexity"]
    # the LMP of 64 lines (tiny.toml's lmp_max_lines) said as such, in the table and for the grid point
    assert f"| this model | {lmp:.3f} (on the first 64 lines only) |" in card
    assert f"| base model | {base_lmp:.3f} (on the first 64 lines only) |" in card
    assert f"LMP of the point: {sel['lmp']:.2f} (on the first 64 lines only); within the LMP budget" in card
    numbers = json.loads((out / "export.json").read_text())
    assert numbers["lmb_after"]["records"] == list(after.values())
    assert "max_steps = 2" in card and "rbjax 0.1.0" in card
    # a non-empty --out is refused
    assert main(["export", str(tiny_study / "seed42/religion1/hd"), "--out", str(out)]) == 1
    assert "is not an empty folder" in capsys.readouterr().err


def test_export_of_a_single_run_and_a_sweeps_other_rule(tiny_study, tmp_path, capsys):
    # CDA: one run (no grid)
    assert main(["export", str(tiny_study / "seed43/religion1/cda/run"), "--out", str(tmp_path / "cda")]) == 0
    card = (tmp_path / "cda" / "README.md").read_text()
    assert "No grid: one run" in card and "CDA — counterfactual data augmentation" in card
    assert _front_matter(card)["license"] == "other"
    # the sweep's point of the other rule: only if it was retrained; else a clear error
    sweep = tiny_study / "seed42/religion1/lmd/sweep"
    code = main(["export", str(sweep), "--rule", "reference", "--out", str(tmp_path / "ref")])
    if (sweep / "selected_reference").is_dir():
        assert code == 0
    else:
        assert code == 1 and "was not retrained and exported" in capsys.readouterr().err
    assert main(["export", str(tiny_study / "baseline"), "--out", str(tmp_path / "no")]) == 1
    assert "not a debiasing run" in capsys.readouterr().err


LLAMA_STUDY = """
[study]
name = "a Llama-architecture study"
random_model = { model_type = "llama", vocab_size = 50257, hidden_size = 32, intermediate_size = 64, num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, max_position_embeddings = 128, tie_word_embeddings = false, bos_token_id = 50256, eos_token_id = 50256, seed = 0 }
bias_types = ["religion1"]
debias_types = ["religion1"]
methods = ["hd"]
seeds = [42]
[training]
epochs = 1
max_steps = 1
layout = "padded"
lmp_max_lines = 16
[sweep]
methods = ["hd"]
batch_size = [4]
grad_accum = [1]
lambda_lm = [0.01]
lambda_d = [10.0, 100.0]
n_bootstrap = 0
dev_max_pairs = 16
[measure]
n_bootstrap = 0
[dialog]
tasks = ["crg"]
crg = { max_examples = 2, max_new_tokens = 4, greedy = true, meteor = false }
"""


def test_a_study_of_a_llama_architecture_model(shared_dir, tmp_path):
    """`rbjax run` on a study file naming a non-GPT-2 model (a random Llama: grouped-query attention, untied head):
    the HD sweep's grid points, the retrained selection, the test-split LMB of both models and CRG generation with
    the grouped-query KV cache all run, and the report names the model family."""
    study = tmp_path / "llama.toml"
    study.write_text(LLAMA_STUDY)
    out = tmp_path / "run"
    offline = [a for a in _offline(shared_dir) if "multiwoz" not in a and a != "--set"]
    sets = [x for v in offline for x in ("--set", v)]
    assert main(["run", str(study), "--out", str(out), "--no-progress", *sets]) == 0
    stages = _stages(out)
    assert all(v["status"] == "done" for v in stages.values())
    assert {"baseline/lmb_test", "seed42/sweeps", "seed42/religion1/hd/lmb_test", "seed42/religion1/hd/dialog"} \
        <= set(stages)
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_key_value_heads"] == 2
    crg = json.loads((out / "seed42" / "religion1" / "hd" / "dialog" / "crg.json").read_text())
    assert crg["generation"]["n_generated"] == 2
    assert json.loads((out / "seed42" / "religion1" / "hd" / "lmb_test" / "lmb.json").read_text())[0]["n_pairs"] > 0
    assert "the starting model is a random llama model" in (out / "report.md").read_text()
