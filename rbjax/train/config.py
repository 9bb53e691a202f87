"""Settings of a training run, for any objective: the trainer's (:class:`TrainerConfig`: batches, schedule length,
precision, layout, checkpoints) and the optimiser's (:class:`OptimizerConfig`: learning rate, Adam, clip).

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
from rbjax.train.batching import LAYOUTS

__all__ = ["TrainerConfig", "OptimizerConfig", "LEFTOVERS"]

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
