"""What the dialog-quality tasks share: the settings base classes, the task record, the model under evaluation, the
keyed result files and the fine-tuning adapter over the shared trainer.

**Settings.** Each task's settings are a frozen dataclass (:class:`TaskSettings`; the tasks' own are
:class:`rbjax.dialog.tasks.lmp.LMPSettings`, :class:`~rbjax.dialog.tasks.dst.DSTSettings` and
:class:`~rbjax.dialog.tasks.crg.CRGSettings`) whose fields carry their default, help, choices and command-line
spelling (:func:`rbjax.core.config.field`): ``rbjax evaluate`` generates its options from them, the study checks
its ``[dialog]`` tables with them, and each default is written once. ``None`` given for a setting means the task's
default (:meth:`TaskSettings.from_settings`).

**Result files.** ``OUT/<task>.json`` carries a ``key``: the content digest of the model and tokenizer files, of
every data file read, and the settings that shape the numbers (:meth:`TaskSettings.key_settings`: not the ones that
name files — their content is keyed instead — nor ``progress`` and ``keep_checkpoints``). A rerun with the same key
returns the stored result; another key is refused unless ``overwrite`` (:class:`rbjax.core.reuse.KeyedResult`).
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import time
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from rbjax.core.config import check_types, field, from_flat, leaves, option_name, section, to_flat
from rbjax.core.digests import file_digest
from rbjax.core.errors import SettingError
from rbjax.core.interrupt import interruptible
from rbjax.core.io import versions
from rbjax.core.keys import canonical
from rbjax.core.log import get_logger
from rbjax.core.mesh import make_mesh, mesh_product, parse_mesh, run_mesh
from rbjax.core.reuse import KeyedResult
from rbjax.model.chat import FORMATS, ChatTurns
from rbjax.model.chat_template import load_chat_template
from rbjax.model.handle import ModelHandle
from rbjax.model.lora import add_adapters
from rbjax.model.memory import DEVICE_MEMORY_HELP, plan_for_model
from rbjax.train.config import AdapterConfig, OptimizerConfig, TrainerConfig
from rbjax.train.loop import Trainer, TrainPoint
from rbjax.train.optim import make_optimizer

__all__ = [
    "RESULT_FORMAT",
    "SEMANTICS",
    "EvalModel",
    "Task",
    "TaskSettings",
    "TrainingSettings",
    "check_memory",
    "drop_checkpoints",
    "existing_result",
    "file_record",
    "fine_tune",
    "finish",
    "memory_plans",
    "resolve_model",
    "result_key",
    "result_path",
    "task_mesh",
    "training_layout",
]

#: bumped when the result files change incompatibly (older files are then recomputed, not reused)
RESULT_FORMAT = 1
SEMANTICS = ("paper", "reference")


log = get_logger("evaluate")


# ------------------------------------------------------------------------------------------------ settings
@dataclasses.dataclass(frozen=True)
class TaskSettings:
    """The settings every task takes (frozen, JSON-serialisable). A task's class adds its own fields.

    Class attributes (not fields): ``path_fields``, the fields that name files or folders (stored as strings, a
    tuple-typed one such as ``refs`` as a tuple of strings; a path that was given must exist — never replaced by a
    download — and its *content* enters the key, not the path); ``no_key_fields``, the fields that do not change a
    result; ``signed_fields``, the integer fields that may take any value (every other integer field is a count,
    >= 1); ``path_options``, ``(field, option)`` pairs: the option named when a given path does not exist, where it
    is not the field's own. The help of a field switched off by ``--no-...`` (``negate``) describes the setting when
    on; the switch's help is generated from it (:func:`rbjax.commands.options.negated_help`).

    Raises:
        rbjax.core.errors.SettingError (a ValueError) naming the field: a value of the wrong type or out of range (the
        command line shows the flag instead, a study file its section and key). FileNotFoundError: a path that was
        given does not exist (named by its option).
    """

    progress: bool = field(True, "progress bars on stderr", negate="--no-progress")
    keep_checkpoints: bool = field(False, "keep the fine-tuned model's checkpoints in OUT/<task>_train/checkpoints "
                                          "after the result is written (default: deleted then); with them a rerun "
                                          "that changes only evaluation settings (e.g. adds --joint-goal) restores "
                                          "the trained model instead of training again")
    mesh: str | None = field(None, "device mesh, e.g. data=2,fsdp=4 or fsdp=4,tensor=2 (axes data, fsdp, tensor; "
                                   "sizes multiply to the device count; docs/scale.md): fsdp/tensor split the "
                                   "parameters (and the fine-tuning's gradients and Adam state), data×fsdp the rows "
                                   "of scoring, training and generation batches. Default: parameters replicated. "
                                   "Recorded in the result, not in its key (a mesh changes the float32 rounding "
                                   "only)", metavar="AXIS=N,...")
    device_memory_gb: float | None = field(None, DEVICE_MEMORY_HELP, metavar="GB")

    format: str = field("raw", "raw: a dialog as bare text (DialoGPT's format, the paper); chat: crg renders each "
                               "context through the model's chat template, user and assistant turns alternating, "
                               "the model answering as the assistant (docs/chat.md, \"Dialog in chat format\"); lmp "
                               "and dst have no chat format and refuse it", choices=FORMATS)
    system: str | None = field(None, "chat format: a system prompt before the dialog", metavar="TEXT")
    chat_template: str | None = field(None, "chat format: a Jinja chat template file (.jinja, or .json with a "
                                            "chat_template entry) instead of the tokenizer's own; its content enters "
                                            "the result's key", metavar="FILE")

    path_fields = ()
    no_key_fields = ("progress", "keep_checkpoints", "mesh", "device_memory_gb")
    #: why the task has no chat format (``None``: it has one)
    chat_refusal = "it has no chat format"
    CHAT_FIELDS = ("format", "system", "chat_template")
    signed_fields = ("seed",)
    path_options = ()

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The task's setting names, in declaration order (a training task's trainer and optimiser settings by their
        flat names, :func:`rbjax.core.config.leaves`)."""
        return tuple(leaf.name for leaf in leaves(cls))

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]):
        """The task's settings from a mapping that may hold other tasks' settings too: the keys this task does not
        take are ignored, and a ``None`` value means the default.

        Raises:
            SettingError, FileNotFoundError: see the class.
        """
        names = set(cls.names())
        return from_flat(cls, {k: v for k, v in settings.items() if k in names and v is not None})

    def to_dict(self) -> dict[str, Any]:
        """The settings by flat name (what results record)."""
        return to_flat(self)

    def key_settings(self) -> dict[str, Any]:
        """The settings that shape the numbers (enter the result's key); the chat-format settings only in the chat
        format (a raw-format key is what it was before they existed)."""
        d = {k: v for k, v in self.to_dict().items() if k not in self.no_key_fields and k not in self.path_fields}
        if self.format == "raw":
            for name in self.CHAT_FIELDS:
                d.pop(name, None)
        return d

    @property
    def is_chat(self) -> bool:
        return self.format == "chat"

    def chat_turns(self, tokenizer) -> ChatTurns | None:
        """The dialogs' :class:`rbjax.model.chat.ChatTurns` (the model as the assistant, its end-of-turn token part
        of a response), or ``None`` in the raw format.

        Raises:
            rbjax.model.chat_template.NoChatTemplateError, FileNotFoundError, ChatTemplateError: no template, a bad
                ``chat_template`` file, a template that refuses a system prompt.
            rbjax.model.chat.ChatError: a template that writes no end-of-turn token after the assistant's reply.
        """
        if not self.is_chat:
            return None
        template = load_chat_template(tokenizer.source, override=self.chat_template)
        # (prompt: the reply's shape, a user turn before the assistant's, as every dialog here has: the template is
        # checked and keyed on it — Gemma's refuses an assistant turn first)
        return ChatTurns(tokenizer, template, role="assistant", system=self.system, prompt="",
                         score_end_of_turn=True)

    def __post_init__(self):
        hints = typing.get_type_hints(type(self))
        for name in self.path_fields:  # paths as strings (their content is keyed, not their type)
            v = getattr(self, name)
            if v is None:
                continue
            if _is_tuple(hints[name]):  # several paths (one may be given alone)
                v = tuple(str(p) for p in ([v] if isinstance(v, (str, os.PathLike)) else v))
            else:
                v = str(v)
            object.__setattr__(self, name, v)
        self._check()
        check_types(self)
        for name in sorted(self.path_fields):  # a path that was given must exist: never fall back to a download
            v = getattr(self, name)
            for p in ([] if v is None else (v if isinstance(v, tuple) else [v])):
                if not Path(p).expanduser().exists():
                    raise FileNotFoundError(f"{self.option(name)} {p}: not found")

    def _check(self) -> None:
        """Value ranges (a subclass adds its own and calls this): every integer field not in ``signed_fields`` is a
        count (>= 1; ``None`` where the type allows it)."""
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            if f.name in self.signed_fields or int not in (hints[f.name], *typing.get_args(hints[f.name])):
                continue
            v = getattr(self, f.name)
            if v is None and type(None) in typing.get_args(hints[f.name]):
                continue
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise SettingError(f.name, f"must be a positive integer, got {v!r}")
        if self.format not in FORMATS:
            raise SettingError("format", f"must be raw or chat, got {self.format!r}")
        for name in ("system", "chat_template"):
            if self.format == "raw" and getattr(self, name) is not None:
                raise SettingError(name, "has no effect with the raw format; add --format chat")
        if self.system is not None and not str(self.system).strip():
            raise SettingError("system", "is empty; leave it out instead")
        if self.is_chat and self.chat_refusal is not None:
            raise SettingError("format", f"chat: {self.chat_refusal}; rbjax evaluate --task crg --format chat "
                                         "generates responses in chat format")
        v = self.device_memory_gb
        if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0):
            raise SettingError("device_memory_gb", f"must be > 0, got {v!r}")
        if self.mesh is not None:  # the syntax here; the device count when the mesh is built (task_mesh)
            try:
                sizes = parse_mesh(str(self.mesh), mesh_product(str(self.mesh)), flag="{name}")
            except ValueError as e:
                raise SettingError("mesh", str(e)) from None
            if sizes is not None and sizes["grid"] > 1:
                raise SettingError("mesh", f"{self.mesh!r}: a dialog task runs one model, it has no grid points to "
                                           "spread; use data, fsdp and tensor")

    @classmethod
    def option(cls, name: str) -> str:
        """The command-line option of a setting (for messages)."""
        return dict(cls.path_options).get(name) or option_name(cls, name)


def _is_tuple(hint) -> bool:
    return any(typing.get_origin(a) is tuple for a in (hint, *typing.get_args(hint)))


def data_dir_field():
    """``data_dir``: the RedditBias data folder (LMP and CRG)."""
    return field(None, "RedditBias data folder: the LMP file text_files/humanref6k.txt and the offline DSTC-7 test "
                       "contexts data/dstc7/response_hyp.txt (default: $RBJAX_DATA_DIR, else the verified download "
                       "cache)", metavar="DIR")


def eval_batch_size_field():
    """``eval_batch_size``: rows per scoring batch (LMP and DST)."""
    return field(64, "rows per scoring batch of LMP lines and DST pairs")


#: the trainer's settings a fine-tuning task takes (options of ``rbjax evaluate``, keys of a study's ``[dialog]``
#: tables); the task sets the others (seed, progress, mesh, checkpoints) from its own
TRAINER_SETTINGS = ("epochs", "batch_size", "grad_accum", "block_size", "max_steps", "dropout", "layout")


def trainer_section(**defaults):
    """The ``trainer`` section of a fine-tuning task: :class:`rbjax.train.config.TrainerConfig` with the task's
    defaults (the reference's: 1 epoch, block 128, and the task's batch size and accumulation), its
    :data:`TRAINER_SETTINGS` exposed."""
    return section(TrainerConfig, expose=TRAINER_SETTINGS, helps=TRAINER_HELPS,
                   **{"epochs": 1, "block_size": 128, "keep_checkpoints": 1, **defaults})


#: the trainer settings' help in the dialog tasks (what they mean there)
TRAINER_HELPS = {"epochs": "training epochs", "batch_size": "training micro-batch", "block_size":
                 "tokens kept per training example", "max_steps": "stop training after N updates (quick runs)",
                 "dropout": "dropout 0.1 during fine-tuning, as the reference",
                 "layout": "token layout of the training micro-batches: packed (default: examples side by side in a "
                           "few rows, no compute on padding, the same loss) or padded (one block_size row per "
                           "example, for comparison); DST in reference semantics is always padded"}


@dataclasses.dataclass(frozen=True)
class TrainingSettings(TaskSettings):
    """The settings of a task that fine-tunes the model with the shared trainer (DST, CRG): its own (examples,
    seed, semantics) and three sections, ``trainer`` (:class:`rbjax.train.config.TrainerConfig`, declared by each
    task with its defaults through :func:`trainer_section`), ``optimizer`` (:class:`rbjax.train.config.OptimizerConfig`:
    the learning rate) and ``adapter`` (:class:`rbjax.train.config.AdapterConfig`: low-rank adapters on the frozen
    model, or every weight fine-tuned)."""

    max_examples: int | None = field(None, "use only the first N examples: dst — of the train and of the test pairs; "
                                           "crg — of the test contexts (quick runs; recorded in the result)",
                                     metavar="N")
    seed: int = field(42, "seed of the DST negatives, classifier head, data order and dropout, and of CRG sampling, "
                          "as in the reference code")
    semantics: str = field("paper", "paper (default): rbjax's corrected semantics; reference: reproduce the official "
                                    "scripts (DST negatives with the slot-remap bug, pooling the last padded column, "
                                    "start-of-text truncation; CRG prompts and top-k 50 + top-p 0.95 sampling, 128 "
                                    "tokens with the prompt)", choices=SEMANTICS)
    optimizer: OptimizerConfig = section(OptimizerConfig, expose=("learning_rate",),
                                         helps={"learning_rate": "peak learning rate, linear decay"})
    adapter: AdapterConfig = section(AdapterConfig)

    def key_settings(self) -> dict[str, Any]:
        """As :meth:`TaskSettings.key_settings`; the adapter settings only when adapters are on (the keys of
        fine-tuning every weight are those they were before adapters existed)."""
        d = super().key_settings()
        if not self.adapter.enabled:
            for name in AdapterConfig.__dataclass_fields__:
                d.pop(name, None)
        return d

    def training_plan(self) -> dict:
        """The memory plan's keywords of the fine-tuning (:func:`rbjax.model.memory.plan_for_model`), adapters
        included."""
        t, a = self.trainer, self.adapter
        return {"training": True, "batch_size": t.batch_size, "seq_len": t.block_size, "grad_accum": t.grad_accum,
                **({"adapter": a.lora_spec(), "param_dtype": a.param_dtype} if a.enabled else {})}

    def _check(self) -> None:
        if self.semantics not in SEMANTICS:
            raise SettingError("semantics", f"must be one of {SEMANTICS}, got {self.semantics!r}")
        super()._check()
        if self.is_chat and self.semantics == "reference":
            raise SettingError("semantics", "reference reproduces the official scripts on DialoGPT's bare text; the "
                                            "chat format runs with --semantics paper")


# ------------------------------------------------------------------------------------------------ the task record
@dataclasses.dataclass(frozen=True)
class Task:
    """One dialog-quality task: its name, settings class and runner ``run(model, out_dir, settings, *,
    overwrite=False) -> result``, a help line, the files it writes into ``OUT`` (the result first) and
    ``plans(settings) -> [plan_for_model keywords, ...]``, its computations for the memory plan
    (:func:`memory_plans`)."""

    name: str
    settings: type[TaskSettings]
    run: Callable[..., dict]
    help: str
    outputs: tuple[str, ...]
    plans: Callable[[TaskSettings], list[dict]]


# ------------------------------------------------------------------------------------------------ model
#: the model under evaluation: :class:`rbjax.model.handle.ModelHandle` (its location, content digests, and weights
#: loaded once on demand)
EvalModel = ModelHandle


def resolve_model(model: str | os.PathLike, tokenizer: str | os.PathLike | None = None) -> ModelHandle:
    """Where the model to evaluate is: an HF folder, a hub id (downloaded into the HF cache), or a finished
    ``rbjax debias`` run folder (then its ``model/`` subfolder) — :meth:`rbjax.model.handle.ModelHandle.open`.

    Raises:
        FileNotFoundError: no such folder (and not a hub id).
        ValueError: a run folder without an exported model (unfinished run, or made with ``--no-export``), or one
            whose ``results.json`` says it did not finish.
        RuntimeError: a hub id that cannot be downloaded.
    """
    return ModelHandle.open(model, tokenizer)


def task_mesh(s: TaskSettings):
    """The device mesh of the ``mesh`` setting (:func:`rbjax.core.mesh.make_mesh`), or ``None`` (the default layout).

    Raises:
        ValueError: the sizes do not fit this machine's device count (named ``--mesh``).
    """
    sizes = parse_mesh(s.mesh, jax.device_count())
    return None if sizes is None else make_mesh(sizes)


def memory_plans(model: EvalModel, s: TaskSettings, plans: list[dict], *, dry_run: bool = False) -> list:
    """The memory plans (:func:`rbjax.model.memory.plan_for_model`, from the model folder's ``config.json``: no
    weights are read) of a task's computations on its mesh. ``plans``: one ``plan_for_model`` keyword dict per
    computation (the task module's ``memory_plans``). A model held only in memory has none. ``dry_run``: the mesh
    may name more devices than this machine has (a plan for a cluster).

    Raises:
        FileNotFoundError: no ``config.json``. ValueError: a mesh that does not fit the devices.
    """
    handle = model
    if handle.hub_id is None and handle.folder is None:  # a model held only in memory
        return []
    n = mesh_product(s.mesh) if dry_run and s.mesh else None
    return [plan_for_model(handle, mesh=s.mesh, device_memory_gb=s.device_memory_gb, n_devices=n, **kw)
            for kw in plans]


def check_memory(model: EvalModel, s: TaskSettings, plans: list[dict]) -> None:
    """:func:`memory_plans`, checked before the weights are loaded.

    Raises:
        rbjax.model.memory.PlanError: a plan that does not fit the devices' memory (names the largest part and a mesh
            or batch that would fit).
    """
    for plan in memory_plans(model, s, plans):
        plan.check()


# ------------------------------------------------------------------------------------------------ results
def result_path(out_dir: Path, task: str) -> Path:
    return out_dir / f"{task}.json"


def existing_result(path: Path, key: dict, task: str, overwrite: bool, check=None) -> dict | None:
    """The existing result at ``path`` when its key equals ``key`` (and ``check(prev)`` passes), else ``None``
    (and the reason for recomputing is printed): :class:`rbjax.core.reuse.KeyedResult`.

    Raises:
        rbjax.core.reuse.OutputExists: ``path`` holds the result of other inputs (or its outputs were changed) and
            not ``overwrite``: it is never replaced silently (nothing was computed).
    """
    return KeyedResult(path, key, task, log.info, check, refuse_other=not overwrite).stored()


def result_key(task: str, model: EvalModel, data: dict, s: TaskSettings) -> dict:
    return canonical({"task": task, "format": RESULT_FORMAT, "model": model.digest,
                      "tokenizer": model.tokenizer_digest, "data": data, "settings": s.key_settings()})


def finish(task: str, out_dir: Path, key: dict, model: EvalModel, s: TaskSettings, overwrite: bool, body: dict,
            t0: float) -> dict:
    v = body.pop("versions", None) or versions()
    res = {"task": task, "format": RESULT_FORMAT, "model": model.describe(), **body,
           "settings": canonical({**s.to_dict(), "overwrite": overwrite}), "versions": v}
    res.setdefault("timings", {})["total_s"] = time.perf_counter() - t0
    return KeyedResult(result_path(out_dir, task), key, task).save(res)


def file_record(path: Path) -> dict:

    return {"path": str(Path(path).resolve()), "sha256": file_digest(path)}


# ------------------------------------------------------------------------------------------------ training
def training_layout(method: str, s: TrainingSettings | Mapping[str, Any]) -> str:
    """The token layout a fine-tuning task trains in: the ``layout`` setting, except ``padded`` for DST in
    reference semantics, whose pooling (the batch's longest row's last column, padding attended:
    ``lm_dst_binary.py``) depends on the padding. ``s``: the task's settings (or a mapping with ``semantics`` and
    ``layout``)."""
    semantics, layout = (s["semantics"], s["layout"]) if isinstance(s, Mapping) else (s.semantics, s.trainer.layout)
    return "padded" if (method == "dst" and semantics == "reference") else layout


def fine_tune(method: str, objective, model: EvalModel, out_dir: Path, s: TrainingSettings, params, data, *, what: str,
              after=()):
    """Fine-tune with the shared trainer in ``OUT/<method>_train`` (checkpoints, resume, Ctrl-C saves): the task's
    composition root — the model handle it was given, the task's mesh built once, the optimiser of its settings.

    A training folder left by other inputs is cleared first (its ``key.json``, the trainer's key as a keyed record,
    :class:`rbjax.core.reuse.KeyedResult`, differs, is missing or unreadable). Unless ``keep_checkpoints``,
    the checkpoints are deleted after the task's result is written (``metrics.jsonl`` stays).

    ``after``: the programs of the task's evaluation, compiled with the training programs before the first update
    (:meth:`rbjax.train.loop.Trainer.run`).

    Returns:
        ``(params, record, train_dir)``.
    """

    train_dir = out_dir / f"{method}_train"
    cfg = s.trainer.replace(seed=s.seed, layout=training_layout(method, s), progress=s.progress,
                            leftover="carry" if s.semantics == "reference" else "drop")
    mesh = run_mesh(s.mesh, batch_size=cfg.batch_size)
    point = TrainPoint({}, s.optimizer.learning_rate)
    key_extra = {"task": method}
    if s.adapter.enabled:  # low-rank adapters on the frozen model (DST: and its classifier head)
        params = add_adapters(params, model.config, s.adapter.lora_spec(), s.seed,
                              base_dtype=jnp.bfloat16 if s.adapter.param_dtype == "bf16" else None)
        key_extra["adapter"] = s.adapter.describe()
    try:
        trainer = Trainer(cfg, model, objective, make_optimizer(s.optimizer), data, mesh=mesh, points=point,
                          params=params, key_extra=key_extra)
    except ValueError as e:
        if "fewer than grad_accum" in str(e):
            raise ValueError(f"{what}: {data.n_examples} training examples make {-(-data.n_examples // cfg.batch_size)}"
                             f" micro-batch(es) of {cfg.batch_size}, fewer than grad_accum={cfg.grad_accum}: no update "
                             "would happen; raise --max-examples or lower --batch-size / --grad-accum") from None
        raise
    # the inputs of the training state in the folder, a keyed record (the one reuse rule): a folder without the
    # record of these inputs is cleared
    inputs = KeyedResult(train_dir / "key.json", trainer.key(), f"{method} training state")
    if train_dir.exists() and inputs.stored() is None:
        if (train_dir / "checkpoints").exists():
            log.info(f"{train_dir}: training state of other inputs ({inputs.reason or 'no key.json'}); starting "
                     "afresh")
        shutil.rmtree(train_dir)
    inputs.save({})
    t0 = time.perf_counter()
    res = trainer.run(train_dir, description=f"{method} fine-tuning", after=after)
    summary = {k: v for k, v in res.summary.items() if k != "last"}
    record = {"updates": res.updates_done, "t_total": res.t_total, "resumed_from": res.resumed_from,
              "n_examples": data.n_examples, "batch_size": cfg.batch_size, "grad_accum": cfg.grad_accum,
              "epochs": cfg.epochs, "learning_rate": s.optimizer.learning_rate, "max_steps": cfg.max_steps,
              "final_loss": (res.summary.get("last") or {}).get("total"), "last": res.summary.get("last"),
              "seconds": time.perf_counter() - t0, "folder": str(train_dir),
              "data_sha256": data.info.get("sha256_arrays"), **summary}
    return res.params, record, train_dir


def drop_checkpoints(train_dir: Path | None, s: TaskSettings) -> None:
    if train_dir is not None and not s.keep_checkpoints and (train_dir / "checkpoints").exists():
        shutil.rmtree(train_dir / "checkpoints")


def evaluation_phase(task: str, what: str, out_dir: Path, training: dict | None = None):
    """:func:`rbjax.core.interrupt.interruptible` for a task's evaluation (``what``: "the test pairs", "generation"
    …): SIGINT/SIGTERM stops it after the batch in flight, and the message says what is kept — the training, when
    the task trained (its final checkpoint, which the same command reuses), and ``OUT/<task>.json`` is not written
    (the evaluation itself is done again)."""

    def message(sig: str) -> str:
        kept = ""
        if training is not None:
            ckpt = Path(training["folder"]) / "checkpoints"
            kept = (f" The training is finished and kept ({training['updates']}/{training['t_total']} updates, "
                    f"checkpoint in {ckpt}); the same command reuses it.")
        return (f"rbjax evaluate: {sig} — {task} stopped during {what}; {result_path(out_dir, task).name} was not "
                f"written (the next run does this part again).{kept} Run the same command again.")

    return interruptible(message)
