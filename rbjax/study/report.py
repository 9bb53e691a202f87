"""The study report: ``report.md`` and a self-contained ``report.html`` (figures embedded) from finished study folders.

What it holds (paper §5, Figure 1, Tables 3–5):

* **Figure 1**: LMB t-value per bias type for the starting model and for each method (the model debiased for that
  bias type), mean over seeds with the seed standard deviation as error bars, the two-tailed significance threshold,
  and the stereotypical (t < 0) / anti-stereotypical (t > 0) directions marked.
* **Table 3 shape**: t and p per bias type for the baseline and each method (mean ± sd over seeds, the per-seed
  values, how many seeds are significant), the paired Cohen's d and the bootstrap CI of the mean log-perplexity
  difference; whether a change from the baseline is larger than the seed noise.
* **Cross-type effects**: every debiased model measured on every bias type (does fixing one bias move another?).
* **Anti-stereotypical overshoots** (§5.2): significant t > 0 where the baseline was not significantly
  anti-stereotypical.
* **Dialog quality** (Tables 4–5): LMP, DST F1/accuracy, CRG BLEU-4, NIST-2, METEOR, entropy-4, dist-2, length.
* **Data notes**: what stood in for an official split (e.g. the MultiWOZ val split for train), un-fine-tuned CRG.
* **Settings and package versions** of every folder.

Every number is read from the stage result files (``lmb.json``, ``<task>.json``); nothing is recomputed.
``rbjax report DIR [DIR ...]`` rebuilds the report from finished folders (several folders: their seeds are pooled).
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
import statistics
from pathlib import Path
from typing import Any

from rbjax.core.io import atomic_file, atomic_write_text, check_output_dir, read_json
from rbjax.core.reuse import claim_outputs, record_outputs
from rbjax.lmb.plot import figure_lmb

__all__ = ["collect", "write_report", "DIALOG_COLUMNS"]

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
METHOD_NAMES = {"lmd": "LMD", "add": "ADD", "hd": "HD", "cda": "CDA", "lm": "LM"}


def _dig(d, path):
    for k in path:
        if d is None:
            return None
        try:
            d = d[k]
        except (KeyError, IndexError, TypeError):
            return None
    return d if isinstance(d, (int, float)) and not isinstance(d, bool) else None


def collect(folders: list[Path]) -> dict:
    """Everything the report shows, read from study folders.

    Returns:
        ``{"baseline": {"lmb": records, "dialog": {task: result}}, "runs": {(method, debiased_type): {seed:
        {"lmb": records, "dialog": {...}, "selection": ...}}}, "studies": [study.json ...]}``.

    Raises:
        FileNotFoundError: a folder without ``study.json`` or a baseline ``lmb.json``.
    """
    out: dict[str, Any] = {"baseline": None, "runs": {}, "studies": [], "folders": [str(f) for f in folders]}
    for f in folders:
        f = Path(f)
        st = read_json(f / "study.json")
        if st is None:
            raise FileNotFoundError(f"{f}: no study.json (is it an 'rbjax run' output folder?)")
        out["studies"].append({**st, "folder": str(f)})
        base = read_json(f / "baseline" / "lmb_test" / "lmb.json")
        if base is None:
            raise FileNotFoundError(f"{f}: no baseline/lmb_test/lmb.json (the study has not measured its baseline)")
        if out["baseline"] is None:
            out["baseline"] = {"lmb": base, "dialog": _dialog(f / "baseline" / "dialog")}
        for sd in sorted(f.glob("seed*")):
            if not sd.is_dir():
                continue
            seed = sd.name[4:]
            for td in sorted(p for p in sd.iterdir() if p.is_dir()):
                for md in sorted(p for p in td.iterdir() if p.is_dir()):
                    lmb = read_json(md / "lmb_test" / "lmb.json")
                    if lmb is None:
                        continue
                    sel = read_json(md / "sweep" / "selection.json")
                    entry = {"lmb": lmb, "dialog": _dialog(md / "dialog"), "selection": sel}
                    out["runs"].setdefault((md.name, td.name), {})[f"{f.name}:{seed}"] = entry
    return out


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
    order = ["lmd", "add", "hd", "cda", "lm"]
    ms = {m for m, _ in data["runs"]}
    return [m for m in order if m in ms] + sorted(ms - set(order))


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
    return figure_lmb(series, title="Figure 1: LMB t per bias type (test split; mean over seeds, error bar = seed sd)")


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
    head = ["model", "bias type", "n pairs kept", "t (per seed)", "Cohen's d (paired)", "mean log-ppl diff",
            "95% CI", "vs baseline"]
    rows = []
    types = _types(data)
    for b in types:
        r = _rec(data["baseline"]["lmb"], b)
        if r:
            ci = r.get("mean_log_ppl_diff_ci")
            rows.append(["baseline", b, str(r.get("n_pairs_after_outliers")), _fmt(r.get("t_value")),
                         _fmt(r.get("cohens_d_paired"), ".3f"), _fmt(r.get("mean_log_ppl_diff"), ".4f"),
                         "n/a" if not ci else f"[{_fmt(ci[0], '.4f')}, {_fmt(ci[1], '.4f')}]", ""])
    for m in _methods(data):
        for b in _debiased(data):
            c = _cell(data, m, b, b)
            if not c["n"]:
                continue
            base = _rec(data["baseline"]["lmb"], b)
            rows.append([METHOD_NAMES.get(m, m), b, ", ".join(str(r.get("n_pairs_after_outliers")) for r in c["records"]),
                         ", ".join(_fmt(r.get("t_value")) for r in c["records"]), _ms(c["d"], ".3f"),
                         ", ".join(_fmt(r.get("mean_log_ppl_diff"), ".4f") for r in c["records"]),
                         "; ".join("n/a" if not ci else f"[{_fmt(ci[0], '.4f')}, {_fmt(ci[1], '.4f')}]"
                                   for ci in c["ci"]),
                         _noise(c, base)])
    return head, rows


def _noise(c: dict, base: dict | None) -> str:
    if base is None or base.get("t_value") is None or c["t"]["mean"] is None:
        return "n/a"
    diff = c["t"]["mean"] - base["t_value"]
    if c["t"]["sd"] is None:
        return f"Δt {diff:+.2f} (one seed: seed noise not estimated)"
    within = abs(diff) <= 2 * c["t"]["sd"]
    return f"Δt {diff:+.2f}; seed sd {c['t']['sd']:.2f}: " + ("within seed noise" if within else "beyond seed noise")


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


def _overshoots(data: dict) -> list[str]:
    alpha = _alpha(data)
    out = []
    for m in _methods(data):
        for d in _debiased(data):
            for b in _types(data):
                c = _cell(data, m, d, b)
                base = _rec(data["baseline"]["lmb"], b)
                if not c["n"] or c["t"]["mean"] is None or c["t"]["mean"] <= 0:
                    continue
                if c["n_sig"] * 2 <= c["n"]:
                    continue  # not significant in most seeds
                base_anti = base is not None and base.get("t_value") is not None and base["t_value"] > 0 and \
                    base.get("p_value") is not None and base["p_value"] < alpha
                if base_anti:
                    continue
                what = "the type it was debiased for" if b == d else f"{b} (debiased for {d})"
                bt = "n/a" if base is None else _fmt(base.get("t_value"))
                out.append(f"{METHOD_NAMES.get(m, m)} on {what}: t = {_ms(c['t'])} > 0, significant in "
                           f"{c['n_sig']}/{c['n']} seeds (baseline t = {bt})")
    return out


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
    for (method, debiased), per_seed in sorted(data["runs"].items()):
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
            rows.append([method, debiased, seed.split(":")[-1], str(pt.get("batch_size", "")),
                         str(pt.get("grad_accum", "")), f"{pt['lambda_lm']:g}" if "lambda_lm" in pt else "",
                         f"{pt['lambda_d']:g}" if "lambda_d" in pt else "", _fmt(dev.get("t_value")),
                         _fmt(dev.get("p_value"), ".2e"), _fmt(chosen.get("lmp"), ".1f"),
                         "" if budget is None else ("yes" if budget else "no")])
    return head, rows, rules


def _notes(data: dict) -> list[str]:
    """The dialog results' own notes (stand-in splits, capped examples, no fine-tuning, …), once each."""
    notes: dict[str, None] = {}
    results = [data["baseline"]["dialog"]] + [e["dialog"] for seeds in data["runs"].values() for e in seeds.values()]
    for res in results:
        for task in ("lmp", "dst", "crg"):
            for n in (res.get(task) or {}).get("notes") or []:
                notes[f"{task.upper()}: {n}"] = None
    return list(notes)


# ----------------------------------------------------------------------------------------------------- output
def _md_table(head, rows) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _html_table(head, rows) -> str:
    th = "".join(f"<th>{html.escape(str(h))}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"


def write_report(folders: list[str | Path], out_dir: str | Path, *, overwrite: bool = False) -> dict:
    """Write ``report.md``, ``report.html`` and ``figure1.png`` into ``out_dir`` from finished study folders.

    ``overwrite``: replace report files in ``out_dir`` that are not rbjax's unchanged report of the same folders
    (a report edited by hand, the report of other folders); without it they are refused before anything is written
    (:func:`rbjax.core.reuse.claim_outputs`). The study runner, which owns its folder, passes True.

    Returns:
        ``{"md": path, "html": path, "figure": path, "tables": {...}}`` (the tables as lists of rows, for tests).

    Raises:
        FileNotFoundError: a folder that is not a finished study (see :func:`collect`).
        ValueError: ``out_dir`` cannot be written; rbjax.core.reuse.OutputExists: see ``overwrite``.
    """

    folders = [Path(f) for f in folders]
    out = check_output_dir(out_dir, "report folder")
    data = collect(folders)
    targets = [out / "figure1.png", out / "report.md", out / "report.html"]
    key = {"command": "report", "folders": [str(f.resolve()) for f in folders]}
    claim_outputs(targets, key, overwrite=overwrite)
    fig = _figure1(data)
    png = _png(fig)
    with atomic_file(out / "figure1.png", "wb") as f:
        f.write(png)
    t3 = _table3(data)
    eff = _effects(data)
    cross = _cross(data)
    over = _overshoots(data)
    dia = _dialog_table(data)
    sel_head, sel_rows, sel_rules = _selections(data)
    notes = _notes(data)
    studies = data["studies"]
    names = ", ".join(s.get("config", {}).get("study", {}).get("name", Path(s["file"]).stem) for s in studies)
    alpha = _alpha(data)
    seeds = sorted({k for v in data["runs"].values() for k in v})
    intro = (f"Study: {names}. Folders: {', '.join(data['folders'])}. LMB on the test split (paired two-tailed t-test "
             f"after the 3σ outlier-pair rule; t < 0 = stereotypical, t > 0 = anti-stereotypical; * p < {alpha:g}). "
             f"Seeds pooled: {len(seeds)} ({', '.join(seeds) if seeds else 'none'}).")
    md = [f"# RedditBias study report\n\n{intro}\n", "## Figure 1\n\n![Figure 1](figure1.png)\n",
          "## LMB per bias type (Table 3 shape)\n\nEach method's cell is the model debiased for that column's bias type, "
          "measured on it: t mean ± sd over seeds (per-seed p-values; seeds significant).\n\n" + _md_table(*t3) + "\n",
          "## Effect sizes, confidence intervals and seed noise\n\n" + _md_table(*eff) + "\n",
          "## Cross-type effects (every debiased model on every bias type)\n"]
    for m, head, rows in cross:
        md.append(f"### {m}\n\n" + _md_table(head, rows) + "\n")
    sel_intro = ("The grid point each sweep selected on the valid split (then retrained, exported and measured above). "
                 "Rule: " + "; ".join(sel_rules) + ".") if sel_rows else "No sweeps in these folders."
    md.append("## Selected grid points\n\n" + sel_intro + "\n\n" + (_md_table(sel_head, sel_rows) + "\n"
                                                                      if sel_rows else ""))
    md.append("## Anti-stereotypical overshoots (§5.2)\n\n" + ("\n".join(f"- {o}" for o in over) if over else
                                                             "None: no significant t > 0 beyond the baseline's.") + "\n")
    md.append("## Dialog quality (Tables 4–5)\n\n" + _md_table(*dia) + "\n")
    md.append("## Data notes\n\n" + ("\n".join(f"- {n}" for n in notes) if notes else
                                     "All dialog data were the official splits given.") + "\n")
    settings_md = []
    for s in studies:
        settings_md.append(f"### {s['folder']}\n\n```json\n{json.dumps(s.get('config'), indent=2)}\n```\n\n"
                           f"Versions:\n\n```json\n{json.dumps(s.get('versions'), indent=2)}\n```\n")
    md.append("## Settings and versions\n\n" + "\n".join(settings_md))
    text = "\n".join(md)
    atomic_write_text(out / "report.md", text)

    b64 = base64.b64encode(png).decode()
    css = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;"
           "margin:1em 0;font-size:13px}td,th{border:1px solid #bbb;padding:3px 8px;text-align:left}"
           "th{background:#eee}pre{background:#f6f6f6;padding:8px;font-size:12px;overflow:auto}")
    body = [f"<h1>RedditBias study report</h1><p>{html.escape(intro)}</p>",
            f"<h2>Figure 1</h2><img alt='Figure 1' style='max-width:100%' src='data:image/png;base64,{b64}'>",
            "<h2>LMB per bias type (Table 3 shape)</h2>" + _html_table(*t3),
            "<h2>Effect sizes, confidence intervals and seed noise</h2>" + _html_table(*eff),
            "<h2>Cross-type effects</h2>" + "".join(f"<h3>{html.escape(m)}</h3>" + _html_table(h, r)
                                                    for m, h, r in cross),
            "<h2>Selected grid points</h2><p>" + html.escape(sel_intro) + "</p>"
            + (_html_table(sel_head, sel_rows) if sel_rows else ""),
            "<h2>Anti-stereotypical overshoots (§5.2)</h2>" + ("<ul>" + "".join(f"<li>{html.escape(o)}</li>"
                                                                                for o in over) + "</ul>"
                                                               if over else "<p>None.</p>"),
            "<h2>Dialog quality (Tables 4–5)</h2>" + _html_table(*dia),
            "<h2>Data notes</h2>" + ("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>"
                                     if notes else "<p>All dialog data were the official splits given.</p>"),
            "<h2>Settings and versions</h2>" + "".join(
                f"<h3>{html.escape(s['folder'])}</h3><pre>{html.escape(json.dumps(s.get('config'), indent=2))}</pre>"
                f"<pre>{html.escape(json.dumps(s.get('versions'), indent=2))}</pre>" for s in studies)]
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>RedditBias study report</title>"
            f"<style>{css}</style></head><body>{''.join(body)}</body></html>")
    atomic_write_text(out / "report.html", page)
    record_outputs(targets, key)
    return {"md": out / "report.md", "html": out / "report.html", "figure": out / "figure1.png",
            "tables": {"table3": t3, "effects": eff, "cross": cross, "dialog": dia, "overshoots": over,
                       "selections": (sel_head, sel_rows),
                       "notes": notes}}
