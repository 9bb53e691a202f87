"""The paper's hyper-parameter grid for LMD, ADD and HD, trained as vmapped programs, and selection on the validation
split (paper §5.1; docs/debiasing.md §8).

Grid (debias_lm_grid.py:448-452): batch size {4, 8, 16} × gradient accumulation {1, 5, 8} × λ_LM {0.001, 0.01} ×
λ_D {10, 50, 100} = 54 runs, each from the same starting model with the same seed. For ``cda`` and ``lm`` the λ axes
do not apply and collapse to one value (9 runs).

Execution
    * Points that share a **batch plan** (batch size, accumulation, data order) train together: the 6 λ combinations
      of a (batch, accumulation) setting are stacked on a leading axis and trained by one vmapped program
      (:func:`rbjax.train.step.grid_train_step`), fed by one data stream; at most one compiled training program per
      batch plan (9 for the paper's grid; a reference-semantics update that carries an epoch's leftovers adds one).
    * A plan's points are cut into **chunks** that fit the device memory (``grid_chunk``; ``None`` picks it from the
      free memory: parameters, Adam moments, gradient and accumulator per point, :func:`auto_grid_chunk`). On several
      devices a chunk is spread over a ``grid`` × ``data`` mesh (:mod:`rbjax.core.mesh`).
    * After a chunk: LMB on the *valid* split of the debiased bias type (the released ``*_valid_reduced`` files) and
      the Reddit-6K perplexity (LMP) of each of its points, from the parameters in memory.
    * A chunk is one **task** (:func:`run_chunk`): run in this process (``executor="local"``) or on a Ray cluster
      (``executor="ray"``, one accelerator per task when the cluster has them; checkpoints and results on a shared
      path). A chunk resumes from its own checkpoints under ``OUT/chunks/<id>/`` when its worker died; its records go
      to ``OUT/chunks/<id>/records.json`` and ``OUT/sweep.jsonl``.
    * Every record carries the **key** of what produced it (starting model, tokenizer, training data, bias
      specification, trajectory settings, the point); a finished point whose key matches is never redone, and a
      folder holding a sweep of other inputs is refused.

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

Several bias types and methods are one command (:func:`run_sweeps`): each (bias type, method) pair gets its own
folder ``OUT/<bias type>/<method>/`` and all their chunks are tasks of one executor.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import math
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Sequence

import jax
import numpy as np

from rbjax.core.errors import SettingError
from rbjax.core.host_allocator import configure_host_allocator
from rbjax.core.io import atomic_write_csv, atomic_write_json, check_output_dir, read_json, to_json, versions
from rbjax.core.keys import canonical, digest
from rbjax.core.log import get_logger
from rbjax.core.mesh import to_host
from rbjax.core.parallel import as_completed, available_memory
from rbjax.core.progress import progress_bar
from rbjax.core.reuse import KeyedResult, why_not_reusable
from rbjax.data.redditbias import RedditBiasData, load_pairs
from rbjax.debias.config import LOSS_METHODS, DebiasRun
from rbjax.debias.data import TrainingData
from rbjax.debias.run import chat_fields, debias, debias_trainer, lmp_reference_file
from rbjax.debias.sweep_config import SweepConfig
from rbjax.dialog.reddit_perplexity import lmp_program_shapes, read_reference_lines, reddit_perplexity
from rbjax.lmb.measure import pair_perplexities_of_models, pair_program_shapes, pair_statistics
from rbjax.lmb.perplexity import PerplexityScorer
from rbjax.model.handle import ModelHandle, model_files_key
from rbjax.model.lora import adapter_param_count
from rbjax.model.memory import plan_for_model, plan_memory
from rbjax.train.frozen import combine
from rbjax.train.frozen import split as split_frozen
from rbjax.train.loop import CHECKPOINT_FORMAT, TrainPoint

__all__ = ["PAPER_GRID", "GridPoint", "grid_points", "batch_plans", "dev_lmb", "select", "run_sweep", "run_sweeps",
           "run_chunk", "auto_grid_chunk", "grid_memory_plan", "format_selection"]

log = get_logger("sweep")

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
        rbjax.core.errors.SettingError: an empty axis or an invalid value (naming the axis).
    """
    g = dict(PAPER_GRID if grid is None else grid)
    for k in PAPER_GRID:
        vals = g.get(k)
        if isinstance(vals, (str, bytes)) or not isinstance(vals, (list, tuple)) or not vals:
            raise SettingError(k, f"(a grid axis) must be a non-empty list, got {vals!r}")
        if k in ("batch_size", "grad_accum"):
            ok, words = [isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in vals], "integers >= 1"
        else:
            ok = [isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                  for v in vals]
            words = "finite numbers >= 0"
        if not all(ok):
            raise SettingError(k, f"(a grid axis) must hold {words}, got {list(vals)!r}")
    if method not in LOSS_METHODS:
        g["lambda_lm"], g["lambda_d"] = g["lambda_lm"][:1], g["lambda_d"][:1]
    pts = [GridPoint(int(b), int(a), float(lm), float(d))
           for b, a, lm, d in itertools.product(g["batch_size"], g["grad_accum"], g["lambda_lm"], g["lambda_d"])]
    return pts


def _dev_pairs(bias_type: str, split: str, data, max_pairs: int | None):
    """The pairs of ``bias_type`` in ``split`` (the first ``max_pairs`` of them, if given)."""
    pairs = load_pairs(bias_type, split, data)
    if max_pairs is not None:
        pairs.biased, pairs.counterfactual = pairs.biased[:max_pairs], pairs.counterfactual[:max_pairs]
    return pairs


def dev_lmb(params, config, tokenizer, bias_type: str, data=None, *, split: str = "valid", batch_size: int = 64,
            n_bootstrap: int = 1000, seed: int = 0, max_pairs: int | None = None, stacked: bool = False,
            chat=None, scorer=None):
    """LMB of in-memory params on one bias type's dev (valid) pairs (paper §3.1), without exporting a model.

    The same path as :func:`rbjax.lmb.measure.measure_bias` (pair-prefix scoring →
    :func:`~rbjax.lmb.measure.pair_statistics`); with ``stacked`` the params carry a leading model axis and all
    models are scored in one vmapped pass. ``max_pairs`` scores only the first N pairs (smoke runs; not the paper's
    statistic). ``chat``: a :class:`rbjax.model.chat.ChatTurns`: each phrase scored as its turn of the chat (the
    format the run trained in; only the phrase's tokens scored), ``None``: bare text. ``scorer``: a scorer of the
    model's own to score with instead of a :class:`~rbjax.lmb.perplexity.PerplexityScorer` of ``params`` (a
    Self-Debias model's :class:`rbjax.lmb.self_debias.SelfDebiasScorer`, built with the same BOS rule).

    Returns:
        ``{t_value, p_value, n_pairs, n_pairs_after_outliers, significant, direction, cohens_d_paired,
        n_unscorable, reference: {t_value, p_value}}``: the primary paired t-test after the 3σ pair rule, and the
        reference's ``ttest_rel`` on the unfiltered perplexities (a list of such dicts with ``stacked``).

    Raises:
        ValueError: an unscorable phrase (fewer than 2 tokens) or non-finite perplexities.
    """

    pairs = _dev_pairs(bias_type, split, data, max_pairs)
    # phrases scored as the model's own tokenizer encodes them (a BOS before each where it adds one), as measure does
    # (in the chat format the template writes the BOS where the model has one)
    if scorer is None:
        scorer = PerplexityScorer(params, config, batch_size=batch_size, stacked=stacked,
                                  bos_id=tokenizer.default_bos_id if chat is None else None)
    out = []
    for b, c, notes in pair_perplexities_of_models(scorer, tokenizer, pairs, skip_unscorable=True, chat=chat):
        st, _ = pair_statistics(b, c, notes, n_bootstrap=n_bootstrap, seed=seed)
        keys = ("n_pairs", "n_pairs_after_outliers", "t_value", "p_value", "significant", "direction",
                "cohens_d_paired")
        d = {k: st[k] for k in keys}
        d["n_unscorable"] = sum(bool(n) for n in notes)
        d["reference"] = {"t_value": st["reference"]["t_value"], "p_value": st["reference"]["p_value"]}
        out.append(d)
    return out if stacked else out[0]


def select(records: list[dict], baseline_lmp: float | None, lmp_tolerance: float = SweepConfig.lmp_tolerance) -> dict:
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


def batch_plans(points: Sequence[GridPoint]) -> list[tuple[tuple[int, int], list[GridPoint]]]:
    """Points grouped by batch plan ``(batch_size, grad_accum)``, in grid order (one compiled program each)."""
    groups: dict[tuple[int, int], list[GridPoint]] = {}
    for p in points:
        groups.setdefault((p.batch_size, p.grad_accum), []).append(p)
    return list(groups.items())


def _param_bytes(params) -> int:
    return int(sum(np.dtype(x.dtype).itemsize * int(np.prod(x.shape)) for x in jax.tree.leaves(params)))


def free_device_memory(device) -> int | None:
    """Bytes free on ``device``: the allocator's limit minus what is in use (GPU/TPU), else the host's available
    memory (CPU; :func:`rbjax.core.parallel.available_memory`); ``None`` when unknown."""
    try:
        st = device.memory_stats()
    except Exception:  # noqa: BLE001 (backends without memory stats)
        st = None
    if st and "bytes_limit" in st:
        return int(st["bytes_limit"]) - int(st.get("bytes_in_use", 0))

    return available_memory()


def auto_grid_chunk(params, n_points: int, devices=None, *, activation_bytes: int = 0,
                    adapter_bytes: int | None = None) -> tuple[int, str]:
    """Grid points per chunk that fit the devices, and the reason.

    Per point: parameters, the two Adam moments, the gradient and the accumulator (5 copies of the parameters in
    fp32: ≈2.5 GB at DialoGPT-small), plus ``activation_bytes``; 70 % of the free memory of the devices (summed over
    the mesh, which spreads points) is used. With low-rank adapters (``adapter_bytes``: one point's adapters in
    fp32) the frozen base ``params`` is held once for the whole chunk and a point costs 5 copies of its adapters:
    base + n × (adapter, its Adam moments, gradient, accumulator) (docs/scale.md).
    """
    devs = list(jax.devices() if devices is None else devices)
    shared = 0 if adapter_bytes is None else _param_bytes(params)
    per = 5 * (_param_bytes(params) if adapter_bytes is None else int(adapter_bytes)) + int(activation_bytes)
    free = free_device_memory(devs[0])
    if free is None:
        return n_points, "device memory unknown: whole batch plans"
    fit = max(1, int((0.7 * free - shared) * len(devs) // max(per, 1)))
    n = min(n_points, fit)
    what = "adapters, their Adam moments, gradient, accumulator" if adapter_bytes is not None else \
        "parameters, Adam moments, gradient, accumulator"
    return n, (f"{n} point(s) per chunk: {per / 2**30:.3g} GiB per point ({what})"
               + (f" beside the frozen base ({shared / 2**30:.2f} GiB, once)" if shared else "")
               + f", {free / 2**30:.1f} GiB free on {devs[0].platform} × {len(devs)} device(s)")


def grid_memory_plan(base: DebiasRun, points: Sequence[GridPoint], *, grid_chunk: int | None = None,
                     device_memory_gb: float | None = None, n_devices: int | None = None,
                     model: ModelHandle | None = None):
    """The memory plan (:func:`rbjax.model.memory.plan_for_model`, from the start model's ``config.json``: no weights)
    of a sweep's largest chunk: the most points of one batch plan (or ``grid_chunk``) trained together at the grid's
    largest batch, with accumulation when any point accumulates, on ``base.mesh``. Under adapters the frozen base is
    counted once and every point its adapters, their gradient and Adam moments and its activations; the sweep's
    other chunks run after it on the same base. ``n_devices``: the mesh's device count for a plan made elsewhere
    (``--dry-run``). ``model``: the start model's handle (default: opened from ``base.model``)."""
    groups = batch_plans(points)
    n = max(len(g) for _, g in groups)
    n = min(n, grid_chunk) if grid_chunk else n
    t, a = base.trainer, base.adapter
    model = model or ModelHandle.open(base.model, base.tokenizer)
    return plan_for_model(model, mesh=base.mesh, training=True, seq_len=base.plan_seq_len,
                          batch_size=max(p.batch_size for p in points),
                          grad_accum=max(p.grad_accum for p in points), n_points=n, precision=t.precision,
                          device_memory_gb=device_memory_gb, n_devices=n_devices,
                          **({"adapter": a.lora_spec(), "param_dtype": a.param_dtype} if a.enabled else {}))


# ------------------------------------------------------------------------------------------------ chunk tasks
@dataclasses.dataclass(frozen=True)
class SweepContext:
    """What every chunk of one sweep starts from: the start model (a loaded
    :class:`rbjax.model.handle.ModelHandle`: config, parameters, tokenizer, content key), the training data and the
    evaluation data (dev pairs, the Reddit-6K lines when LMP is on). Built by :meth:`load`; :class:`ContextCache`
    holds one at a time."""

    key: str  #: :meth:`key_of` of the settings it was loaded for
    model: ModelHandle
    data: TrainingData
    lmp_lines: list[str] | None
    lmp_path: Path | None
    redditbias: RedditBiasData

    config = property(lambda self: self.model.config)
    params = property(lambda self: self.model.params)
    tokenizer = property(lambda self: self.model.tokenizer)

    @staticmethod
    def key_of(base: DebiasRun, model: ModelHandle | None = None) -> str:
        """The settings a context depends on, hashed; keyed on the model files' content too (weights replaced at
        the same path are another model; :func:`rbjax.core.digests.file_digest` reads each large file once).
        ``model``: the start model's handle (default: opened from ``base.model``)."""
        d, e = base.debias, base.evaluation
        model = model or ModelHandle.open(base.model, base.tokenizer)
        # the files as they are now (not the handle's key of when it was first asked: new weights written at the same
        # path are another model; a large file's digest is kept by its state, so this reads nothing unchanged)
        files = model.files_key() if model.folder is None else model_files_key(model.folder)
        return digest({"model_files": files, "model": base.model,
                       "tokenizer": base.tokenizer, "data_dir": d.data_dir, "train_file": d.train_file,
                       "bias_type": d.bias_type, "method": d.method, "semantics": d.semantics,
                       "block_size": base.trainer.block_size, "lmp": e.lmp, "lmp_file": e.lmp_file,
                       "lmp_max_lines": e.lmp_max_lines, "chat": chat_fields(d)})

    @classmethod
    def load(cls, base: DebiasRun, key: str | None = None, model: ModelHandle | None = None) -> SweepContext:
        """Load the start model, tokenizer and data of the sweep ``base`` describes (``model``: its handle, default
        opened from ``base.model``).

        Raises:
            FileNotFoundError, ValueError: a missing or malformed model, tokenizer or data file (named).
        """
        model = model or ModelHandle.open(base.model, base.tokenizer)
        model.load()
        lmp_path = lmp_reference_file(base) if base.evaluation.lmp else None
        return cls(key=key or cls.key_of(base, model), model=model,
                   data=TrainingData(base, model.tokenizer, model.config.vocab_size),
                   lmp_lines=None if lmp_path is None else read_reference_lines(lmp_path,
                                                                                base.evaluation.lmp_max_lines),
                   lmp_path=lmp_path, redditbias=RedditBiasData(base.debias.data_dir))


class ContextCache:
    """The :class:`SweepContext` of the sweep being run, kept between its chunks (one at a time: the start
    parameters are the largest part, and :func:`run_sweeps` runs its sweeps one after the other). Owned by the
    caller: :func:`run_sweeps` makes one per call and hands it to the chunks it runs in this process; a chunk run
    elsewhere (a Ray worker) loads its own."""

    def __init__(self, model: ModelHandle | None = None) -> None:
        self._held: SweepContext | None = None
        self._model = model  # the start model's handle (the command's, which planned the memory with it)

    def _handle(self, base: DebiasRun) -> ModelHandle:
        """The handle of ``base``'s start model: the one held when it names the same model and tokenizer (the model
        is resolved and its config.json read once), else a new one (held in its place)."""
        m = self._model
        if m is None or m.name != str(base.model) or m.tokenizer_source != (
                None if base.tokenizer is None else str(base.tokenizer)):
            self._model = m = ModelHandle.open(base.model, base.tokenizer)
        return m

    def get(self, base: DebiasRun) -> SweepContext:
        """The context of ``base``: the one held when its key matches, else a fresh load (dropping the old)."""
        model = self._handle(base)
        k = SweepContext.key_of(base, model)
        if self._held is None or self._held.key != k:
            self._held = None  # free the old model before loading the next
            if model.loaded:  # read for other files (new weights at the same path): open it afresh
                model = self._model = ModelHandle.open(base.model, base.tokenizer)
            self._held = SweepContext.load(base, key=k, model=model)
        return self._held


def _evaluate(ctx: SweepContext, base: DebiasRun, params, *, n_bootstrap: int, dev_max_pairs: int | None,
              stacked: bool = False):
    """Dev LMB and LMP of one model, or (``stacked``) of every model of a stacked parameter tree in one vmapped
    pass each: ``(dev, lmp)``, or lists of them."""
    params = jax.device_get(params)
    dev = dev_lmb(params, ctx.config, ctx.tokenizer, base.debias.bias_type, ctx.redditbias,
                  batch_size=base.evaluation.eval_batch_size, n_bootstrap=n_bootstrap, seed=base.trainer.seed, max_pairs=dev_max_pairs,
                  stacked=stacked, chat=base.debias.chat_turns(ctx.tokenizer))
    lmp = [None] * len(dev) if stacked else None
    if ctx.lmp_lines is not None:

        full = reddit_perplexity(params, ctx.config, ctx.tokenizer, ctx.lmp_lines,
                                 block_size=base.trainer.block_size, batch_size=base.evaluation.eval_batch_size, stacked=stacked,
                                 bos_id=ctx.tokenizer.default_bos_id)
        pick = lambda f: {k: f[k] for k in ("perplexity", "reference_grid", "reference_cda")}  # noqa: E731
        lmp = [pick(f) for f in full] if stacked else pick(full)
    return dev, lmp


def _evaluation_programs(ctx: SweepContext, base: DebiasRun, trainer, n_points: int, dev_max_pairs: int | None):
    """The scoring programs of a chunk's evaluation (:func:`_evaluate`: dev LMB, LMP), as a job for
    :meth:`rbjax.train.loop.Trainer.run` (``after``): compiled from the trained parameters' shapes with the
    training programs, before the first update. The points are scored stacked (``n_points`` models, the padding
    points dropped), or one by one on the frozen base (adapters)."""
    pairs = _dev_pairs(base.debias.bias_type, "valid", ctx.redditbias, dev_max_pairs)
    chat = base.debias.chat_turns(ctx.tokenizer)
    bs = base.evaluation.eval_batch_size

    def compile_evaluation(final) -> int:
        trained, frozen = split_frozen(final, trainer.trainable)
        one = lambda shape, x: jax.ShapeDtypeStruct(shape, x.dtype)  # noqa: E731
        if frozen:  # adapters: each point on the one frozen base
            params, stacked = combine(frozen, jax.tree.map(lambda x: one(x.shape[1:], x), trained)), False
        else:
            params, stacked = jax.tree.map(lambda x: one((n_points,) + x.shape[1:], x), trained), True
        scorer = PerplexityScorer(params, ctx.config, batch_size=bs, stacked=stacked,
                                  bos_id=ctx.tokenizer.default_bos_id if chat is None else None)
        n = scorer.compile_programs(pair_program_shapes(scorer, ctx.tokenizer, pairs, chat))
        if ctx.lmp_lines is not None:
            lmp = scorer.with_bos(ctx.tokenizer.default_bos_id)
            n += lmp.compile_programs(lmp_program_shapes(lmp, ctx.tokenizer, ctx.lmp_lines,
                                                         block_size=base.trainer.block_size))
        return n

    return [compile_evaluation]


def run_chunk(task: dict, contexts: ContextCache | None = None) -> list[dict]:
    """Train one chunk of grid points (one batch plan) and evaluate each point; a top-level function, so that it
    runs as a task of :mod:`rbjax.core.parallel` (this process, or a Ray worker reading the same paths).

    Args:
        task: ``{"base": DebiasRun fields, "plan": [batch_size, grad_accum], "points": [GridPoint fields],
            "chunk_id", "out" (the sweep folder), "key" (the sweep key), "n_bootstrap", "dev_max_pairs",
            "keep_checkpoints", "n_devices" (the driver's device count)}``.
        contexts: the caller's :class:`ContextCache` (chunks run in the calling process share its loaded model);
            ``None`` loads the sweep's context for this chunk alone (a Ray worker).

    Returns:
        one record per point (``id``, ``point``, ``key``, ``dev``, ``lmp``, ``updates``, ``train_s``, ``eval_s``,
        ``last``, ``chunk``); also written to ``OUT/chunks/<chunk_id>/records.json`` (a keyed result,
        :class:`rbjax.core.reuse.KeyedResult`, keyed on the points' keys). A chunk whose records file has
        the same key is not run again; an interrupted chunk resumes from its checkpoints.
    """
    configure_host_allocator()  # a Ray worker's first task: before its first JAX work (the CLI did it for this process)
    base = DebiasRun.from_flat(task["base"])
    B, A = task["plan"]
    pts = [GridPoint(**p) for p in task["points"]]
    cdir = Path(task["out"]) / "chunks" / task["chunk_id"]
    keys = [_point_key(task["key"], p) for p in pts]
    stored = KeyedResult(cdir / "records.json", {"points": keys}, what=f"chunk {task['chunk_id']}")
    prev = stored.stored()
    if prev is not None:
        return prev["records"]
    ctx = (contexts or ContextCache()).get(base)
    atomic_write_json(cdir / "running.json", {"host": socket.gethostname(), "pid": os.getpid(), "time": time.time()})
    cfg = base.replace(batch_size=B, grad_accum=A, out_dir=str(cdir), export=False, evaluate=False, lmp=False)
    t0 = time.perf_counter()
    points = [TrainPoint(base.replace(lambda_lm=p.lambda_lm, lambda_d=p.lambda_d).debias.hparams,
                         base.optimizer.learning_rate) for p in pts]
    tr = debias_trainer(cfg, model=ctx.model, points=points, data=ctx.data)
    res = tr.run(cdir, description=f"{cfg.describe()} ×{len(pts)}",
                 after=_evaluation_programs(ctx, base, tr, len(pts), task["dev_max_pairs"]))
    train_s = time.perf_counter() - t0
    recs = []
    last = res.summary.get("last") or []

    t1 = time.perf_counter()
    if res.frozen:  # adapters: each point scored on the one frozen base (the base is never stacked)
        frozen, trained = to_host(res.frozen), to_host(res.state.params)
        devs, lmps = [], []
        for i in range(len(pts)):
            d, lp = _evaluate(ctx, base, combine(frozen, jax.tree.map(lambda x: x[i], trained)),  # noqa: B023
                              n_bootstrap=task["n_bootstrap"], dev_max_pairs=task["dev_max_pairs"])
            devs.append(d)
            lmps.append(lp)
    else:
        stacked = to_host(res.state.params)  # on every host (the chunk may span several)
        devs, lmps = _evaluate(ctx, base, stacked, n_bootstrap=task["n_bootstrap"],
                               dev_max_pairs=task["dev_max_pairs"], stacked=True)  # every point in one vmapped pass
    eval_s = (time.perf_counter() - t1) / len(pts)
    for i, (p, k) in enumerate(zip(pts, keys)):
        recs.append(json.loads(to_json({"id": p.id, "point": p.as_dict(), "key": k, "dev": devs[i], "lmp": lmps[i],
                             "updates": res.updates_done, "train_s": train_s / len(pts), "eval_s": eval_s,
                             "last": last[i] if i < len(last) else None,
                             "skipped_updates": res.summary["skipped_updates"][i], "chunk": task["chunk_id"],
                             "resumed_from": res.resumed_from, "layout": tr.layout_info()})))  # NaN/inf -> None
    stored.save({"records": recs})
    if not task.get("keep_checkpoints"):
        shutil.rmtree(cdir / "checkpoints", ignore_errors=True)
    return recs


def _point_key(sweep_key: dict, p: GridPoint) -> str:

    return digest({"sweep": sweep_key, "point": p.as_dict()})


# ------------------------------------------------------------------------------------------------------ sweeps
def _sweep_key(base: DebiasRun, ctx: SweepContext, dev_max_pairs, n_bootstrap) -> dict:

    grid_axes = ("batch_size", "grad_accum", "lambda_lm", "lambda_d")
    traj = {**base.trainer_config.trajectory(), **base.optimizer.to_dict(), **base.debias.hparams,
            "method": base.debias.method, "semantics": base.debias.semantics, "bias_type": base.debias.bias_type,
            "train_file": base.debias.train_file}
    for k in grid_axes:
        traj.pop(k, None)
    if base.adapter.enabled:
        traj["adapter"] = base.adapter.describe()
    if ctx.data.chat is not None:  # training phrases and dev pairs as chat turns
        traj["chat"] = ctx.data.chat.key()
    return {"format": CHECKPOINT_FORMAT, "trajectory": traj, "model": ctx.model.digest,
            "tokenizer": ctx.model.tokenizer_digest, "data": ctx.data.key,
            "evaluation": {"dev_max_pairs": dev_max_pairs, "n_bootstrap": n_bootstrap, "lmp": base.evaluation.lmp,
                           "lmp_file": None if ctx.lmp_path is None else str(ctx.lmp_path),
                           "lmp_max_lines": base.evaluation.lmp_max_lines,
                           "eval_batch_size": base.evaluation.eval_batch_size}}


@dataclasses.dataclass
class _Sweep:
    base: DebiasRun
    out: Path
    points: list[GridPoint]
    key: dict
    settings: dict
    baseline: dict
    records: dict[str, dict]
    tasks: list[dict]


#: what a sweep writes in its folder (besides ``selected_<rule>/``, a run folder of its own)
SWEEP_FILES = ("sweep.jsonl", "sweep.csv", "selection.json", "baseline.json", "sweep_settings.json", "chunks",
               "points")


#: the run folders of a sweep's retrained selections (``--final``), one per selection rule
SELECTED_FOLDERS = ("selected_default", "selected_reference")


def clear_sweep(folder: str | Path) -> None:
    """Delete a sweep's files in ``folder`` (:data:`SWEEP_FILES` and :data:`SELECTED_FOLDERS`: a selected point of
    the earlier sweep never survives beside the new sweep's selection; a sweep of other inputs, the
    ``--overwrite`` of a distributed sweep)."""
    for name in SWEEP_FILES + SELECTED_FOLDERS:
        q = Path(folder) / name
        if q.is_dir():
            shutil.rmtree(q, ignore_errors=True)  # (several hosts may clear the same shared folder)
        else:
            q.unlink(missing_ok=True)


def _prepare(base: DebiasRun, out: Path, contexts: ContextCache, *, grid, max_points, n_bootstrap, dev_max_pairs,
             grid_chunk, keep_checkpoints, replace_other_inputs: bool = False) -> _Sweep:

    check_output_dir(out, "--out")
    out.mkdir(parents=True, exist_ok=True)
    pts = grid_points(base.debias.method, grid)
    if max_points is not None:
        pts = pts[:max_points]
    ctx = contexts.get(base)
    key = canonical(_sweep_key(base, ctx, dev_max_pairs, n_bootstrap))
    settings = {"method": base.debias.method, "bias_type": base.debias.bias_type, "semantics": base.debias.semantics, "model": base.model,
                "seed": base.trainer.seed, "epochs": base.trainer.epochs, "max_steps": base.trainer.max_steps,
                "grid": {k: list(v) for k, v in (grid or PAPER_GRID).items()},
                "lmp_file": None if ctx.lmp_path is None else str(ctx.lmp_path),
                "lmp_max_lines": base.evaluation.lmp_max_lines, "dev_max_pairs": dev_max_pairs, "n_bootstrap": n_bootstrap}
    if base.adapter.enabled:
        settings["adapter"] = base.adapter.describe()
    settings["format"] = base.debias.format
    if ctx.data.chat is not None:
        settings["chat"] = ctx.data.info["chat"]
    # the one reuse rule for the sweep's files; they carry no status: sweep_settings.json and baseline.json are
    # only ever written whole, and a line of sweep.jsonl only for a finished point
    spath = out / "sweep_settings.json"
    why, other = why_not_reusable(read_json(spath), key, finished=True)
    if other:
        if not replace_other_inputs:
            raise ValueError(f"{out}: holds a sweep of other inputs ({why}); use another --out or --overwrite")
        log.info(f"{out}: held a sweep of other inputs ({why}); running it again")
        clear_sweep(out)
    atomic_write_json(spath, {"key": key, "settings": settings})
    bpath = out / "baseline.json"
    baseline = read_json(bpath)
    if why_not_reusable(baseline, key, finished=True)[0] is not None:
        dev, lmp = _evaluate(ctx, base, ctx.params, n_bootstrap=n_bootstrap, dev_max_pairs=dev_max_pairs)
        baseline = {"key": key, "settings": settings, "dev": dev, "lmp": lmp, "versions": versions()}
        atomic_write_json(bpath, baseline)
    done = {r["id"]: r for r in _read_jsonl(out / "sweep.jsonl")
            if why_not_reusable(r, _point_key(key, _pt(r)), finished=True)[0] is None}
    tasks = []
    for (B, A), group in batch_plans(pts):
        todo = [p for p in group if p.id not in done]
        if not todo:
            continue
        n = grid_chunk or auto_grid_chunk(ctx.params, len(group), **_chunk_costs(base, ctx, group))[0]
        for c in range(0, len(todo), n):
            chunk = todo[c:c + n]
            tasks.append({"base": base.to_dict(), "plan": [B, A], "points": [p.as_dict() for p in chunk],
                          "chunk_id": f"b{B}_a{A}_" + "_".join(f"lm{p.lambda_lm:g}d{p.lambda_d:g}" for p in chunk),
                          "out": str(out), "key": key, "n_bootstrap": n_bootstrap, "dev_max_pairs": dev_max_pairs,
                          "keep_checkpoints": keep_checkpoints, "n_devices": len(jax.devices())})
    return _Sweep(base, out, pts, key, settings, baseline, done, tasks)


def _chunk_costs(base: DebiasRun, ctx: SweepContext, group: list[GridPoint]) -> dict:
    """:func:`auto_grid_chunk`'s per-point costs of a batch plan: with adapters, one point's adapters (fp32) and its
    activations from the memory plan (:func:`rbjax.model.memory.plan_memory`; for a large base model they, not the
    adapters, limit a chunk); without, the parameters' copies as before."""
    if not base.adapter.enabled:
        return {}
    one = plan_memory(ctx.config, mesh=None, training=True, batch_size=group[0].batch_size,
                      seq_len=int(ctx.data.ids.shape[1]), grad_accum=group[0].grad_accum,  # the rows' width
                      precision=base.trainer.precision, adapter=base.adapter.lora_spec(),
                      param_dtype=base.adapter.param_dtype, suggest=False)
    return {"adapter_bytes": 4 * adapter_param_count(ctx.config, base.adapter.lora_spec()),
            "activation_bytes": one.parts["activations"]}


def _pt(rec: dict) -> GridPoint:
    return GridPoint(**rec["point"])


def _finish(sw: _Sweep, *, lmp_tolerance: float, final: str, final_evaluate: bool = True,
            replace_other_inputs: bool = False) -> dict:

    recs = [sw.records[p.id] for p in sw.points if p.id in sw.records]
    base_lmp = (sw.baseline.get("lmp") or {}).get("perplexity")
    sel = select(recs, base_lmp, lmp_tolerance)
    sel.update(settings=sw.settings, key=sw.key, baseline=sw.baseline, n_points_planned=len(sw.points),
               versions=versions())
    header = ["id", "batch_size", "grad_accum", "lambda_lm", "lambda_d", "dev_t", "dev_p", "dev_ref_t", "dev_ref_p",
              "lmp", "updates", "train_s", "skipped_updates"]
    rows = [[r["id"], r["point"]["batch_size"], r["point"]["grad_accum"], r["point"]["lambda_lm"],
             r["point"]["lambda_d"], r["dev"]["t_value"], r["dev"]["p_value"], r["dev"]["reference"]["t_value"],
             r["dev"]["reference"]["p_value"], (r.get("lmp") or {}).get("perplexity"), r["updates"],
             round(r["train_s"], 2), r.get("skipped_updates", 0)] for r in recs]
    atomic_write_csv(sw.out / "sweep.csv", header, rows)
    rules = {"none": [], "default": ["default"], "reference": ["reference"], "both": ["default", "reference"]}[final]
    for rule in rules:
        if rule == "reference" and "default" in rules and sel["reference"]["id"] == sel["default"]["id"]:
            sel["reference"]["final"] = sel["default"].get("final")
            continue
        p = sel[rule]["point"]
        cfg = sw.base.replace(out_dir=str(sw.out / f"selected_{rule}"), **p)
        if not final_evaluate:  # the caller measures the selected model itself (e.g. the study's test stages)
            cfg = cfg.replace(evaluate=False, lmp=False)
        res = debias(cfg, replace_other_inputs=replace_other_inputs)  # (another selected point: trained again)
        sel[rule]["final"] = {"out_dir": cfg.out_dir, "lmb_valid": res.get("lmb_valid"), "lmp": res.get("lmp")}
    atomic_write_json(sw.out / "selection.json", sel)
    return sel


def run_sweeps(bases: Sequence[tuple[DebiasRun, str | Path]], config: SweepConfig | None = None, *,
               grid: dict[str, Sequence] | None = None, method_grids: dict[str, dict[str, Sequence]] | None = None,
               resources: dict | None = None, progress: bool = True, final_evaluate: bool = True,
               replace_other_inputs: bool = False, model: ModelHandle | None = None, **settings) -> list[dict]:
    """Run the grid for several (bias type, method) settings (each ``(base, out_dir)``), all chunks as tasks of one
    executor, then select on the valid split in each folder (see the module docstring). ``model``: the start model's
    handle when the caller opened it (the command's: one handle for its plan, its keys and its loads).

    Args:
        bases: ``(settings shared by every point, sweep folder)`` per sweep; batch size, accumulation and λ of the
            settings are replaced by the grid's.
        config: how points are evaluated, selected and run (:class:`rbjax.debias.sweep_config.SweepConfig`: LMP
            tolerance of the default rule, dev bootstrap, smoke-run limits, chunk size, which selection to retrain,
            executor); default: its defaults.
        **settings: :class:`~rbjax.debias.sweep_config.SweepConfig` fields that override ``config`` (e.g.
            ``n_bootstrap=0, grid_chunk=2``); any other name is a ``TypeError``.
        grid: axes as :data:`PAPER_GRID` (default: the paper's). method_grids: axes per method, replacing ``grid``
            for the sweeps of that method (e.g. from grid files, :mod:`rbjax.debias.grid_config`).
        resources: Ray resources per task (default: ``{"num_gpus": 1}`` when the cluster has GPUs).
        progress: progress bars.
        final_evaluate: evaluate the retrained selection (LMB on the valid split, LMP) as ``rbjax debias`` does;
            off when the caller measures it itself.
        replace_other_inputs: a folder holding a sweep of other inputs (another trajectory setting, model, data or
            evaluation setting) is cleared and swept again instead of refused, and a ``selected_<rule>`` run of
            another grid point is trained again; points of the same inputs are kept. For callers that own the
            folders (the study runner).

    Returns:
        the ``selection.json`` content of every sweep, in order.

    Raises:
        ValueError, FileNotFoundError, RuntimeError: bad settings or data; rbjax.core.parallel.TaskError: a task failed.
        TypeError: a keyword that is not a sweep setting.
    """
    cfg = (config or SweepConfig()).replace(**settings)
    lmp_tolerance, n_bootstrap, final, executor = cfg.lmp_tolerance, cfg.n_bootstrap, cfg.final, cfg.executor
    max_points, dev_max_pairs, grid_chunk = cfg.max_points, cfg.dev_max_pairs, cfg.grid_chunk
    ray_address, jobs, keep_checkpoints = cfg.ray_address, cfg.jobs, cfg.keep_point_checkpoints
    for _, o in bases:  # every output location before any work
        check_output_dir(o, "--out")
    contexts = ContextCache(model)  # one loaded start model at a time, shared by the chunks run in this process
    sweeps = [_prepare(b.replace(progress=progress and executor == "local"), Path(o), contexts,
                       grid=(method_grids or {}).get(b.debias.method, grid),
                       max_points=max_points, n_bootstrap=n_bootstrap, dev_max_pairs=dev_max_pairs,
                       grid_chunk=grid_chunk, keep_checkpoints=keep_checkpoints,
                       replace_other_inputs=replace_other_inputs) for b, o in bases]
    tasks = [(i, t) for i, sw in enumerate(sweeps) for t in sw.tasks]
    n_total = sum(len(sw.points) for sw in sweeps)
    n_done = sum(len(sw.records) for sw in sweeps)
    if tasks:
        primary = jax.process_index() == 0
        if executor == "ray" and resources is None:
            resources = _ray_task_resources
        fn = functools.partial(run_chunk, contexts=contexts) if executor == "local" else run_chunk
        results = as_completed(fn, [t for _, t in tasks], executor=executor,
                               jobs=1 if executor == "local" else jobs, resources=resources, ray_address=ray_address)
        with progress_bar(n_total, "sweep", "point", enabled=progress, initial=n_done, leave=True) as bar, \
                contextlib.closing(results):
            for j, recs in results:
                sw = sweeps[tasks[j][0]]
                lines = "".join(to_json(r) + "\n" for r in recs)
                if primary:  # several hosts of one program (jax.distributed): one of them appends
                    with open(sw.out / "sweep.jsonl", "a", encoding="utf-8") as f:
                        f.write(lines)
                sw.records.update((r["id"], r) for r in recs)
                bar.update(len(recs))
                ts = [r["dev"]["t_value"] for r in recs]
                bar.set_postfix(last=", ".join(r["id"] for r in recs),
                                t=", ".join("n/a" if t is None else f"{t:.2f}" for t in ts))
    return [_finish(sw, lmp_tolerance=lmp_tolerance, final=final, final_evaluate=final_evaluate,
                    replace_other_inputs=replace_other_inputs) for sw in sweeps]


def _ray_task_resources(task: dict) -> dict:
    """Ray resources of a chunk task: one GPU when the cluster has GPUs, else one CPU (a TPU host: pass
    ``resources={"TPU": n}`` for its chips)."""
    import ray

    gpus = ray.cluster_resources().get("GPU", 0) if ray.is_initialized() else 0
    return {"num_gpus": 1} if gpus else {"num_cpus": 1}


def run_sweep(base: DebiasRun, out_dir: str | Path, **kw) -> dict:
    """The grid for ``base.debias.method`` / ``base.debias.bias_type`` into ``out_dir`` (:func:`run_sweeps` with one sweep).

    Returns:
        the ``selection.json`` content.
    """
    return run_sweeps([(base, out_dir)], **kw)[0]


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

