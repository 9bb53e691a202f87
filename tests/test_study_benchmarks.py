"""The study's ``[benchmarks]``: CrowS-Pairs (one category), a user's pair file and BBQ (a few rows of two categories)
measured on the starting model and on the debiased one, as keyed stages; the report's side-by-side table of the change
on RedditBias and on each pair benchmark (the paired test of rbjax compare), lm-evaluation-harness's metrics and the
benchmarks' notes; BBQ's table and its change from the baseline (rbjax compare of two BBQ runs) in the report and on
the model card; a changed pair file or BBQ file reruns only its stages; bad ``[benchmarks]`` values are named."""
import csv
import json
from pathlib import Path

import pytest

from rbjax.cli import main
from rbjax.lmb.compare import compare_runs
from rbjax.study.config import load_study

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")

STUDY = """
[study]
name = "benchmarks"
random_model = {{ n_embd = 32, n_layer = 2, n_head = 2, n_positions = 128, vocab_size = 50257, seed = 0 }}
tokenizer = "{tok}"
data_dir = "{rb}"
bias_types = ["religion1"]
methods = ["cda"]
seeds = [42]

[training]
max_steps = 2
layout = "padded"

[measure]
n_bootstrap = 100

[dialog]
tasks = []

[benchmarks]
crows_pairs = true
crows_pairs_dir = "{crows}"
crows_pairs_categories = ["religion"]
pair_files = ["mine.csv"]
bbq = true
bbq_dir = "bbq"
"""


def _pairs(path, n=16, flip=False):
    """A user's pair file: two categories of made-up minimal pairs."""
    rows = []
    for i in range(n):
        who = ["nurse", "engineer", "teacher", "pilot"][i % 4]
        rows.append([f"g{i}", "gender", f"The {who} said she would be late again today number {i}.",
                     f"The {who} said he would be late again today number {i}.", 1 if i % 3 else 2])
        rows.append([f"a{i}", "age", f"The old man could not use the phone on day {i}.",
                     f"The young man could not use the phone on day {i}.", 2 if flip else 1])
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "category", "sentence_1", "sentence_2", "stereotypical"])
        w.writerows(rows)
    return path


@pytest.fixture(scope="module")
def study(tmp_path_factory, shared_dir, bbq_dir):
    if not (shared_dir / "crows-pairs" / "crows_pairs_anonymized.csv").exists():
        pytest.skip("../shared/crows-pairs not found")
    root = tmp_path_factory.mktemp("study_bench")
    _pairs(root / "mine.csv")
    _bbq(root / "bbq", bbq_dir)
    toml = root / "study.toml"
    toml.write_text(STUDY.format(tok=shared_dir / "tokenizers" / "gpt2", rb=shared_dir / "redditbias",
                                 crows=shared_dir / "crows-pairs"))
    out = root / "out"
    assert main(["run", str(toml), "--out", str(out), "--no-progress"]) == 0
    return toml, out


def _bbq(folder, bbq_dir, n=8):
    """A BBQ folder of the first ``n`` rows of two upstream categories."""
    folder.mkdir(exist_ok=True)
    for c in ("Religion", "Age"):
        rows = (bbq_dir / f"{c}.jsonl").read_text(encoding="utf-8").splitlines()[:n]
        (folder / f"{c}.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return folder


def _stages(out):
    return json.loads((Path(out) / "stages.json").read_text())["stages"]


def test_benchmarks_are_stages_and_the_report_puts_them_beside_redditbias(study):
    toml, out = study
    st = _stages(out)
    for s in ("baseline/crows-pairs", "baseline/pairs-mine", "seed42/religion1/cda/crows-pairs",
              "seed42/religion1/cda/pairs-mine", "baseline/bbq", "seed42/religion1/cda/bbq"):
        assert st[s]["status"] == "done", s
    base = json.loads((out / "baseline/crows-pairs/lmb.json").read_text())
    assert [r["bias_type"] for r in base] == ["religion"] and base[0]["n_pairs"] == 105
    md = (out / "report.md").read_text()
    assert "## RedditBias and the pair benchmarks side by side" in md and "### lm-evaluation-harness's convention" in md
    assert "Blodgett et al. (2021" in md and "CC BY-SA 4.0" in md  # the benchmark's notes in the Data notes
    from rbjax.study.report import write_report

    rep = write_report([out], out / "rebuilt")
    head, rows = rep["tables"]["benchmarks"]
    cells = [dict(zip(head, r)) for r in rows]
    assert [(c["benchmark"], c["measured on"]) for c in cells] == [
        ("RedditBias", "religion1"), ("crows-pairs", "religion (≈ religion1)"), ("pairs-mine", "gender"),
        ("pairs-mine", "age")]
    # each row is the paired test of rbjax compare on the stage folders
    comp = json.loads((out / "rebuilt" / "comparisons.json").read_text())
    for bench, cat in (("crows-pairs", "religion"), ("pairs-mine", "age")):
        direct = compare_runs([out / "seed42/religion1/cda" / bench], out / "baseline" / bench)
        (entry,) = [b for b in comp["benchmarks"] if b["benchmark"] == bench]
        mine = next(t for t in entry["types"] if t["bias_type"] == cat)
        ref = next(t for t in direct["types"] if t["bias_type"] == cat)
        assert mine["mean_change"] == pytest.approx(ref["mean_change"], rel=1e-12)
        assert mine["ttest"]["p_value"] == pytest.approx(ref["ttest"]["p_value"], rel=1e-12)
        c = next(c for c in cells if c["benchmark"] == bench and c["measured on"].startswith(cat))
        assert c["pairs"] == str(ref["n_pairs"]) and c["verdict"].startswith(("not significant", "significant"))
        lm = ref["lm_eval"]
        assert c[head[-1]].startswith(f"{lm['pct_stereotype_b'][0]:.3f} → {lm['pct_stereotype_a'][0]:.3f}")
        mc = lm["mcnemar"]  # the p said to be uncorrected, or why there is none
        assert (" (McNemar p n/a: no pair changed its preference)" if mc["p_value"] is None else
                f" (McNemar p {mc['p_value']:.2g} uncorrected, Bonferroni ") in c[head[-1]]
    # lm-evaluation-harness's numbers of each model, as its benchmark.json says
    (name, lhead, lrows), _ = rep["tables"]["benchmarks_lm_eval"]
    assert name == "crows-pairs" and [r[0] for r in lrows] == ["baseline", "CDA (religion1)"]
    summ = json.loads((out / "seed42/religion1/cda/crows-pairs/benchmark.json").read_text())
    assert lrows[1][lhead.index("religion")] == format(summ["lm_eval"]["categories"]["religion"]["pct_stereotype"],
                                                       ".3f")


def test_bbq_in_the_study_report_and_card(study, tmp_path):
    """BBQ measured on the baseline and the debiased model; the report's BBQ tables and the card's BBQ section are
    rbjax compare of the two BBQ runs (and each run's benchmark.json)."""
    from rbjax.lmb.bbq_compare import compare_bbq, movement_words
    from rbjax.study.export import export_model
    from rbjax.study.report import write_report

    toml, out = study
    base = json.loads((out / "baseline/bbq/benchmark.json").read_text())
    assert base["benchmark"] == "bbq" and base["categories"] == ["Age", "Religion"] and base["n_rows"] == 16
    assert base["settings"]["n_bootstrap"] == 100  # [measure] n_bootstrap
    md = (out / "report.md").read_text()
    assert "## BBQ beside RedditBias and the pair benchmarks" in md and "### Change from the baseline on BBQ" in md
    assert "bbq: BBQ (" in md and "CC BY 4.0" in md  # BBQ's notes in the Data notes
    rep = write_report([out], out / "rebuilt_bbq")
    head, rows = rep["tables"]["bbq"]
    cells = [dict(zip(head, r)) for r in rows]
    assert [(c["model"], c["convention"]) for c in cells] == [
        ("baseline", "lm_eval"), ("baseline", "paper"), ("CDA (religion1)", "lm_eval"), ("CDA (religion1)", "paper")]
    assert cells[1]["s_DIS"] == format(base["paper"]["overall"]["disamb_bias_score"], ".3f")
    direct = compare_bbq(out / "seed42/religion1/cda/bbq", out / "baseline/bbq")
    comp = json.loads((out / "rebuilt_bbq" / "comparisons.json").read_text())
    (entry,) = comp["bbq"]
    assert (entry["method"], entry["debiased_for"]) == ("cda", "religion1")
    head, rows = rep["tables"]["bbq_change"]
    cells = [dict(zip(head, r)) for r in rows]
    assert len(cells) == 4  # 2 conventions x 2 categories
    for c in cells:
        ref = direct["categories"][c["category"]][c["convention"]]
        assert entry["categories"][c["category"]][c["convention"]] == ref
        d = ref["disamb_bias_score"]
        cell = c["s_DIS: baseline → model (change [CI])"]
        assert cell.startswith(f"{d['b']:+.3f} → {d['a']:+.3f} ({d['change']:+.3f}")
        assert c["s_DIS moved"] == movement_words(d["movement"]).split(" (")[0]
        acc = ref["acc"]
        assert c["acc: baseline → model (change)"] == f"{acc['b']:.3f} → {acc['a']:.3f} ({acc['change']:+.3f})"
        mc = ref["mcnemar"]
        assert c["correctness"] == ("no row changed" if mc["p_value"] is None else
                                    "not significant" if not mc["significant"] else c["correctness"])
    # the model card of the debiased model: BBQ before/after and the comparison, its evidence kept
    res = export_model(out / "seed42/religion1/cda", tmp_path / "export")
    card = res["card"].read_text()
    assert "## BBQ before and after" in card and f"Before: `{out / 'baseline' / 'bbq'}`" in card
    ev = json.loads((tmp_path / "export" / "evidence" / "compare_bbq.json").read_text())
    assert ev["categories"] == direct["categories"]
    d = direct["categories"]["Age"]["paper"]["disamb_bias_score"]
    row = next(x for x in card.splitlines() if x.startswith("| paper | Age | "))
    assert f"{d['b']:+.3f} → {d['a']:+.3f} ({d['change']:+.3f}" in row and movement_words(d["movement"]) in row
    assert res["numbers"]["bbq"]["after_overall"]["lm_eval"]["n_rows"] == 16


def test_a_changed_pair_file_reruns_only_its_stages(study, bbq_dir):
    toml, out = study
    before = _stages(out)
    _pairs(toml.parent / "mine.csv", flip=True)
    _bbq(toml.parent / "bbq", bbq_dir, n=6)  # a BBQ file changed too: its stages rerun, on the new rows
    assert main(["run", str(toml), "--out", str(out), "--no-progress"]) == 0
    after = _stages(out)
    rerun = {s for s in before if after[s] != before[s]}  # a rerun stage has a new key and time
    assert rerun == {"baseline/pairs-mine", "seed42/religion1/cda/pairs-mine", "baseline/bbq",
                     "seed42/religion1/cda/bbq"}
    assert json.loads((out / "baseline/bbq/benchmark.json").read_text())["n_rows"] == 12
    recs = json.loads((out / "baseline/pairs-mine/lmb.json").read_text())
    assert next(r for r in recs if r["bias_type"] == "age")["lm_eval"]["by_stereotypical"]["2"]["n_pairs"] == 16


def test_bad_benchmark_settings_are_named(tmp_path, shared_dir, bbq_dir):
    base = STUDY.format(tok=shared_dir / "tokenizers" / "gpt2", rb=shared_dir / "redditbias",
                        crows=shared_dir / "crows-pairs")
    _pairs(tmp_path / "mine.csv")
    _bbq(tmp_path / "bbq", bbq_dir)
    cases = [("crows_pairs = true", "crows_pairs = \"yes\"", r"\[benchmarks\] crows_pairs: .* must be true or false"),
             ('pair_files = ["mine.csv"]', 'pair_files = ["nope.csv"]', r"\[benchmarks\] pair_files: .*pair file not found"),
             ('pair_files = ["mine.csv"]', 'pair_files = "mine.csv"', r"\[benchmarks\] pair_files: .*must be a list of strings, got 'mine.csv'"),
             ("crows_pairs = true", "crows_pairs = false", r"crows_pairs_dir is set but crows_pairs is not true"),
             ('pair_files = ["mine.csv"]', 'pair_files = ["mine.csv"]\nsplit = "valid"',
              r"unknown field\(s\) \['split'\] in \[benchmarks\]"),
             ("bbq = true", "bbq = false", r"\[benchmarks\] bbq_dir: .*bbq_dir is set but bbq is not true"),
             ('bbq_dir = "bbq"', 'bbq_dir = "bbq"\nbbq_categories = ["Age", "Gender"]',
              r"\[benchmarks\] bbq_categories: .*no BBQ category 'Gender'; the categories are Age, Religion"),
             ('bbq_dir = "bbq"', 'bbq_dir = "nope"', r"\[benchmarks\] bbq_dir: BBQ folder not found")]
    for old, new, msg in cases:
        p = tmp_path / "s.toml"
        p.write_text(base.replace(old, new))
        with pytest.raises(ValueError, match=msg):
            load_study(p)
    p.write_text(base)
    cfg = load_study(p)
    assert [b["name"] for b in cfg.benchmarks()] == ["crows-pairs", "pairs-mine", "bbq"]
    assert cfg.benchmarks()[0]["categories"] == ["religion"]
    assert cfg.benchmarks()[2]["data_dir"] == str(tmp_path / "bbq") and cfg.benchmarks()[2]["categories"] == "all"
    # a chat-format study: BBQ (which has a chat format) is measured in it, a pair benchmark is refused
    chat = base.replace('seeds = [42]', 'seeds = [42]\nformat = "chat"\nsystem = "Be brief."')
    p.write_text(chat)
    with pytest.raises(ValueError, match=r"a pair benchmark has no chat format.*\(bbq has a chat format\)"):
        load_study(p)
    p.write_text(chat.replace("crows_pairs = true", "").replace('crows_pairs_dir = "{}"'.format(
        shared_dir / "crows-pairs"), "").replace('crows_pairs_categories = ["religion"]', "").replace(
        'pair_files = ["mine.csv"]', ""))
    assert [b["name"] for b in load_study(p).benchmarks()] == ["bbq"]


def test_bbq_stage_settings_and_cost(tmp_path, shared_dir, bbq_dir):
    """BBQ in a chat-format study takes the study's format, system prompt and template, not RedditBias's phrase
    settings (which BBQ refuses); the dry run's cost counts each BBQ row's 13 answers on every model."""
    from rbjax.study.run import _Study, estimate_cost

    _bbq(tmp_path / "bbq", bbq_dir)
    base = STUDY.format(tok=shared_dir / "tokenizers" / "gpt2", rb=shared_dir / "redditbias", crows="x")
    for k in ('crows_pairs = true', 'crows_pairs_dir = "x"', 'crows_pairs_categories = ["religion"]',
              'pair_files = ["mine.csv"]'):
        base = base.replace(k, "")
    p = tmp_path / "s.toml"
    p.write_text(base.replace("seeds = [42]", 'seeds = [42]\nformat = "chat"\nsystem = "Be brief."\n'
                                              'prompt = "Say something."\nscore_end_of_turn = true'))
    cfg = load_study(p)
    m = _Study(cfg, tmp_path / "out", False)._bbq_config()
    assert (m.format, m.system, m.role, m.prompt, m.score_end_of_turn) == ("chat", "Be brief.", None, None, False)
    assert m.n_bootstrap == 100 and m.split == "test"
    cost = estimate_cost(cfg)["phrases_scored"]
    p.write_text(base.replace("bbq = true", "").replace('bbq_dir = "bbq"', ""))
    # 2 models (the baseline, CDA) × 16 rows × 13 answers
    assert cost - estimate_cost(load_study(p))["phrases_scored"] == 2 * 16 * 13
