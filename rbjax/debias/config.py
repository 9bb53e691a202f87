"""Configuration of a debiasing run (paper §4, §5.1; reference-debias.md §7).

:class:`TrainConfig` is a frozen, JSON-serialisable dataclass: everything that defines one run. Its fields are also
the command-line options of ``rbjax debias`` and ``rbjax sweep`` (built from the dataclass by
:func:`rbjax.commands.debias.add_training_arguments`, so the help and the defaults live here, in the field
metadata, and nowhere else).
"""
from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

from rbjax.core.errors import SettingError
from rbjax.core.mesh import mesh_product, parse_mesh
from rbjax.core.precision import PRECISIONS
from rbjax.lmb import SCORING_BATCH_HELP
from rbjax.specs import canonical_bias_type, is_spec_path, load_spec

__all__ = ["METHODS", "LOSS_METHODS", "LAYOUTS", "TRAJECTORY_FIELDS", "TrainConfig", "resolve_bias_type",
           "bias_spec", "option_name"]

#: debiasing methods (``lm``: plain LM fine-tuning on the training phrases, a control / benchmark baseline)
METHODS = ("lmd", "add", "hd", "cda", "lm")
LOSS_METHODS = ("lmd", "add", "hd")
#: fine-tuning tasks of the dialog checks (paper §3.2) that reuse the same trainer: ``dst`` (binary slot-value
#: classifier, BCE on a linear head) and ``crg`` (causal LM loss on the response tokens only)
TASKS = ("dst", "crg")
SEMANTICS = ("paper", "reference")
#: token layouts of a micro-batch (:class:`rbjax.debias.data.BatchPlan`): ``packed`` (the examples' tokens side by
#: side in a few rows, no update computes on padding) or ``padded`` (one row of ``block_size`` per example)
LAYOUTS = ("packed", "padded")

#: fields of :class:`TrainConfig` that determine the training trajectory; a resumed run must match them (together
#: with the content of the model, tokenizer, data and bias specification: see :mod:`rbjax.debias.loop`)
TRAJECTORY_FIELDS = (
    "method", "bias_type", "train_file", "semantics", "seed", "epochs", "batch_size", "grad_accum",
    "learning_rate", "adam_b1", "adam_b2", "adam_eps", "max_grad_norm", "block_size", "lambda_lm", "lambda_d",
    "max_steps", "leftover", "dropout", "precision", "layout",
)


def _f(default, help: str, *, flag: str | None = None, negate: str | None = None,  # noqa: A002
       choices: tuple | None = None, metavar: str | None = None, grid: bool = False):
    """A config field whose help, choices and command-line spelling live with it (the CLI is generated from these
    fields by :func:`rbjax.commands.debias.add_training_arguments`).

    ``flag``: the option's name when it is not ``--<field-name>``; ``negate``: a boolean switched off by
    ``--no-<name>`` (e.g. ``--no-dropout``); ``grid``: a hyper-parameter of the paper's grid (``rbjax sweep`` takes
    lists of values instead).
    """
    if metavar is None and choices is None and negate is None:
        metavar = {int: "N", float: "X", str: "TEXT"}.get(type(default), "VALUE")
    return dataclasses.field(default=default, metadata={"help": help, "flag": flag, "negate": negate,
                                                        "choices": choices, "metavar": metavar, "grid": grid})


def option_name(field_name: str) -> str:
    """The command-line option of a :class:`TrainConfig` field (``learning_rate`` → ``--lr``, ``dropout`` →
    ``--no-dropout``, ``epochs`` → ``--epochs``)."""
    md = {f.name: f.metadata for f in dataclasses.fields(TrainConfig)}[field_name]
    return md["negate"] or md["flag"] or "--" + field_name.replace("_", "-")


def _check_types(cfg) -> None:
    """Each field holds a value of its declared type (ints not bools, finite floats, strings), else
    :class:`SettingError` naming the field."""
    for name, hint in typing.get_type_hints(type(cfg)).items():
        v = getattr(cfg, name)
        args = typing.get_args(hint)
        if v is None and type(None) in args:
            continue
        base = next((a for a in args if a is not type(None)), hint)
        if base is bool:
            ok, words = isinstance(v, bool), "true or false"
        elif base is int:
            ok, words = isinstance(v, int) and not isinstance(v, bool), "an integer"
        elif base is float:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            words = "a finite number"
        elif base is str:
            ok, words = isinstance(v, str), "a string"
        else:
            continue
        if not ok:
            raise SettingError(name, f"must be {words}, got {v!r}")


def resolve_bias_type(name: str) -> str:
    """Canonical name of a packaged bias type, or a user bias-specification file (returned as given).

    Raises:
        ValueError: unknown bias type or invalid spec file. FileNotFoundError: a spec path that does not exist.
    """

    if is_spec_path(name):
        load_spec(name)  # fail early on a bad spec file
        return str(name)
    return canonical_bias_type(name)


def bias_spec(bias_type: str):
    """The :class:`rbjax.specs.BiasSpec` of a packaged type or a spec file."""

    return load_spec(bias_type)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything that defines one debiasing run (frozen, JSON-serialisable; stored in ``OUT/config.json``).

    Defaults are the paper's / the reference's (§5.1, reference-debias.md §7): Adam 5e-5 (β 0.9/0.999, ε 1e-8),
    linear decay to 0 without warm-up, clip 1.0, 2 epochs, block size 36, seed 42. Each field's ``metadata["help"]``
    is its documentation (shown by ``rbjax debias --help``).
    """

    method: str = _f("hd", "lmd: equalising loss (§4.1); add: attribute distance (§4.2); hd: hard debiasing (§4.3); "
                           "cda: counterfactual data augmentation (§4.4); lm: plain LM fine-tuning (control)",
                     choices=METHODS)
    bias_type: str = _f("religion1", "bias type: religion1, religion2, race, gender, queerness (orientation), or a "
                                     "bias-specification JSON file of your own (with --data-dir holding its "
                                     "text_files/<name>/<name>_bias_manual_train.txt, as `rbjax splits` writes)",
                        flag="--bias", metavar="TYPE")
    model: str = _f("microsoft/DialoGPT-small", "HF model folder (any supported family), hub id or finished run folder to start from", metavar="MODEL")
    out_dir: str = _f("runs/debias", "run folder (an unfinished run there is resumed; a finished one is reused)",
                      flag="--out", metavar="DIR")
    tokenizer: str | None = _f(None, "tokenizer folder or hub id (default: the model folder)", metavar="PATH")
    data_dir: str | None = _f(None, "RedditBias data folder (default: $RBJAX_DATA_DIR, else download and cache)",
                              metavar="DIR")
    train_file: str | None = _f(None, "train on this text file (one phrase a line) instead of the bias type's "
                                      "training phrases", metavar="FILE")
    semantics: str = _f("paper", "paper: the paper's losses, triggers and swapping; reference: reproduce the official "
                                 "PyTorch code (see docs/debiasing.md)", choices=SEMANTICS)
    seed: int = _f(42, "data order and dropout (the reference: 42)")
    epochs: int = _f(2, "passes over the training set (§5.1)")
    batch_size: int | None = _f(None, "micro-batch size (default: 8; cda: 2, the reference's CDA run; the "
                                      "grid: 4, 8, 16)", grid=True, metavar="N")
    grad_accum: int = _f(1, "micro-batches per update (the grid: 1, 5, 8)", grid=True)
    learning_rate: float = _f(5e-5, "peak learning rate (linear decay to 0, no warm-up)", flag="--lr")
    adam_b1: float = _f(0.9, "Adam β1")
    adam_b2: float = _f(0.999, "Adam β2")
    adam_eps: float = _f(1e-8, "Adam ε")
    max_grad_norm: float = _f(1.0, "global gradient-norm clip")
    block_size: int = _f(36, "tokens kept per training phrase")
    lambda_lm: float = _f(0.01, "λ_LM of eq. 2 (the grid: 0.001, 0.01)", grid=True)
    lambda_d: float = _f(10.0, "λ_D of eq. 2 (the grid: 10, 50, 100)", grid=True)
    max_steps: int | None = _f(None, "stop after N updates (smoke runs; the schedule then decays over N, as HF)",
                               metavar="N")
    leftover: str | None = _f(None, "micro-batches left at an epoch's end when #batches is not a multiple of the accumulation: drop "
                                    "(paper default) or carry into the next epoch's first update (reference Trainer; "
                                    "reference default)", choices=("drop", "carry"))
    dropout: bool = _f(True, "dropout 0.1 during training, as the reference", negate="--no-dropout")
    precision: str = _f("fp32", "compute precision: fp32 (default) or bf16 (bf16 matmuls, fp32 parameters, "
                                "optimizer state and losses; for accelerators)", choices=PRECISIONS)
    layout: str = _f("packed", "token layout of a micro-batch: packed (default: its phrases side by side in a few "
                               "rows, block-diagonal attention, positions restarting per phrase; no compute on "
                               "padding; the same losses and updates) or padded (one block_size row per phrase, for "
                               "comparison). DST in reference semantics is always padded (its pooling attends "
                               "padding)", choices=LAYOUTS)
    mesh: str | None = _f(None, "device mesh, e.g. data=2,fsdp=4 or grid=2,fsdp=4 (axes grid, data, fsdp, tensor; "
                                "sizes multiply to the device count; fsdp/tensor split parameters, gradients and "
                                "Adam state; docs/scale.md). Default: grid × data chosen automatically, parameters "
                                "replicated", metavar="AXIS=N,...")
    save_every: int = _f(100, "checkpoint every N updates (also every --save-every-s seconds, on Ctrl-C/SIGTERM and "
                              "at the end)")
    save_every_s: float = _f(600.0, "checkpoint when this many seconds passed since the last one (0: off)")
    keep_checkpoints: int = _f(2, "checkpoints kept on disk")
    export: bool = _f(True, "write OUT/model (an HF folder)", negate="--no-export")
    evaluate: bool = _f(True, "LMB on the valid split after training", negate="--no-eval")
    eval_bias: str = _f("all", "bias types of the post-training LMB (comma list or all; the debiased type is always "
                               "included)")
    lmp: bool = _f(True, "the Reddit-6K perplexity (LMP, §3.2) after training", negate="--no-lmp")
    lmp_file: str | None = _f(None, "LMP reference file (default: RedditBias text_files/humanref6k.txt)",
                              metavar="FILE")
    lmp_max_lines: int | None = _f(None, "score only the first N LMP lines (smoke runs)", metavar="N")
    eval_batch_size: int = _f(64, "LMB and LMP after training: " + SCORING_BATCH_HELP)
    progress: bool = _f(True, "progress bars", negate="--no-progress")

    def __post_init__(self):
        """Raises :class:`rbjax.core.errors.SettingError` (a ValueError) naming the field: the command line shows
        the flag instead, a study file its section and key."""
        _check_types(self)
        if self.method not in METHODS + TASKS:
            raise SettingError("method", f"must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.batch_size is None:  # the method's default (the reference's CDA run uses batch size 2)
            object.__setattr__(self, "batch_size", 2 if self.method == "cda" else 8)
        for name, allowed in (("semantics", SEMANTICS), ("precision", PRECISIONS), ("layout", LAYOUTS),
                              ("leftover", (None, "drop", "carry"))):
            if getattr(self, name) not in allowed:
                raise SettingError(name, f"must be one of {', '.join(a for a in allowed if a)}, "
                                         f"got {getattr(self, name)!r}")
        if self.mesh is not None:  # the syntax here; the device count when the mesh is built
            try:
                parse_mesh(self.mesh, mesh_product(self.mesh))
            except ValueError as e:
                raise SettingError("mesh", str(e)) from None
        for name in ("epochs", "batch_size", "grad_accum", "save_every", "keep_checkpoints", "eval_batch_size",
                     "max_steps", "lmp_max_lines"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise SettingError(name, f"must be >= 1, got {v!r}")
        if self.block_size < 2:
            raise SettingError("block_size", f"must be >= 2, got {self.block_size}")
        for name in ("learning_rate", "max_grad_norm"):
            if not getattr(self, name) > 0:
                raise SettingError(name, f"must be > 0, got {getattr(self, name)}")
        for name in ("adam_eps", "save_every_s", "lambda_lm", "lambda_d"):
            if getattr(self, name) < 0:
                raise SettingError(name, f"must be >= 0, got {getattr(self, name)}")
        for name in ("adam_b1", "adam_b2"):
            if not 0 <= getattr(self, name) < 1:
                raise SettingError(name, f"must be in [0, 1), got {getattr(self, name)}")
        try:
            object.__setattr__(self, "bias_type", resolve_bias_type(self.bias_type))
        except ValueError as e:
            raise SettingError("bias_type", f"{self.bias_type!r}: {e}") from None
        if self.semantics == "reference" and self.method in LOSS_METHODS:
            spec = bias_spec(self.bias_type)
            if not spec.reference:
                raise ValueError(
                    f"{self.bias_type}: reference semantics reproduces the official code's token-id lists, which "
                    "exist only for the five packaged bias types; use --semantics paper for a bias type of your own")
        if self.semantics == "reference" and self.method == "cda" and not bias_spec(self.bias_type).reference.get(
                "swap_rules"):
            raise ValueError(
                f"{self.bias_type}: reference semantics swaps CDA copies with the official code's substring rules, "
                "which exist only for the five packaged bias types; use --semantics paper for a bias type of your own")

    @property
    def resolved_leftover(self) -> str:
        """``drop`` or ``carry`` (the default follows the semantics)."""
        if self.leftover is not None:
            return self.leftover
        return "carry" if self.semantics == "reference" else "drop"

    @property
    def resolved_layout(self) -> str:
        """The layout the trainer uses: ``layout``, except ``padded`` for DST in reference semantics, whose pooling
        (the batch's longest row's last column, padding attended: ``lm_dst_binary.py``) depends on the padding."""
        return "padded" if (self.method == "dst" and self.semantics == "reference") else self.layout

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def trajectory(self) -> dict[str, Any]:
        """The settings a resumed run must share with the checkpointed one."""
        d = {k: getattr(self, k) for k in TRAJECTORY_FIELDS}
        d["leftover"] = self.resolved_leftover
        d["layout"] = self.resolved_layout
        return d

    def replace(self, **kw) -> "TrainConfig":
        return dataclasses.replace(self, **kw)
