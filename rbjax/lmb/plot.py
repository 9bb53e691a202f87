"""Figure-1-style plot of LMB t-values per bias type (paper §5.2, Figure 1), one series per result folder.

Every series is labelled with what its numbers mean: the split the phrases came from and how outliers were handled
(the 3σ pair rule on a model's perplexities, or the released stored perplexities, which are already reduced).
Series that differ in either are not comparable side by side, and are refused unless ``allow_mixed`` is set.
Bars of significant results (p < alpha) are solid and marked ``*``, others hatched; a short dashed line over each
bar marks the two-tailed critical |t| at alpha for that bar's own degrees of freedom (the types' pair counts differ,
so do their thresholds); a bias type a series has no t-value for (not measured, or undefined: see its ``status``) is
marked "n/a". The legend, outside the axes, explains what is drawn and nothing else; no text is drawn on the bars
or the frame.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from rbjax.core.errors import SettingError
from rbjax.core.io import atomic_file
from rbjax.lmb.config import PlotConfig
from rbjax.specs import BIAS_TYPES

__all__ = ["load_results", "series_description", "figure_lmb", "plot_lmb", "figure_changes", "fit_labels", "FORMATS"]

#: output formats by file suffix
FORMATS = {".png": "png", ".pdf": "pdf", ".svg": "svg"}
HATCH = "//"


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


def _rule_key(r: dict) -> tuple:
    rule = r.get("outlier_rule") or {}
    stored = (r.get("settings") or {}).get("stored_perplexities")
    applied = rule.get("applied")
    return (stored, applied, rule.get("n_std") if applied else None, rule.get("ddof") if applied else None)


def _rule_text(key: tuple) -> str:
    stored, applied, n_std, ddof = key
    if applied is None:
        how = "outlier rule unknown"
    elif applied:
        how = f"{n_std:g}σ outlier pairs removed" if n_std is not None else "outlier pairs removed"
        how += "" if ddof in (0, None) else " (sample std)"
    else:
        how = "no outlier removal"
    if stored is None:
        return f"{how}, perplexity source unknown"
    return f"stored perplexities, {how}" if stored else how


def series_description(records: list[dict]) -> dict:
    """What a series' t-values mean: ``{"splits": [...], "rules": [...], "text": "test split, 3σ ..."}``.

    ``splits`` are the records' ``split`` values (``"unknown"`` when absent); ``rules`` are descriptions of the
    outlier handling from ``outlier_rule`` and ``settings.stored_perplexities``.
    """
    splits = sorted({str(r.get("split") or "unknown") for r in records})
    keys = sorted({_rule_key(r) for r in records}, key=repr)
    rules = [_rule_text(k) for k in keys]
    return {"splits": splits, "rule_keys": keys, "rules": rules,
            "text": f"{'all pairs' if splits == ['all'] else '+'.join(splits) + ' split'}, {'; '.join(rules)}"}


def _check_mix(results: dict[str, list[dict]], allow_mixed: bool) -> dict[str, dict]:
    desc = {lab: series_description(recs) for lab, recs in results.items()}
    if allow_mixed:
        return desc
    problems = []
    splits = {lab: tuple(d["splits"]) for lab, d in desc.items()}
    if len(set(splits.values())) > 1 or any(len(s) > 1 for s in splits.values()):
        problems.append("splits (" + ", ".join(f"{lab}: {'+'.join(s)}" for lab, s in splits.items()) + ")")
    rules = {lab: tuple(d["rule_keys"]) for lab, d in desc.items()}
    if len(set(rules.values())) > 1 or any(len(k) > 1 for k in rules.values()):
        problems.append("outlier handling (" + ", ".join(f"{lab}: {'; '.join(d['rules'])}" for lab, d in desc.items())
                        + ")")
    if problems:
        raise SettingError("allow_mixed", "the results mix " + " and ".join(problems) + ": their t-values are not "
                           "comparable side by side; pass {name} to plot them anyway, each series labelled")
    return desc


def _alpha(results: dict[str, list[dict]], alpha: float | None) -> float:
    if alpha is not None:  # (its range: checked by PlotConfig)
        return float(alpha)
    found = {(r.get("settings") or {}).get("alpha") for recs in results.values() for r in recs} - {None}
    if len(found) > 1:
        raise ValueError(f"the records were tested at different alpha levels {sorted(found)}; give alpha (--alpha)")
    return float(found.pop()) if found else 0.05


NA_LABEL = "n/a: type not measured, or t undefined (see status)"


def figure_lmb(results: dict[str, list[dict]], config: PlotConfig | None = None, *, na_label: str = NA_LABEL,
               legend_below: bool = False, **settings):
    """Build the t-value bar chart: one group per bias type, one bar per series (result folder).

    Args:
        results: series label → LMB records (as in ``lmb.json``).
        config: :class:`rbjax.lmb.config.PlotConfig` — ``alpha``, the significance level of the marks and of the
            threshold lines (``None``: the records' own ``settings.alpha``, 0.05 if absent); ``title``, the axes
            title (default: a description of the test); ``allow_mixed``: plot series from different splits or
            outlier handling together instead of refusing.
        **settings: :class:`~rbjax.lmb.config.PlotConfig` fields that override ``config`` (``alpha=0.01``); any
            other name is a ``TypeError``.
        na_label: what an "n/a" mark means, in the legend (the study report: no model was debiased for the type).
        legend_below: the legend under the axes in two columns (a wide figure stays readable when scaled to a
            page), and the split/outlier description said once when every series shares it.

    Returns:
        a ``matplotlib.figure.Figure`` (Agg canvas, not registered with pyplot) with one axes. Artists carry
        ``gid``s for inspection: bars ``"bar:<label>:<bias type>"``, stars ``"star:…"``, n/a marks ``"na:…"``,
        threshold segments ``"threshold:+:<label>:<bias type>"`` / ``"threshold:-:…"`` (over the bar, at its df).

    Raises:
        ValueError: no records; mixed splits/outlier handling without ``allow_mixed``; records tested at
            different alpha levels without an explicit ``alpha``; a setting of the wrong type or out of range
            (:class:`rbjax.core.errors.SettingError`). TypeError: a keyword that is not a setting.
    """
    cfg = (config or PlotConfig()).replace(**settings)
    alpha, title, allow_mixed = cfg.alpha, cfg.title, cfg.allow_mixed
    if not results or not any(results.values()):
        raise ValueError("nothing to plot: no LMB records")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    desc = _check_mix(results, allow_mixed)
    alpha = _alpha(results, alpha)
    labels = list(results)
    types = _type_order(results)
    drawn = [r for recs in results.values() for r in recs if r.get("t_value") is not None]
    tcrits = [_critical_t(r, alpha) for r in drawn]

    fig = Figure(figsize=(max(5.5, 0.9 * len(types) * len(labels) ** 0.5) + 3.5, 4.2) if not legend_below else
                 (max(10.0, 0.9 * len(types) * len(labels) ** 0.5 + 2.0), 4.2 + 0.22 * (len(labels) + 9) / 2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    handles = _draw_series(ax, results, types, desc, alpha, tcrits, legend_below)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(np.arange(len(types)), types)  # slanted or upright by fit_labels when they would overlap
    ax.set_ylabel("LMB t-value\n(t < 0: stereotypical,\nt > 0: anti-stereotypical)")
    ax.set_title(title or "Language model bias: two-tailed paired t-test per bias type", fontsize=10)
    # the legend explains what is drawn, nothing else
    handles += _key_handles(results, drawn, tcrits, alpha, len(types) * len(labels), na_label)
    _place_legend(ax, handles, desc, len(labels), legend_below)
    fit_labels(fig, ax, legend_below=legend_below)
    return fig


def _type_order(results: dict[str, list[dict]]) -> list[str]:
    """The bias types along the x axis: a pair benchmark's categories in their order, else the paper's bias types
    first, then any other in name order."""
    present = {r["bias_type"] for recs in results.values() for r in recs}
    if all(r.get("benchmark") for recs in results.values() for r in recs):  # a pair benchmark: its categories' order
        return list(dict.fromkeys(r["bias_type"] for recs in results.values() for r in recs))
    return [b for b in BIAS_TYPES if b in present] + sorted(present - set(BIAS_TYPES))


def _critical_t(r: dict, alpha: float) -> float:
    """Two-tailed |t| at ``alpha`` for the record's own df (the normal approximation without one)."""
    from scipy import stats  # here, not at the top: ≈ 0.5 s that commands which draw nothing do not pay

    df = r.get("df")
    return float(stats.t.ppf(1 - alpha / 2, df)) if df else float(stats.norm.ppf(1 - alpha / 2))


def _draw_series(ax, results: dict[str, list[dict]], types: list[str], desc: dict, alpha: float,
                 tcrits: list[float], legend_below: bool) -> list:
    """The axes' limits, then every series' bars (one per bias type, :func:`_draw_bar`); one legend patch per
    series (labelled with what its t-values mean, unless ``legend_below`` says that once for all)."""
    from matplotlib import rcParams
    from matplotlib.patches import Patch
    from scipy import stats

    labels = list(results)
    width = 0.8 / len(labels)
    x = np.arange(len(types))
    colors = rcParams["axes.prop_cycle"].by_key()["color"]
    ts = [abs(r["t_value"]) + (r.get("t_sd") or 0.0) for recs in results.values() for r in recs
          if r.get("t_value") is not None]
    top = 1.3 * max([*tcrits, *ts, float(stats.norm.ppf(1 - alpha / 2))])  # room for the stars inside the frame
    ax.set_ylim(-top, top)
    ax.set_xlim(-0.5, len(types) - 0.5)
    handles = []
    for j, lab in enumerate(labels):
        color = colors[j % len(colors)]
        by = {r["bias_type"]: r for r in results[lab]}
        for i, bt in enumerate(types):
            _draw_bar(ax, by.get(bt), x[i] - 0.4 + width * (j + 0.5), width, color, top, f"{lab}:{bt}", alpha)
        shared = legend_below and len({d["text"] for d in desc.values()}) == 1
        handles.append(Patch(facecolor=color, edgecolor="black", linewidth=0.5,
                             label=lab if shared else f"{lab}: {desc[lab]['text']}"))
    return handles


def _draw_bar(ax, r: dict | None, xpos: float, width: float, color, top: float, gid: str, alpha: float) -> None:
    """One bar of a series at ``xpos``: "n/a" without a t-value; else the bar (solid when p < alpha, else hatched),
    its own threshold lines, the seeds' error bar and the star. ``gid``: ``"<label>:<bias type>"``."""
    t = None if r is None else r.get("t_value")
    if t is None:
        ax.text(xpos, 0.02 * top, "n/a", ha="center", va="bottom", rotation=90, fontsize=7, color="dimgray",
                gid=f"na:{gid}")
        return
    p = r.get("p_value")
    sig = p is not None and p < alpha
    (bar,) = ax.bar(xpos, t, width, color=color, edgecolor="black", linewidth=0.5,
                    hatch=None if sig else HATCH, alpha=1.0 if sig else 0.6)
    bar.set_gid(f"bar:{gid}")
    tc = _critical_t(r, alpha)
    for sign in (1, -1):  # this bar's own threshold (its df), as wide as the bar
        ax.plot([xpos - width / 2, xpos + width / 2], [sign * tc] * 2, color="grey", linestyle="--",
                linewidth=0.8, gid=f"threshold:{'+' if sign > 0 else '-'}:{gid}")
    sd = r.get("t_sd")
    if sd:  # several seeds: the bar is their mean, the error bar ± their standard deviation
        ax.errorbar(xpos, t, yerr=sd, fmt="none", ecolor="black", elinewidth=0.8, capsize=2, gid=f"sd:{gid}")
    if sig:  # beyond the error bar's cap, never on it
        ystar = t + (sd or 0.0) * (1 if t > 0 else -1)
        ax.annotate("*", (xpos, ystar), xytext=(0, 1 if t > 0 else -1), textcoords="offset points",
                    ha="center", va="bottom" if t > 0 else "top", fontsize=12, gid=f"star:{gid}")


def _key_handles(results: dict[str, list[dict]], drawn: list[dict], tcrits: list[float], alpha: float,
                 n_slots: int, na_label: str) -> list:
    """The legend entries that explain what is drawn: solid / hatched bars and stars (those that occur), the
    dashed thresholds, the "n/a" mark (fewer drawn bars than ``n_slots``) and the seeds' error bars."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = []
    sig = [r.get("p_value") is not None and r["p_value"] < alpha for r in drawn]
    if any(sig):
        handles += [Patch(facecolor="lightgrey", edgecolor="black", linewidth=0.5,
                          label=f"solid bar: significant, p < {alpha:g}"),
                    Line2D([], [], linestyle="none", marker="$*$", markersize=8, color="black",
                           label=f"*: p < {alpha:g} (two-tailed)")]
    if not all(sig):
        handles.append(Patch(facecolor="white", edgecolor="black", linewidth=0.5, hatch=HATCH,
                             label=f"hatched bar: not significant, p ≥ {alpha:g}"))
    dfs = sorted({r["df"] for r in drawn if r.get("df")})
    if drawn and not dfs:
        dashed = f"dashed: |t| = {tcrits[0]:.2f}, p = {alpha:g} (normal approximation: no df recorded)"
    elif len(dfs) == 1 and all(r.get("df") for r in drawn):
        dashed = f"dashed: |t| = {tcrits[0]:.2f}, p = {alpha:g} (df = {dfs[0]})"
    elif drawn:
        dashed = (f"dashed, over each bar: |t| at p = {alpha:g} for the bar's own df (df {dfs[0]}–{dfs[-1]}: "
                  f"|t| = {min(tcrits):.2f}–{max(tcrits):.2f})")
    if drawn:
        handles.append(Line2D([], [], color="grey", linestyle="--", linewidth=0.8, label=dashed))
    if len(drawn) < n_slots:  # a type a series has no t-value for
        handles.append(Line2D([], [], linestyle="none", marker="$n/a$", markersize=12, color="dimgray",
                              label=na_label))
    if any(r.get("t_sd") for recs in results.values() for r in recs):
        handles.append(Line2D([], [], color="black", linewidth=0.8, marker="_", markersize=6,
                              label="error bar: ± seed standard deviation of t (bar: mean over seeds)"))
    return handles


def _place_legend(ax, handles: list, desc: dict, n_series: int, legend_below: bool) -> None:
    """The legend outside the axes: right of them, or under them in two columns (``legend_below``; the shared
    description of the series said once, after their entries)."""
    from matplotlib.patches import Patch

    if legend_below:
        if len({d["text"] for d in desc.values()}) == 1:
            handles.insert(n_series, Patch(facecolor="white", edgecolor="white",
                                           label=f"every series: {next(iter(desc.values()))['text']}"))
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.09), borderaxespad=0.0, fontsize=9,
                  ncol=2, frameon=False)
    else:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=8,
                  frameon=False)


def fit_labels(fig, ax, *, legend_below: bool = False, min_height: float = 2.6, max_passes: int = 5) -> None:
    """Lay out a one-axes figure so that no two of its labels overlap, whatever the length of the category names,
    the title or the number of categories; in place.

    * x tick labels: upright when each fits between its neighbours' ticks, else slanted by 30° (anchored at the
      tick, so neighbours are parallel strips ``gap · sin 30°`` apart: they clear each other when that exceeds the
      text height), else vertical; when even vertical labels are closer than their height, the figure is widened.
    * the title and the y label are wrapped at spaces to the axes' width and height (a label written with its own
      line breaks is kept); the figure is made taller where the axes would be lower than ``min_height`` inches.
    * a legend under the axes (``legend_below``) is moved below the tick labels, however tall they are; the figure
      is widened where the legend is wider than it.

    ``fig.tight_layout`` after each change, until nothing changes (at most ``max_passes`` passes).
    """
    import textwrap

    ticks = [t for t in ax.get_xticklabels() if t.get_text()]
    title, ylab = ax.title, ax.yaxis.label
    raw = {id(title): title.get_text(), id(ylab): ylab.get_text()}
    legend = ax.get_legend()
    if legend_below and legend is not None:  # a legend wider than the figure: the figure widened to hold it
        fig.canvas.draw()
        need = legend.get_window_extent().width / fig.dpi + 0.6
        if need > fig.get_figwidth():
            fig.set_figwidth(need)
    for _ in range(max_passes):
        fig.tight_layout()
        r = fig.canvas.get_renderer()
        frame = ax.get_window_extent(r)
        changed = False
        if frame.height < min_height * fig.dpi:  # squeezed by tall tick labels or a legend below: a taller figure
            fig.set_figheight(fig.get_figheight() + min_height - frame.height / fig.dpi)
            continue
        if len(ticks) > 1:
            xs = sorted(float(ax.transData.transform((x, 0))[0]) for x in ax.get_xticks())
            gap = min(np.diff(xs))
            state = [(t.get_rotation(), t.get_ha()) for t in ticks]
            for t in ticks:  # measured upright
                t.set_rotation(0)
            ext = [t.get_window_extent(r) for t in ticks]
            h = max(e.height for e in ext)
            if all((a.width + b.width) / 2 + 0.6 * h <= gap for a, b in zip(ext, ext[1:])):
                want = (0.0, "center", "default")
            elif gap * 0.5 >= 1.3 * h:  # sin 30° = 0.5
                want = (30.0, "right", "anchor")
            else:
                want = (90.0, "center", "default")
                if gap < 1.3 * h:
                    fig.set_figwidth(fig.get_figwidth() * 1.3 * h / gap + 0.2)
                    changed = True
            for t in ticks:
                t.set_rotation(want[0])
                t.set_ha(want[1])
                t.set_rotation_mode(want[2])
            changed |= state != [(t.get_rotation(), t.get_ha()) for t in ticks]
        for text, room, along in ((title, frame.width, "width"), (ylab, frame.height, "height")):
            full = raw[id(text)]
            if not full or "\n" in full:  # written with its own line breaks: kept
                continue
            shown = text.get_text()
            text.set_text(full)  # measured on one line
            lines = max(1, int(np.ceil(getattr(text.get_window_extent(r), along) / (0.95 * room))))
            wrapped = "\n".join(textwrap.wrap(full, int(np.ceil(len(full) / lines)) + 1)) if lines > 1 else full
            text.set_text(wrapped)
            changed |= wrapped != shown
        if legend_below and legend is not None:
            fig.canvas.draw()  # the tick labels' final extent
            bottom = min([t.get_window_extent(r).y0 for t in ticks] + [frame.y0])
            y = float(ax.transAxes.inverted().transform((0, bottom - 4))[1])
            old = legend.get_bbox_to_anchor().transformed(ax.transAxes.inverted()).y0
            if abs(old - y) > 1e-3:
                legend.set_bbox_to_anchor((0.5, y), transform=ax.transAxes)
                changed = True
        if not changed:
            break
    fig.tight_layout()


def plot_lmb(results: dict[str, list[dict]], out_path: str | os.PathLike, config: PlotConfig | None = None,
             **settings) -> Path:
    """Draw :func:`figure_lmb` (``config`` and ``settings`` as there: :class:`rbjax.lmb.config.PlotConfig`) and write
    it to ``out_path`` (PNG, PDF or SVG by suffix), atomically; the Python side of ``rbjax plot``.

    Returns:
        the path written.
    Raises:
        ValueError: ``out_path`` is a folder or has an unsupported suffix, and everything :func:`figure_lmb` raises.
    """

    out = Path(out_path)
    if out.is_dir():
        raise ValueError(f"{out} is a folder; give the file to write (e.g. {out / 'lmb.png'})")
    fmt = FORMATS.get(out.suffix.lower())
    if fmt is None:
        raise ValueError(f"{out}: unsupported plot format {out.suffix!r}; use one of {', '.join(FORMATS)}")
    fig = figure_lmb(results, (config or PlotConfig()).replace(**settings))
    with atomic_file(out, "wb") as f:
        fig.savefig(f, format=fmt, dpi=150, bbox_inches="tight")
    return out


def figure_changes(res: dict, title: str | None = None):
    """The paired comparison of :func:`rbjax.lmb.compare.compare_runs`: per bias type the mean change of the
    per-pair bias effect (A − B, log-perplexity ratio) with its bootstrap CI (at the comparison's ``ci_level``, the
    family-wise level of the verdict), solid when significant after the correction across types, hatched otherwise;
    a zero line.

    Returns:
        a ``matplotlib.figure.Figure`` (Agg canvas). Artists carry ``gid``s: ``"change:<type>"``, ``"ci:<type>"``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    rows = res["types"]
    if not rows:
        raise ValueError("nothing to plot: no bias type compared")
    fig = Figure(figsize=(max(5.0, 1.1 * len(rows) + 2.0), 4.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    x = np.arange(len(rows))
    alpha = res["alpha"]
    for i, r in enumerate(rows):
        m = r["mean_change"]
        if m is None:
            continue
        sig = r["significant"]
        (bar,) = ax.bar(i, m, 0.6, color="tab:blue", edgecolor="black", linewidth=0.5,
                        hatch=None if sig else HATCH, alpha=1.0 if sig else 0.55)
        bar.set_gid(f"change:{r['bias_type']}")
        ci = r.get("mean_change_ci")
        if ci:
            ax.errorbar(i, m, yerr=[[m - ci[0]], [ci[1] - m]], fmt="none", ecolor="black", elinewidth=0.9,
                        capsize=4, gid=f"ci:{r['bias_type']}")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(x, [r["bias_type"] for r in rows])  # slanted or upright by fit_labels when they would overlap
    ax.set_ylabel("mean change of e, A − B\n(> 0: A toward the\nanti-stereotypical side)", fontsize=9)
    ax.set_title(title or f"A = {res['a']['label']} vs B = {res['b']['label']}: paired change per bias type of "
                          "e = log ppl(biased) − log ppl(counterfactual)", fontsize=10)
    level = res.get("ci_level", 1 - alpha)
    lvl = f"{100 * level:.4g}%" + ("" if len(rows) <= 1 else f", Bonferroni-adjusted for {len(rows)} types (the "
                                                             "level of the verdict)")
    handles = [Patch(facecolor="tab:blue", edgecolor="black", linewidth=0.5,
                     label=f"solid: significant ({res['correction']}-corrected paired t-test, p < {alpha:g})"),
               Patch(facecolor="tab:blue", alpha=0.55, edgecolor="black", linewidth=0.5, hatch=HATCH,
                     label="hatched: not significant"),
               Patch(facecolor="white", edgecolor="white", label=f"error bar: {lvl} bootstrap CI (BCa) of the mean")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=1, fontsize=8, frameon=False)
    fit_labels(fig, ax, legend_below=True)
    return fig
