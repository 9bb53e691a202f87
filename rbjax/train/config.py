"""Settings of a training run, for any objective: optimiser, schedule, batches, precision, layout, mesh, checkpoints.

:class:`TrainerConfig` is a frozen, JSON-serialisable dataclass whose fields carry their own help, choices and
command-line spelling (:func:`field`); a task's configuration extends it with its own fields
(:class:`rbjax.debias.config.TrainConfig`: method, bias type, λ, evaluation), and the CLI options of ``rbjax debias``
and ``rbjax sweep`` are generated from those fields (:func:`rbjax.commands.debias.add_training_arguments`), so every
default and help text is written once, here or in the task's class. Defaults are the paper's / the reference's
(§5.1, reference-debias.md §7): Adam 5e-5 (β 0.9/0.999, ε 1e-8), linear decay to 0 without warm-up, clip 1.0,
2 epochs, block size 36, seed 42.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from rbjax.core.config import check_types, field
from rbjax.core.errors import SettingError
from rbjax.core.mesh import mesh_product, parse_mesh
from rbjax.core.precision import PRECISIONS
from rbjax.train.batching import LAYOUTS

__all__ = ["TrainerConfig", "LEFTOVERS"]

#: what happens to the micro-batches left at an epoch's end (:func:`rbjax.train.batching.update_plan`)
LEFTOVERS = ("drop", "carry")


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """The settings of the trainer (:class:`rbjax.train.loop.Trainer`) that no objective reads (frozen,
    JSON-serialisable; stored with each run). Each field's ``metadata["help"]`` is its documentation.

    Raises:
        rbjax.core.errors.SettingError (a ValueError) naming the field: a value of the wrong type or out of range
        (the command line shows the flag instead, a study file its section and key).
    """

    model: str = field("microsoft/DialoGPT-small", "HF model folder (any supported family), hub id or finished run "
                                                   "folder to start from", metavar="MODEL")
    out_dir: str = field("runs/debias", "run folder (an unfinished run there is resumed; a finished one is reused)",
                         flag="--out", metavar="DIR")
    tokenizer: str | None = field(None, "tokenizer folder or hub id (default: the model folder)", metavar="PATH")
    seed: int = field(42, "data order and dropout (the reference: 42)")
    epochs: int = field(2, "passes over the training set (§5.1)")
    batch_size: int | None = field(None, "micro-batch size (default: 8; cda: 2, the reference's CDA run; the "
                                         "grid: 4, 8, 16)", grid=True, metavar="N")
    grad_accum: int = field(1, "micro-batches per update (the grid: 1, 5, 8)", grid=True)
    learning_rate: float = field(5e-5, "peak learning rate (linear decay to 0, no warm-up)", flag="--lr")
    adam_b1: float = field(0.9, "Adam β1")
    adam_b2: float = field(0.999, "Adam β2")
    adam_eps: float = field(1e-8, "Adam ε")
    max_grad_norm: float = field(1.0, "global gradient-norm clip")
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
    mesh: str | None = field(None, "device mesh, e.g. data=2,fsdp=4 or grid=2,fsdp=4 (axes grid, data, fsdp, "
                                   "tensor; sizes multiply to the device count; fsdp/tensor split parameters, "
                                   "gradients and Adam state; docs/scale.md). Default: grid × data chosen "
                                   "automatically, parameters replicated", metavar="AXIS=N,...")
    save_every: int = field(100, "checkpoint every N updates (also every --save-every-s seconds, on Ctrl-C/SIGTERM "
                                 "and at the end)")
    save_every_s: float = field(600.0, "checkpoint when this many seconds passed since the last one (0: off)")
    keep_checkpoints: int = field(2, "checkpoints kept on disk")
    progress: bool = field(True, "progress bars", negate="--no-progress")

    #: fields that determine the training trajectory; a resumed run must match them (with the content of the model,
    #: tokenizer and data: :meth:`rbjax.train.loop.Trainer.key`). A task's config adds its own.
    trajectory_fields = ("seed", "epochs", "batch_size", "grad_accum", "learning_rate", "adam_b1", "adam_b2",
                         "adam_eps", "max_grad_norm", "block_size", "max_steps", "leftover", "dropout", "precision",
                         "layout")
    #: micro-batch size when ``batch_size`` is not given
    default_batch_size = 8

    def __post_init__(self):
        check_types(self)
        if self.batch_size is None:
            object.__setattr__(self, "batch_size", self.default_batch_size)
        for name, allowed in (("precision", PRECISIONS), ("layout", LAYOUTS), ("leftover", (None, *LEFTOVERS))):
            if getattr(self, name) not in allowed:
                raise SettingError(name, f"must be one of {', '.join(a for a in allowed if a)}, "
                                         f"got {getattr(self, name)!r}")
        if self.mesh is not None:  # the syntax here; the device count when the mesh is built
            try:
                parse_mesh(self.mesh, mesh_product(self.mesh), flag="{name}")
            except ValueError as e:
                raise SettingError("mesh", str(e)) from None
        for name in ("epochs", "batch_size", "grad_accum", "save_every", "keep_checkpoints", "max_steps"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise SettingError(name, f"must be >= 1, got {v!r}")
        if self.block_size < 2:
            raise SettingError("block_size", f"must be >= 2, got {self.block_size}")
        for name in ("learning_rate", "max_grad_norm"):
            if not getattr(self, name) > 0:
                raise SettingError(name, f"must be > 0, got {getattr(self, name)}")
        for name in ("adam_eps", "save_every_s"):
            if getattr(self, name) < 0:
                raise SettingError(name, f"must be >= 0, got {getattr(self, name)}")
        for name in ("adam_b1", "adam_b2"):
            if not 0 <= getattr(self, name) < 1:
                raise SettingError(name, f"must be in [0, 1), got {getattr(self, name)}")

    @property
    def resolved_leftover(self) -> str:
        """``drop`` or ``carry`` (default ``drop``; a task's config may tie the default to its semantics)."""
        return self.leftover if self.leftover is not None else "drop"

    @property
    def loss_weights(self) -> tuple[float, float]:
        """The objective's two loss weights held in the train state (a task's config sets them, e.g. λ_LM and λ_D of
        the debiasing objective; an objective without weights ignores them)."""
        return 1.0, 0.0

    def describe(self) -> str:
        """A few words naming the run on its progress bar."""
        return "training"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def trajectory(self) -> dict[str, Any]:
        """The settings a resumed run must share with the checkpointed one."""
        d = {k: getattr(self, k) for k in self.trajectory_fields}
        d["leftover"] = self.resolved_leftover
        return d

    def replace(self, **kw):
        return dataclasses.replace(self, **kw)
