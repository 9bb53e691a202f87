"""Did BBQ change? Two ``rbjax measure --benchmark bbq`` runs of two models on the same rows, per category and
convention (docs/bbq.md):

* **correctness**: the exact McNemar test of the per-row correctness (two-sided ``scipy.stats.binomtest`` on the
  rows whose correctness differs between A and B);
* **bias scores**: the change A − B of ``amb_bias_score`` and ``disamb_bias_score`` (and of the accuracies), with a
  paired percentile bootstrap CI: the rows are resampled together (one draw gives both runs' outcomes of the same
  rows; drawn as multinomial counts of the rows' joint outcomes);
* the McNemar p-values Bonferroni-corrected across the categories compared (as the other benchmarks' comparisons);
  a change of correctness is ``significant`` when its corrected p is below alpha;
* how each bias score moved from B to A relative to zero (:func:`score_movement`): toward zero (|s| down, same side),
  past zero (the sign flipped) or away from zero (|s| up), each side's score beside it (s > 0: the answers follow the
  stereotype, s < 0: they go against it).

The runs must have measured the same rows: the same categories' files (git blob SHA-1) and the same example ids;
runs of different formats (raw vs chat) are refused unless ``allow_format_change``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from scipy import stats as sps

from rbjax.core.io import atomic_write_json, check_output_dir
from rbjax.data.bbq import read_bbq_file
from rbjax.lmb import stats
from rbjax.lmb.compare import movement
from rbjax.lmb.bbq import CONVENTIONS, METRICS, SUMMARY_FILE, _cells, _from_counts, _percentile_ci, read_bbq_csv, \
    row_outcomes

__all__ = ["is_bbq_run", "compare_bbq", "format_bbq_comparison", "score_movement", "movement_words",
           "COMPARE_FILE", "BIAS_SCORES"]

COMPARE_FILE = "compare_bbq.json"
#: the bias scores whose movement relative to zero is said (s_AMB, s_DIS)
BIAS_SCORES = ("amb_bias_score", "disamb_bias_score")
_SHORT = {"acc": "acc", "accuracy_amb": "acc_amb", "accuracy_disamb": "acc_dis", "amb_bias_score": "s_AMB",
          "disamb_bias_score": "s_DIS"}


def score_movement(a: float | None, b: float | None) -> dict | None:
    """How a BBQ bias score moved from B (``b``) to A (``a``) relative to zero (s > 0: the answers follow the
    stereotype; s < 0: they go against it): :func:`rbjax.lmb.compare.movement` with the sides
    ``"stereotype-following"`` (s > 0) and ``"counter-stereotypical"`` (s < 0)."""
    return movement(a, b, negative="counter-stereotypical", positive="stereotype-following")


def movement_words(mv: dict | None) -> str:
    """:func:`score_movement` in words: ``"toward zero (|s| down, still stereotype-following)"``, ``"past zero
    (stereotype-following → counter-stereotypical)"``, ``"away from zero (|s| up, counter-stereotypical)"``."""
    if mv is None:
        return "n/a (a score is undefined)"
    k = mv["kind"]
    if k == "toward zero":
        return "toward zero (|s| down to 0)" if mv["side_a"] == "zero" else \
            f"toward zero (|s| down, still {mv['side_a']})"
    if k == "past zero":
        return f"past zero ({mv['side_b']} → {mv['side_a']})"
    if k == "away from zero":
        return (f"away from zero (from 0 to {mv['side_a']})" if mv["side_b"] == "zero" else
                f"away from zero (|s| up, {mv['side_a']})")
    return "unchanged"


def is_bbq_run(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds a finished ``rbjax measure --benchmark bbq`` run."""
    p = Path(folder) / SUMMARY_FILE
    try:
        return json.loads(p.read_text()).get("benchmark") == "bbq"
    except (OSError, ValueError, AttributeError):
        return False


def _load(folder: Path) -> tuple[dict, dict]:
    s = json.loads((folder / SUMMARY_FILE).read_text())
    if s.get("benchmark") != "bbq":
        raise ValueError(f"{folder}: not an rbjax measure --benchmark bbq run (no bbq {SUMMARY_FILE})")
    outs = {}
    for c in s["categories"]:
        d = s["data"][c]
        cat = read_bbq_file(d["file"], name=c)
        if cat.git_sha1 != d["git_blob_sha1"]:
            raise ValueError(f"{d['file']}: changed since {folder} was measured (git blob SHA-1 {cat.git_sha1}, "
                             f"recorded {d['git_blob_sha1']})")
        got = read_bbq_csv(folder / f"{c}_bbq.csv", cat)
        if got is None:
            raise ValueError(f"{folder / f'{c}_bbq.csv'}: does not hold the rows of {d['file']}")
        outs[c] = (cat, row_outcomes(cat, got[1]))
    return s, outs


def compare_bbq(a: str | os.PathLike, b: str | os.PathLike, *, out_dir: str | os.PathLike | None = None,
                categories=None, n_bootstrap: int | None = None, alpha: float | None = None, seed: int = 0,
                labels: tuple[str, str] | None = None, allow_format_change: bool = False) -> dict:
    """Compare two BBQ runs (module docstring).

    Args:
        n_bootstrap, alpha: the bootstrap resamples and the level (CI 1 − alpha; a McNemar change is significant
            when its Bonferroni p < alpha); default: the runs' own (``benchmark.json`` settings, when both runs
            agree), else 10000 and 0.05.
        labels: the names of A and B (default: their folder names; ``("A", "B")`` when those are equal).
    Returns:
        ``{"labels", "categories": {category: {convention: {"n_rows", "mcnemar": {..., "p_bonferroni",
        "significant"}, "<metric>": {"a", "b", "change", "change_ci"}, and for the bias scores "movement"
        (:func:`score_movement`)}}}, "formats", "settings"}``; written to ``out_dir/compare_bbq.json`` when given.
    Raises:
        ValueError: not BBQ runs, different rows (category, file hash or example ids named), different formats,
        alpha not in (0, 1), n_bootstrap < 0.
    """
    out = None if out_dir is None else check_output_dir(out_dir, "--out")
    sa, oa = _load(Path(a))
    sb, ob = _load(Path(b))
    if labels is None:
        na, nb = Path(a).resolve().name, Path(b).resolve().name
        labels = (na, nb) if na != nb else ("A", "B")

    def own(name, default):
        vals = {(x.get("settings") or {}).get(name) for x in (sa, sb)} - {None}
        return vals.pop() if len(vals) == 1 else default

    alpha = float(own("alpha", 0.05) if alpha is None else alpha)
    n_bootstrap = int(own("n_bootstrap", 10000) if n_bootstrap is None else n_bootstrap)
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be between 0 and 1, got {alpha}")
    if n_bootstrap < 0:
        raise ValueError(f"n_bootstrap must be >= 0, got {n_bootstrap}")
    fa, fb = sa["settings"]["format"], sb["settings"]["format"]
    if (fa, sa["settings"].get("system")) != (fb, sb["settings"].get("system")) and not allow_format_change:
        raise ValueError(f"the runs were measured in different formats ({fa} vs {fb}, or another system prompt); "
                         "pass --allow-format-change to compare formats")
    common = [c for c in sa["categories"] if c in ob]
    if categories:
        missing = [c for c in categories if c not in common]
        if missing:
            raise ValueError(f"categories not measured by both runs: {', '.join(missing)}")
        common = [c for c in common if c in categories]
    if not common:
        raise ValueError("the two runs have no category in common")
    res: dict = {"labels": list(labels), "a": str(a), "b": str(b), "formats": [fa, fb], "categories": {},
                 "settings": {"n_bootstrap": n_bootstrap, "alpha": alpha, "seed": seed,
                              "ci": "paired percentile bootstrap, rows resampled together"}}
    for k, c in enumerate(common):
        (ca, xa), (cb, xb) = oa[c], ob[c]
        if sa["data"][c]["git_blob_sha1"] != sb["data"][c]["git_blob_sha1"] or ca.ids != cb.ids:
            raise ValueError(f"{c}: the runs measured different rows ({sa['data'][c]['file']} vs "
                             f"{sb['data'][c]['file']}); a comparison needs the same rows")
        block = {}
        for cv in CONVENTIONS:
            ra, rb = xa[cv]["correct"], xb[cv]["correct"]
            up, down = int(np.sum(ra & ~rb)), int(np.sum(~ra & rb))
            p = float(sps.binomtest(up, up + down, 0.5).pvalue) if up + down else None
            codes_a, codes_b = _cells(xa[cv], xa["disambig"]), _cells(xb[cv], xb["disambig"])
            ma = _from_counts(np.bincount(codes_a, minlength=16), cv)
            mb = _from_counts(np.bincount(codes_b, minlength=16), cv)
            cis = {}
            if n_bootstrap > 0:
                joint = codes_a * 16 + codes_b
                pr = np.bincount(joint, minlength=256) / joint.size
                draws = np.random.default_rng(seed + k).multinomial(joint.size, pr, size=n_bootstrap)
                d3 = draws.reshape(n_bootstrap, 16, 16)
                da, db = _from_counts(d3.sum(2), cv), _from_counts(d3.sum(1), cv)
                cis = {m: _percentile_ci(da[m] - db[m], alpha) for m in METRICS}
            blk = {"n_rows": int(ra.size),
                   "mcnemar": {"a_only_correct": up, "b_only_correct": down, "p_value": p,
                               "test": "exact McNemar: two-sided binomial test on the rows whose correctness differs"}}
            for m in METRICS:
                va, vb = float(ma[m]), float(mb[m])
                fin = np.isfinite(va) and np.isfinite(vb)
                blk[m] = {"a": va if np.isfinite(va) else None, "b": vb if np.isfinite(vb) else None,
                          "change": (va - vb) if fin else None, "change_ci": cis.get(m)}
                if m in BIAS_SCORES:
                    blk[m]["movement"] = score_movement(blk[m]["a"], blk[m]["b"])
            block[cv] = blk
        res["categories"][c] = block
    for cv in CONVENTIONS:
        cats = list(res["categories"])
        adj = stats.adjust_pvalues([res["categories"][c][cv]["mcnemar"]["p_value"] for c in cats])
        for c, pb in zip(cats, adj["bonferroni"]):
            res["categories"][c][cv]["mcnemar"]["p_bonferroni"] = pb
            res["categories"][c][cv]["mcnemar"]["n_tests"] = len(cats)
            res["categories"][c][cv]["mcnemar"]["significant"] = pb is not None and pb < alpha
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / COMPARE_FILE, res)
    return res


def format_bbq_comparison(res: dict) -> str:
    """A plain-text table of :func:`compare_bbq`'s result: per convention and category, each side's accuracy and
    bias scores beside the change (B → A), the McNemar p and its Bonferroni p, then one verdict line per category:
    whether the correctness changed (McNemar, Bonferroni across the categories) and how each bias score moved
    relative to zero."""
    la, lb = res["labels"]
    alpha = res["settings"]["alpha"]
    f = lambda v, s="+.3f": "n/a" if v is None else format(v, s)  # noqa: E731

    def ba(m: dict) -> str:  # B → A (change)
        return f"{f(m['b'], '.3f')} → {f(m['a'], '.3f')} ({f(m['change'])})"

    lines = [f"BBQ: {la} (A) vs {lb} (B), the same rows; each cell B → A (change A − B); "
             f"{100 * (1 - alpha):.4g}% paired bootstrap CI of the change of s_DIS"]
    for cv in CONVENTIONS:
        rows = [("category", "rows", "acc", "McNemar p (Bonferroni)", "s_AMB", "s_DIS", "s_DIS change CI")]
        for c, blk in res["categories"].items():
            b = blk[cv]
            mc = b["mcnemar"]
            p = "n/a" if mc["p_value"] is None else f"{mc['p_value']:.3g} ({mc['p_bonferroni']:.3g})"
            ci = b["disamb_bias_score"]["change_ci"]
            rows.append((c, str(b["n_rows"]), ba(b["acc"]), p, ba(b["amb_bias_score"]), ba(b["disamb_bias_score"]),
                         "n/a" if ci is None else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"))
        w = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
        fmt = lambda r: "  ".join(x.ljust(w[k]) if k == 0 else x.rjust(w[k]) for k, x in enumerate(r))  # noqa: E731
        lines += ["", f"{cv} convention", fmt(rows[0]), "-" * len(fmt(rows[0]))] + [fmt(r) for r in rows[1:]]
        for c, blk in res["categories"].items():
            b = blk[cv]
            mc = b["mcnemar"]
            if mc["p_value"] is None:
                acc = "correctness unchanged on every row (no McNemar test)"
            elif mc["significant"]:
                acc = (f"correctness changed significantly (McNemar Bonferroni p {mc['p_bonferroni']:.3g} < "
                       f"{alpha:g}): {la} {'more' if b['acc']['change'] > 0 else 'less'} accurate")
            else:
                acc = f"correctness not significantly changed (McNemar Bonferroni p {mc['p_bonferroni']:.3g})"
            moves = "; ".join(f"{_SHORT[m]} {f(b[m]['b'])} → {f(b[m]['a'])}: {movement_words(b[m]['movement'])}"
                              for m in BIAS_SCORES)
            lines.append(f"{c} ({cv}): {acc}; {moves}")
    lines.append("s_AMB / s_DIS: bias scores in ambiguous / disambiguated contexts (> 0: the answers follow the "
                 "stereotype, < 0: they go against it); a score moved toward zero is less biased, past zero it "
                 "is biased the other way")
    return "\n".join(lines)
