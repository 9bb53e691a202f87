"""Settings of a training run, for any objective: the trainer's (:class:`TrainerConfig`: batches, schedule length,
precision, layout, checkpoints), the optimiser's (:class:`OptimizerConfig`: learning rate, Adam, clip) and the
adapters' (:class:`AdapterConfig`: low-rank adapters on a frozen base, or none).

Frozen, JSON-serialisable dataclasses whose fields carry their own help, choices and command-line spelling
(:func:`rbjax.core.config.field`). A task's run settings hold them as sections (levanter's
``TrainLmConfig(trainer=…, optimizer=…)``): :class:`rbjax.debias.config.DebiasRun` and the dialog tasks'
:class:`rbjax.dialog.tasks.common.TrainingSettings`; their options are generated from the fields, so every default
and help text is written once, here or in the task's class. Defaults are the paper's / the reference's (§5.1,
docs/debiasing.md "Training"): Adam 5e-5 (β 0.9/0.999, ε 1e-8), linear decay to 0 without warm-up, clip 1.0,
2 epochs, block size 36, seed 42.

The trainer reads no model, tokenizer, output folder or mesh from here: the run's composition root
(:func:`rbjax.debias.run.debias_trainer`, :func:`rbjax.dialog.tasks.common.fine_tune`) opens the model, builds the
mesh and the optimiser (:func:`rbjax.train.optim.make_optimizer`) and hands them to
:class:`rbjax.train.loop.Trainer`.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from rbjax.core.config import check_types, field
from rbjax.core.errors import SettingError
from rbjax.core.precision import PRECISIONS
from rbjax.model.lora import LoraSpec
from rbjax.train.batching import LAYOUTS

__all__ = ["TrainerConfig", "OptimizerConfig", "AdapterConfig", "LEFTOVERS", "ADAPTERS", "BASE_DTYPES"]

#: what happens to the micro-batches left at an epoch's end (:func:`rbjax.train.batching.update_plan`)
LEFTOVERS = ("drop", "carry")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """The optimiser of every training run: global-norm clip, then Adam, with the learning rate decaying linearly to
    0 over the run without warm-up (paper §5.1; the reference's HF Trainer). Built by
    :func:`rbjax.train.optim.make_optimizer`.

    Raises:
        rbjax.core.errors.SettingError naming the field: a value of the wrong type or out of range.
    """

    learning_rate: float = field(5e-5, "peak learning rate (linear decay to 0, no warm-up)", flag="--lr")
    adam_b1: float = field(0.9, "Adam β1")
    adam_b2: float = field(0.999, "Adam β2")
    adam_eps: float = field(1e-8, "Adam ε")
    max_grad_norm: float = field(1.0, "global gradient-norm clip")

    def __post_init__(self):
        for name in ("learning_rate", "max_grad_norm"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0):
                raise SettingError(name, f"must be > 0, got {v!r}")
        check_types(self)
        if self.adam_eps < 0:
            raise SettingError("adam_eps", f"must be >= 0, got {self.adam_eps}")
        for name in ("adam_b1", "adam_b2"):
            if not 0 <= getattr(self, name) < 1:
                raise SettingError(name, f"must be in [0, 1), got {getattr(self, name)}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """The settings of the trainer (:class:`rbjax.train.loop.Trainer`) that no objective reads (frozen,
    JSON-serialisable; stored with each run). Each field's ``metadata["help"]`` is its documentation.

    ``batch_size`` and ``leftover`` may be ``None``: the task's default, which the task's run settings fill in
    (:class:`rbjax.debias.config.DebiasRun`: batch 2 for CDA, the reference's ``carry`` under reference semantics);
    the trainer refuses ``batch_size=None``.

    Raises:
        rbjax.core.errors.SettingError (a ValueError) naming the field: a value of the wrong type or out of range
        (the command line shows the flag instead, a study file its section and key).
    """

    seed: int = field(42, "data order and dropout (the reference: 42)")
    epochs: int = field(2, "passes over the training set (§5.1)")
    batch_size: int | None = field(None, "micro-batch size (default: the task's)", metavar="N")
    grad_accum: int = field(1, "micro-batches per update")
    block_size: int = field(36, "tokens kept per training phrase")
    max_steps: int | None = field(None, "stop after N updates (smoke runs; the schedule then decays over N, as HF)",
                                  metavar="N")
    leftover: str | None = field(None, "micro-batches left at an epoch's end when #batches is not a multiple of the "
                                       "accumulation: drop (paper default) or carry into the next epoch's first "
                                       "update (reference Trainer; reference default)", choices=LEFTOVERS)
    dropout: bool = field(True, "dropout 0.1 during training, as the reference", negate="--no-dropout")
    precision: str = field("fp32", "compute precision: fp32 (default) or bf16 (bf16 matmuls, fp32 parameters, "
                                   "optimizer state and losses; for accelerators)", choices=PRECISIONS)
    layout: str = field("packed", "token layout of a micro-batch: packed (default: its phrases side by side in a few "
                                  "rows, block-diagonal attention, positions restarting per phrase; no compute on "
                                  "padding; the same losses and updates) or padded (one block_size row per phrase, "
                                  "for comparison). DST in reference semantics is always padded (its pooling "
                                  "attends padding)", choices=LAYOUTS)
    save_every: int = field(100, "checkpoint every N updates (also every --save-every-s seconds, on Ctrl-C/SIGTERM "
                                 "and at the end)")
    save_every_s: float = field(600.0, "checkpoint when this many seconds passed since the last one (0: off)")
    keep_checkpoints: int = field(2, "checkpoints kept on disk")
    progress: bool = field(True, "progress bars on stderr", negate="--no-progress")

    #: fields that determine the training trajectory; a resumed run must match them (with the optimiser's settings,
    #: the objective and the content of the model, tokenizer and data: :meth:`rbjax.train.loop.Trainer.key`)
    trajectory_fields = ("seed", "epochs", "batch_size", "grad_accum", "block_size", "max_steps", "leftover",
                         "dropout", "precision", "layout")

    def __post_init__(self):
        check_types(self)
        for name, allowed in (("precision", PRECISIONS), ("layout", LAYOUTS), ("leftover", (None, *LEFTOVERS))):
            if getattr(self, name) not in allowed:
                raise SettingError(name, f"must be one of {', '.join(a for a in allowed if a)}, "
                                         f"got {getattr(self, name)!r}")
        for name in ("epochs", "batch_size", "grad_accum", "save_every", "keep_checkpoints", "max_steps"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise SettingError(name, f"must be >= 1, got {v!r}")
        if self.block_size < 2:
            raise SettingError("block_size", f"must be >= 2, got {self.block_size}")
        if self.save_every_s < 0:
            raise SettingError("save_every_s", f"must be >= 0, got {self.save_every_s}")

    @property
    def resolved_leftover(self) -> str:
        """``drop`` or ``carry`` (``drop`` when not set)."""
        return self.leftover if self.leftover is not None else "drop"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def trajectory(self) -> dict[str, Any]:
        """The settings a resumed run must share with the checkpointed one."""
        d = {k: getattr(self, k) for k in self.trajectory_fields}
        d["leftover"] = self.resolved_leftover
        return d

    def replace(self, **kw):
        return dataclasses.replace(self, **kw)


#: parameter-efficient fine-tuning methods (``none``: every weight is trained)
ADAPTERS = ("none", "lora")
#: storage dtypes of the frozen base model under adapters
BASE_DTYPES = ("fp32", "bf16")


@dataclasses.dataclass(frozen=True)
class AdapterConfig:
    """Low-rank adapters (LoRA, Hu et al. 2021; :mod:`rbjax.model.lora`): train two small matrices per adapted
    projection instead of every weight, the base model frozen (no gradient, no optimiser state; with
    ``param_dtype`` bf16 stored in half the memory). The ``adapter`` section of a training run's settings
    (:class:`rbjax.debias.config.DebiasRun`, the dialog tasks'); docs/debiasing.md "Adapters". Defaults: rank 8,
    α 16, no adapter dropout (PEFT's default; a rate > 0 draws a mask per adapted layer and update, which costs as
    much as the rest of a LoRA update on a CPU: benchmarks/RESULTS.md), every linear layer (PEFT's ``all-linear``).

    Raises:
        rbjax.core.errors.SettingError naming the field: a value out of range, or an adapter setting given without
        ``adapter = "lora"`` (it would have no effect).
    """

    adapter: str = field("none", "none: fine-tune every weight (the paper); lora: train low-rank adapters on a frozen "
                                 "base model (every method, the dialog fine-tuning, a sweep's grid on one base)",
                         choices=ADAPTERS)
    lora_rank: int = field(8, "LoRA rank r")
    lora_alpha: float = field(16.0, "LoRA α: the adapter's update is scaled by α/r (α/√r with --lora-rslora)")
    lora_dropout: float = field(0.0, "dropout rate of the adapter's input during training (PEFT's lora_dropout; "
                                     "default 0, PEFT's)")
    lora_targets: str = field("all-linear", "adapted layers: all-linear (every attention and MLP projection, not "
                                            "the LM head), attention, mlp, or the family's module names, comma "
                                            "separated (gpt2: c_attn, attn.c_proj, c_fc, mlp.c_proj; llama, "
                                            "mistral, qwen2, gemma2: q_proj, k_proj, v_proj, o_proj, gate_proj, "
                                            "up_proj, down_proj; gpt_neox: query_key_value, dense, dense_h_to_4h, "
                                            "dense_4h_to_h)", metavar="NAMES")
    lora_rslora: bool = field(False, "rsLoRA: scale by α/√r instead of α/r")
    param_dtype: str = field("fp32", "storage of the frozen base model under adapters: bf16 halves its memory "
                                     "(adapters and their optimizer state stay fp32)", choices=BASE_DTYPES)

    def __post_init__(self):
        check_types(self)
        for name, allowed in (("adapter", ADAPTERS), ("param_dtype", BASE_DTYPES)):
            if getattr(self, name) not in allowed:
                raise SettingError(name, f"must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.lora_rank < 1:
            raise SettingError("lora_rank", f"must be >= 1, got {self.lora_rank}")
        if not self.lora_alpha > 0:
            raise SettingError("lora_alpha", f"must be > 0, got {self.lora_alpha}")
        if not 0 <= self.lora_dropout < 1:
            raise SettingError("lora_dropout", f"must be in [0, 1), got {self.lora_dropout}")
        if not [t for t in self.lora_targets.split(",") if t.strip()]:
            raise SettingError("lora_targets", "is empty")
        if self.adapter == "none":
            changed = [f.name for f in dataclasses.fields(self) if f.name != "adapter"
                       and getattr(self, f.name) != f.default]
            if changed:
                raise SettingError(changed[0], "has no effect without adapter lora (--adapter lora)")

    @property
    def enabled(self) -> bool:
        return self.adapter != "none"

    def lora_spec(self) -> LoraSpec:
        """The adapter of these settings (:class:`rbjax.model.lora.LoraSpec`)."""
        return LoraSpec(rank=self.lora_rank, alpha=float(self.lora_alpha), dropout=float(self.lora_dropout),
                        targets=self.lora_targets, rslora=self.lora_rslora)

    def describe(self) -> dict[str, Any] | None:
        """The settings that define the adapters (a run's key and records); ``None`` without adapters."""
        return None if not self.enabled else dataclasses.asdict(self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
