"""The Figure-1 plot's content (bars, marks, legend, threshold, layout) and `rbjax plot`'s refusal of mixed folders."""
import json

import numpy as np
import pytest
from scipy import stats as sps

from rbjax.cli import main
from rbjax.lmb.plot import figure_lmb, load_results, plot_lmb


def rec(bt, t, p, *, df=200, split="test", applied=True, stored=False, alpha=0.05, status="ok"):
    return {"bias_type": bt, "split": split, "t_value": t, "p_value": p, "df": df, "status": status,
            "significant": p is not None and p < alpha,
            "outlier_rule": {"applied": applied, "n_std": 3.0, "ddof": 0},
            "settings": {"stored_perplexities": stored, "alpha": alpha, "split": split}}


BASE = [rec("religion1", -3.5, 5e-4), rec("religion2", -5.3, 2e-7), rec("race", 1.1, 0.25),
        rec("gender", None, None, status="zero variance of the differences")]  # queerness not measured
HD = [rec("religion1", -0.5, 0.6), rec("religion2", -2.5, 0.013), rec("race", 0.3, 0.7), rec("gender", -1.0, 0.3),
      rec("queerness", 2.2, 0.03, df=150)]


def _by_gid(ax, prefix):
    arts = list(ax.patches) + list(ax.texts) + list(ax.lines)
    return {a.get_gid()[len(prefix):]: a for a in arts if (a.get_gid() or "").startswith(prefix)}


def test_bars_marks_threshold_and_legend():
    fig = figure_lmb({"base": BASE, "hd": HD})
    (ax,) = fig.axes
    bars = _by_gid(ax, "bar:")
    want = {f"{lab}:{r['bias_type']}": r for lab, recs in (("base", BASE), ("hd", HD)) for r in recs
            if r["t_value"] is not None}
    assert set(bars) == set(want)
    for k, r in want.items():
        assert bars[k].get_height() == pytest.approx(r["t_value"])  # bar height = the record's t-value
        assert (bars[k].get_hatch() is None) == (r["p_value"] < 0.05)  # solid iff significant, else hatched
    # bias types in the paper's order, the series side by side within a group
    assert [t.get_text() for t in ax.get_xticklabels()] == ["religion1", "religion2", "race", "gender", "queerness"]
    xs = {k: b.get_x() + b.get_width() / 2 for k, b in bars.items()}
    assert xs["base:religion1"] < xs["hd:religion1"] < xs["base:religion2"] < xs["hd:queerness"]
    # stars exactly on the significant bars, at their ends
    stars = _by_gid(ax, "star:")
    assert set(stars) == {"base:religion1", "base:religion2", "hd:religion2", "hd:queerness"}
    for k, s in stars.items():
        assert s.get_text() == "*" and s.xy == pytest.approx((xs[k], want[k]["t_value"]))
    # n/a for an undefined t and for a type the series did not measure
    na = _by_gid(ax, "na:")
    assert set(na) == {"base:gender", "base:queerness"} and all(t.get_text() == "n/a" for t in na.values())
    assert na["base:queerness"].get_position()[0] == pytest.approx(xs["hd:queerness"] - bars["hd:queerness"].get_width())
    # thresholds: over every bar, the two-tailed critical t at alpha for that bar's own df (queerness: 150, the
    # others 200), as wide as the bar; none where there is no bar
    th = _by_gid(ax, "threshold:")
    assert set(th) == {f"{s}:{k}" for s in "+-" for k in want}
    for k, r in want.items():
        tcrit = sps.t.ppf(0.975, r["df"])
        for s, sign in (("+", 1), ("-", -1)):
            line = th[f"{s}:{k}"]
            assert list(line.get_ydata()) == pytest.approx([sign * tcrit] * 2)
            assert list(line.get_xdata()) == pytest.approx([bars[k].get_x(), bars[k].get_x() + bars[k].get_width()])
    # the legend names each series with its split and outlier rule and explains what is drawn, nothing else
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert texts[:2] == ["base: test split, 3σ outlier pairs removed", "hd: test split, 3σ outlier pairs removed"]
    assert "hatched bar: not significant, p ≥ 0.05" in texts and "solid bar: significant, p < 0.05" in texts
    assert "*: p < 0.05 (two-tailed)" in texts
    lo, hi = sps.t.ppf(0.975, 200), sps.t.ppf(0.975, 150)
    assert (f"dashed, over each bar: |t| at p = 0.05 for the bar's own df (df 150–200: |t| = {lo:.2f}–{hi:.2f})"
            in texts)
    assert any(t.startswith("n/a:") for t in texts)
    assert not any("↓" in t or "↑" in t or "direction" in t for t in texts)  # no arrows are drawn
    assert len(texts) == 2 + 5  # the series, solid, *, hatched, dashed, n/a
    assert "t < 0: stereotypical" in ax.get_ylabel() and "t > 0: anti-stereotypical" in ax.get_ylabel()


def test_one_df_one_threshold_and_a_legend_of_what_is_drawn():
    recs = [rec(bt, -0.5, 0.6, df=231) for bt in ("religion1", "race")]
    ax = figure_lmb({"m": recs}).axes[0]
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    tcrit = sps.t.ppf(0.975, 231)
    assert texts[1:] == ["hatched bar: not significant, p ≥ 0.05", f"dashed: |t| = {tcrit:.2f}, p = 0.05 (df = 231)"]
    assert {round(line.get_ydata()[0], 9) for line in _by_gid(ax, "threshold:").values()} == {
        round(tcrit, 9), round(-tcrit, 9)}


def test_labels_stay_off_the_bars_and_the_frame():
    fig = figure_lmb({"base": BASE, "hd": HD, "third": HD[:3]})
    (ax,) = fig.axes
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    frame = ax.get_window_extent(r)
    bars = [b.get_window_extent(r) for b in _by_gid(ax, "bar:").values()]
    legend = ax.get_legend().get_window_extent(r)
    assert legend.x0 >= frame.x1  # beside the axes, covering nothing
    marks = list(_by_gid(ax, "star:").values()) + list(_by_gid(ax, "na:").values())
    assert len(marks) == 5 + 4
    for m in marks:
        e = m.get_window_extent(r).shrunk(0.9, 0.9)  # glyph boxes include a little padding
        assert frame.x0 <= e.x0 and e.x1 <= frame.x1 and frame.y0 <= e.y0 and e.y1 <= frame.y1, m.get_gid()
        assert not any(e.overlaps(b) for b in bars), m.get_gid()
    # nothing else is written inside the axes (no threshold label on the frame)
    assert {(t.get_gid() or "").split(":")[0] for t in ax.texts} == {"star", "na"}


def test_mixed_splits_or_outlier_handling_are_refused_unless_asked():
    valid = [dict(r, split="valid") for r in HD]
    with pytest.raises(ValueError, match=r"mix splits \(base: test, hd: valid\).*pass allow_mixed to plot"):
        figure_lmb({"base": BASE, "hd": valid})
    fig = figure_lmb({"base": BASE, "hd": valid}, allow_mixed=True)
    texts = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert texts[:2] == ["base: test split, 3σ outlier pairs removed", "hd: valid split, 3σ outlier pairs removed"]
    stored = [rec(r["bias_type"], r["t_value"], r["p_value"], applied=False, stored=True) for r in HD]
    with pytest.raises(ValueError, match="mix outlier handling"):
        figure_lmb({"model": BASE, "stored": stored})
    fig = figure_lmb({"model": BASE, "stored": stored}, allow_mixed=True)
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()][1] == (
        "stored: test split, stored perplexities, no outlier removal")
    with pytest.raises(ValueError, match="mix splits"):  # one folder mixing splits is refused too
        figure_lmb({"both": BASE[:2] + valid[2:]})


def test_alpha_from_the_records_or_given():
    a01 = [dict(r, settings=dict(r["settings"], alpha=0.01)) for r in HD]
    fig = figure_lmb({"hd": a01})
    ax = fig.axes[0]
    assert set(_by_gid(ax, "star:")) == set()  # p = 0.013 and 0.03 are not < 0.01
    assert _by_gid(ax, "threshold:")["+:hd:queerness"].get_ydata()[0] == pytest.approx(sps.t.ppf(0.995, 150))
    assert _by_gid(ax, "threshold:")["+:hd:race"].get_ydata()[0] == pytest.approx(sps.t.ppf(0.995, 200))
    assert set(_by_gid(figure_lmb({"hd": a01}, alpha=0.05).axes[0], "star:")) == {"hd:religion2", "hd:queerness"}
    with pytest.raises(ValueError, match="different alpha"):
        figure_lmb({"a": a01, "b": BASE})


def _folder(tmp_path, name, recs):
    d = tmp_path / name
    d.mkdir()
    (d / "lmb.json").write_text(json.dumps(recs))
    return d


def test_cli_writes_where_told_and_refuses_mixed_folders(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a, b = _folder(tmp_path, "base", BASE), _folder(tmp_path, "hd", HD)
    v = _folder(tmp_path, "hd_valid", [dict(r, split="valid") for r in HD])
    out = tmp_path / "figs" / "fig1.png"
    assert main(["plot", f"base={a}", str(b), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out.resolve()}"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # test and valid folders: refused, nothing written
    bad = tmp_path / "mixed.png"
    assert main(["plot", str(a), str(v), "--out", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "mix splits (base: test, hd_valid: valid)" in err and "pass --allow-mixed to plot" in err and "allow_mixed" not in err and not bad.exists()
    assert main(["plot", str(a), str(v), "--out", str(bad), "--allow-mixed"]) == 0 and bad.exists()
    # --out is required: nothing lands in the current folder unannounced
    with pytest.raises(SystemExit):
        main(["plot", str(a)])
    assert "--out" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == [".rbjax_outputs.json", "mixed.png"]
    # the same plot again is this command's own file; another plot into it only with --overwrite
    assert main(["plot", str(a), str(v), "--out", str(bad), "--allow-mixed"]) == 0
    assert main(["plot", str(a), "--out", str(bad)]) == 1
    assert "mixed.png (written from other inputs" in capsys.readouterr().err
    assert main(["plot", str(a), "--out", str(bad), "--overwrite"]) == 0
    # clear errors
    assert main(["plot", str(a), "--out", str(tmp_path)]) == 1 and "is a folder" in capsys.readouterr().err
    assert main(["plot", str(a), "--out", "x.jpg"]) == 1 and "unsupported plot format" in capsys.readouterr().err
    assert main(["plot", f"x={a}", f"x={b}", "--out", "y.png"]) == 1 and "labelled 'x'" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "nope"), "--out", "y.png"]) == 1 and "no lmb.json" in capsys.readouterr().err


def test_plot_of_real_measure_records(redditbias_dir, tmp_path):
    from rbjax.lmb.measure import measure_bias

    recs = measure_bias(stored_perplexities=True, bias_types="all", data_dir=redditbias_dir, out_dir=tmp_path,
                        progress=False, n_bootstrap=0)
    assert (tmp_path / "lmb.png").read_bytes()[:4] == b"\x89PNG"
    fig = figure_lmb({"DialoGPT-small (released)": load_results(tmp_path)})
    ax = fig.axes[0]
    bars = _by_gid(ax, "bar:DialoGPT-small (released):")
    assert {k: b.get_height() for k, b in bars.items()} == {r["bias_type"]: pytest.approx(r["t_value"]) for r in recs}
    assert set(_by_gid(ax, "star:")) == {"DialoGPT-small (released):religion1", "DialoGPT-small (released):religion2"}
    assert [t.get_text() for t in ax.get_legend().get_texts()][0] == (
        "DialoGPT-small (released): test split, stored perplexities, no outlier removal")
    out = plot_lmb({"a": recs}, tmp_path / "p.svg")
    assert out.read_text().lstrip().startswith("<?xml")
    assert np.isfinite([r["t_value"] for r in recs]).all()


def overlapping_texts(fig) -> list[tuple[str, str]]:
    """Pairs of texts of ``fig``'s axes whose drawn glyphs share a pixel: the figure is drawn, then each text alone
    onto a cleared canvas, and the pixels each inks are compared — exact for slanted labels too, whose axis-aligned
    bounding boxes overlap even where the glyphs do not. The texts: title, axis labels, x tick labels, the y tick
    labels within the limits, the legend's texts and the texts in the axes."""
    (ax,) = fig.axes
    fig.canvas.draw()
    lo, hi = ax.get_ylim()
    texts = [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.get_xticklabels(), *ax.texts,
             *[t for t, y in zip(ax.get_yticklabels(), ax.get_yticks()) if lo <= y <= hi],
             *(ax.get_legend().get_texts() if ax.get_legend() else [])]
    texts = [t for t in texts if t.get_visible() and t.get_text().strip()]
    r = fig.canvas.get_renderer()
    masks = []
    for t in texts:
        r.clear()
        t.draw(r)
        masks.append(np.asarray(r.buffer_rgba())[..., 3] > 100)
    assert all(m.any() for m in masks)  # every text is drawn on the canvas, whole
    for t in texts:
        e = t.get_window_extent(r)
        assert fig.bbox.x0 <= e.x0 and e.x1 <= fig.bbox.x1 and fig.bbox.y0 <= e.y0 and e.y1 <= fig.bbox.y1, t
    return [(texts[i].get_text(), texts[j].get_text()) for i in range(len(texts)) for j in range(i + 1, len(texts))
            if (masks[i] & masks[j]).any()]


CROWS = ["race-color", "socioeconomic", "gender", "disability", "nationality", "sexual-orientation",
         "physical-appearance", "religion", "age"]


def _crows_records(names):
    return [dict(rec(c, (i - 4) * 1.3, 0.01 if i % 2 else 0.3, df=100, split="all"), benchmark="crows-pairs")
            for i, c in enumerate(names)]


def test_no_two_labels_of_a_pair_benchmarks_lmb_png_overlap():
    """CrowS-Pairs' nine categories with the long title `rbjax measure --benchmark` gives: no label touches another
    (tick labels, title — wrapped to the axes' width —, y label, legend); the long names are slanted."""
    names = CROWS
    fig = figure_lmb({"dialogpt-small": _crows_records(names)},
                     title="crows-pairs, rbjax convention: two-tailed paired t-test per category (t < 0: "
                           "stereotype-consistent sentences more likely)")
    assert overlapping_texts(fig) == []
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == names  # wrapped nowhere, in the benchmark's order
    assert {t.get_rotation() for t in ax.get_xticklabels()} == {30.0}  # too long to stand upright


def test_no_two_labels_of_compare_png_overlap_and_short_names_stand_upright():
    """compare.png of CrowS-Pairs' nine categories: no overlap (the legend under the axes sits below the slanted tick
    labels); a comparison of RedditBias' short names keeps them upright."""
    from rbjax.lmb.plot import figure_changes

    def res(names):
        return {"a": {"label": "cda/crows-pairs"}, "b": {"label": "baseline/crows-pairs"}, "alpha": 0.05,
                "ci_level": 1 - 0.05 / len(names), "correction": "bonferroni",
                "types": [{"bias_type": c, "mean_change": 0.01 * (i - 4), "significant": i % 2 == 0,
                           "mean_change_ci": [0.01 * (i - 4) - 0.005, 0.01 * (i - 4) + 0.005]}
                          for i, c in enumerate(names)]}

    fig = figure_changes(res(CROWS))
    assert overlapping_texts(fig) == []
    fig = figure_changes(res(["religion1", "religion2", "race", "gender", "queerness"]))
    assert overlapping_texts(fig) == []
    assert {t.get_rotation() for t in fig.axes[0].get_xticklabels()} == {0.0}
