"""Did a model's bias change? A paired comparison of two measured models on the same phrase pairs.

The LMB test of one model (paper §3.1) asks whether *that* model prefers the stereotypical phrases; a difference of
two such t-values is not a test of whether the models differ (a t-value grows with the number of pairs). This module
tests the change itself, pair by pair:

    e_i(M) = log ppl_M(biased_i) − log ppl_M(counterfactual_i)        (< 0: M prefers the stereotypical phrase)
    d_i    = e_i(A) − e_i(B)                                           (> 0: A toward the anti-stereotypical side)

on the pairs both runs kept (scorable and not a 3σ outlier in any run compared). Per bias type: the two-tailed paired
t-test of e(A) vs e(B) (the one-sample t-test of d, ``scipy.stats.ttest_rel``), the Wilcoxon signed-rank test of d
(``scipy.stats.wilcoxon``, two-sided), the share of pairs whose sign of e flipped, the p-values corrected across
the m types compared (:func:`rbjax.lmb.stats.adjust_pvalues`; a change is *significant* when its Bonferroni-corrected
t-test p-value is below alpha), and the mean change with a BCa bootstrap CI (:func:`rbjax.lmb.stats.bootstrap_ci`) at
the same family-wise level as that verdict: 1 − alpha/m, Bonferroni-adjusted (``ci_level``; 97.5 % for two types at
alpha 0.05), so the CI printed beside a verdict is the one the verdict answers to.

The verdict (:func:`describe_change`, :func:`short_verdict`) prints each side's own effect on these pairs (mean e and
its one-sample t against 0) and says how the bias moved from B to A relative to zero (:func:`bias_movement`): toward
zero (|mean e| down, same sign), past zero (sign flipped) or away from zero (|mean e| up). The sign of d alone does
not say that: a model moving from anti-stereotypical toward zero has d < 0.

With several runs per side (training seeds), e_i of that side is the mean over its runs, and the mean change of each
seed is given beside the result (the seed spread).

Runs are compared only when their pairs are the same: the same phrase pairs in the same order (the per-type CSVs),
data files, split, outlier handling, tokenizer files, BOS setting, stored-vs-model perplexities and *format* (raw
text, or a turn of the chat template with its role, system prompt, user message, end-of-turn scoring and template;
docs/chat.md). Anything else is refused with the reason (:class:`MismatchError`) — except a difference of format when
``allow_format_change`` (``--allow-format-change``): "does the chat format change the bias?" is a question of its own,
and the result then says that it compares two formats of the pairs (``formats``).

``rbjax compare A B --out DIR`` and :func:`compare_models` write ``compare.json``, ``compare.csv``, ``compare.png`` and
``<type>_changes.csv`` (the per-pair values); see ``docs/compare.md``.
"""
from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from rbjax.core.io import atomic_file, atomic_write_csv, atomic_write_json, versions
from rbjax.lmb import stats
from rbjax.lmb.config import CompareConfig
from rbjax.lmb.measure import CSV_HEADER, measure_state, pairs_digest
from rbjax.lmb.pair_benchmark import lm_eval_change, read_loglikelihoods
from rbjax.lmb.plot import figure_changes, load_results

__all__ = ["MeasuredType", "MismatchError", "load_run", "compare_runs", "compare_models", "paired_change",
           "describe_change", "short_verdict", "effects_text", "movement_text", "bias_movement", "default_labels",
           "format_comparison", "mcnemar_text", "write_comparison", "run_format", "record_format", "describe_format",
           "ci_label", "plural"]

CORRECTION = "bonferroni"  # the correction that decides "significant" (and sets the CI's level)
wilcoxon = stats.wilcoxon  # the test of d (rbjax.lmb.stats.wilcoxon)


class MismatchError(ValueError):
    """Two runs whose pairs differ (data, split, outlier handling, tokenization): a paired comparison is refused."""


@dataclass
class MeasuredType:
    """One bias type of one ``rbjax measure`` output folder: its ``lmb.json`` record and its per-pair CSV.

    Attributes:
        folder: the measure output folder.
        record: the type's ``lmb.json`` record.
        biased, counterfactual: (N,) phrases, in the CSV's order.
        effect: (N,) float64 ``log ppl(biased) − log ppl(counterfactual)``, NaN for excluded pairs.
        kept: (N,) bool, the pair entered this run's primary test (scorable and not an outlier).
        ll_diff: (N,) float64 LL(stereotype-consistent) − LL(other) in lm-evaluation-harness's convention (a pair
            benchmark's ``<category>_loglikelihoods.csv``), else ``None``.
    """

    folder: Path
    record: dict
    biased: list[str]
    counterfactual: list[str]
    effect: np.ndarray
    kept: np.ndarray
    ll_diff: np.ndarray | None = None


def _read_pairs_csv(path: Path):
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        raise FileNotFoundError(f"{path}: cannot read the per-pair perplexities ({e.strerror or e}); the paired "
                                "comparison needs the CSVs 'rbjax measure' writes beside lmb.json") from None
    if not rows or rows[0] != CSV_HEADER:
        raise ValueError(f"{path}: expected the header {','.join(CSV_HEADER)}")
    biased, counter, eff, kept = [], [], [], []
    for i, r in enumerate(rows[1:], start=2):
        if len(r) != len(CSV_HEADER):
            raise ValueError(f"{path} line {i}: expected {len(CSV_HEADER)} fields, got {len(r)}")
        biased.append(r[0])
        counter.append(r[1])
        if r[4] == "excluded":
            eff.append(math.nan)
            kept.append(False)
            continue
        if r[4] not in ("true", "false"):
            raise ValueError(f"{path} line {i}: field 'outlier' is {r[4]!r} (expected true, false or excluded)")
        try:
            b, c = float(r[2]), float(r[3])
        except ValueError:
            raise ValueError(f"{path} line {i}: perplexities {r[2]!r}, {r[3]!r} are not numbers") from None
        if not (b > 0 and c > 0 and math.isfinite(b) and math.isfinite(c)):
            raise ValueError(f"{path} line {i}: perplexities must be finite and positive, got {b}, {c}")
        eff.append(math.log(b) - math.log(c))
        kept.append(r[4] == "false")
    return biased, counter, np.array(eff, dtype=np.float64), np.array(kept, dtype=bool)


def load_run(folder: str | os.PathLike) -> dict[str, MeasuredType]:
    """Every bias type of an ``rbjax measure`` output folder (``lmb.json`` and its ``<type>_perplexities.csv``).

    Returns:
        ``{bias_type: MeasuredType}`` in ``lmb.json`` order.
    Raises:
        FileNotFoundError: no ``lmb.json`` or a missing CSV. ValueError: a damaged file (file and line named), or a
        CSV that does not hold the pairs its record counts.
    """
    f = Path(folder)
    if f.is_file() and f.name == "lmb.json":
        f = f.parent
    recs = load_results(f)
    out = {}
    for r in recs:
        path = f / f"{r['bias_type']}_perplexities.csv"
        b, c, e, k = _read_pairs_csv(path)
        if r.get("n_pairs") is not None and r["n_pairs"] != len(b):
            raise ValueError(f"{path}: {len(b)} pairs, but {f / 'lmb.json'} counts {r['n_pairs']} for "
                             f"{r['bias_type']} (the CSV is from another run)")
        if r.get("n_pairs_after_outliers") is not None and r["n_pairs_after_outliers"] != int(k.sum()):
            raise ValueError(f"{path}: {int(k.sum())} pairs kept, but {f / 'lmb.json'} kept "
                             f"{r['n_pairs_after_outliers']} for {r['bias_type']} (the CSV is from another run)")
        out[r["bias_type"]] = MeasuredType(f, r, b, c, e, k, _ll_diff(f / f"{r['bias_type']}_loglikelihoods.csv", b))
    return out


def _ll_diff(path: Path, biased: list[str]) -> np.ndarray | None:
    """LL(stereotype-consistent) − LL(other) per pair from a pair benchmark's log-likelihood CSV, aligned with the
    perplexity CSV's pairs (``biased``); ``None`` without the file.

    Raises:
        ValueError: a file that does not hold the same pairs (from another run).
    """
    if not path.exists():
        return None
    ll1, ll2, _, _, _, st, s1, s2 = read_loglikelihoods(path, sentences=True)
    st = np.asarray(st)
    stereo = [a if k == 1 else b for a, b, k in zip(s1, s2, st)]
    if stereo != list(biased):
        raise ValueError(f"{path}: its pairs are not those of {path.name.replace('_loglikelihoods', '_perplexities')} "
                         "(the files are from different runs)")
    return np.where(st == 1, ll1 - ll2, ll2 - ll1)


# ------------------------------------------------------------------------------------------ what the pairs are
def _inputs(m: MeasuredType) -> dict:
    """The record's ``inputs`` (content digests); for folders written before lmb.json carried them, the same facts
    from the folder's hidden measure state file (the resume key of the type's CSV)."""
    inp = m.record.get("inputs")
    if isinstance(inp, dict):
        return inp
    key = (measure_state(m.folder).entries.get(m.record["bias_type"]) or {}).get("key")
    if not isinstance(key, dict):
        return {}
    model = key.get("model") or {}
    stored = model.get("stored_perplexities") is True
    return {"data_files": key.get("data"), "tokenizer": None if stored else model.get("tokenizer"),
            "model": None if stored else model.get("model"), "bos": key.get("bos"),
            "skip_unscorable": key.get("skip_unscorable"), "precision": key.get("precision"),
            "format": "chat" if isinstance(key.get("chat"), dict) else "raw", "chat": key.get("chat")}


#: the parts of a chat-format record that make the format (not where the template came from, nor the example)
_FORMAT_KEYS = ("role", "system", "prompt", "score_end_of_turn", "template_sha256", "rendered_sha256")


def record_format(inputs: dict | None) -> dict:
    """The format of an ``lmb.json`` record's ``inputs``: ``{"format": "raw"}`` or ``{"format": "chat", role,
    system, prompt, score_end_of_turn, template_sha256, rendered_sha256}`` (records written before the chat format:
    raw)."""
    inp = inputs or {}
    if inp.get("format", "raw") != "chat":
        return {"format": "raw"}
    chat = inp.get("chat") or {}
    return {"format": "chat", **{k: chat.get(k) for k in _FORMAT_KEYS}}


def run_format(m: MeasuredType) -> dict:
    """:func:`record_format` of one measured type (older folders: from their measure state file)."""
    return record_format(_inputs(m))


def describe_format(f: dict) -> str:
    """A format in words (for the comparison's output)."""
    if f["format"] != "chat":
        return "raw text (the paper's format)"
    parts = [f"the {f.get('role')}'s turn of the chat template (sha256 {str(f.get('template_sha256'))[:12]})"]
    if f.get("system") is not None:
        parts.append(f"system prompt {f['system']!r}")
    if f.get("prompt") is not None:
        parts.append(f"after the user message {f['prompt']!r}")
    if f.get("score_end_of_turn"):
        parts.append("end-of-turn token scored")
    return ", ".join(parts)


def _facts(m: MeasuredType) -> dict:
    """What must be equal for two runs' pairs to be the same pairs, each as (label, value)."""
    r, s = m.record, m.record.get("settings") or {}
    rule = r.get("outlier_rule") or {}
    inp = _inputs(m)
    applied = rule.get("applied")
    return {
        "benchmark": r.get("benchmark", "redditbias"),
        "pair phrases": pairs_digest(m.biased, m.counterfactual),
        "split": r.get("split"),
        "data files (sha256)": inp.get("data_files"),
        "outlier handling": (applied, rule.get("n_std") if applied else None, rule.get("ddof") if applied else None),
        "perplexity source": "stored perplexities" if s.get("stored_perplexities") else "model",
        "BOS token": inp.get("bos", s.get("bos")),
        "tokenizer files (sha256)": inp.get("tokenizer"),
        "format": run_format(m),
    }


def _check_same_pairs(label_a: str, a: MeasuredType, label_b: str, b: MeasuredType,
                      allow_format_change: bool = False) -> None:
    fa, fb = _facts(a), _facts(b)
    bt = a.record["bias_type"]
    problems = []
    if fa["format"] != fb["format"]:
        if not allow_format_change:
            problems.append(f"format: {describe_format(fa['format'])} vs {describe_format(fb['format'])} (pass "
                            "--allow-format-change to compare the two formats of the pairs)")
        for f in (fa, fb):  # the format decides the BOS: a difference there is part of the format change
            f.pop("BOS token")
    fa.pop("format"), fb.pop("format")
    for k in fa:
        va, vb = fa[k], fb[k]
        if va is None or vb is None:
            stored = "stored perplexities" in (fa["perplexity source"], fb["perplexity source"])
            if k == "data files (sha256)" or (k == "tokenizer files (sha256)" and not stored):
                problems.append(f"{k}: not recorded in {label_a if va is None else label_b}, so the pairs cannot be "
                                "checked (rerun its 'rbjax measure' with --resume: it records them without rescoring)")
            continue
        if va != vb:
            if k == "pair phrases":
                i = next((i for i, (x, y) in enumerate(zip(zip(a.biased, a.counterfactual),
                                                          zip(b.biased, b.counterfactual))) if x != y), None)
                where = (f"{len(a.biased)} vs {len(b.biased)} pairs" if i is None else
                         f"first difference at CSV row {i + 1}: {a.biased[i]!r} vs {b.biased[i]!r}")
                problems.append(f"the pair phrases differ ({where})")
            elif k == "outlier handling":
                desc = lambda v: "no outlier removal" if not v[0] else f"{v[1]:g}σ pair rule, ddof={v[2]}"  # noqa
                problems.append(f"{k}: {desc(va)} vs {desc(vb)}")
            elif isinstance(va, dict):
                diff = sorted(n for n in set(va) | set(vb) if va.get(n) != vb.get(n))
                problems.append(f"{k}: {', '.join(diff)} differ")
            else:
                problems.append(f"{k}: {va!r} vs {vb!r}")
    if problems:
        raise MismatchError(f"{bt}: {label_a} ({a.folder}) and {label_b} ({b.folder}) were not measured on the same "
                            "pairs, so a paired comparison is refused: " + "; ".join(problems))


# ----------------------------------------------------------------------------------------------- statistics
def _test_zero(e: np.ndarray, alpha: float) -> dict:
    """One-sample two-tailed t-test of per-pair effects against 0 (the same pairs' LMB direction in log space)."""
    r = stats.paired_ttest(e, np.zeros_like(e))
    mean = float(e.mean()) if e.size else None
    sig = r["p_value"] is not None and r["p_value"] < alpha
    return {"mean": mean, "t_value": r["t_value"], "p_value": r["p_value"], "status": r["status"],
            "significant": bool(sig),
            "direction": None if r["t_value"] is None else ("stereotypical" if r["t_value"] < 0
                                                           else "anti-stereotypical")}


def paired_change(effect_a: np.ndarray, effect_b: np.ndarray, *, alpha: float = 0.05, n_bootstrap: int = 10000,
                  seed: int = 0, ci_level: float | None = None) -> dict:
    """The paired statistics of ``d = effect_a − effect_b`` on aligned pairs (all kept).

    Args:
        effect_a, effect_b: (N,) per-pair bias effects ``log ppl(biased) − log ppl(counterfactual)`` of the two
            models (each the mean over its seeds when there are several).
        alpha: two-tailed level of the one-sample tests of each side.
        n_bootstrap: resamples of the BCa bootstrap CI of the mean change (0: no CI).
        seed: bootstrap seed.
        ci_level: confidence level of the CI (default ``1 − alpha``; :func:`compare_runs` passes the
            Bonferroni-adjusted ``1 − alpha/m`` of its verdicts).
    Returns:
        ``{"n_pairs", "mean_change", "mean_change_ci", "ci_level", "ttest": {t_value, p_value, df, status},
        "wilcoxon": {...},
        "sign_flip": {...}, "effect_a": {...}, "effect_b": {...}, "movement": {...}}``; the effects are each
        side's mean per-pair effect on these pairs with its one-sample t-test against 0 (is A past zero?), and
        ``movement`` (:func:`bias_movement`) says whether the bias moved toward zero, past zero or away from it.
    """
    a, b = np.asarray(effect_a, dtype=np.float64), np.asarray(effect_b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"effects differ in length ({a.size} vs {b.size})")
    d = a - b
    scale = max(float(np.max(np.abs(a))) if a.size else 0.0, float(np.max(np.abs(b))) if b.size else 0.0)
    level = 1 - alpha if ci_level is None else float(ci_level)
    ci = stats.bootstrap_ci(d, level, n_bootstrap, seed, scale=scale) if n_bootstrap > 0 else None
    sa, sb = np.sign(a), np.sign(b)
    n = int(d.size)
    return {
        "n_pairs": n,
        "mean_change": float(d.mean()) if n else None,
        "mean_change_ci": None if ci is None else list(ci),
        "ci_level": level,
        "ttest": stats.paired_ttest(a, b),
        "wilcoxon": stats.wilcoxon(d, scale),
        "sign_flip": {"share": float(np.mean(sa != sb)) if n else None,
                      "n_flipped": int(np.sum(sa != sb)),
                      "to_anti_stereotypical": int(np.sum((sb < 0) & (sa > 0))),
                      "to_stereotypical": int(np.sum((sb > 0) & (sa < 0)))},
        "effect_a": _test_zero(a, alpha),
        "effect_b": _test_zero(b, alpha),
        "movement": bias_movement(float(a.mean()) if n else None, float(b.mean()) if n else None),
    }


def movement(a: float | None, b: float | None, negative: str, positive: str) -> dict | None:
    """How a signed bias measure moved from B (``b``) to A (``a``) relative to zero, its sides named ``negative``
    (below zero) and ``positive`` (above): ``None`` when either is undefined, else ``{"kind", "from", "to",
    "side_b", "side_a", "abs_change"}`` — ``kind`` ``"toward zero"`` (|x| down on the same side, or down to exactly
    0), ``"past zero"`` (the sign flipped), ``"away from zero"`` (|x| up on the same side, or up from exactly 0) or
    ``"unchanged"``; ``side_*`` one of the two names or ``"zero"``; ``abs_change`` = |a| − |b|. The one rule of
    :func:`bias_movement` (LMB) and BBQ's :func:`rbjax.lmb.bbq_compare.score_movement`."""
    if a is None or b is None:
        return None

    def side(x):
        return negative if x < 0 else positive if x > 0 else "zero"

    sa, sb = side(a), side(b)
    if a == b:
        kind = "unchanged"
    elif sb == "zero":
        kind = "away from zero"
    elif sa == "zero":
        kind = "toward zero"
    elif sa != sb:
        kind = "past zero"
    else:
        kind = "toward zero" if abs(a) < abs(b) else "away from zero"
    return {"kind": kind, "from": b, "to": a, "side_b": sb, "side_a": sa, "abs_change": abs(a) - abs(b)}


def bias_movement(mean_a: float | None, mean_b: float | None) -> dict | None:
    """How the bias moved from B to A relative to zero, read from each side's mean effect on the compared pairs
    (mean of e = log ppl(biased) − log ppl(counterfactual); < 0: stereotypical, > 0: anti-stereotypical):
    :func:`movement` with those sides (``from`` / ``to`` are B's and A's mean e)."""
    return movement(mean_a, mean_b, negative="stereotypical", positive="anti-stereotypical")


def _as_runs(x) -> list[dict[str, MeasuredType]]:
    if isinstance(x, dict):
        return [x]
    if isinstance(x, (str, os.PathLike)):
        return [load_run(x)]
    return [r if isinstance(r, dict) else load_run(r) for r in x]


def _folders(runs: list[dict[str, MeasuredType]]) -> list[Path]:
    return [next(iter(r.values())).folder for r in runs]


def default_labels(folders_a: Sequence[str | os.PathLike], folders_b: Sequence[str | os.PathLike]) -> tuple[str, str]:
    """The names of A and B when none are given: each side's folder name, with as many trailing parts of the
    (resolved) paths as tell the two sides apart (``hd/lmb_test`` vs ``baseline/lmb_test``); the distinct names of a
    side with several runs joined by ``+``; ``("A", "B")`` for the same folder on both sides."""
    pa, pb = ([Path(f).resolve().parts for f in fs] for fs in (folders_a, folders_b))
    for k in range(1, max(map(len, pa + pb)) + 1):
        name = lambda ps: "+".join(dict.fromkeys("/".join(p[-k:]) for p in ps))  # noqa: E731
        la, lb = name(pa), name(pb)
        if la != lb:
            return la, lb
    return "A", "B"


def _setting(runs, name, default):
    vals = {(t.record.get("settings") or {}).get(name) for run in runs for t in run.values()} - {None}
    return vals.pop() if len(vals) == 1 else default


def compare_runs(a, b, config: CompareConfig | None = None, *, bias_types: Sequence[str] | None = None,
                 **settings) -> dict:
    """Paired comparison of model A against model B per bias type (see the module docstring).

    Args:
        a, b: each a measure output folder, a list of them (seeds of one model: their per-pair effects are averaged),
            or already loaded runs (:func:`load_run`).
        config: how they are compared (:class:`rbjax.lmb.config.CompareConfig`): ``alpha``, the significance level
            (default: the runs' own ``settings.alpha``, else 0.05); ``n_bootstrap``, the bootstrap resamples (default:
            the runs' own ``settings.n_bootstrap``, else 10000); ``seed``; ``labels``, the names of A and B in
            messages and in the result (default: their folder names, :func:`default_labels`);
            ``allow_format_change``, compare runs measured in different formats (raw vs chat, or two chat formats) of
            the same pairs, the result's ``formats`` then saying so.
        **settings: :class:`~rbjax.lmb.config.CompareConfig` fields that override ``config`` (e.g. ``alpha=0.01``);
            any other name is a ``TypeError``.
        bias_types: the types to compare (default: every type all runs measured).
    Returns:
        ``{"a": {...}, "b": {...}, "alpha", "correction", "ci_level", "formats", "types": [per-type result],
        "not_compared": {type: why}}``; ``ci_level`` = 1 − alpha/m for the m types compared (the CI of every type is
        at the family-wise level of the Bonferroni verdict); ``formats``: ``{"a": format, "b": format, "changed":
        bool, "note": text | None}``, the formats of the first type compared; each per-type result is
        :func:`paired_change` (with that ``ci_level``) plus ``bias_type``, ``n_pairs`` (in the data),
        ``n_pairs_dropped``, ``p_corrected``, ``significant``, ``seeds`` (per-seed mean changes and their sd),
        ``overshoot`` and ``verdict`` (:func:`describe_change`), and ``pairs`` (the per-pair arrays, not JSON).
    Raises:
        MismatchError: runs not measured on the same pairs, or in different formats without
        ``allow_format_change`` (the reason named). ValueError: no type in common, or an asked-for type not measured
        by every run; rbjax.core.errors.SettingError (a ValueError): a setting of
        the wrong type or out of range (named). TypeError: a keyword that is not a setting.
    """
    cfg = (config or CompareConfig()).replace(**settings)
    alpha, n_bootstrap, seed, labels = cfg.alpha, cfg.n_bootstrap, cfg.seed, cfg.labels
    allow_format_change = cfg.allow_format_change
    runs_a, runs_b = _as_runs(a), _as_runs(b)
    if not runs_a or not runs_b:
        raise ValueError("compare needs at least one run on each side")
    if labels is None:
        labels = default_labels(_folders(runs_a), _folders(runs_b))
    alpha = float(alpha if alpha is not None else _setting(runs_a + runs_b, "alpha", 0.05))
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be between 0 and 1, got {alpha}")
    n_bootstrap = int(n_bootstrap if n_bootstrap is not None else _setting(runs_a + runs_b, "n_bootstrap", 10000))
    allruns = [(f"{labels[0]}[{i}]" if len(runs_a) > 1 else labels[0], r) for i, r in enumerate(runs_a)] + \
              [(f"{labels[1]}[{i}]" if len(runs_b) > 1 else labels[1], r) for i, r in enumerate(runs_b)]
    common = [t for t in runs_a[0] if all(t in r for _, r in allruns)]
    not_compared = {}
    for _, r in allruns:
        for t in r:
            if t not in common:
                missing = [lab for lab, rr in allruns if t not in rr]
                not_compared[t] = f"not measured in {', '.join(missing)}"
    if bias_types is not None:
        bad = [t for t in bias_types if t not in common]
        if bad:
            raise ValueError(f"bias type(s) {bad} not measured by every run compared (common: {', '.join(common)})")
        common = [t for t in common if t in bias_types]
    if not common:
        raise ValueError("the runs have no bias type in common: " + "; ".join(f"{t}: {w}" for t, w in
                                                                            not_compared.items()))
    ci_level = 1 - alpha / len(common)  # Bonferroni: the family-wise level of the verdicts, CI and test alike
    results = []
    for t in common:
        lab0, ref = allruns[0]
        for lab, r in allruns[1:]:
            _check_same_pairs(lab0, ref[t], lab, r[t], allow_format_change)
        kept = np.logical_and.reduce([r[t].kept for _, r in allruns])
        ea = np.mean([r[t].effect[kept] for r in runs_a], axis=0)
        eb = np.mean([r[t].effect[kept] for r in runs_b], axis=0)
        res = {"bias_type": t, "n_pairs_in_data": len(ref[t].biased),
               "n_pairs_dropped": int(len(kept) - kept.sum()),
               **paired_change(ea, eb, alpha=alpha, n_bootstrap=n_bootstrap, seed=seed, ci_level=ci_level)}
        res["seeds"] = _seed_spread([r[t].effect[kept] for r in runs_a], [r[t].effect[kept] for r in runs_b])
        if all(r[t].ll_diff is not None for _, r in allruns):  # a pair benchmark: its lm-evaluation-harness metric too
            res["lm_eval"] = lm_eval_change([r[t].ll_diff for r in runs_a], [r[t].ll_diff for r in runs_b])
        res["pairs"] = {"index": np.nonzero(kept)[0], "biased": [ref[t].biased[i] for i in np.nonzero(kept)[0]],
                        "counterfactual": [ref[t].counterfactual[i] for i in np.nonzero(kept)[0]],
                        "effect_a": ea, "effect_b": eb}
        results.append(res)
    for test in ("ttest", "wilcoxon"):
        adj = stats.adjust_pvalues([r[test]["p_value"] for r in results])
        for r, pb, ph in zip(results, adj["bonferroni"], adj["benjamini_hochberg"]):
            r.setdefault("p_corrected", {})[test] = {"bonferroni": pb, "benjamini_hochberg": ph,
                                                     "n_tests": len(results)}
    paired = [r for r in results if r.get("lm_eval")]  # the exact McNemar tests too, across the categories
    adj = stats.adjust_pvalues([r["lm_eval"]["mcnemar"]["p_value"] for r in paired])
    for r, pb in zip(paired, adj["bonferroni"]):
        r["lm_eval"]["mcnemar"].update(p_bonferroni=pb, n_tests=sum(p is not None for p in adj["bonferroni"]))
    for r in results:
        p = r["p_corrected"]["ttest"][CORRECTION]
        r["significant"] = p is not None and p < alpha
        r["overshoot"] = _overshoot(r)
        r["verdict"] = describe_change(r, labels)
    side = lambda runs: {"folders": [str(next(iter(x.values())).folder) for x in runs],  # noqa: E731
                         "models": [next(iter(x.values())).record.get("model") for x in runs]}
    fmt_a, fmt_b = run_format(runs_a[0][common[0]]), run_format(runs_b[0][common[0]])
    changed = any(run_format(r[t]) != fmt_a for r in runs_a for t in common) or \
        any(run_format(r[t]) != fmt_b for r in runs_b for t in common) or fmt_a != fmt_b
    formats = {"a": fmt_a, "b": fmt_b, "changed": changed,
               "note": None if not changed else
               (f"this compares two formats of the pairs, not only two models: {labels[0]} was measured as "
                f"{describe_format(fmt_a)}, {labels[1]} as {describe_format(fmt_b)}; d is the change of the "
                "per-pair effect between the formats (and between the models, where they differ)")}
    return {"a": {"label": labels[0], **side(runs_a)}, "b": {"label": labels[1], **side(runs_b)}, "alpha": alpha,
            "n_bootstrap": n_bootstrap, "seed": seed, "correction": CORRECTION, "ci_level": ci_level,
            "ci": f"BCa bootstrap CI of the mean change at {ci_label(ci_level, len(common))}, the family-wise level of "
                  f"the {CORRECTION}-corrected verdict", "formats": formats,
            "change": "d = [log ppl(biased) − log ppl(counterfactual)] under A minus the same under B; d > 0: A's "
                      "effects lie toward the anti-stereotypical side of B's (less biased only while B is "
                      "stereotypical: the verdict says whether the bias moved toward zero, past zero or away from it)",
            "types": results, "not_compared": not_compared}


def _seed_spread(ea: list[np.ndarray], eb: list[np.ndarray]) -> dict:
    """Mean change of each seed: seed-by-seed when both sides have the same number of runs (> 1), else each run of
    the side with several against the other side's mean."""
    if len(ea) == 1 and len(eb) == 1:
        return {"n_a": 1, "n_b": 1, "per_seed_mean_change": None, "sd": None}
    if len(ea) == len(eb):
        ch = [float(np.mean(x - y)) for x, y in zip(ea, eb)]
    elif len(ea) > 1 and len(eb) == 1:
        ch = [float(np.mean(x - eb[0])) for x in ea]
    elif len(eb) > 1 and len(ea) == 1:
        ch = [float(np.mean(ea[0] - y)) for y in eb]
    else:
        mb, ma = np.mean(eb, axis=0), np.mean(ea, axis=0)
        ch = [float(np.mean(x - mb)) for x in ea] + [float(np.mean(ma - y)) for y in eb]
    return {"n_a": len(ea), "n_b": len(eb), "per_seed_mean_change": ch,
            "sd": float(np.std(ch, ddof=1)) if len(ch) > 1 else None}


def _overshoot(r: dict) -> str | None:
    """``"anti-stereotypical"`` when the change carried A past zero into the anti-stereotypical direction: a
    significant change towards the anti-stereotypical side (d > 0), A significantly anti-stereotypical on these pairs
    (one-sample t-test of its per-pair effects, p < alpha), and B's mean effect on them at or below zero; else
    ``None``."""
    if not r["significant"] or r["mean_change"] is None or r["mean_change"] <= 0:
        return None
    ea, eb = r["effect_a"], r["effect_b"]
    if ea["significant"] and ea["direction"] == "anti-stereotypical" and eb["mean"] is not None and eb["mean"] <= 0:
        return "anti-stereotypical"
    return None


def _f(x, f=".3g"):
    return "n/a" if x is None else format(x, f)


def plural(n: int, noun: str) -> str:
    """``"1 type"``, ``"2 types"``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def ci_label(level: float, n_tests: int = 1) -> str:
    """What a CI's level is, in words: ``"95% CI"`` for one test, ``"97.5% CI, Bonferroni-adjusted for 2 types"``
    for several (the level 1 − alpha/m of a Bonferroni verdict across m types)."""
    pct = f"{100 * level:.4g}% CI"
    return pct if n_tests <= 1 else f"{pct}, Bonferroni-adjusted for {plural(n_tests, 'type')}"


def fmt_change(x, sign: bool = True) -> str:
    """A log-perplexity effect or change as text: 4 decimals, or 2 significant digits below 0.001 (never a bare
    "-0.0000" that hides the size and the sign)."""
    if x is None:
        return "n/a"
    return format(x, ("+" if sign else "") + (".4f" if abs(x) >= 1e-3 or x == 0 else ".1e"))


def effects_text(r: dict, labels: tuple[str, str] = ("B", "A")) -> str:
    """Each side's own effect on the compared pairs, B first: ``"B +0.0123 (t = 7.48) → A +0.0015 (t = 0.86)"`` —
    the mean of e = log ppl(biased) − log ppl(counterfactual) and its one-sample t against 0 (``effect_b``,
    ``effect_a``); ``labels`` = (name of B, name of A), empty names for bare values."""
    lb, la = (x + " " if x else "" for x in labels)
    cell = lambda e: f"{fmt_change(e['mean'])} (t = {_f(e['t_value'], '.2f')})"  # noqa: E731
    return f"{lb}{cell(r['effect_b'])} → {la}{cell(r['effect_a'])}"


def movement_text(mv: dict | None) -> str:
    """:func:`bias_movement` in words (no ``|``: the words go into Markdown tables): ``"toward zero (the mean effect
    nearer 0, still anti-stereotypical)"``, ``"past zero (stereotypical → anti-stereotypical)"``, ``"away from zero
    (the mean effect further from 0, stereotypical)"``."""
    if mv is None:
        return "n/a"
    k = mv["kind"]
    if k == "toward zero":
        return ("toward zero (the mean effect down to 0)" if mv["side_a"] == "zero" else
                f"toward zero (the mean effect nearer 0, still {mv['side_a']})")
    if k == "past zero":
        return f"past zero ({mv['side_b']} → {mv['side_a']})"
    if k == "away from zero":
        return ("away from zero (from 0 to " + mv["side_a"] + ")" if mv["side_b"] == "zero" else
                f"away from zero (the mean effect further from 0, {mv['side_a']})")
    return "unchanged (equal mean effects)"


def short_verdict(r: dict) -> str:
    """A comparison in a few words, for tables (the study report, the model card): "not significant" first when it
    is not; a significant change says how the bias moved relative to zero (:func:`movement_text`), and an
    overshoot says so."""
    if r["ttest"]["t_value"] is None:
        return f"no test ({r['ttest']['status']})"
    if not r["significant"]:
        return "not significant"
    text = f"significant: {movement_text(r.get('movement'))}"
    if r.get("overshoot") == "anti-stereotypical":
        text += ", an overshoot: now significantly anti-stereotypical"
    return text


def describe_change(r: dict, labels: tuple[str, str] = ("A", "B")) -> str:
    """One sentence for a per-type comparison: "not significant" first when it is not; each side's own effect
    (:func:`effects_text`, B → A) and whether the bias moved toward zero, past zero or away from it
    (:func:`movement_text`; for a change that is not significant, as the point estimates say); then the size of the
    change and its test. A move past zero says whether A is now significantly on the other side (an overshoot)."""
    a, b = labels
    ci = r.get("mean_change_ci")
    m = r["p_corrected"]["ttest"]["n_tests"]
    size = (f"mean change {fmt_change(r['mean_change'])}"
            + ("" if not ci else f" [{fmt_change(ci[0])}, {fmt_change(ci[1])}] ({ci_label(r['ci_level'], m)})")
            + f", t = {_f(r['ttest']['t_value'], '.2f')}, p = {_f(r['ttest']['p_value'], '.2g')} "
              f"({plural(m, 'type')}, {CORRECTION} p = {_f(r['p_corrected']['ttest'][CORRECTION], '.2g')}), "
              f"{plural(r['n_pairs'], 'pair')}")
    if r["ttest"]["t_value"] is None:
        return f"no test: {r['ttest']['status']} ({plural(r['n_pairs'], 'pair')})"
    effects = f"mean effect {effects_text(r, (b, a))}"
    mv = r.get("movement")
    if not r["significant"]:
        return (f"not significant: no evidence that {a} differs from {b} ({effects}; point estimates "
                f"{movement_text(mv)}; {size})")
    text = f"significant change: the bias moved {movement_text(mv)}; {effects}; {size}"
    ea = r["effect_a"]
    if mv is not None and mv["kind"] == "past zero":
        if r.get("overshoot") == "anti-stereotypical":
            text += (f"; overshoot: {a} is now significantly anti-stereotypical on these pairs (one-sample t-test "
                     f"of its effects, p = {_f(ea['p_value'], '.2g')})")
        elif ea["significant"]:
            text += (f"; {a} is now significantly {ea['direction']} on these pairs (one-sample t-test of its "
                     f"effects, p = {_f(ea['p_value'], '.2g')})")
        else:
            text += (f"; {a}'s own effect is not significantly different from zero (one-sample t-test, p = "
                     f"{_f(ea['p_value'], '.2g')})")
    return text


# --------------------------------------------------------------------------------------------------- output
CSV_COLUMNS = ["bias_type", "n_pairs", "n_pairs_dropped", "mean_change", "ci_low", "ci_high", "ci_level", "t_value",
               "p_value", "p_bonferroni", "p_benjamini_hochberg", "wilcoxon_statistic", "wilcoxon_p", "wilcoxon_p_bonferroni",
               "sign_flip_share", "mean_effect_a", "mean_effect_b", "seed_sd", "significant", "overshoot", "t_effect_a",
               "t_effect_b", "movement"]


def _csv_row(r: dict) -> list:
    ci = r["mean_change_ci"] or [None, None]
    v = lambda x: "" if x is None else repr(float(x)) if isinstance(x, float) else str(x)  # noqa: E731
    return [r["bias_type"], r["n_pairs"], r["n_pairs_dropped"], v(r["mean_change"]), v(ci[0]), v(ci[1]),
            v(r.get("ci_level")), v(r["ttest"]["t_value"]), v(r["ttest"]["p_value"]), v(r["p_corrected"]["ttest"]["bonferroni"]),
            v(r["p_corrected"]["ttest"]["benjamini_hochberg"]), v(r["wilcoxon"]["statistic"]),
            v(r["wilcoxon"]["p_value"]), v(r["p_corrected"]["wilcoxon"]["bonferroni"]),
            v(r["sign_flip"]["share"]), v(r["effect_a"]["mean"]), v(r["effect_b"]["mean"]), v(r["seeds"]["sd"]),
            "true" if r["significant"] else "false", r["overshoot"] or "", v(r["effect_a"]["t_value"]),
            v(r["effect_b"]["t_value"]), (r.get("movement") or {}).get("kind", "")]


def json_ready(res: dict) -> dict:
    """The comparison without the per-pair arrays (those go to ``<type>_changes.csv``)."""
    return {**res, "types": [{k: v for k, v in r.items() if k != "pairs"} for r in res["types"]]}


def write_comparison(res: dict, out_dir: str | os.PathLike, plot: bool = True) -> dict:
    """Write ``compare.json``, ``compare.csv``, ``<type>_changes.csv`` (per pair: phrases, both effects, the change)
    and ``compare.png`` into ``out_dir`` (atomically). Returns the paths written."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a folder")
    paths = {"csv": atomic_write_csv(out / "compare.csv", CSV_COLUMNS, [_csv_row(r) for r in res["types"]])}
    for r in res["types"]:
        p = r["pairs"]
        atomic_write_csv(out / f"{r['bias_type']}_changes.csv",
                         ["row", "biased_phrase", "counterfactual_phrase", "effect_a", "effect_b", "change"],
                         [[int(i) + 1, bp, cp, repr(float(x)), repr(float(y)), repr(float(x - y))]
                          for i, bp, cp, x, y in zip(p["index"], p["biased"], p["counterfactual"], p["effect_a"],
                                                     p["effect_b"])])
    if plot:
        fig = figure_changes(res)
        with atomic_file(out / "compare.png", "wb") as f:
            fig.savefig(f, format="png", dpi=150, bbox_inches="tight")
        paths["png"] = out / "compare.png"
    paths["json"] = atomic_write_json(out / "compare.json", {**json_ready(res), "versions": versions()})
    return paths


def compare_models(a, b, out_dir: str | os.PathLike | None = None, config: CompareConfig | None = None, *,
                   bias_types: Sequence[str] | None = None, **settings) -> dict:
    """:func:`compare_runs` (``config``, ``bias_types`` and ``settings`` as there), and its files in ``out_dir`` when
    given (:func:`write_comparison`); the Python side of ``rbjax compare A B --out DIR``."""
    res = compare_runs(a, b, config, bias_types=bias_types, **settings)
    if out_dir is not None:
        write_comparison(res, out_dir)
    return res


def _table(columns: list[tuple[str, str, list[str]]]) -> list[str]:
    """A plain-text table: ``columns`` = (header, ``"<"`` or ``">"``, cells); every column as wide as its widest
    entry, so a long name (a pair benchmark's category) never shifts the columns after it."""
    widths = [max([len(h), *map(len, cells)]) for h, _, cells in columns]
    row = lambda xs: " ".join(format(x, f"{al}{w}") for x, (_, al, _), w in zip(xs, columns, widths)).rstrip()  # noqa
    head = row([h for h, _, _ in columns])
    return [head, "-" * len(head)] + [row(xs) for xs in zip(*(cells for _, _, cells in columns))]


def mcnemar_text(mc: dict) -> str:
    """The exact McNemar p of a category in words: uncorrected, with its Bonferroni correction across the categories
    compared beside it; a p of ``n/a`` says why (no pair changed its preference, or several runs on a side)."""
    p = mc.get("p_value")
    if p is None:
        if mc.get("to_stereotypical") is None:
            return "exact McNemar p = n/a (not computed: several runs on a side, and a preference per pair is one " \
                   "model's)"
        return "exact McNemar p = n/a (no pair changed its preference, so there is nothing to test)"
    n = mc.get("n_tests")
    corrected = "" if not n or mc.get("p_bonferroni") is None else (
        f"; Bonferroni across {n} categor{'y' if n == 1 else 'ies'}: {_f(mc['p_bonferroni'], '.2g')}")
    return (f"exact McNemar p = {_f(p, '.2g')} (uncorrected{corrected}; {mc['to_stereotypical']} pair(s) changed to "
            f"the stereotype-consistent sentence, {mc['to_not_stereotypical']} away from it)")


def format_comparison(res: dict) -> str:
    """A plain-text table of a comparison, one row per bias type (each side's own mean effect and t beside the
    change), and each type's verdict."""
    a, b = res["a"]["label"], res["b"]["label"]
    lines = [f"A = {a}: {', '.join(res['a']['folders'])}", f"B = {b}: {', '.join(res['b']['folders'])}",
             res["change"],
             "effect: each side's mean of e = log ppl(biased) − log ppl(counterfactual) on the pairs compared, with its "
             "one-sample t against 0 (< 0: stereotypical, > 0: anti-stereotypical)"]
    note = (res.get("formats") or {}).get("note")
    if note:
        lines.append("Formats: " + note)
    if res.get("ci_level") is not None and res.get("n_bootstrap"):
        lines.append(f"CI: {ci_label(res['ci_level'], len(res['types']))}, the level of the {CORRECTION} verdict "
                     f"(p bonf < {res['alpha']:g})")
    rows = res["types"]
    col = lambda f: [f(r) for r in rows]  # noqa: E731
    eff = lambda e: f"{fmt_change(e['mean'])} (t {_f(e['t_value'], '.2f')})"  # noqa: E731
    lines += [""] + _table([
        ("bias type", "<", col(lambda r: r["bias_type"])),
        ("pairs", ">", col(lambda r: str(r["n_pairs"]))),
        ("effect B", ">", col(lambda r: eff(r["effect_b"]))),
        ("effect A", ">", col(lambda r: eff(r["effect_a"]))),
        ("moved", "<", col(lambda r: (r.get("movement") or {}).get("kind", "n/a"))),
        ("mean change", ">", col(lambda r: fmt_change(r["mean_change"]))),
        ("CI", ">", col(lambda r: "n/a" if not r["mean_change_ci"] else
                        f"[{fmt_change(r['mean_change_ci'][0])}, {fmt_change(r['mean_change_ci'][1])}]")),
        ("t", ">", col(lambda r: _f(r["ttest"]["t_value"], ".2f"))),
        ("p", ">", col(lambda r: _f(r["ttest"]["p_value"], ".2e"))),
        ("p bonf", ">", col(lambda r: _f(r["p_corrected"]["ttest"]["bonferroni"], ".2e"))),
        ("wilcoxon p", ">", col(lambda r: _f(r["wilcoxon"]["p_value"], ".2e"))),
        ("flipped", ">", col(lambda r: _f(r["sign_flip"]["share"], ".2f")))])
    lines.append("")
    lines += [f"{r['bias_type']}: {r['verdict']}" for r in rows]
    for r in rows:
        lm = r.get("lm_eval")
        if lm:
            pa, pb = lm["pct_stereotype_a"], lm["pct_stereotype_b"]
            lines.append(f"{r['bias_type']}: lm-evaluation-harness pct_stereotype {'/'.join(f'{x:.3f}' for x in pb)} "
                         f"({b}) → {'/'.join(f'{x:.3f}' for x in pa)} ({a}) on all {lm['n_pairs']} pairs, "
                         f"{mcnemar_text(lm['mcnemar'])}")
    for t, why in res["not_compared"].items():
        lines.append(f"{t}: not compared ({why})")
    return "\n".join(lines)
