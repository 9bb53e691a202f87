"""Did BBQ change? Two ``rbjax measure --benchmark bbq`` runs of two models on the same rows, per category and
convention (docs/bbq.md):

* **correctness**: the exact McNemar test of the per-row correctness (two-sided ``scipy.stats.binomtest`` on the
  rows whose correctness differs between A and B);
* **bias scores**: the change A − B of ``amb_bias_score`` and ``disamb_bias_score`` (and of the accuracies), with a
  paired percentile bootstrap CI: the rows are resampled together (one draw gives both runs' outcomes of the same
  rows; drawn as multinomial counts of the rows' joint outcomes);
* the McNemar p-values Bonferroni-corrected across the categories compared (as the other benchmarks' comparisons).

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
from rbjax.lmb.bbq import CONVENTIONS, METRICS, SUMMARY_FILE, _cells, _from_counts, _percentile_ci, read_bbq_csv, \
    row_outcomes

__all__ = ["is_bbq_run", "compare_bbq", "format_bbq_comparison", "COMPARE_FILE"]

COMPARE_FILE = "compare_bbq.json"


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
                categories=None, n_bootstrap: int = 10000, alpha: float = 0.05, seed: int = 0,
                labels: tuple[str, str] = ("A", "B"), allow_format_change: bool = False) -> dict:
    """Compare two BBQ runs (module docstring).

    Returns:
        ``{"labels", "categories": {category: {convention: {"n_rows", "mcnemar": {...}, "<metric>": {"a", "b",
        "change", "change_ci"}}}}, "formats", ...}``; written to ``out_dir/compare_bbq.json`` when given.
    Raises:
        ValueError: not BBQ runs, different rows (category, file hash or example ids named), different formats.
    """
    out = None if out_dir is None else check_output_dir(out_dir, "--out")
    sa, oa = _load(Path(a))
    sb, ob = _load(Path(b))
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
            block[cv] = blk
        res["categories"][c] = block
    for cv in CONVENTIONS:
        cats = list(res["categories"])
        adj = stats.adjust_pvalues([res["categories"][c][cv]["mcnemar"]["p_value"] for c in cats])
        for c, pb in zip(cats, adj["bonferroni"]):
            res["categories"][c][cv]["mcnemar"]["p_bonferroni"] = pb
            res["categories"][c][cv]["mcnemar"]["n_tests"] = len(cats)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / COMPARE_FILE, res)
    return res


def format_bbq_comparison(res: dict) -> str:
    """A plain-text table of :func:`compare_bbq`'s result."""
    la, lb = res["labels"]
    f = lambda v: "   n/a" if v is None else f"{v:+.3f}"  # noqa: E731
    lines = [f"BBQ: {la} − {lb}"]
    for cv in CONVENTIONS:
        head = f"{cv:<22} {'rows':>5} {'Δacc':>7} {'McNemar p(bonf)':>16} {'Δs_AMB':>7} {'Δs_DIS':>7}  Δs_DIS CI"
        lines += ["", head, "-" * len(head)]
        for c, blk in res["categories"].items():
            b = blk[cv]
            pb = b["mcnemar"]["p_bonferroni"]
            ci = b["disamb_bias_score"]["change_ci"]
            lines.append(f"{c:<22} {b['n_rows']:>5} {f(b['acc']['change']):>7} "
                         f"{'n/a' if pb is None else format(pb, '.3g'):>16} {f(b['amb_bias_score']['change']):>7} "
                         f"{f(b['disamb_bias_score']['change']):>7}  "
                         + ("" if ci is None else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"))
    return "\n".join(lines)
