"""The paper's hyper-parameter grid for LMD, ADD and HD, and selection on the validation split (paper §5.1;
docs/reference-debias.md §7).

Grid (debias_lm_grid.py:448-452): batch size {4, 8, 16} × gradient accumulation {1, 5, 8} × λ_LM {0.001, 0.01} ×
λ_D {10, 50, 100} = 54 runs, each from the same starting model with the same seed. For ``cda`` and ``lm`` the λ axes
do not apply and collapse to one value (9 runs).

Compilation: λ_LM, λ_D, the learning rate, ``t_total`` and the accumulation scale are traced arguments of the jitted
steps (:mod:`rbjax.debias.train`), and gradient accumulation is a host loop over one compiled micro-batch step, so
the whole grid compiles, per batch size, one fused step (accumulation 1) and one micro-batch step (accumulation 5
and 8), plus one update step: 7 programs for 54 runs. Points are run in grid order with the batch size outermost.

After every run: LMB on the *valid* split of the debiased bias type (the released ``*_valid_reduced`` files) and the
Reddit-6K perplexity (LMP). One line per run goes to ``OUT/sweep.jsonl`` (a killed sweep resumes: finished points
are skipped; an unfinished point resumes from its own checkpoints under ``OUT/points/<id>/``).

Selection — both rules are computed and recorded in ``OUT/selection.json``:

* ``reference``: the reference rule (debias_lm_grid.py:637-660): the run with the **highest dev p-value** of
  ``scipy.stats.ttest_rel`` on the (unfiltered) valid-split perplexities. It ignores the sign of t and language-model
  quality.
* ``default`` (rbjax's rule, "LM-constrained least bias"): among the runs whose LMP stays within ``lmp_tolerance``
  (default 10 %) of the starting model's LMP, the run with the **smallest |t|** of the paper's LMB statistic (paired
  t after the 3σ outlier-pair rule) on the valid split; ties go to the lower LMP. If no run meets the LMP budget, the
  run with the lowest LMP is chosen and ``constraint_met`` is false. Why: a large p-value can be bought by ruining
  the model (the paper reports LMD raising Reddit perplexity a lot, §5.2) — the reference rule cannot see that —
  and ``|t|`` measures the remaining bias directly, in either direction, on the same statistic the paper reports.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Sequence

from rbjax.debias.train import LOSS_METHODS, TrainConfig, Trainer, load_training_texts

__all__ = ["PAPER_GRID", "GridPoint", "grid_points", "dev_lmb", "select", "run_sweep"]

PAPER_GRID: dict[str, tuple] = {
    "batch_size": (4, 8, 16),
    "grad_accum": (1, 5, 8),
    "lambda_lm": (0.001, 0.01),
    "lambda_d": (10.0, 50.0, 100.0),
}


@dataclasses.dataclass(frozen=True)
class GridPoint:
    """One point of the grid."""

    batch_size: int
    grad_accum: int
    lambda_lm: float
    lambda_d: float

    @property
    def id(self) -> str:
        return f"b{self.batch_size}_a{self.grad_accum}_lm{self.lambda_lm:g}_d{self.lambda_d:g}"

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def grid_points(method: str, grid: dict[str, Sequence] | None = None) -> list[GridPoint]:
    """The grid's points in run order (batch size outermost, so each compiled shape is reused in a row).

    For ``cda``/``lm`` (no debiasing loss) only the first λ values are used.

    Raises:
        ValueError: an empty or invalid axis.
    """
    g = dict(PAPER_GRID if grid is None else grid)
    for k in PAPER_GRID:
        vals = g.get(k)
        if not vals:
            raise ValueError(f"grid axis {k!r} is empty")
    if method not in LOSS_METHODS:
        g["lambda_lm"], g["lambda_d"] = g["lambda_lm"][:1], g["lambda_d"][:1]
    pts = [GridPoint(int(b), int(a), float(lm), float(d))
           for b, a, lm, d in itertools.product(g["batch_size"], g["grad_accum"], g["lambda_lm"], g["lambda_d"])]
    for p in pts:
        if p.batch_size < 1 or p.grad_accum < 1:
            raise ValueError(f"invalid grid point {p}")
    return pts


def dev_lmb(params, config, tokenizer, bias_type: str, data=None, *, split: str = "valid", batch_size: int = 64,
            n_bootstrap: int = 1000, seed: int = 0, max_pairs: int | None = None) -> dict:
    """LMB of in-memory params on one bias type's dev (valid) pairs (paper §3.1), without exporting a model.

    ``max_pairs`` scores only the first N pairs (smoke runs; not the paper's statistic).

    Returns:
        ``{t_value, p_value, n_pairs, n_pairs_after_outliers, significant, direction, reference: {t_value,
        p_value}}``: the primary paired t-test after the 3σ pair rule, and the reference's ``ttest_rel`` on the
        unfiltered perplexities.

    Raises:
        ValueError: an unscorable phrase (fewer than 2 tokens) or non-finite perplexities.
    """
    from rbjax.data.redditbias import load_pairs
    from rbjax.lmb import stats
    from rbjax.lmb.perplexity import PerplexityScorer

    pairs = load_pairs(bias_type, split, data)
    if max_pairs is not None:
        pairs.biased, pairs.counterfactual = pairs.biased[:max_pairs], pairs.counterfactual[:max_pairs]
    scorer = PerplexityScorer(params, config, batch_size=batch_size)
    b = scorer.score_texts(pairs.biased, tokenizer)
    c = scorer.score_texts(pairs.counterfactual, tokenizer)
    ok = b.scorable & c.scorable
    st = stats.lmb_statistics(b.perplexity[ok], c.perplexity[ok], n_bootstrap=n_bootstrap, seed=seed)
    st.pop("_outlier_mask", None)
    keys = ("n_pairs", "n_pairs_after_outliers", "t_value", "p_value", "significant", "direction",
            "cohens_d_paired")
    out = {k: st[k] for k in keys}
    out["n_unscorable"] = int((~ok).sum())
    out["reference"] = {"t_value": st["reference"]["t_value"], "p_value": st["reference"]["p_value"]}
    return out


def select(records: list[dict], baseline_lmp: float | None, lmp_tolerance: float = 0.10) -> dict:
    """Apply both selection rules to finished sweep records (see the module docstring).

    Args:
        records: ``sweep.jsonl`` records (``point``, ``dev``, ``lmp``).
        baseline_lmp: the starting model's LMP (``None``: the LMP budget is not applied).
        lmp_tolerance: allowed relative LMP increase for the default rule.

    Returns:
        ``{"reference": {...}, "default": {...}}``, each with ``point``, ``id``, ``dev``, ``lmp`` and ``rule``.

    Raises:
        ValueError: no record has a dev result.
    """
    recs = [r for r in records if r.get("dev") and r["dev"].get("t_value") is not None]
    if not recs:
        raise ValueError("no finished sweep run with a dev LMB result to select from")

    def lmp_of(r):
        v = (r.get("lmp") or {}).get("perplexity")
        return float("inf") if v is None else v

    def pref(r):
        p = r["dev"]["reference"]["p_value"]
        return -1.0 if p is None else p

    ref = max(recs, key=pref)  # first maximum in grid order
    budget = None if baseline_lmp is None else baseline_lmp * (1.0 + lmp_tolerance)
    within = [r for r in recs if budget is None or lmp_of(r) <= budget]
    if within:
        best = min(within, key=lambda r: (abs(r["dev"]["t_value"]), lmp_of(r)))
        met = True
    else:
        best = min(recs, key=lmp_of)
        met = False

    def pack(r, rule, **extra):
        return {"id": r["id"], "point": r["point"], "dev": r["dev"], "lmp": (r.get("lmp") or {}).get("perplexity"),
                "rule": rule, **extra}

    return {
        "reference": pack(ref, "highest dev p-value of ttest_rel on unfiltered valid perplexities "
                               "(debias_lm_grid.py:637-660)"),
        "default": pack(best, f"smallest |dev t| (paired t after the 3σ pair rule) among runs with LMP <= "
                              f"(1 + {lmp_tolerance:g}) x baseline LMP; ties: lower LMP",
                        constraint_met=met, lmp_budget=budget, n_within_budget=len(within)),
        "n_runs": len(recs),
        "baseline_lmp": baseline_lmp,
        "lmp_tolerance": lmp_tolerance,
    }


def _finite(o):
    """Non-finite floats (and numpy scalars) made JSON-safe: NaN/inf become None."""
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    if hasattr(o, "item") and not isinstance(o, (str, bytes)):
        o = o.item()
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return o


def _read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for ln in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(ln))
        except json.JSONDecodeError:
            break  # a line cut by a kill
    return out


def run_sweep(base: TrainConfig, out_dir: str | Path, *, grid: dict[str, Sequence] | None = None,
              lmp_tolerance: float = 0.10, keep_checkpoints: bool = False, max_points: int | None = None,
              n_bootstrap: int = 1000, final: str = "none", dev_max_pairs: int | None = None,
              progress: bool = True) -> dict:
    """Run the grid for ``base.method`` / ``base.bias_type``, select on the valid split, write the results.

    Args:
        base: the run settings shared by every point (its batch size, accumulation and λ are replaced by the
            grid's; its ``out_dir`` is replaced by ``OUT/points/<id>``).
        out_dir: sweep folder: ``sweep.jsonl``, ``baseline.json``, ``selection.json``, ``sweep.csv``.
        grid: axes as :data:`PAPER_GRID` (default: the paper's).
        lmp_tolerance: LMP budget of the default selection rule.
        keep_checkpoints: keep each point's checkpoints (default: deleted once the point is recorded).
        max_points: run only the first N points (smoke runs; selection uses what is finished).
        n_bootstrap: bootstrap resamples of the dev LMB statistics.
        dev_max_pairs: score only the first N dev pairs (smoke runs).
        final: retrain and fully evaluate (export, LMB on all types, LMP) the selected run(s) into
            ``OUT/selected_<rule>``: ``none``, ``default``, ``reference`` or ``both``.
        progress: progress bars.

    Returns:
        the ``selection.json`` content.

    Raises:
        ValueError, FileNotFoundError, RuntimeError: bad settings or data.
    """
    import jax

    from rbjax.data.redditbias import RedditBiasData
    from rbjax.debias.train import train
    from rbjax.dialog.lmp import read_reference_lines, reddit_perplexity
    from rbjax.model.hf import load_pretrained, resolve_model_dir
    from rbjax.model.tokenizer import load_tokenizer
    from rbjax.report.io import atomic_write_csv, atomic_write_json, versions

    if final not in ("none", "default", "reference", "both"):
        raise ValueError(f"final must be none, default, reference or both, got {final!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pts = grid_points(base.method, grid)
    if max_points is not None:
        pts = pts[:max_points]
    model_dir = resolve_model_dir(base.model)
    config, params = load_pretrained(model_dir)
    tok_src = base.tokenizer if base.tokenizer is not None else model_dir
    tokenizer = load_tokenizer(tok_src, expected_vocab_size=None)
    data = RedditBiasData(base.data_dir)
    texts, _ = load_training_texts(base, data)
    lmp_path = Path(base.lmp_file) if base.lmp_file else data.reddit_reference_file()
    lines = read_reference_lines(lmp_path, base.lmp_max_lines) if base.lmp else None

    def evaluate(p) -> tuple[dict, dict | None]:
        dev = dev_lmb(p, config, tokenizer, base.bias_type, data, batch_size=base.eval_batch_size,
                      n_bootstrap=n_bootstrap, seed=base.seed, max_pairs=dev_max_pairs)
        lmp = None
        if lines is not None:
            lmp = reddit_perplexity(p, config, tokenizer, lines, block_size=base.block_size,
                                    batch_size=base.eval_batch_size)
        return dev, lmp

    settings = {"method": base.method, "bias_type": base.bias_type, "semantics": base.semantics, "model": base.model,
                "seed": base.seed, "epochs": base.epochs, "max_steps": base.max_steps,
                "grid": {k: list(v) for k, v in (grid or PAPER_GRID).items()}, "lmp_file": str(lmp_path),
                "lmp_max_lines": base.lmp_max_lines, "dev_max_pairs": dev_max_pairs}
    same_run = {k: v for k, v in settings.items() if k != "grid"}
    spath = out / "sweep_settings.json"
    if spath.exists():
        prev = json.loads(spath.read_text())
        if prev != json.loads(json.dumps(same_run)):
            diff = {k: (prev.get(k), v) for k, v in json.loads(json.dumps(same_run)).items() if prev.get(k) != v}
            raise ValueError(f"{out}: holds a sweep with other settings ({diff}); use another --out")
    else:
        atomic_write_json(spath, same_run)
    bpath = out / "baseline.json"
    baseline = json.loads(bpath.read_text()) if bpath.exists() else None
    if baseline is None:
        dev, lmp = evaluate(params)
        baseline = {"settings": settings, "dev": dev, "lmp": lmp, "versions": versions()}
        atomic_write_json(bpath, baseline)
    jpath = out / "sweep.jsonl"
    records = _read_jsonl(jpath)
    done = {r["id"] for r in records}
    todo = [p for p in pts if p.id not in done]
    from tqdm.auto import tqdm

    bar = tqdm(total=len(pts), initial=len(pts) - len(todo), desc=f"sweep {base.method} {base.bias_type}",
               unit="run", file=sys.stderr, disable=not progress)
    try:
        for pt in todo:
            pdir = out / "points" / pt.id
            cfg = base.replace(out_dir=str(pdir), batch_size=pt.batch_size, grad_accum=pt.grad_accum,
                               lambda_lm=pt.lambda_lm, lambda_d=pt.lambda_d, export=False, evaluate=False,
                               lmp=False, progress=False)
            t0 = time.perf_counter()
            trainer = Trainer(cfg, model_config=config, params=params, tokenizer=tokenizer, texts=texts)
            res = trainer.run()
            train_s = time.perf_counter() - t0
            dev, lmp = evaluate(jax.device_get(res.params))
            rec = {"id": pt.id, "point": pt.as_dict(), "dev": dev,
                   "lmp": None if lmp is None else {k: lmp[k] for k in ("perplexity", "reference_grid", "reference_cda")},
                   "updates": res.updates_done, "train_s": train_s, "eval_s": time.perf_counter() - t0 - train_s,
                   "last": res.summary.get("last")}
            with open(jpath, "a", encoding="utf-8") as f:
                f.write(json.dumps(_finite(rec), allow_nan=False, default=float) + "\n")
            records.append(rec)
            if not keep_checkpoints:
                shutil.rmtree(pdir / "checkpoints", ignore_errors=True)
            bar.update(1)
            bar.set_postfix(t=f"{dev['t_value']:.2f}", lmp=f"{(lmp or {}).get('perplexity') or float('nan'):.1f}")
    finally:
        bar.close()
    wanted = {p.id for p in pts}
    recs = [r for r in records if r["id"] in wanted]
    base_lmp = (baseline.get("lmp") or {}).get("perplexity")
    sel = select(recs, base_lmp, lmp_tolerance)
    sel.update(settings=settings, baseline=baseline, n_points_planned=len(pts), versions=versions())
    header = ["id", "batch_size", "grad_accum", "lambda_lm", "lambda_d", "dev_t", "dev_p", "dev_ref_t", "dev_ref_p",
              "lmp", "updates", "train_s"]
    rows = [[r["id"], r["point"]["batch_size"], r["point"]["grad_accum"], r["point"]["lambda_lm"],
             r["point"]["lambda_d"], r["dev"]["t_value"], r["dev"]["p_value"], r["dev"]["reference"]["t_value"],
             r["dev"]["reference"]["p_value"], (r.get("lmp") or {}).get("perplexity"), r["updates"],
             round(r["train_s"], 2)] for r in recs]
    atomic_write_csv(out / "sweep.csv", header, rows)
    rules = {"none": [], "default": ["default"], "reference": ["reference"], "both": ["default", "reference"]}[final]
    for rule in rules:
        if rule == "reference" and "default" in rules and sel["reference"]["id"] == sel["default"]["id"]:
            sel["reference"]["final"] = sel["default"].get("final")
            continue
        p = sel[rule]["point"]
        cfg = base.replace(out_dir=str(out / f"selected_{rule}"), **p)
        res = train(cfg)
        sel[rule]["final"] = {"out_dir": cfg.out_dir, "lmb_valid": res.get("lmb_valid"), "lmp": res.get("lmp")}
    atomic_write_json(out / "selection.json", sel)
    return sel


def format_selection(sel: dict) -> str:
    """A few lines describing both selections."""
    def one(name: str, s: dict) -> str:
        d = s["dev"]
        lmp = "n/a" if s["lmp"] is None else f"{s['lmp']:.2f}"
        return (f"  {name:<9} {s['id']:<24} dev t {d['t_value']:7.3f} (p {d['p_value']:.3g}; ref ttest_rel p "
                f"{d['reference']['p_value']:.3g})  LMP {lmp}")

    b = sel.get("baseline") or {}
    bl = (b.get("lmp") or {}).get("perplexity")
    bd = b.get("dev") or {}
    lines = [f"{sel['n_runs']} run(s); baseline dev t {bd.get('t_value', float('nan')):.3f}, "
             f"LMP {'n/a' if bl is None else format(bl, '.2f')}",
             one("reference", sel["reference"]), one("default", sel["default"])]
    if not sel["default"].get("constraint_met", True):
        lines.append("  note: no run kept LMP within the budget; the default rule fell back to the lowest LMP")
    return "\n".join(lines)

