"""Figure-1-style plot of LMB t-values per bias type (and per model), with the significance threshold."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from scipy import stats

from rbjax.specs import BIAS_TYPES


def load_results(folder: str | os.PathLike) -> list[dict]:
    """Read ``lmb.json`` from a result folder (or the file itself). Raises FileNotFoundError/ValueError."""
    p = Path(folder)
    f = p / "lmb.json" if p.is_dir() else p
    if not f.exists():
        raise FileNotFoundError(f"{f}: no lmb.json (is {p} an 'rbjax measure' output folder?)")
    try:
        recs = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{f}: not valid JSON ({e})") from None
    if not isinstance(recs, list) or not all(isinstance(r, dict) and "bias_type" in r and "t_value" in r for r in recs):
        raise ValueError(f"{f}: expected a list of LMB records with 'bias_type' and 't_value'")
    if not recs:
        raise ValueError(f"{f}: no LMB records")
    return recs


def plot_lmb(results: dict[str, list[dict]], out_path: str | os.PathLike, alpha: float = 0.05,
             title: str | None = None) -> Path:
    """Grouped bars of t-values: one group per bias type, one bar per model.

    The dashed lines mark the two-tailed critical t at ``alpha`` (for the smallest
    degrees of freedom among the records: the most conservative threshold); bars of
    significant results are drawn solid and starred, others hatched. Negative t =
    stereotypical direction. Undefined t-values are shown as "n/a".

    Args:
        results: label → records (as in ``lmb.json``).
        out_path: PNG path (written atomically).
    """
    out = Path(out_path)
    if out.is_dir():
        raise ValueError(f"{out} is a folder; give the PNG file to write (e.g. {out / 'lmb.png'})")
    if not any(results.values()):
        raise ValueError("nothing to plot: no LMB records")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(results)
    present = {r["bias_type"] for recs in results.values() for r in recs}
    types = [b for b in BIAS_TYPES if b in present] + sorted(present - set(BIAS_TYPES))
    dfs = [r.get("df") for recs in results.values() for r in recs if r.get("df")]
    tcrit = float(stats.t.ppf(1 - alpha / 2, min(dfs))) if dfs else 1.96
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(types) * max(1, len(labels)) ** 0.5), 4))
    width = 0.8 / max(1, len(labels))
    x = np.arange(len(types))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for j, lab in enumerate(labels):
        by = {r["bias_type"]: r for r in results[lab]}
        for i, bt in enumerate(types):
            r = by.get(bt)
            xpos = x[i] - 0.4 + width * (j + 0.5)
            if r is None:
                continue
            t = r.get("t_value")
            if t is None:
                ax.text(xpos, 0, "n/a", ha="center", va="bottom", fontsize=7)
                continue
            sig = bool(r.get("significant"))
            ax.bar(xpos, t, width, color=colors[j % len(colors)], alpha=1.0 if sig else 0.55,
                   hatch=None if sig else "//", edgecolor="black", linewidth=0.5,
                   label=lab if i == 0 or bt == types[0] else None)
            if sig:
                ax.text(xpos, t, "*", ha="center", va="bottom" if t > 0 else "top", fontsize=12)
    lo, hi = ax.get_ylim()
    ax.set_ylim(min(lo, -1.25 * tcrit), max(hi, 1.25 * tcrit))
    ax.axhline(0, color="black", linewidth=0.8)
    for s in (tcrit, -tcrit):
        ax.axhline(s, color="grey", linestyle="--", linewidth=0.8)
    ax.text(len(types) - 0.5, tcrit, f" p={alpha:g}", va="bottom", ha="right", fontsize=8, color="grey")
    ax.set_xticks(x, types)
    ax.set_ylabel("LMB t-value (negative = stereotypical)")
    applied = {r.get("outlier_rule", {}).get("applied", True) for recs in results.values() for r in recs}
    how = "3σ outlier pairs removed" if applied == {True} else ("no outlier removal" if applied == {False} else "")
    ax.set_title(title or f"Language model bias (two-tailed paired t-test{', ' + how if how else ''})", fontsize=10)
    handles, labs = ax.get_legend_handles_labels()
    if len(labels) > 1 or labels:
        uniq = dict(zip(labs, handles))
        ax.legend(uniq.values(), uniq.keys(), fontsize=8, loc="best")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.stem}.tmp.png")
    fig.savefig(tmp, dpi=150)
    plt.close(fig)
    os.replace(tmp, out)
    return out
