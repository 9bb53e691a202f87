"""A debiasing run end to end (paper §4, §5.1): train, export, evaluate, ``results.json``.

::

    cfg = DebiasRun.from_flat(method="hd", bias_type="religion1", model="microsoft/DialoGPT-small", out_dir="runs/hd")
    result = debias(cfg)          # OUT/model (HF folder), OUT/lmb_valid/, OUT/results.json, OUT/metrics.jsonl

This module is the run's **composition root** (:func:`debias_trainer`): it opens the model once
(:class:`rbjax.model.handle.ModelHandle`), builds the device mesh once (:func:`rbjax.core.mesh.run_mesh`), the
optimiser (:func:`rbjax.train.optim.make_optimizer`), the method's objective
(:class:`rbjax.debias.objective.DebiasObjective`) and the training data (:class:`rbjax.debias.data.TrainingData`:
phrases → tokens → triggers), and hands them to the task-agnostic :class:`rbjax.train.loop.Trainer`. :func:`debias`
chains training, export and evaluation and decides what a rerun may reuse:

* an unfinished run in ``OUT`` is resumed from its checkpoint (same key, see :mod:`rbjax.train.loop`);
* a finished run is not trained again: its training record is kept, and only evaluations that are missing or whose
  inputs changed are computed (e.g. a rerun with another ``--eval-bias`` adds the new bias types' LMB; an identical
  rerun does nothing). What was reused is printed and recorded under ``reused`` in ``results.json``.
* a run whose settings, starting model or data differ from what ``OUT`` holds is refused (``--overwrite`` starts
  again), never mixed: ``--overwrite`` sets the earlier run's files aside and deletes them only when the new run has
  finished (an error or interrupt before then puts them back).

Outputs in ``out_dir``: ``config.json`` (the config, derived sizes, data files and hashes, versions),
``metrics.jsonl`` (one line per update), ``checkpoints/``, ``model/`` (HF folder with tokenizer files; with
low-rank adapters the merged model, and ``adapter/`` the adapters as a PEFT folder),
``lmb_valid/`` (:func:`rbjax.lmb.measure.measure_bias` on the valid split), ``results.json`` (config, key, training
summary, LMB of the debiased type and of every evaluated type, LMP, what was reused).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from rbjax.core.digests import file_digest
from rbjax.core.errors import SettingError
from rbjax.core.interrupt import Interrupted
from rbjax.core.io import (atomic_write_json, atomic_write_text, check_output_dir, read_json, replaced_leftovers,
                           replacing, versions)
from rbjax.core.keys import canonical, describe_difference, digest, tree_digest
from rbjax.core.log import get_logger
from rbjax.core.mesh import is_model_parallel, run_mesh, to_host
from rbjax.core.progress import progress_bar
from rbjax.core.reuse import KeyedResult, why_not_reusable
from rbjax.data.redditbias import ENV_DATA_DIR, RedditBiasData, expand_bias_types, load_pairs
from rbjax.debias.config import METHODS, DebiasRun
from rbjax.debias.data import TrainingData
from rbjax.debias.objective import DebiasObjective
from rbjax.dialog.reddit_perplexity import lmp_program_shapes, read_reference_lines, reddit_perplexity
from rbjax.lmb import measure
from rbjax.lmb.config import MeasureConfig
from rbjax.lmb.perplexity import PerplexityScorer
from rbjax.model.chat import ChatSettings
from rbjax.model.handle import ModelHandle
from rbjax.model.hf import model_files_key, save_pretrained
from rbjax.model.lora import adapter_param_count, add_adapters, merge_adapters
from rbjax.model.lora import describe as describe_lora
from rbjax.model.peft_adapter import ADAPTER_CONFIG, base_weights_key, save_adapter
from rbjax.specs import BIAS_TYPES, UPSTREAM_NAME, is_spec_path, load_spec
from rbjax.train.checkpoint import Checkpointer
from rbjax.train.config import AdapterConfig
from rbjax.train.loop import Trainer, TrainPoint
from rbjax.train.optim import make_optimizer

__all__ = ["DebiasRun", "debias_trainer", "adapted_params", "lambda_point", "debias", "evaluate_run",
           "evaluation_programs", "chat_fields", "METHODS"]

log = get_logger("debias")

RUN_FILES = ("checkpoints", "metrics.jsonl", "results.json", "model", "adapter", "lmb_valid", "config.json")


def _check_out_dir(out: Path) -> None:
    check_output_dir(out, "--out")  # a file in the way, an unwritable folder: named before any work
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--out {out}: cannot create the run folder ({e.strerror or e})") from None


def lambda_point(lambda_lm: float, lambda_d: float, learning_rate: float) -> TrainPoint:
    """The per-run hyper-parameters of an LMD, ADD or HD run (or grid point): λ_LM, λ_D of eq. 2 and the peak
    learning rate (:class:`rbjax.train.loop.TrainPoint`)."""
    return TrainPoint({"lambda_lm": float(lambda_lm), "lambda_d": float(lambda_d)}, float(learning_rate))


def debias_trainer(cfg: DebiasRun, *, model: ModelHandle | None = None, mesh=None,
                   points: TrainPoint | list[TrainPoint] | None = None, data: TrainingData | None = None,
                   plan=None, texts: list[str] | None = None) -> Trainer:
    """The composition root of a debiasing run (or of a sweep's chunk): each part built once and handed to the
    :class:`rbjax.train.loop.Trainer`.

    Args:
        cfg: the run's settings.
        model: the starting model (default: :meth:`ModelHandle.open` of ``cfg.model`` / ``cfg.tokenizer``; its
            content key is hashed once, :func:`rbjax.core.keys.file_digest`). Loaded here if it is not yet (on an
            fsdp/tensor mesh slice by slice into the devices).
        mesh: the device mesh (default: ``cfg.mesh`` built once, :func:`rbjax.core.mesh.run_mesh`).
        points: a :class:`TrainPoint` (default: ``cfg``'s λ and learning rate) or a chunk's list of them.
        data, plan, texts: the training data (default: built from the tokenizer; ``texts`` instead of the bias
            type's phrases), a prepared batch plan.

    Raises:
        FileNotFoundError, ValueError, RuntimeError: a missing model, tokenizer or data file; a bad mesh.
    """
    tcfg = cfg.trainer_config
    model = model or ModelHandle.open(cfg.model, cfg.tokenizer)
    n = len(points) if isinstance(points, (list, tuple)) else 1
    mesh = mesh or run_mesh(cfg.mesh, n_points=n, batch_size=tcfg.batch_size,
                            stacked=isinstance(points, (list, tuple)))
    model.load(mesh=mesh if is_model_parallel(mesh) else None)
    objective = DebiasObjective(cfg.debias.method, cfg.debias.semantics)
    if data is None:
        data = TrainingData(cfg, model.tokenizer, model.config.vocab_size, texts)
    if points is None:
        points = TrainPoint(cfg.debias.hparams, cfg.optimizer.learning_rate)
    key_extra = {"bias_type": cfg.debias.bias_type, "train_file": cfg.debias.train_file}
    if data.chat is not None:  # the template's text and the chat settings (the tokens are in data.key too)
        key_extra["chat"] = data.chat.key()
    params = None
    if cfg.adapter.enabled:  # low-rank adapters on the frozen base (one base for every point of a chunk)
        params = adapted_params(cfg.adapter, model, cfg.trainer.seed)
        key_extra["adapter"] = cfg.adapter.describe()
    return Trainer(tcfg, model, objective, make_optimizer(cfg.optimizer), data, mesh=mesh, points=points,
                   params=params, plan=plan, key_extra=key_extra, out_dir=cfg.out_dir)


def chat_fields(settings) -> dict:
    """The chat-format settings (:class:`rbjax.model.chat.ChatSettings` fields) of ``settings`` by name, to pass on
    to another command's settings (the post-training LMB is measured in the run's format)."""
    return {f.name: getattr(settings, f.name) for f in dataclasses.fields(ChatSettings)}


def adapted_params(adapter: AdapterConfig, model: ModelHandle, seed: int, params=None) -> dict:
    """The start of an adapter run: the model's (or ``params``') frozen base, stored as ``adapter.param_dtype``
    says, with fresh adapters seeded by ``seed`` (:func:`rbjax.model.lora.add_adapters`).

    Raises:
        rbjax.core.errors.SettingError: ``lora_targets`` names no module of the model's family.
    """
    try:
        return add_adapters(model.params if params is None else params, model.config, adapter.lora_spec(), seed,
                            base_dtype=jnp.bfloat16 if adapter.param_dtype == "bf16" else None)
    except ValueError as e:
        raise SettingError("lora_targets", str(e).removeprefix("--lora-targets ")) from None


def adapter_record(cfg: DebiasRun, trainer: Trainer, folder: Path | None) -> dict:
    """What ``results.json`` (and the model card) record of an adapter run: rank, α, dropout, rsLoRA, scale, the
    resolved target modules, trained numbers, the base model's storage dtype and content key, the PEFT folder."""
    spec = cfg.adapter.lora_spec()
    return {**describe_lora(spec, trainer.config), "param_dtype": cfg.adapter.param_dtype,
            "trained_parameters": adapter_param_count(trainer.config, spec),
            "base_model": cfg.model, "base_model_key": trainer.model.digest,
            "folder": None if folder is None or not (folder / ADAPTER_CONFIG).is_file() else str(folder)}


def _lmb_summary(rec: dict) -> dict:
    keys = ("bias_type", "split", "n_pairs", "n_pairs_after_outliers", "t_value", "p_value", "significant",
            "direction", "cohens_d_paired", "mean_log_ppl_diff", "reused_perplexities")
    out = {k: rec.get(k) for k in keys}
    out["reference_ttest_rel"] = {k: rec.get("reference", {}).get(k) for k in ("t_value", "p_value")}
    return out


def _type_name(bias_type: str) -> str:
    """The name LMB records carry for a bias type: the packaged name, or a spec file's ``name``."""

    return load_spec(bias_type).name if is_spec_path(bias_type) else bias_type


def _eval_types(cfg: DebiasRun) -> list[str]:
    """The bias types of the post-training LMB: ``eval_bias`` plus the debiased type. For a bias type of one's own
    (a spec file) whose data folder holds no files of a packaged type, ``all`` skips those types (and says so)."""

    types = expand_bias_types(cfg.evaluation.eval_bias)
    if is_spec_path(cfg.debias.bias_type) and cfg.evaluation.eval_bias.strip().lower() == "all":
        data = RedditBiasData(cfg.debias.data_dir)
        missing = [t for t in types if t in BIAS_TYPES and not data.is_cache
                   and not (data.root / "data" / UPSTREAM_NAME[t]).is_dir()]
        if missing:
            log.info(f"{data.root} holds no RedditBias files of {', '.join(missing)}: LMB of the debiased type only "
                 "(--eval-bias names other types explicitly)")
            types = [t for t in types if t not in missing]
    # compared by name: a spec file may be named by another path in --eval-bias
    return types if _type_name(cfg.debias.bias_type) in map(_type_name, types) else [cfg.debias.bias_type] + types


def check_own_bias_type_data(cfg: DebiasRun) -> None:
    """A bias type of one's own (a spec file) trains on the phrases of its data folder, which the RedditBias release
    does not hold: without --data-dir (or $RBJAX_DATA_DIR) and --train-file, say so (not that a download failed).

    Raises:
        FileNotFoundError: naming the spec file and the file it needs.
    """
    if is_spec_path(cfg.debias.bias_type) and cfg.debias.train_file is None and cfg.debias.data_dir is None \
            and not os.environ.get(ENV_DATA_DIR):
        raise FileNotFoundError(
            f"--bias {cfg.debias.bias_type}: a bias type of your own trains on its phrases in "
            f"DATA_DIR/{RedditBiasData.train_file(cfg.debias.bias_type)}, which the RedditBias release does not hold; pass "
            "--data-dir (the folder `rbjax splits` wrote) or --train-file")


def lmp_reference_file(cfg: DebiasRun) -> Path:
    """The LMP reference file: ``lmp_file``, else ``text_files/humanref6k.txt`` of the data folder, else (a bias type
    of one's own whose data folder lacks it) of the RedditBias release (``$RBJAX_DATA_DIR`` or the verified cache)."""

    if cfg.evaluation.lmp_file:
        return Path(cfg.evaluation.lmp_file)
    try:
        return RedditBiasData(cfg.debias.data_dir).reddit_reference_file()
    except FileNotFoundError:
        if cfg.debias.data_dir is None:
            raise
        try:
            return RedditBiasData(None).reddit_reference_file()
        except (FileNotFoundError, RuntimeError) as e:
            raise FileNotFoundError(
                f"the LMP reference text_files/humanref6k.txt is not in --data-dir {cfg.debias.data_dir} and the RedditBias "
                f"release could not be read ({e}); give --lmp-file FILE (e.g. a local RedditBias copy's "
                "text_files/humanref6k.txt) or --no-lmp") from None


def _lmp_key(cfg: DebiasRun, model_key: str) -> dict:

    path = lmp_reference_file(cfg)
    return {"model": model_key, "file": str(path), "sha256": file_digest(path), "max_lines": cfg.evaluation.lmp_max_lines,
            "block_size": cfg.trainer.block_size}


def _scores_on_training_mesh(trainer: Trainer) -> bool:
    """Whether the evaluation scores the trained parameters where they lie, split over the run's fsdp/tensor mesh
    of this process; otherwise they are gathered to the host and scored on this process's devices."""
    return is_model_parallel(trainer.mesh) and jax.process_count() == 1


def evaluate_run(cfg: DebiasRun, trainer: Trainer, params, model_dir: Path | None, *, model_key: str | None,
                 previous: dict | None = None) -> dict:
    """Post-training evaluation of the trained ``params`` in memory: LMB on the valid split and the Reddit LMP.

    LMB reuses the per-type perplexities already in ``OUT/lmb_valid`` that were produced by the same model files and
    data (:func:`rbjax.lmb.measure.measure_bias` with ``resume``); LMP reuses ``previous["lmp"]`` when its key (model
    content, reference file content, line cap, block size) is the same.

    Args:
        model_key: the digest of the exported model files; ``None`` (not exported): the digest of ``params``,
            computed only when an evaluation is on (a sha256 over every weight: ≈ 3 s at 124M parameters).

    Returns:
        ``{"lmb_valid": ..., "lmp": ...}`` (keys present for the evaluations switched on) and ``"reused"``.
    """
    if model_key is None and (cfg.evaluation.evaluate or cfg.evaluation.lmp):
        model_key = tree_digest(to_host(params))  # the trained parameters key the evaluation's reuse
    res: dict[str, Any] = {"reused": {}}
    if cfg.evaluation.evaluate:

        types = _eval_types(cfg)
        t0 = time.perf_counter()
        # in memory: the trained parameters are scored as they are, not exported and read back
        # on an fsdp/tensor mesh of this process the scorer keeps the trained parameters split the same way (a mesh
        # over several processes: gathered, and every process scores on its own devices, as the sweep does)
        mp = _scores_on_training_mesh(trainer)
        loaded = measure.LoadedModel.from_params(params if mp else to_host(params), trainer.config,
                                         trainer.tokenizer, name=str(model_dir or Path(cfg.out_dir)), digest=model_key,
                                         batch_size=cfg.evaluation.eval_batch_size, mesh=trainer.mesh if mp else None)
        recs = measure.measure_bias(model=loaded, bias_types=types, split="valid", data_dir=cfg.debias.data_dir,
                            out_dir=Path(cfg.out_dir) / "lmb_valid", seed=cfg.trainer.seed, progress=cfg.trainer.progress,
                            resume=True, overwrite=True,  # in the run's format: a chat-trained model as a chat
                            **chat_fields(cfg.debias))  # the run owns lmb_valid (its key guards the folder)
        res["lmb_valid"] = {
            "debiased_type": next(_lmb_summary(r) for r in recs if r["bias_type"] == _type_name(cfg.debias.bias_type)),
            "all": [_lmb_summary(r) for r in recs],
            "folder": str(Path(cfg.out_dir) / "lmb_valid"),
            "seconds": time.perf_counter() - t0,
        }
        res["reused"]["lmb_types"] = [r["bias_type"] for r in recs if r.get("reused_perplexities")]
    if cfg.evaluation.lmp:

        key = _lmp_key(cfg, model_key)
        prev = (previous or {}).get("lmp")
        # the LMP record of a finished results.json (the one reuse rule; its status is the run's)
        if prev and why_not_reusable(prev, canonical(key), finished=True)[0] is None:
            res["lmp"] = prev
            res["reused"]["lmp"] = True
        else:
            path = Path(key["file"])
            lines = read_reference_lines(path, cfg.evaluation.lmp_max_lines)
            t0 = time.perf_counter()
            with progress_bar(len(lines), "LMP (Reddit 6K)", "line", enabled=cfg.trainer.progress) as bar:
                lmp = reddit_perplexity(to_host(params), trainer.config, trainer.tokenizer, lines,
                                        block_size=cfg.trainer.block_size, batch_size=cfg.evaluation.eval_batch_size,
                                        progress=bar.update, bos_id=trainer.tokenizer.default_bos_id)
            lmp.update(file=str(path), max_lines=cfg.evaluation.lmp_max_lines, seconds=time.perf_counter() - t0, key=key)
            res["lmp"] = lmp
            res["reused"]["lmp"] = False
    return res


def evaluation_programs(cfg: DebiasRun, trainer: Trainer) -> list:
    """What :func:`evaluate_run` will compile, as jobs for :meth:`rbjax.train.loop.Trainer.run` (``after``): the
    scoring programs of the LMB valid split of every evaluated type and of the LMP lines, for the trained
    parameters' shapes, so that they are compiled before the first update with the training programs and the
    evaluation compiles nothing. Their inputs are read and checked here, before training: a phrase or line that
    cannot be scored fails the run now, not after it. None on a model-parallel mesh (the scorer then keeps the
    trained parameters' own placement, known only after training: its programs are compiled when evaluation
    starts, and are in the persistent compilation cache after the first such run).

    Raises:
        ValueError: a valid-split phrase or an LMP line that cannot be scored (file and row named).
    """
    if _scores_on_training_mesh(trainer):
        return []
    ev, model = cfg.evaluation, trainer.model
    jobs = []
    if ev.evaluate:
        chat = MeasureConfig().replace(**chat_fields(cfg.debias)).chat_turns(model.tokenizer)
        data = RedditBiasData(cfg.debias.data_dir)
        pairs = [load_pairs(b, "valid", data) for b in _eval_types(cfg)]

        def lmb(params) -> int:
            scorer = PerplexityScorer(params, model.config, batch_size=ev.eval_batch_size, bos_id=model.bos_id(None))
            return scorer.compile_programs(measure.pair_program_shapes(scorer, model.tokenizer, pairs, chat))
        jobs.append(lmb)
    if ev.lmp:
        lines = read_reference_lines(lmp_reference_file(cfg), ev.lmp_max_lines)

        def lmp(params) -> int:
            scorer = PerplexityScorer(params, model.config, batch_size=ev.eval_batch_size,
                                      bos_id=model.tokenizer.default_bos_id)
            return scorer.compile_programs(lmp_program_shapes(scorer, model.tokenizer, lines,
                                                              block_size=cfg.trainer.block_size))
        jobs.append(lmp)
    return jobs


def write_config(cfg: DebiasRun, trainer: Trainer) -> None:

    data = trainer.data
    atomic_write_json(Path(cfg.out_dir) / "config.json", {
        "config": cfg.to_dict(), "resolved": {"leftover": trainer.cfg.resolved_leftover},
        "derived": {"n_examples": trainer.n_examples, "n_batches_per_epoch": trainer.n_batches,
                    "t_total": trainer.t_total, "micro_batches_planned": sum(len(p) for p in trainer.plan.plan),
                    "occurrence_axis": data.n_occ},
        "model": {"source": cfg.model, "folder": None if trainer.model.folder is None else str(trainer.model.folder),
                  "config": dataclasses.asdict(trainer.config)},
        "tokenizer": getattr(trainer.tokenizer, "source", None),
        "data": data.info, "triggers": data.trigger_stats,
        "target_pairs": {k: v.tolist() for k, v in data.shared.items()},
        "key": trainer.key(), "versions": versions()})


def whole_run_totals(metrics_path: Path, upto: int, current: float | None = None) -> dict | None:
    """Tokens and training seconds of a run over all its sessions, from ``metrics.jsonl``.

    A resumed run's in-memory summary covers only the updates of the last session; the metric lines cover every
    update (those after a resumed checkpoint are truncated and redone). Each line carries its session's tag
    (``session``) and the seconds since that session started (``elapsed_s``), so a session's time is its last
    line's ``elapsed_s`` (lines without a tag, from older versions: a new session wherever ``elapsed_s`` drops).
    Lines of point 0 only (grid chunks repeat the tokens per point).

    Args:
        metrics_path: the run's ``metrics.jsonl``. upto: the run's update count.
        current: the tag of the session in progress: its seconds are left out of ``train_s`` (the caller adds its
            own measure, which also counts the time after its last update, e.g. the final checkpoint).
    Returns:
        ``{"tokens", "train_s", "sessions", "updates_logged"}`` for updates ≤ ``upto``, or ``None`` when the file is
        missing, unreadable or does not cover updates 1..``upto``.
    """
    try:
        lines = metrics_path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    tokens, steps, ends = 0, set(), []  # ends: [tag, last elapsed_s] per session, in order
    for ln in lines:
        try:
            r = json.loads(ln)
        except ValueError:
            return None
        if r.get("point", 0) != 0 or int(r.get("step", 0)) > upto:
            continue
        el, tag = float(r.get("elapsed_s", 0.0)), r.get("session")
        if not ends or (tag != ends[-1][0] if "session" in r else el < ends[-1][1]):
            ends.append([tag, el])
        ends[-1][1] = el
        tokens += int(r.get("tokens", 0))
        steps.add(int(r["step"]))
    if steps != set(range(1, upto + 1)):
        return None
    seconds = sum(el for tag, el in ends if current is None or tag != current)
    return {"tokens": tokens, "train_s": seconds, "sessions": len(ends), "updates_logged": len(steps)}


def _last_metrics(metrics_path: Path) -> dict | None:
    """The last metric line of point 0 (``None`` if there is none)."""
    last = None
    try:
        for ln in metrics_path.read_text(encoding="utf-8").splitlines():
            r = json.loads(ln)
            if r.get("point", 0) == 0:
                last = r
    except (OSError, ValueError):
        return None
    return last


def _other_inputs(out: Path, key: dict) -> str | None:
    """Why ``out`` holds a run of other inputs than ``key`` (a finished run's ``results.json`` or the newest
    checkpoint), or None when it holds nothing or a run of these inputs."""
    why, other = why_not_reusable(read_json(out / "results.json"), key)
    if other:
        return why
    if (out / "checkpoints").is_dir():
        ckpt = Checkpointer(out / "checkpoints")
        try:
            step = ckpt.latest_step()
            meta = ckpt.restore_meta(step) if step is not None else None
        finally:
            ckpt.close()
        why, other = why_not_reusable(meta, key, finished=True)  # a committed checkpoint's metadata
        if other:
            return why
    return None


def _clear_run(out: Path) -> None:
    for name in RUN_FILES:
        p = out / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()



def adapter_base(model: str, folder: Path | None) -> dict:
    """:func:`rbjax.model.peft_adapter.save_adapter`'s record of the base: ``base_model`` — the hub id as given, or
    the absolute path of the base's HF folder (a run folder's ``model/``), so that ``AutoPeftModelForCausalLM`` finds
    it from any working folder — and ``base_key``, the base's weights key (none for a base only in memory)."""
    local = Path(model).expanduser().exists() and folder is not None
    return {"base_model": str(Path(folder).resolve()) if local else str(model),
            "base_key": None if folder is None else base_weights_key(folder)}


class _Unfinished(Exception):
    """A run of ``--overwrite`` that stopped before it finished (``stop_after``): the earlier run is put back."""

    def __init__(self, result: dict):
        super().__init__("unfinished")
        self.result = result


def debias(cfg: DebiasRun, *, stop_after: int | None = None, overwrite: bool = False,
           trainer: Trainer | None = None, replace_other_inputs: bool = False,
           model: ModelHandle | None = None) -> dict:
    """Run a debiasing job end to end: train (resuming if possible), export, evaluate, write ``results.json``.

    Args:
        cfg: the run configuration.
        stop_after: stop after this many updates (checkpointed), without export or evaluation (simulated kill).
        overwrite: replace the run in ``out_dir`` (even one of the same inputs) by a new one. Its files
            (:data:`RUN_FILES`: checkpoints, metrics, results, ``model/``, ``adapter/``, ``lmb_valid/``, config) are
            set aside once the inputs are checked and the model and data are read (:func:`rbjax.core.io.replacing`),
            the new run is trained in a folder holding none of them, and they are deleted only when it has
            finished; an error, an interrupt or ``stop_after`` before then discards the new run's files and puts the
            earlier run back as it was (an interrupted ``--overwrite`` run is not resumable: it starts over).
        trainer: a prepared trainer of ``cfg`` (:func:`debias_trainer`; reuses loaded weights).
        model: the starting model's handle when the caller opened it already (the command's, which planned the
            memory with it); default: :func:`debias_trainer` opens ``cfg.model``.
        replace_other_inputs: a folder holding a run of other inputs (another setting, model or data: its
            ``results.json`` or checkpoints) is cleared and trained again instead of refused; a run of the same
            inputs is still reused or resumed. For callers that own the folder (the study runner, whose stages
            are keyed on their inputs); ``overwrite`` discards even a run of the same inputs.

    Returns:
        the ``results.json`` content (``{"status": "stopped", ...}`` after ``stop_after``).

    Raises:
        FileNotFoundError, ValueError, RuntimeError: bad inputs (messages name the file / setting).
        rbjax.core.interrupt.Interrupted: Ctrl-C / SIGTERM during training (a checkpoint was saved).
    """

    out = Path(cfg.out_dir)
    _check_out_dir(out)
    check_own_bias_type_data(cfg)  # before the LMP file: the training phrases are what is missing
    if cfg.evaluation.lmp and not lmp_reference_file(cfg).is_file():  # fail before training, not after it
        raise FileNotFoundError(f"--lmp-file {cfg.evaluation.lmp_file}: LMP reference file not found")
    t0 = time.perf_counter()
    trainer = trainer or debias_trainer(cfg, model=model)
    key = canonical(trainer.key())
    if not overwrite:
        return _debias(cfg, out, trainer, key, t0, stop_after, replace_other_inputs)
    for p in replaced_leftovers(out):
        log.warning(f"{p}: the files of a run that an earlier 'rbjax debias --overwrite' into {out} replaced and "
                    f"that was killed before it finished; move them back (into {out}) or delete them")
    # the run's files are set aside, not deleted: the new run starts from a folder holding none of them (nothing of
    # the earlier run survives beside it), and only once it has finished are they deleted; an error or an
    # interrupt before then discards the new run's files and puts the earlier run back as it was
    earlier: list[str] = []
    try:
        with replacing(out, RUN_FILES) as earlier:
            res = _debias(cfg, out, trainer, key, t0, stop_after, replace_other_inputs=False)
            if res.get("status") == "stopped" and earlier:
                raise _Unfinished(res)
    except _Unfinished as e:
        log.info(f"{out}: the new run stopped before it finished; the earlier run there is kept as it was")
        return e.result
    except KeyboardInterrupt:
        if not earlier:
            raise
        raise Interrupted(
            f"rbjax debias --overwrite: interrupted before the new run finished. Its files are discarded and the "
            f"earlier run in {out} is kept as it was. Run the same command again to start over, or give another "
            "--out to keep both.") from None
    return res


def _debias(cfg: DebiasRun, out: Path, trainer: Trainer, key: dict, t0: float, stop_after: int | None,
            replace_other_inputs: bool) -> dict:
    """:func:`debias` once ``trainer`` is built and ``key`` known (with ``overwrite``, in a folder whose run files
    were set aside): the finished run of these inputs that ``out`` holds (if any), training (or its reuse), export,
    evaluation, ``results.json``."""
    if replace_other_inputs:
        why = _other_inputs(out, key)
        if why is not None:
            log.info(f"{out}: held a run of other inputs ({why}); training again")
            _clear_run(out)
    prev, same_settings = _finished_run(out, key, cfg)
    exported = _intact_export(prev, out / "model", trainer)
    if exported is not None and stop_after is None:
        # a finished run whose exported weights are intact: its training is not repeated
        params, training, reused_training = jax.device_put(exported.params), prev["training"], True
        log.info(f"{out}: training finished earlier ({training['updates']} updates); reusing {out / 'model'}")
    else:
        trained = _train(cfg, out, trainer, stop_after, prev)
        if trained.get("status") == "stopped":
            return trained
        params, training, reused_training = trained["params"], trained["training"], trained["reused"]
    model_dir = _export(cfg, out, trainer, params) if cfg.export and exported is None else \
        (out / "model" if cfg.export else None)
    model_key = digest(model_files_key(model_dir)) if model_dir is not None else None
    evals = _evaluate_trained(cfg, out, trainer, params, model_dir, model_key, prev, training)
    reused = {"training": reused_training, **evals.pop("reused")}
    if prev is not None:
        if same_settings and _nothing_new(cfg, prev, evals, reused):
            log.info(f"{out / 'results.json'}: this run is complete (training, LMB of "
                     f"{', '.join(_lmb_types(evals)) or 'none'}{', LMP' if cfg.evaluation.lmp else ''}); nothing to do "
                     "(--overwrite starts again)")
            return prev
        _keep_earlier_evaluations(prev, evals, reused_training)
    res = {"status": "done", "method": cfg.debias.method, "bias_type": cfg.debias.bias_type,
           "semantics": cfg.debias.semantics, "format": cfg.debias.format, "chat": trainer.data.info.get("chat"),
           "config": cfg.to_dict(), "key": key, "model_dir": None if model_dir is None else str(model_dir),
           "model_files": None if model_dir is None else model_key,
           "training": training, **evals, "reused": reused, "wall_s": time.perf_counter() - t0, "versions": versions()}
    if cfg.adapter.enabled:
        res["adapter"] = adapter_record(cfg, trainer, out / "adapter" if cfg.export else None)
    atomic_write_json(out / "results.json", res)
    return res


def _finished_run(out: Path, key: dict, cfg: DebiasRun) -> tuple[dict | None, bool]:
    """The finished run of ``key`` that ``out`` holds — its ``results.json`` as written; ``None`` when there is none
    (no file, an unreadable or unfinished one) — and whether it was run with ``cfg``'s settings too (only then may a
    rerun whose training and evaluations are all reused return it unchanged). The one reuse rule
    (:class:`rbjax.core.reuse.KeyedResult`): the record's ``key``, then its ``config`` (its ``check``).

    Raises:
        ValueError: ``out`` holds a finished run of other inputs (the fields that differ named).
    """
    path = out / "results.json"
    run = KeyedResult(path, key, "debias run")
    if run.stored() is None:
        if run.other:
            raise ValueError(f"{out}: holds a finished run with other inputs ({run.reason}); use another --out or "
                             "--overwrite")
        return None, False
    settings = canonical(cfg.to_dict())

    def same_settings(rec: dict) -> str | None:
        if rec.get("config") == settings:
            return None
        return f"settings differ: {describe_difference(rec.get('config') or {}, settings)}"

    whole = KeyedResult(path, key, "debias run", check=same_settings)
    return run.record, whole.stored() is not None


def _intact_export(prev: dict | None, model_out: Path, trainer: Trainer) -> ModelHandle | None:
    """The finished run's exported model (``OUT/model``) when its files are those ``prev`` recorded, else ``None``."""
    if prev is None or not (model_out / "config.json").is_file() or not prev.get("model_files"):
        return None
    exported = ModelHandle.open(model_out, tokenizer=trainer.tokenizer.source)
    return exported if exported.digest == prev["model_files"] else None


def _train(cfg: DebiasRun, out: Path, trainer: Trainer, stop_after: int | None, prev: dict | None) -> dict:
    """Train (resuming from ``OUT/checkpoints``): ``{"params", "training" (the record of the training),
    "reused" (the final checkpoint was restored: nothing trained)}``, or the ``{"status": "stopped", ...}`` result
    after ``stop_after`` updates."""
    write_config(cfg, trainer)
    after = evaluation_programs(cfg, trainer) if stop_after is None else []
    result = trainer.run(out, stop_after=stop_after, description=cfg.describe(), after=after)
    if not result.finished:
        return {"status": "stopped", "updates_done": result.updates_done, "t_total": result.t_total,
                "out_dir": str(out)}
    reused = result.resumed_from == result.t_total
    if reused and prev is not None:
        training = prev["training"]  # restored the final checkpoint: keep the record of the real training
    else:
        training = _training_record(result, trainer, out)
    if reused:
        log.info(f"{out}: training finished earlier; reusing its final checkpoint")
    return {"params": result.params, "training": training, "reused": reused}


def _training_record(result, trainer: Trainer, out: Path) -> dict:
    """``results.json``'s ``training``: updates, examples, triggers and the trainer's summary; for a resumed run
    the whole run's tokens and seconds from ``metrics.jsonl`` (:func:`whole_run_totals`), this session's apart."""
    training = {"updates": result.updates_done, "t_total": result.t_total, "resumed_from": result.resumed_from,
                "n_examples": trainer.n_examples, "triggers": trainer.data.trigger_stats, **result.summary}
    training["skipped_updates"] = int(sum(result.summary.get("skipped_updates") or [0]))  # one run: a count
    if result.resumed_from is None:
        return training
    # the summary covers this session only: the run's totals come from its metric lines
    whole = whole_run_totals(out / "metrics.jsonl", result.t_total, current=result.summary.get("session"))
    training["this_session"] = {k: result.summary.get(k) for k in ("tokens", "train_s", "first_update_s")}
    if whole is not None:
        training.update(tokens=whole["tokens"], train_s=whole["train_s"] + result.summary["train_s"],
                        sessions=max(whole["sessions"], 1))
        training["tokens_per_s"] = whole["tokens"] / whole["train_s"] if whole["train_s"] > 0 else None
        training.pop("steady_tokens_per_s", None)
        if training.get("last") is None:
            training["last"] = _last_metrics(out / "metrics.jsonl")
    else:
        training["totals_note"] = ("metrics.jsonl does not cover every update: tokens and train_s are those of the "
                                   "last session only")
    return training


def _export(cfg: DebiasRun, out: Path, trainer: Trainer, params) -> Path:
    """Write the trained model as an HF folder (``OUT/model``; with adapters the merged model, and the adapters as a
    PEFT folder ``OUT/adapter``); returns the model folder."""
    model_out = out / "model"
    host = to_host(params)
    if cfg.adapter.enabled:  # the adapters as a PEFT folder, and the merged model as an HF folder
        save_adapter(host, trainer.config, out / "adapter", cfg.adapter.lora_spec(),
                     **adapter_base(cfg.model, trainer.model.folder))
    model_dir = save_pretrained(merge_adapters(host), trainer.config, model_out,
                                tokenizer_dir=trainer.model.tokenizer_folder(),
                                source_dir=trainer.model.folder)  # generation_config.json from the model
    if trainer.data.chat is not None and cfg.debias.chat_template is not None:
        # trained with --chat-template: the export reads as it was trained (chat_template.jinja wins over
        # the tokenizer_config.json entry, in transformers as in rbjax)
        atomic_write_text(model_out / "chat_template.jinja", trainer.data.chat.template.text)
    return model_dir


def _evaluate_trained(cfg: DebiasRun, out: Path, trainer: Trainer, params, model_dir: Path | None,
                      model_key: str | None, prev: dict | None, training: dict) -> dict:
    """:func:`evaluate_run` of the trained parameters; an interrupt says what is kept and how to go on.

    Raises:
        rbjax.core.interrupt.Interrupted: Ctrl-C / SIGTERM during the evaluation.
    """
    try:
        return evaluate_run(cfg, trainer, params, model_dir, model_key=model_key, previous=prev)
    except KeyboardInterrupt:
        kept = f" and exported to {model_dir}" if model_dir is not None else ""
        raise Interrupted(
            f"rbjax debias: interrupted during the evaluation. Training is finished ({training['updates']} updates, "
            f"final checkpoint in {out / 'checkpoints'}{kept}); the bias types already measured are kept in "
            f"{out / 'lmb_valid'}. Run the same rbjax debias command again: it reuses the training and those "
            "measurements and evaluates the rest.") from None


def _lmb_types(rec: dict) -> list[str]:
    """The bias types of a record's post-training LMB, in order."""
    return [r["bias_type"] for r in (rec.get("lmb_valid") or {}).get("all", [])]


def _nothing_new(cfg: DebiasRun, prev: dict, evals: dict, reused: dict) -> bool:
    """Whether this rerun of a finished run (of the same inputs and settings) reused everything: its training, the
    LMB of exactly the earlier types, and the LMP (on or off as before)."""
    new_types = _lmb_types(evals)
    return (reused["training"] and _lmb_types(prev) == new_types and set(reused.get("lmb_types", [])) == set(new_types)
            and reused.get("lmp", True) and bool(prev.get("lmp")) == bool(cfg.evaluation.lmp))


def _keep_earlier_evaluations(prev: dict, evals: dict, reused_training: bool) -> None:
    """Add to ``evals`` the finished run's LMB of the bias types not measured this time, when the weights are the
    same (training reused); says which types this rerun added."""
    old_types, new_types = _lmb_types(prev), _lmb_types(evals)
    added = [t for t in new_types if t not in old_types]
    if added:
        log.info(f"added the LMB of {', '.join(added)} to the finished run")
    if reused_training and evals.get("lmb_valid") and prev.get("lmb_valid"):
        # the same weights: keep the earlier evaluations of the types not measured this time
        evals["lmb_valid"]["all"] += [r for r in prev["lmb_valid"]["all"] if r["bias_type"] not in new_types]
