"""The study report: ``report.md`` and a self-contained ``report.html`` (figures embedded) from finished study folders.

What it holds (paper §5, Figure 1, Tables 3–5):

* **Completeness**: a study with stages that did not finish says so at the top and lists them.
* **Figure 1**: LMB t-value per bias type for the starting model and for each method (the model debiased for that
  bias type), mean over seeds with the seed standard deviation as error bars, the two-tailed significance threshold,
  and the stereotypical (t < 0) / anti-stereotypical (t > 0) directions marked.
* **Table 3 shape**: t and p per bias type for the baseline and each method (mean ± sd over seeds, the per-seed
  values, how many seeds are significant), the paired Cohen's d and the bootstrap CI of the mean log-perplexity
  difference (each model tested against zero).
* **Change from the baseline** and **method vs method**: every statement that a model changed (or did not) is the
  paired test of :mod:`rbjax.lmb.compare` on the same pairs — the per-pair bias effect averaged over seeds, the seed
  spread of the mean change beside it, p-values corrected across the types compared; "not significant" is said first;
  each side's own mean effect beside the change, and the verdict says whether the bias moved toward zero, past zero
  or away from it (:func:`rbjax.lmb.compare.short_verdict`, the model card's wording too).
* **Cross-type effects**: every debiased model measured on every bias type (does fixing one bias move another?).
* **Anti-stereotypical overshoots** (§5.2): a significant change from the baseline past zero into the
  anti-stereotypical direction (the debiased model is significantly anti-stereotypical on the same pairs, the
  baseline was not).
* **Pair benchmarks beside RedditBias** (``[benchmarks]``: CrowS-Pairs, pair files): per debiased model, the paired
  change on the RedditBias type it was debiased for and on every category of each benchmark, side by side (does
  debiasing on RedditBias move CrowS-Pairs?), and lm-evaluation-harness's ``pct_stereotype`` of every model; the
  benchmarks' notes (CrowS-Pairs' licence and reliability warning) in the data notes.
* **BBQ beside them** (``[benchmarks] bbq``): the accuracies and bias scores (s_DIS, s_AMB) of every model in both
  conventions, and per debiased model and seed the change from the baseline per category
  (:func:`rbjax.lmb.bbq_compare.compare_bbq`: the exact McNemar test of the per-row correctness, Bonferroni across
  the categories; each bias score baseline → model with its paired bootstrap CI and whether it moved toward zero,
  past zero or away).
* **Dialog quality** (Tables 4–5): LMP, DST F1/accuracy, CRG BLEU-4, NIST-2, METEOR, entropy-4, dist-2, length
  (a Self-Debias model: LMP and CRG with the rescaled distribution, DST n/a — its classifier never reads the
  next-token distribution —, said in the notes; a study folder without its dialog stage: "not evaluated").
* **Data notes**: every setting that cuts the study down from the paper's (training steps, the dev pairs of the
  selection, a reduced grid, LMP/DST/CRG cut-downs), what stood in for an official split, un-fine-tuned CRG.
* **Settings and package versions** of every folder.

Every number is read from the stage result files (``lmb.json``, ``<type>_perplexities.csv``, ``<task>.json``); the
paired comparisons are computed from the per-pair perplexities and written to ``comparisons.json``.
``rbjax report DIR [DIR ...]`` rebuilds the report from study folders (several folders: their seeds are pooled; the
same stage in two folders — a copied run — is counted once). Methods appear in one order everywhere: LMD, ADD, HD, CDA,
then the methods without training (SentenceDebias, INLP, Self-Debias: :data:`METHOD_ORDER`).
"""
from __future__ import annotations

import base64
import dataclasses
import html
import io
import json
import math
import statistics
from pathlib import Path
from typing import Any

from rbjax.core.config import leaves
from rbjax.core.io import atomic_file, atomic_write_json, atomic_write_text, check_output_dir, read_json
from rbjax.core.log import get_logger
from rbjax.core.reuse import claim_outputs, record_outputs
from rbjax.debias.config import DebiasRun
from rbjax.debias.sweep import PAPER_GRID
from rbjax.lmb.compare import compare_runs, effects_text, fmt_change, json_ready, load_run, short_verdict
from rbjax.lmb.pair_benchmark import SUMMARY_FILE
from rbjax.lmb.plot import figure_lmb
from rbjax.lmb.bbq import CONVENTIONS as BBQ_CONVENTIONS
from rbjax.lmb.bbq_compare import compare_bbq, is_bbq_run, movement_words
from rbjax.specs import BIAS_TYPES
from rbjax.train.config import AdapterConfig

__all__ = ["collect", "write_report", "random_model_name", "DIALOG_COLUMNS"]

log = get_logger("report")


def random_model_name(random_model: dict) -> str:
    """How a report or model card names a study's ``[study.random_model]``: ``GPT-2``, or its ``model_type``."""
    t = random_model.get("model_type", "gpt2")
    return "GPT-2" if t == "gpt2" else f"{t} model"


#: dialog table columns: (header, task, path into the task's "metrics")
DIALOG_COLUMNS = [
    ("LMP", "lmp", ("perplexity",)),
    ("DST F1", "dst", ("f1",)),
    ("DST acc", "dst", ("accuracy",)),
    ("BLEU-4", "crg", ("bleu", 3)),
    ("NIST-2", "crg", ("nist", 1)),
    ("METEOR", "crg", ("meteor",)),
    ("entropy-4", "crg", ("entropy", 3)),
    ("dist-2", "crg", ("dist", 1)),
    ("avg len", "crg", ("avg_len",)),
]
METHOD_NAMES = {"lmd": "LMD", "add": "ADD", "hd": "HD", "cda": "CDA", "lm": "LM", "sentence-debias": "SentenceDebias",
                "inlp": "INLP", "self-debias": "Self-Debias"}
#: the order of the methods in every table: the paper's four, the LM control, then the methods without training
METHOD_ORDER = ["lmd", "add", "hd", "cda", "lm", "sentence-debias", "inlp", "self-debias"]
#: what the dialog table says of a Self-Debias model without dialog results (a study whose [dialog] tasks are DST
#: alone, which does not apply to it, or a folder made before its LMP and CRG were implemented)
NOT_EVALUATED = "not evaluated: no LMP or CRG result (DST does not apply to Self-Debias)"
#: the note on Self-Debias's dialog quality
SELF_DEBIAS_DIALOG = ("Self-Debias: LMP scored with the self-debiased log-likelihoods and CRG generated from the "
                      "self-debiased distribution; DST does not apply (its classifier never reads the next-token "
                      "distribution, which is all Self-Debias rescales: it would be the base model's DST)")


def _dig(d, path):
    for k in path:
        if d is None:
            return None
        try:
            d = d[k]
        except (KeyError, IndexError, TypeError):
            return None
    return d if isinstance(d, (int, float)) and not isinstance(d, bool) else None


def _planned_stages(st: dict) -> list[str] | None:
    """The stage names a study folder planned, as ``rbjax run`` records them in ``study.json`` (``None`` for a
    folder written before it did: completeness is then unknown, and the report says so)."""
    return [str(x) for x in st["stages"]] if isinstance(st.get("stages"), list) else None


def collect(folders: list[Path]) -> dict:
    """Everything the report shows, read from study folders.

    Returns:
        ``{"baseline": {"lmb": records, "dialog": {task: result}, "folder": lmb_test folder}, "runs": {(method,
        debiased_type): {seed label: {"lmb": records, "dialog": {...}, "selection": ..., "folder": lmb_test folder}}},
        "studies": [study.json ...], "missing": {folder: [stage names not finished] | None}, "duplicates": [message
        ...]}``. A stage found in two folders with the same key (a copied run) is counted once (``duplicates``).

    Raises:
        FileNotFoundError: a folder without ``study.json`` or a baseline ``lmb.json``.
        ValueError: folders whose baselines differ (their seeds cannot be pooled against one baseline).
    """
    out: dict[str, Any] = {"baseline": None, "runs": {}, "studies": [], "folders": [str(f) for f in folders],
                           "missing": {}, "duplicates": [], "benchmarks": {}, "bbq": {"baseline": None, "runs": {}}}
    seen: dict[str, str] = {}  # stage key → where it was first found
    base_key = None
    names = [Path(f).name for f in folders]
    for i, f in enumerate(folders):
        f = Path(f)
        st = read_json(f / "study.json")
        if st is None:
            raise FileNotFoundError(f"{f}: no study.json (is it an 'rbjax run' output folder?)")
        st = {**st, "folder": str(f)}
        out["studies"].append(st)
        done = {k: v for k, v in (read_json(f / "stages.json", {}) or {}).get("stages", {}).items()
                if isinstance(v, dict) and v.get("status") == "done"}
        planned = _planned_stages(st)
        out["missing"][str(f)] = None if planned is None else [n for n in planned if n not in done]
        base = read_json(f / "baseline" / "lmb_test" / "lmb.json")
        if base is None:
            raise FileNotFoundError(f"{f}: no baseline/lmb_test/lmb.json (the study has not measured its baseline)")
        bk = (done.get("baseline/lmb_test") or {}).get("key")
        if out["baseline"] is None:
            out["baseline"] = {"lmb": base, "dialog": _dialog(f / "baseline" / "dialog"),
                               "folder": f / "baseline" / "lmb_test"}
            base_key = bk
        elif bk != base_key:
            raise ValueError(f"{f}: its baseline (baseline/lmb_test) is not the one of {folders[0]} (the stage keys "
                                 "differ: another starting model, data or measure settings); the seeds of these "
                                 "folders cannot be pooled against one baseline — report them separately")
        label = f.name if names.count(f.name) == 1 else f"{f.name}#{i + 1}"
        for bd in _benchmark_dirs(f / "baseline"):
            b = out["benchmarks"].setdefault(bd.name, {"baseline": None, "runs": {}})
            b["baseline"] = b["baseline"] or bd
        if is_bbq_run(f / "baseline" / "bbq"):
            out["bbq"]["baseline"] = out["bbq"]["baseline"] or f / "baseline" / "bbq"
        for sd in sorted(f.glob("seed*")):
            if not sd.is_dir():
                continue
            seed = sd.name[4:]
            for td in sorted(p for p in sd.iterdir() if p.is_dir()):
                for md in sorted(p for p in td.iterdir() if p.is_dir()):
                    lmb = read_json(md / "lmb_test" / "lmb.json")
                    if lmb is None:
                        continue
                    stage = f"seed{seed}/{td.name}/{md.name}/lmb_test"
                    key = (done.get(stage) or {}).get("key")
                    if key is not None and key in seen:
                        out["duplicates"].append(
                            f"{f / stage} is the same stage as {seen[key]} (same key: the same model measured the "
                            "same way, e.g. a copied run): counted once")
                        continue
                    if key is not None:
                        seen[key] = str(f / stage)
                    sel = read_json(md / "sweep" / "selection.json")
                    entry = {"lmb": lmb, "dialog": _dialog(md / "dialog"), "selection": sel,
                             "folder": md / "lmb_test"}
                    out["runs"].setdefault((md.name, td.name), {})[f"{label}:{seed}"] = entry
                    for bd in _benchmark_dirs(md):
                        b = out["benchmarks"].setdefault(bd.name, {"baseline": None, "runs": {}})
                        b["runs"].setdefault((md.name, td.name), {})[f"{label}:{seed}"] = bd
                    if is_bbq_run(md / "bbq"):
                        out["bbq"]["runs"].setdefault((md.name, td.name), {})[f"{label}:{seed}"] = md / "bbq"
    return out


def _benchmark_dirs(folder: Path) -> list[Path]:
    """The finished pair-benchmark stages in a model's folder ([benchmarks]: ``crows-pairs``, ``pairs-<stem>``)."""
    if not folder.is_dir():
        return []
    return [d for d in sorted(folder.iterdir()) if d.is_dir() and (d / SUMMARY_FILE).is_file()
            and (d / "lmb.json").is_file()]


def _dialog(folder: Path) -> dict:
    res = {}
    for task in ("lmp", "dst", "crg"):
        r = read_json(folder / f"{task}.json")
        if r is not None:
            res[task] = r
    return res


# ------------------------------------------------------------------------------------------------ aggregation
def _stats(values: list[float | None]) -> dict:
    v = [x for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))]
    if not v:
        return {"mean": None, "sd": None, "n": 0, "values": values}
    return {"mean": statistics.fmean(v), "sd": statistics.stdev(v) if len(v) > 1 else None, "n": len(v),
            "values": values}


def _rec(records: list[dict], bias_type: str) -> dict | None:
    return next((r for r in records if r["bias_type"] == bias_type), None)


def _fmt(x, f=".2f") -> str:
    return "n/a" if x is None else format(x, f)


def _ms(s: dict, f=".2f") -> str:
    if s["mean"] is None:
        return "n/a"
    return _fmt(s["mean"], f) + ("" if s["sd"] is None else f" ± {_fmt(s['sd'], f)}")


def _alpha(data: dict) -> float:
    r = data["baseline"]["lmb"][0]
    return float((r.get("settings") or {}).get("alpha") or 0.05)


def _cell(data: dict, method: str, debiased: str, measured: str) -> dict:
    seeds = data["runs"].get((method, debiased), {})
    recs = [_rec(e["lmb"], measured) for e in seeds.values()]
    recs = [r for r in recs if r is not None]
    alpha = _alpha(data)
    return {"t": _stats([r.get("t_value") for r in recs]), "p": [r.get("p_value") for r in recs],
            "n_sig": sum(1 for r in recs if r.get("p_value") is not None and r["p_value"] < alpha),
            "d": _stats([r.get("cohens_d_paired") for r in recs]),
            "ci": [r.get("mean_log_ppl_diff_ci") for r in recs], "n": len(recs), "records": recs}


def _types(data: dict) -> list[str]:
    return [r["bias_type"] for r in data["baseline"]["lmb"]]


def _methods(data: dict) -> list[str]:
    ms = {m for m, _ in data["runs"]}
    return [m for m in METHOD_ORDER if m in ms] + sorted(ms - set(METHOD_ORDER))


def _debiased(data: dict) -> list[str]:
    ds = {t for _, t in data["runs"]}
    return [t for t in _types(data) if t in ds] + sorted(ds - set(_types(data)))


# ----------------------------------------------------------------------------------------------------- figure
def _figure1(data: dict):

    types = _types(data)
    series = {"baseline": data["baseline"]["lmb"]}
    for m in _methods(data):
        recs = []
        for b in types:
            c = _cell(data, m, b, b)
            if c["n"]:
                r0 = c["records"][0]
                ps = [p for p in c["p"] if p is not None]
                recs.append({**r0, "t_value": c["t"]["mean"], "t_sd": c["t"]["sd"],
                             "p_value": statistics.median(ps) if ps else None})
        series[f"{METHOD_NAMES.get(m, m)} (debiased per type)"] = recs
    return figure_lmb(series, title="Figure 1: LMB t per bias type (test split; mean over seeds, error bar = seed sd)",
                      na_label="n/a: no model was debiased for this type (see the cross-type tables)",
                      legend_below=True)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=130, bbox_inches="tight")
    return buf.getvalue()


# ----------------------------------------------------------------------------------------------------- tables
def _table3(data: dict) -> tuple[list[str], list[list[str]]]:
    types = _types(data)
    head = ["model"] + types
    rows = [["baseline"] + [f"{_fmt(r['t_value'])} (p {_fmt(r['p_value'], '.2g')}){' *' if r.get('significant') else ''}"
                            if (r := _rec(data["baseline"]["lmb"], b)) else "n/a" for b in types]]
    for m in _methods(data):
        row = [METHOD_NAMES.get(m, m)]
        for b in types:
            c = _cell(data, m, b, b)
            if not c["n"]:
                row.append("n/a")
                continue
            ps = ", ".join(_fmt(p, ".2g") for p in c["p"])
            row.append(f"{_ms(c['t'])} (p {ps}; {c['n_sig']}/{c['n']} sig.)")
        rows.append(row)
    return head, rows


def _effects(data: dict) -> tuple[list[str], list[list[str]]]:
    types = _types(data)
    levels = {r.get("ci_level") for b in types for r in [_rec(data["baseline"]["lmb"], b)] if r} | {
        r.get("ci_level") for m in _methods(data) for b in _debiased(data) for r in _cell(data, m, b, b)["records"]}
    levels.discard(None)
    head = ["model", "bias type", "n pairs kept", "t (per seed)", "Cohen's d (paired)", "mean log-ppl diff",
            f"{100 * levels.pop():.4g}% CI" if len(levels) == 1 else "CI (level 1 − alpha of each record)"]
    rows = []
    for b in types:
        r = _rec(data["baseline"]["lmb"], b)
        if r:
            ci = r.get("mean_log_ppl_diff_ci")
            rows.append(["baseline", b, str(r.get("n_pairs_after_outliers")), _fmt(r.get("t_value")),
                         _fmt(r.get("cohens_d_paired"), ".3f"), _fmt(r.get("mean_log_ppl_diff"), ".4f"),
                         "n/a" if not ci else f"[{_fmt(ci[0], '.4f')}, {_fmt(ci[1], '.4f')}]"])
    for m in _methods(data):
        for b in _debiased(data):
            c = _cell(data, m, b, b)
            if not c["n"]:
                continue
            rows.append([METHOD_NAMES.get(m, m), b, ", ".join(str(r.get("n_pairs_after_outliers")) for r in c["records"]),
                         ", ".join(_fmt(r.get("t_value")) for r in c["records"]), _ms(c["d"], ".3f"),
                         ", ".join(_fmt(r.get("mean_log_ppl_diff"), ".4f") for r in c["records"]),
                         "; ".join("n/a" if not ci else f"[{_fmt(ci[0], '.4f')}, {_fmt(ci[1], '.4f')}]"
                                   for ci in c["ci"])])
    return head, rows


# -------------------------------------------------------------------------------------- paired comparisons
def _comparisons(data: dict) -> dict:
    """The paired tests (:func:`rbjax.lmb.compare.compare_runs`) behind every "changed / did not change" statement.

    Returns:
        ``{"vs_baseline": {(method, debiased): result | {"error": why}}, "method_vs_method": {(debiased, m1, m2):
        result | {"error": why}}}``: each debiased model (its seeds averaged per pair) against the baseline on every
        measured type (corrected across those types); each pair of methods debiased for a type, on that type.
    """
    cache: dict[str, dict] = {}

    def run(folder: Path):
        k = str(folder)
        if k not in cache:
            cache[k] = load_run(folder)
        return cache[k]

    def seeds(m, d):
        return [run(e["folder"]) for _, e in sorted(data["runs"].get((m, d), {}).items())]

    out: dict[str, dict] = {"vs_baseline": {}, "method_vs_method": {}}
    try:
        base = run(data["baseline"]["folder"])
    except (OSError, ValueError) as e:
        out["error"] = f"the baseline's per-pair perplexities cannot be read: {e}"
        return out
    for m in _methods(data):
        for d in _debiased(data):
            if not data["runs"].get((m, d)):
                continue
            name = METHOD_NAMES.get(m, m)
            try:
                out["vs_baseline"][(m, d)] = compare_runs(seeds(m, d), base, labels=(f"{name} ({d})", "baseline"))
            except (OSError, ValueError) as e:
                out["vs_baseline"][(m, d)] = {"error": str(e)}
    for d in _debiased(data):
        ms = [m for m in _methods(data) if data["runs"].get((m, d))]
        for i, m1 in enumerate(ms):
            for m2 in ms[i + 1:]:
                if d not in {r["bias_type"] for r in data["baseline"]["lmb"]}:
                    continue
                n1, n2 = METHOD_NAMES.get(m1, m1), METHOD_NAMES.get(m2, m2)
                try:
                    out["method_vs_method"][(d, m1, m2)] = compare_runs(seeds(m1, d), seeds(m2, d), bias_types=[d],
                                                                        labels=(n1, n2))
                except (OSError, ValueError) as e:
                    out["method_vs_method"][(d, m1, m2)] = {"error": str(e)}
    return out


#: the CrowS-Pairs category that holds the social groups of each RedditBias bias type (rbjax's reading of the two
#: benchmarks' categories; shown first and marked in the side-by-side table)
CROWS_PAIRS_MATCH = {"religion1": "religion", "religion2": "religion", "race": "race-color", "gender": "gender",
                     "queerness": "sexual-orientation"}
SIDE_INTRO = (
    "Per debiased model: the change on the RedditBias type it was debiased for (as in the change table above), then "
    "on every category of each pair benchmark of [benchmarks] — does debiasing on RedditBias move CrowS-Pairs? The "
    "same paired test on the benchmark's own pairs (rbjax compare): per pair, the effect e = log ppl(stereotype-"
    "consistent sentence) − log ppl(other sentence), averaged over the seeds; d = e(debiased) − e(baseline) on the "
    "pairs every run kept; d > 0: toward the anti-stereotypical side; paired t-test on d with p corrected across "
    "that benchmark's categories (Bonferroni), each side's own mean effect, the verdict's move toward zero, past zero "
    "or away from it, Wilcoxon p, bootstrap CI, sign flips, seed spread. The last column is lm-evaluation-harness's "
    "pct_stereotype of the baseline and of the model, with the exact McNemar test of the change in the per-pair "
    "preference (one seed per side; its p uncorrected, the Bonferroni p across the benchmark's categories beside it; "
    "n/a says why: no pair changed its preference, or several seeds). ≈ marks the category that holds the "
    "RedditBias type's groups. CrowS-Pairs carries the upstream reliability warning (Data notes).")
LM_EVAL_INTRO = (
    "lm-evaluation-harness's crows_pairs metrics of each model (total log-likelihood of each sentence given the "
    "start token): pct_stereotype, the share of pairs whose stereotype-consistent sentence is more likely (0.5: no "
    "preference), overall ± its standard error and per category; mean ± seed sd for the debiased models. These are "
    "the numbers the field reports; the tests of a change are the table above.")


def _benchmark_comparisons(data: dict) -> dict:
    """Each debiased model (its seeds averaged per pair) against the baseline on each pair benchmark, per category
    (:func:`rbjax.lmb.compare.compare_runs`): ``{(benchmark, method, debiased): result | {"error": why}}``."""
    out: dict = {}
    for name, b in data["benchmarks"].items():
        try:
            base = load_run(b["baseline"]) if b["baseline"] is not None else None
        except (OSError, ValueError) as e:
            base, err = None, f"the baseline's per-pair values cannot be read: {e}"
        else:
            err = None if base is not None else f"the baseline has no finished {name} stage"
        for (m, d), seeds in b["runs"].items():
            if err is not None:
                out[(name, m, d)] = {"error": err}
                continue
            try:
                runs = [load_run(f) for _, f in sorted(seeds.items())]
                out[(name, m, d)] = compare_runs(runs, base, labels=(f"{METHOD_NAMES.get(m, m)} ({d})", "baseline"))
            except (OSError, ValueError) as e:
                out[(name, m, d)] = {"error": str(e)}
    return out


def _side_by_side(data: dict, comp: dict) -> tuple[list[str], list[list[str]]]:
    head = ["verdict", "model", "debiased for", "benchmark", "measured on"] + CHANGE_HEAD + [
        "pct_stereotype: baseline → model (exact McNemar p, uncorrected; Bonferroni across the categories)"]
    rows = []
    for m in _methods(data):
        for d in _debiased(data):
            if not data["runs"].get((m, d)):
                continue
            name = METHOD_NAMES.get(m, m)
            res = comp["vs_baseline"].get((m, d)) or {}
            r = next((x for x in res.get("types", []) if x["bias_type"] == d), None)
            if r is not None:
                rows.append([short_verdict(r), name, d, "RedditBias", d, *_change_cells(r), ""])
            for bench in data["benchmarks"]:
                bres = comp["benchmarks"].get((bench, m, d))
                if bres is None:
                    continue
                if "error" in bres:
                    rows.append([f"not compared: {bres['error']}", name, d, bench, "", *[""] * (len(CHANGE_HEAD) + 1)])
                    continue
                match = CROWS_PAIRS_MATCH.get(d) if bench == "crows-pairs" else d
                for x in sorted(bres["types"], key=lambda x: x["bias_type"] != match):
                    on = x["bias_type"] + (f" (≈ {d})" if x["bias_type"] == match else "")
                    rows.append([short_verdict(x), name, d, bench, on, *_change_cells(x), _pct_change(x.get("lm_eval"))])
    return head, rows


def _pct_change(lm: dict | None) -> str:
    """lm-evaluation-harness's pct_stereotype of the baseline → the model (seeds' mean), with the exact McNemar p."""
    if not lm:
        return ""
    pb, pa = statistics.fmean(lm["pct_stereotype_b"]), statistics.fmean(lm["pct_stereotype_a"])
    mc = lm["mcnemar"]
    p = mc["p_value"]
    if p is None:
        why = "several seeds" if mc.get("to_stereotypical") is None else "no pair changed its preference"
        return f"{pb:.3f} → {pa:.3f} (McNemar p n/a: {why})"
    bonf = "" if mc.get("p_bonferroni") is None else f", Bonferroni {_fmt(mc['p_bonferroni'], '.2g')}"
    return f"{pb:.3f} → {pa:.3f} (McNemar p {_fmt(p, '.2g')} uncorrected{bonf})"


def _benchmark_lm_eval_tables(data: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """Per benchmark: lm-evaluation-harness's pct_stereotype of the baseline and of each debiased model."""
    out = []
    for name, b in data["benchmarks"].items():
        base = read_json(b["baseline"] / SUMMARY_FILE) if b["baseline"] is not None else None
        cats = list((base or {}).get("categories") or [])
        head = ["model", "pairs", "pct_stereotype", "likelihood_diff"] + cats
        rows = []

        def cells(summaries: list[dict]) -> list[str]:
            ov = [x["lm_eval"]["overall"] for x in summaries]
            if len(ov) == 1:
                pct = f"{_fmt(ov[0]['pct_stereotype'], '.3f')} ± {_fmt(ov[0]['pct_stereotype_stderr'], '.3f')}"
                ld = f"{_fmt(ov[0]['likelihood_diff'], '.2f')} ± {_fmt(ov[0]['likelihood_diff_stderr'], '.2f')}"
            else:
                pct = _ms(_stats([o["pct_stereotype"] for o in ov]), ".3f")
                ld = _ms(_stats([o["likelihood_diff"] for o in ov]), ".2f")
            per = [_ms(_stats([((x["lm_eval"]["categories"].get(c) or {}).get("pct_stereotype")) for x in summaries]),
                       ".3f") for c in cats]
            return [str(ov[0]["n_pairs"]), pct, ld, *per]

        if base is not None:
            rows.append(["baseline", *cells([base])])
        for m in _methods(data):
            for d in _debiased(data):
                seeds = b["runs"].get((m, d)) or {}
                sums = [x for x in (read_json(f / SUMMARY_FILE) for _, f in sorted(seeds.items())) if x]
                if sums:
                    rows.append([f"{METHOD_NAMES.get(m, m)} ({d})", *cells(sums)])
        out.append((name, head, rows))
    return out


def _benchmark_notes(data: dict) -> list[str]:
    """The pair benchmarks' own notes (CrowS-Pairs: licence, the upstream reliability warning), once each."""
    notes: dict[str, None] = {}
    for name, b in data["benchmarks"].items():
        folders = ([b["baseline"]] if b["baseline"] is not None else []) + \
            [f for seeds in b["runs"].values() for f in seeds.values()]
        for f in folders[:1]:
            for n in (read_json(f / SUMMARY_FILE) or {}).get("notes") or []:
                notes[f"{name}: {n}"] = None
    return list(notes)


def _change_cells(r: dict) -> list[str]:
    ci = r.get("mean_change_ci")
    level = f" ({100 * r['ci_level']:.4g}%)" if r.get("ci_level") is not None else ""
    sp = r["seeds"]
    spread = ("one seed" if sp["per_seed_mean_change"] is None else
              f"{fmt_change(sp['sd'], False)} ({', '.join(fmt_change(x) for x in sp['per_seed_mean_change'])})")
    pc = r["p_corrected"]["ttest"]
    return [str(r["n_pairs"]), effects_text(r, ("", "")), fmt_change(r["mean_change"]),
            "n/a" if not ci else f"[{fmt_change(ci[0])}, {fmt_change(ci[1])}]{level}",
            _fmt(r["ttest"]["t_value"]), f"{_fmt(pc['bonferroni'], '.2g')} (of {pc['n_tests']})",
            _fmt(r["wilcoxon"]["p_value"], ".2g"), _fmt(r["sign_flip"]["share"], ".2f"), spread]


#: the change columns; the second is each side's own effect, B first (:func:`rbjax.lmb.compare.effects_text`)
CHANGE_HEAD = ["pairs", "mean effect e (t): baseline → model", "mean change", "CI (level of the verdict)", "t", "p (Bonferroni, types)", "Wilcoxon p", "sign flipped",
               "seed sd of the change (per seed)"]


def _change_table(data: dict, comp: dict) -> tuple[list[str], list[list[str]]]:
    head = ["verdict", "model", "debiased for", "measured on"] + CHANGE_HEAD
    rows = []
    types = _types(data)
    for (m, d), res in comp["vs_baseline"].items():
        name = METHOD_NAMES.get(m, m)
        if "error" in res:
            rows.append([f"not compared: {res['error']}", name, d, "", *[""] * len(CHANGE_HEAD)])
            continue
        by = {r["bias_type"]: r for r in res["types"]}
        for b in sorted(by, key=lambda t: (t != d, types.index(t) if t in types else len(types))):
            rows.append([short_verdict(by[b]), name, d, b, *_change_cells(by[b])])
    return head, rows


def _method_table(comp: dict) -> tuple[list[str], list[list[str]]]:
    head = ["verdict", "A", "B", "debiased for and measured on"] + [
        "mean effect e (t): B → A" if h == CHANGE_HEAD[1] else h for h in CHANGE_HEAD]
    rows = []
    for (d, m1, m2), res in comp["method_vs_method"].items():
        n1, n2 = METHOD_NAMES.get(m1, m1), METHOD_NAMES.get(m2, m2)
        if "error" in res:
            rows.append([f"not compared: {res['error']}", n1, n2, d, *[""] * len(CHANGE_HEAD)])
            continue
        (r,) = res["types"]
        rows.append([short_verdict(r), n1, n2, d, *_change_cells(r)])
    return head, rows


def _cross(data: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    types = _types(data)
    out = []
    for m in _methods(data):
        head = ["debiased for \\ measured on"] + types
        rows = []
        for d in _debiased(data):
            row = [d]
            for b in types:
                c = _cell(data, m, d, b)
                mark = " *" if c["n"] and c["n_sig"] == c["n"] else ""
                row.append(_ms(c["t"]) + mark if c["n"] else "n/a")
            rows.append(row)
        out.append((METHOD_NAMES.get(m, m), head, rows))
    return out


def _overshoots(data: dict, comp: dict) -> list[str]:
    """Significant changes from the baseline past zero into the anti-stereotypical direction, in words."""
    out = []
    for (m, d), res in comp["vs_baseline"].items():
        for r in res.get("types", []):
            if r.get("overshoot") != "anti-stereotypical":
                continue
            b = r["bias_type"]
            what = "the type it was debiased for" if b == d else f"{b} (debiased for {d})"
            out.append(f"{METHOD_NAMES.get(m, m)} on {what}: {r['verdict']}")
    return out


# ----------------------------------------------------------------------------------------------------------- BBQ
BBQ_INTRO = (
    "BBQ (Parrish et al. 2022; docs/bbq.md), multiple choice by log-likelihood in lm-evaluation-harness's convention "
    "(lm_eval: the row's two other answers and ten phrasings of 'unknown') and the paper's (the row's three "
    "answers). acc_amb / acc_dis: accuracy on the ambiguous / disambiguated rows; s_DIS = 2·(biased / non-unknown "
    "answers) − 1 on the disambiguated rows, s_AMB = (1 − acc_amb) · the same on the ambiguous rows (> 0: the "
    "answers follow the stereotype, < 0: they go against it). Overall pools every row measured; mean ± seed sd for "
    "the debiased models.")
BBQ_CHANGE_INTRO = (
    "Each debiased model (one row per seed: BBQ compares one run with another) against the baseline on the same "
    "rows, per category and convention (rbjax compare): the exact McNemar test of the per-row correctness, p "
    "corrected across the categories (Bonferroni; significant: below alpha); each score baseline → model with the "
    "change and its paired bootstrap CI (rows resampled together), and whether the bias score moved toward zero "
    "(less biased), past zero (biased the other way) or away from zero (more biased).")


def _bbq_comparisons(data: dict) -> dict:
    """Each debiased model's BBQ run (per seed) against the baseline's (:func:`rbjax.lmb.bbq_compare.compare_bbq`):
    ``{(method, debiased, seed label): result | {"error": why}}``."""
    b = data["bbq"]
    out: dict = {}
    for (m, d), seeds in b["runs"].items():
        for seed, folder in sorted(seeds.items()):
            if b["baseline"] is None:
                out[(m, d, seed)] = {"error": "the baseline has no finished bbq stage"}
                continue
            try:
                out[(m, d, seed)] = compare_bbq(folder, b["baseline"],
                                                labels=(f"{METHOD_NAMES.get(m, m)} ({d})", "baseline"))
            except (OSError, ValueError, KeyError) as e:
                out[(m, d, seed)] = {"error": str(e)}
    return out


def _bbq_scores_table(data: dict) -> tuple[list[str], list[list[str]]]:
    """Every model's BBQ numbers, overall, in both conventions."""
    b = data["bbq"]
    keys = ("accuracy_amb", "accuracy_disamb", "disamb_bias_score", "amb_bias_score")
    head = ["model", "convention", "rows", "acc_amb", "acc_dis", "s_DIS", "s_AMB"]
    rows = []
    models = [("baseline", [b["baseline"]] if b["baseline"] is not None else [])]
    for m in _methods(data):
        for d in _debiased(data):
            seeds = b["runs"].get((m, d)) or {}
            if seeds:
                models.append((f"{METHOD_NAMES.get(m, m)} ({d})", [f for _, f in sorted(seeds.items())]))
    for name, folders in models:
        sums = [x for x in (read_json(f / SUMMARY_FILE) for f in folders) if x]
        if not sums:
            continue
        for cv in BBQ_CONVENTIONS:
            ov = [x[cv]["overall"] for x in sums]
            rows.append([name, cv, str(ov[0]["n_rows"]), *(_ms(_stats([o[k] for o in ov]), ".3f") for k in keys)])
    return head, rows


def _bbq_change_table(comp: dict) -> tuple[list[str], list[list[str]]]:
    """Per debiased model, seed, category and convention: the change from the baseline (:func:`_bbq_comparisons`)."""
    head = ["correctness", "model", "seed", "category", "convention", "rows", "acc: baseline → model (change)",
            "McNemar p (Bonferroni, categories)", "s_DIS: baseline → model (change [CI])", "s_DIS moved",
            "s_AMB: baseline → model (change [CI])", "s_AMB moved"]
    rows = []

    def cell(x: dict, ci: bool = True) -> str:
        c = x.get("change_ci")
        v = "+.3f" if ci else ".3f"  # a bias score signed, an accuracy not
        return (f"{_fmt(x['b'], v)} → {_fmt(x['a'], v)} ({_fmt(x['change'], '+.3f')}"
                + (f" [{c[0]:+.3f}, {c[1]:+.3f}]" if ci and c else "") + ")")

    for (m, d, seed), res in comp.items():
        name = f"{METHOD_NAMES.get(m, m)} ({d})"
        if "error" in res:
            rows.append([f"not compared: {res['error']}", name, seed.split(":")[-1], *[""] * (len(head) - 3)])
            continue
        for cv in BBQ_CONVENTIONS:
            for c, blk in res["categories"].items():
                x, mc = blk[cv], blk[cv]["mcnemar"]
                verdict = ("no row changed" if mc["p_value"] is None else
                           ("significant: " + ("more" if x["acc"]["change"] > 0 else "less") + " accurate")
                           if mc["significant"] else "not significant")
                p = ("n/a" if mc["p_value"] is None else
                     f"{_fmt(mc['p_value'], '.2g')} ({_fmt(mc['p_bonferroni'], '.2g')} of {mc['n_tests']})")
                score = [v for k in ("disamb_bias_score", "amb_bias_score")
                         for v in (cell(x[k]), movement_words(x[k]["movement"]).split(" (")[0])]
                rows.append([verdict, name, seed.split(":")[-1], c, cv, str(x["n_rows"]), cell(x["acc"], False), p,
                             *score])
    return head, rows


def _bbq_notes(data: dict) -> list[str]:
    """BBQ's own notes (its source and licence, local files), once each."""
    b = data["bbq"]
    folders = ([b["baseline"]] if b["baseline"] is not None else []) + \
        [f for seeds in b["runs"].values() for f in seeds.values()]
    notes: dict[str, None] = {}
    for f in folders[:1]:
        for n in (read_json(f / SUMMARY_FILE) or {}).get("notes") or []:
            notes[f"bbq: {n}"] = None
    return list(notes)


def _dialog_table(data: dict) -> tuple[list[str], list[list[str]]]:
    head = ["model"] + [c[0] for c in DIALOG_COLUMNS]
    base = data["baseline"]["dialog"]
    rows = [["baseline"] + [_fmt(_dig((base.get(t) or {}).get("metrics"), path), ".3f")
                            for _, t, path in DIALOG_COLUMNS]]
    for m in _methods(data):
        for d in _debiased(data):
            seeds = data["runs"].get((m, d), {})
            if not seeds:
                continue
            row = [f"{METHOD_NAMES.get(m, m)} ({d})"]
            if m == "self-debias" and not any(e["dialog"] for e in seeds.values()):
                rows.append(row + [NOT_EVALUATED] + ["—"] * (len(DIALOG_COLUMNS) - 1))
                continue
            for _, t, path in DIALOG_COLUMNS:
                row.append(_ms(_stats([_dig((e["dialog"].get(t) or {}).get("metrics"), path)
                                       for e in seeds.values()]), ".3f"))
            rows.append(row)
    return head, rows


def _selections(data: dict) -> tuple[list[str], list[list[str]], list[str]]:
    """The grid point each sweep selected on the valid split: (header, rows, the selection rules used)."""
    head = ["method", "debiased for", "seed", "batch", "accum.", "λ_LM", "λ_D", "dev t", "dev p", "LMP",
            "within LMP budget"]
    rows, rules = [], []
    rule_of = {}
    for st in data["studies"]:
        rule_of[Path(st["folder"]).name] = ((st.get("config") or {}).get("sweep") or {}).get("selection", "default")
    mo, do = _methods(data), _debiased(data)
    for (method, debiased), per_seed in sorted(data["runs"].items(), key=lambda kv: (mo.index(kv[0][0]),
                                                                                     do.index(kv[0][1]))):
        for seed, entry in sorted(per_seed.items()):
            sel = entry.get("selection")
            if not sel:
                continue
            which = rule_of.get(seed.split(":")[0], "default")
            chosen = sel.get(which) or sel.get("default") or {}
            pt, dev = chosen.get("point") or {}, chosen.get("dev") or {}
            if chosen.get("rule") and chosen["rule"] not in rules:
                rules.append(chosen["rule"])
            budget = chosen.get("constraint_met")
            own = ", ".join(f"{k} = {v:g}" for k, v in pt.items()  # a method without training: its grid's setting
                            if k not in ("batch_size", "grad_accum", "lambda_lm", "lambda_d"))
            name = METHOD_NAMES.get(method, method) + (f" ({own})" if own else "")
            rows.append([name, debiased, seed.split(":")[-1], str(pt.get("batch_size", "")),
                         str(pt.get("grad_accum", "")), f"{pt['lambda_lm']:g}" if "lambda_lm" in pt else "",
                         f"{pt['lambda_d']:g}" if "lambda_d" in pt else "", _fmt(dev.get("t_value")),
                         _fmt(dev.get("p_value"), ".2e"), _fmt(chosen.get("lmp"), ".1f"),
                         "" if budget is None else ("yes" if budget else "no")])
    return head, rows, rules


def _notes(data: dict) -> list[str]:
    """Every setting that cuts the study down from the paper's (:func:`_cutdowns`), then the dialog results' own notes
    (stand-in splits, capped examples, no fine-tuning, …), once each."""
    notes: dict[str, None] = {}
    for st in data["studies"]:
        for n in _cutdowns(st.get("config") or {}):
            notes[n] = None
    if any(e["dialog"] for (m, _), seeds in data["runs"].items() if m == "self-debias" for e in seeds.values()):
        notes[SELF_DEBIAS_DIALOG] = None
    results = [data["baseline"]["dialog"]] + [e["dialog"] for seeds in data["runs"].values() for e in seeds.values()]
    for res in results:
        for task in ("lmp", "dst", "crg"):
            for n in (res.get(task) or {}).get("notes") or []:
                notes[f"{task.upper()}: {n}"] = None
    return list(notes)


#: dialog settings that make a check smaller than the paper's
DIALOG_CUTS = ("lmp_max_lines", "max_steps", "max_examples", "max_new_tokens", "jga_max_dialogues", "epochs")


def _cutdowns(raw: dict) -> list[str]:
    """The settings of a study file (``study.json``'s ``config``) that cut it down from the paper's §5 study."""
    out = []
    study, training = raw.get("study") or {}, raw.get("training") or {}
    sweep, measure, dialog = raw.get("sweep") or {}, raw.get("measure") or {}, raw.get("dialog") or {}
    if study.get("random_model"):
        out.append(f"the starting model is a random {random_model_name(study['random_model'])} "
                   f"({json.dumps(study['random_model'])}), not DialoGPT-small")
    deb = study.get("debias_types") or study.get("bias_types")
    if isinstance(deb, list) and set(deb) != set(BIAS_TYPES):
        out.append(f"debiased only for {', '.join(deb)} (the paper: all five bias types)")
    methods = study.get("methods")
    if isinstance(methods, list) and set(methods) != {"lmd", "add", "hd", "cda"}:
        out.append(f"methods: {', '.join(METHOD_NAMES.get(m, m) for m in methods)} (the paper: LMD, ADD, HD, CDA)")
    defaults = {leaf.name: leaf.default for leaf in leaves(DebiasRun)}
    if training.get("max_steps") is not None:
        out.append(f"training: every debiasing run stopped after max_steps = {training['max_steps']} update(s) (the "
                   f"paper: {defaults['epochs']} epochs over the training phrases)")
    if training.get("lmp_max_lines") is not None:
        out.append(f"training: the LMP of each grid point (the selection's LMP budget) on the first "
                   f"{training['lmp_max_lines']} lines only")
    adapter_keys = set(AdapterConfig.__dataclass_fields__)
    if training.get("adapter", "none") != "none":
        a = {k: training.get(k, defaults[k]) for k in adapter_keys}
        out.append(f"training: every debiasing run trained LoRA adapters (rank {a['lora_rank']}, α {a['lora_alpha']:g}"
                   f"{', rsLoRA' if a['lora_rslora'] else ''}, dropout {a['lora_dropout']:g}, on {a['lora_targets']}) "
                   f"on the frozen base model stored in {a['param_dtype']}, not every weight as the paper "
                   "(docs/debiasing.md §9: the target embeddings of LMD, ADD and HD do not move)")
    for k, v in training.items():
        if k in ("max_steps", "lmp_max_lines", "eval_batch_size", "progress", "save_every", "save_every_s",
                 "keep_checkpoints") or k in adapter_keys or k not in defaults or v == defaults[k]:
            continue
        out.append(f"training: {k} = {v!r} (the paper's / rbjax's default: {defaults[k]!r})")
    if sweep.get("dev_max_pairs") is not None:
        out.append(f"selection: the \"dev t\" of every grid point (and of the selected ones) is on the first "
                   f"{sweep['dev_max_pairs']} valid pairs per bias type (dev_max_pairs), not the whole valid split")
    cut = [f"{k} {list(sweep[k])} (paper {list(v)})" for k, v in PAPER_GRID.items()
           if k in sweep and tuple(sweep[k]) != tuple(v)]
    if cut:
        out.append("reduced grid: " + "; ".join(cut))
    if sweep.get("max_points") is not None:
        out.append(f"grid: only the first {sweep['max_points']} point(s) per sweep (max_points)")
    if measure.get("split", "test") != "test":
        out.append(f"LMB measured on the {measure['split']} split (the paper: test)")
    tasks = dialog.get("tasks", ["lmp", "dst", "crg"])
    skipped = [t.upper() for t in ("lmp", "dst", "crg") if t not in tasks]
    if skipped:
        out.append(f"dialog checks not run: {', '.join(skipped)}")
    for t in ("lmp", "dst", "crg"):
        cuts = {k: v for k, v in (dialog.get(t) or {}).items() if k in DIALOG_CUTS and v is not None}
        if t in tasks and cuts:
            out.append(f"{t.upper()} cut down: " + ", ".join(f"{k} = {v}" for k, v in cuts.items()))
    return out


# ----------------------------------------------------------------------------------------------------- output
def _study_model(study: dict) -> str:
    """A study's starting model in words, from its study.json's config ([study] model, or random_model)."""
    st = (study.get("config") or {}).get("study") or {}
    if st.get("random_model"):
        return f"a random {random_model_name(st['random_model'])} (see the data notes)"
    return str(st.get("model") or "not recorded")


def _study_format(study: dict) -> str:
    """A study's format in words, from its study.json's config ([study] format, role, system, prompt)."""
    st = (study.get("config") or {}).get("study") or {}
    if st.get("format", "raw") != "chat":
        if ((study.get("config") or {}).get("measure") or {}).get("format") == "chat":
            return "raw text (the paper's format) for training; LMB measured in chat format"
        return "raw text (the paper's format)"
    bits = [f"chat turns ({st.get('role') or 'assistant'}"]
    for k, what in (("system", "system prompt"), ("prompt", "user message")):
        if st.get(k):
            bits.append(f"{what} {st[k]!r}")
    if st.get("chat_template"):
        bits.append(f"template {st['chat_template']}")
    return ", ".join(bits) + "): training, LMB and CRG through the model's chat template"


def _md_table(head, rows) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _html_table(head, rows) -> str:
    th = "".join(f"<th>{html.escape(str(h))}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"


def _incomplete(data: dict) -> list[str]:
    """One line per folder whose study did not finish (its missing stages)."""
    return [f"{folder}: {len(missing)} stage(s) did not finish: {', '.join(missing)}"
            for folder, missing in data["missing"].items() if missing]


def _comparisons_json(comp: dict) -> dict:
    def ready(res):
        return res if "error" in res else json_ready(res)

    return {"vs_baseline": [{"method": m, "debiased_for": d, **ready(r)} for (m, d), r in comp["vs_baseline"].items()],
            "method_vs_method": [{"debiased_for": d, "a": m1, "b": m2, **ready(r)}
                                 for (d, m1, m2), r in comp["method_vs_method"].items()],
            "benchmarks": [{"benchmark": b, "method": m, "debiased_for": d, **ready(r)}
                           for (b, m, d), r in comp.get("benchmarks", {}).items()],
            "bbq": [{"method": m, "debiased_for": d, "seed": seed, **r}
                    for (m, d, seed), r in comp.get("bbq", {}).items()],
            **({"error": comp["error"]} if "error" in comp else {})}


def write_report(folders: list[str | Path], out_dir: str | Path | None = None, *, overwrite: bool = False) -> dict:
    """Write ``report.md``, ``report.html``, ``figure1.png`` and ``comparisons.json`` into ``out_dir`` (default: the
    first folder) from study folders (finished or not: an incomplete study says so at the top and lists its missing
    stages).

    ``overwrite``: replace report files in ``out_dir`` that are not rbjax's unchanged report of the same folders
    (a report edited by hand, the report of other folders); without it they are refused before anything is written
    (:func:`rbjax.core.reuse.claim_outputs`). The study runner, which owns its folder, passes True.

    Returns:
        ``{"md": path, "html": path, "figure": path, "tables": {...}, "incomplete": [...], "duplicates": [...]}``
        (the tables as lists of rows, for tests).

    Raises:
        FileNotFoundError: a folder that is not a study with a measured baseline (see :func:`collect`).
        ValueError: folders with different baselines, or ``out_dir`` cannot be written;
        rbjax.core.reuse.OutputExists: see ``overwrite``.
    """
    folders = [Path(f) for f in folders]
    out = check_output_dir(folders[0] if out_dir is None else out_dir, "report folder")
    data = collect(folders)
    targets = [out / "figure1.png", out / "report.md", out / "report.html", out / "comparisons.json"]
    key = {"command": "report", "folders": [str(f.resolve()) for f in folders]}
    claim_outputs(targets, key, overwrite=overwrite)
    for msg in data["duplicates"]:
        log.info(msg)
    png = _png(_figure1(data))
    with atomic_file(out / "figure1.png", "wb") as f:
        f.write(png)
    comp = _comparisons(data)
    comp["benchmarks"] = _benchmark_comparisons(data)
    comp["bbq"] = _bbq_comparisons(data)
    atomic_write_json(out / "comparisons.json", _comparisons_json(comp))
    rep = _report_parts(data, comp)
    atomic_write_text(out / "report.md", _markdown(rep))
    atomic_write_text(out / "report.html", _html_page(rep, png))
    record_outputs(targets, key)
    return {"md": out / "report.md", "html": out / "report.html", "figure": out / "figure1.png",
            "comparisons": out / "comparisons.json", "incomplete": rep.incomplete, "duplicates": data["duplicates"],
            "tables": rep.tables()}


MVM_INTRO = ("Each pair of methods debiased for a type, on that type: the same paired test, A − B (d > 0: A's "
             "effects lie toward the anti-stereotypical side of B's; the verdict says whether the bias moved "
             "toward zero, past zero or away from it from B to A); one type per comparison, so no correction.")
OVER_NONE = ("None: no model changed significantly past zero into the anti-stereotypical direction (paired test "
             "against the baseline on the same pairs).")


@dataclasses.dataclass
class _ReportParts:
    """What ``report.md`` and ``report.html`` say, computed once: the tables (each ``(head, rows)``; ``cross`` and
    ``bench_lm``: ``[(name, head, rows)]``), the lists and the texts that introduce them."""

    data: dict
    t3: tuple
    eff: tuple
    change: tuple
    mvm: tuple
    cross: list
    side: tuple
    bench_lm: list
    has_bbq: bool
    bbq_scores: tuple
    bbq_change: tuple
    over: list[str]
    dia: tuple
    sel_head: list[str]
    sel_rows: list[list[str]]
    notes: list[str]
    incomplete: list[str]
    intro: str
    warn: str
    change_intro: str
    sel_intro: str

    def tables(self) -> dict:
        """The tables as :func:`write_report` returns them."""
        return {"table3": self.t3, "effects": self.eff, "change": self.change, "method_vs_method": self.mvm,
                "cross": self.cross, "benchmarks": self.side, "benchmarks_lm_eval": self.bench_lm,
                "bbq": self.bbq_scores, "bbq_change": self.bbq_change,
                "dialog": self.dia, "overshoots": self.over, "selections": (self.sel_head, self.sel_rows),
                "notes": self.notes}


def _report_parts(data: dict, comp: dict) -> _ReportParts:
    """Every table and text of the report, from the collected folders and their comparisons."""
    side = _side_by_side(data, comp)
    bench_lm = _benchmark_lm_eval_tables(data)
    has_bbq = data["bbq"]["baseline"] is not None or bool(data["bbq"]["runs"])
    bbq_scores, bbq_change = _bbq_scores_table(data), _bbq_change_table(comp["bbq"])
    t3 = _table3(data)
    eff = _effects(data)
    change = _change_table(data, comp)
    mvm = _method_table(comp)
    cross = _cross(data)
    over = _overshoots(data, comp)
    dia = _dialog_table(data)
    sel_head, sel_rows, sel_rules = _selections(data)
    notes = _notes(data) + _benchmark_notes(data) + _bbq_notes(data)
    incomplete = _incomplete(data)
    warn = ("INCOMPLETE STUDY: not every planned stage finished; every table below holds only the finished stages, "
            "and a missing model is absent, not a result.") if incomplete else ""
    sel_intro = ("The grid point each sweep selected on the valid split (then retrained, exported and measured above). "
                 "Rule: " + "; ".join(sel_rules) + ".") if sel_rows else (
        "No selected grid points in these folders" + (" (the sweep stages did not finish)." if incomplete else "."))
    return _ReportParts(data, t3, eff, change, mvm, cross, side, bench_lm, has_bbq, bbq_scores, bbq_change, over, dia,
                        sel_head, sel_rows, notes, incomplete, _intro(data), warn, _change_intro(_alpha(data)),
                        sel_intro)


def _intro(data: dict) -> str:
    """The report's first paragraph: the studies, models, folders, the test, the seeds and the format."""
    studies = data["studies"]
    names = ", ".join(s.get("config", {}).get("study", {}).get("name", Path(s["file"]).stem) for s in studies)
    alpha = _alpha(data)
    seeds = sorted({k for v in data["runs"].values() for k in v})
    models = "; ".join(dict.fromkeys(_study_model(s) for s in studies))
    intro = (f"Study: {names}. Model: {models}. Folders: {', '.join(data['folders'])}. LMB on the test split (paired "
             f"two-tailed t-test after the 3σ outlier-pair rule; t < 0 = stereotypical, t > 0 = anti-stereotypical; "
             f"* p < {alpha:g}). "
             f"Seeds pooled: {len(seeds)} ({', '.join(seeds) if seeds else 'none'}). Format: "
             + "; ".join(sorted({_study_format(s) for s in studies}) or ["raw text"]) + ".")
    if data["duplicates"]:
        intro += f" Counted once: {len(data['duplicates'])} stage(s) found in more than one folder (see below)."
    unknown = [f for f, m in data["missing"].items() if m is None]
    if unknown:
        intro += (f" Completeness not checked for {', '.join(unknown)}: its study.json predates the record of the "
                  "planned stages (rerun `rbjax run` with the same study file: finished stages are skipped).")
    return intro


def _change_intro(alpha: float) -> str:
    """What the change-from-the-baseline table tests and shows."""
    return (
        "Every statement that a model changed is this paired test on the same pairs (rbjax compare): per pair, the "
        "bias effect e = log ppl(biased) − log ppl(counterfactual), averaged over the seeds; the change d = e(debiased) "
        "− e(baseline) on the pairs every run kept; d > 0: toward the anti-stereotypical side. Paired t-test on d (p "
        "corrected across "
        f"the types compared, Bonferroni; significant: p < {alpha:g}), Wilcoxon signed-rank p, the mean change with "
        f"its bootstrap CI at the verdict's family-wise level (1 − {alpha:g}/m for m types compared, Bonferroni-"
        "adjusted like the p-value; the level is beside each CI), the share of pairs whose sign of e flipped, and "
        "the seed spread of the mean change. "
        "Beside the change: each side's own effect on these pairs (the mean of e, with its one-sample t against 0), "
        "baseline → model; the verdict says how the bias moved relative to zero: toward zero (|mean e| down, same "
        "sign), past zero (the sign of the mean e flipped) or away from zero (|mean e| up) — a model that moves from "
        "anti-stereotypical toward zero has d < 0 and is less biased, not more. "
        "Overshoot: a significant change past zero into the anti-stereotypical direction — the debiased model is "
        "significantly anti-stereotypical on the same pairs, the baseline's mean effect on them was at or below "
        "zero. A change of t-values is not a test and is not used. The test takes the seeds' models as given (their "
        "per-pair effects averaged): it says whether these models differ from the baseline on these pairs; whether a "
        "method's effect holds across training seeds is what the seed spread beside it shows (per-seed mean "
        "changes of opposite signs: not reproducible across seeds).")


def _markdown(rep: _ReportParts) -> str:
    """``report.md``."""
    data = rep.data
    md = ["# RedditBias study report\n"]
    if rep.warn:
        md.append(f"**{rep.warn}**\n\n" + "\n".join(f"- {x}" for x in rep.incomplete) + "\n")
    md += [f"{rep.intro}\n"]
    if data["duplicates"]:
        md.append("\n".join(f"- {x}" for x in data["duplicates"]) + "\n")
    md += ["## Figure 1\n\n![Figure 1](figure1.png)\n",
           "## LMB per bias type (Table 3 shape)\n\nEach method's cell is the model debiased for that column's bias "
           "type, measured on it: t mean ± sd over seeds (per-seed p-values; seeds significant).\n\n"
           + _md_table(*rep.t3) + "\n",
           "## Effect sizes and confidence intervals (each model against zero)\n\n" + _md_table(*rep.eff) + "\n",
           "## Change from the baseline (paired test on the same pairs)\n\n" + rep.change_intro + "\n\n"
           + (_md_table(*rep.change) if rep.change[1] else "No debiased model finished.") + "\n",
           "## Method vs method (paired test on the same pairs)\n\n" + MVM_INTRO + "\n\n"
           + (_md_table(*rep.mvm) if rep.mvm[1] else "Fewer than two methods finished for any type.") + "\n",
           "## Cross-type effects (every debiased model on every bias type)\n"]
    for m, head, rows in rep.cross:
        md.append(f"### {m}\n\n" + _md_table(head, rows) + "\n")
    md.append("## Selected grid points\n\n" + rep.sel_intro + "\n\n" + (_md_table(rep.sel_head, rep.sel_rows) + "\n"
                                                                          if rep.sel_rows else ""))
    if data["benchmarks"]:
        md.append("## RedditBias and the pair benchmarks side by side\n\n" + SIDE_INTRO + "\n\n"
                  + (_md_table(*rep.side) if rep.side[1] else "No debiased model finished a pair benchmark.") + "\n")
        md.append("### lm-evaluation-harness's convention\n\n" + LM_EVAL_INTRO + "\n\n"
                  + "\n\n".join(f"**{name}**\n\n" + _md_table(h, r) for name, h, r in rep.bench_lm) + "\n")
    if rep.has_bbq:
        md.append("## BBQ beside RedditBias and the pair benchmarks\n\n" + BBQ_INTRO + "\n\n"
                  + _md_table(*rep.bbq_scores) + "\n\n### Change from the baseline on BBQ\n\n" + BBQ_CHANGE_INTRO
                  + "\n\n" + (_md_table(*rep.bbq_change) if rep.bbq_change[1] else "No debiased model finished BBQ.")
                  + "\n")
    md.append("## Anti-stereotypical overshoots (§5.2)\n\n" + ("\n".join(f"- {o}" for o in rep.over) if rep.over
                                                              else OVER_NONE) + "\n")
    md.append("## Dialog quality (Tables 4–5)\n\n" + _md_table(*rep.dia) + "\n")
    md.append("## Data notes\n\nEvery setting that makes this study smaller than the paper's, and what stood in for "
              "official data:\n\n" + ("\n".join(f"- {n}" for n in rep.notes) if rep.notes else
                                      "- none: the paper's settings and the official splits.") + "\n")
    settings_md = []
    for s in data["studies"]:
        settings_md.append(f"### {s['folder']}\n\n```json\n{json.dumps(s.get('config'), indent=2)}\n```\n\n"
                           f"Versions:\n\n```json\n{json.dumps(s.get('versions'), indent=2)}\n```\n")
    md.append("## Settings and versions\n\n" + "\n".join(settings_md))
    return "\n".join(md)


def _html_page(rep: _ReportParts, png: bytes) -> str:
    """``report.html``: the same content as :func:`_markdown`, the figure inlined."""
    data = rep.data
    b64 = base64.b64encode(png).decode()
    css = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;"
           "margin:1em 0;font-size:13px}td,th{border:1px solid #bbb;padding:3px 8px;text-align:left}"
           "th{background:#eee}pre{background:#f6f6f6;padding:8px;font-size:12px;overflow:auto}"
           ".warn{border:2px solid #b00;background:#fee;padding:8px 12px}")
    ul = lambda items: "<ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in items) + "</ul>"  # noqa: E731
    body = ["<h1>RedditBias study report</h1>"]
    if rep.warn:
        body.append(f"<div class='warn'><p><strong>{html.escape(rep.warn)}</strong></p>{ul(rep.incomplete)}</div>")
    body += [f"<p>{html.escape(rep.intro)}</p>" + (ul(data["duplicates"]) if data["duplicates"] else ""),
             f"<h2>Figure 1</h2><img alt='Figure 1' style='width:100%;max-width:1100px' "
             f"src='data:image/png;base64,{b64}'>",
             "<h2>LMB per bias type (Table 3 shape)</h2>" + _html_table(*rep.t3),
             "<h2>Effect sizes and confidence intervals (each model against zero)</h2>" + _html_table(*rep.eff),
             "<h2>Change from the baseline (paired test on the same pairs)</h2><p>" + html.escape(rep.change_intro)
             + "</p>" + (_html_table(*rep.change) if rep.change[1] else "<p>No debiased model finished.</p>"),
             "<h2>Method vs method (paired test on the same pairs)</h2><p>" + html.escape(MVM_INTRO) + "</p>"
             + (_html_table(*rep.mvm) if rep.mvm[1] else "<p>Fewer than two methods finished for any type.</p>"),
             "<h2>Cross-type effects</h2>" + "".join(f"<h3>{html.escape(m)}</h3>" + _html_table(h, r)
                                                     for m, h, r in rep.cross),
             "<h2>Selected grid points</h2><p>" + html.escape(rep.sel_intro) + "</p>"
             + (_html_table(rep.sel_head, rep.sel_rows) if rep.sel_rows else ""),
             ("<h2>RedditBias and the pair benchmarks side by side</h2><p>" + html.escape(SIDE_INTRO) + "</p>"
              + (_html_table(*rep.side) if rep.side[1] else "<p>No debiased model finished a pair benchmark.</p>")
              + "<h3>lm-evaluation-harness's convention</h3><p>" + html.escape(LM_EVAL_INTRO) + "</p>"
              + "".join(f"<h4>{html.escape(name)}</h4>" + _html_table(h, r) for name, h, r in rep.bench_lm)
              if data["benchmarks"] else ""),
             ("<h2>BBQ beside RedditBias and the pair benchmarks</h2><p>" + html.escape(BBQ_INTRO) + "</p>"
              + _html_table(*rep.bbq_scores) + "<h3>Change from the baseline on BBQ</h3><p>"
              + html.escape(BBQ_CHANGE_INTRO) + "</p>"
              + (_html_table(*rep.bbq_change) if rep.bbq_change[1] else "<p>No debiased model finished BBQ.</p>")
              if rep.has_bbq else ""),
             "<h2>Anti-stereotypical overshoots (§5.2)</h2>" + (ul(rep.over) if rep.over else
                                                               f"<p>{html.escape(OVER_NONE)}</p>"),
             "<h2>Dialog quality (Tables 4–5)</h2>" + _html_table(*rep.dia),
             "<h2>Data notes</h2><p>Every setting that makes this study smaller than the paper's, and what stood in "
             "for official data:</p>" + (ul(rep.notes) if rep.notes else
                                         "<p>None: the paper's settings and the official splits.</p>"),
             "<h2>Settings and versions</h2>" + "".join(
                 f"<h3>{html.escape(s['folder'])}</h3><pre>{html.escape(json.dumps(s.get('config'), indent=2))}</pre>"
                 f"<pre>{html.escape(json.dumps(s.get('versions'), indent=2))}</pre>" for s in data["studies"])]
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>RedditBias study report</title>"
            f"<style>{css}</style></head><body>{''.join(body)}</body></html>")

