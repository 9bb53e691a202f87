"""Configuration of a debiasing run (paper §4, §5.1; reference-debias.md §7).

:class:`TrainConfig` is a frozen, JSON-serialisable dataclass: everything that defines one run. Its fields are also
the command-line options of ``rbjax debias`` and ``rbjax sweep`` (built from the dataclass by
:func:`rbjax.commands.debias.add_training_arguments`, so the help and the defaults live here, in the field
metadata, and nowhere else).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from rbjax.core.mesh import mesh_product, parse_mesh
from rbjax.core.precision import PRECISIONS
from rbjax.specs import canonical_bias_type, is_spec_path, load_spec

__all__ = ["METHODS", "LOSS_METHODS", "TRAJECTORY_FIELDS", "TrainConfig", "resolve_bias_type", "bias_spec"]

#: debiasing methods (``lm``: plain LM fine-tuning on the training phrases, a control / benchmark baseline)
METHODS = ("lmd", "add", "hd", "cda", "lm")
LOSS_METHODS = ("lmd", "add", "hd")
#: fine-tuning tasks of the dialog checks (paper §3.2) that reuse the same trainer: ``dst`` (binary slot-value
#: classifier, BCE on a linear head) and ``crg`` (causal LM loss on the response tokens only)
TASKS = ("dst", "crg")
SEMANTICS = ("paper", "reference")

#: fields of :class:`TrainConfig` that determine the training trajectory; a resumed run must match them (together
#: with the content of the model, tokenizer, data and bias specification: see :mod:`rbjax.debias.loop`)
TRAJECTORY_FIELDS = (
    "method", "bias_type", "train_file", "semantics", "seed", "epochs", "batch_size", "grad_accum",
    "learning_rate", "adam_b1", "adam_b2", "adam_eps", "max_grad_norm", "block_size", "lambda_lm", "lambda_d",
    "max_steps", "leftover", "dropout", "precision",
)


def _f(default, help: str, *, flag: str | None = None, negate: str | None = None, **kw):  # noqa: A002
    """A config field whose help, choices and command-line spelling live with it (simple_parsing builds the CLI).

    ``flag``: the option's name when it is not ``--<field-name>``; ``negate``: a boolean switched off by
    ``--no-<name>`` (e.g. ``--no-dropout``); ``grid``: a hyper-parameter of the paper's grid (``rbjax sweep`` takes
    lists of values instead).
    """
    from simple_parsing import field
    from simple_parsing.helpers import flag as sp_flag

    grid = kw.pop("grid", False)
    if "metavar" not in kw and "choices" not in kw and negate is None:
        kw["metavar"] = {int: "N", float: "X", str: "TEXT"}.get(type(default), "VALUE")
    if negate is not None:
        f = sp_flag(default, help=help, negative_option=negate, **kw)
    else:
        f = field(default, help=help, alias=[flag] if flag else None, **kw)
    f.metadata = {**f.metadata, "grid": grid, "flag": flag}  # type: ignore[misc]
    return f


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
    model: str = _f("microsoft/DialoGPT-small", "HF GPT-2 folder or hub id to start from", metavar="MODEL")
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
    eval_batch_size: int = _f(64, "phrases per scoring batch")
    progress: bool = _f(True, "progress bars", negate="--no-progress")

    def __post_init__(self):
        if self.method not in METHODS + TASKS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.batch_size is None:  # the method's default (the reference's CDA run uses batch size 2)
            object.__setattr__(self, "batch_size", 2 if self.method == "cda" else 8)
        object.__setattr__(self, "bias_type", resolve_bias_type(self.bias_type))
        if self.semantics not in SEMANTICS:
            raise ValueError(f"semantics must be one of {SEMANTICS}, got {self.semantics!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.mesh is not None:  # the syntax here; the device count when the mesh is built
            parse_mesh(self.mesh, mesh_product(self.mesh))
        if self.leftover not in (None, "drop", "carry"):
            raise ValueError(f"leftover must be 'drop', 'carry' or None, got {self.leftover!r}")
        for name in ("epochs", "batch_size", "grad_accum", "block_size", "save_every", "keep_checkpoints",
                     "eval_batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2, got {self.block_size}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.lmp_max_lines is not None and self.lmp_max_lines < 1:
            raise ValueError(f"lmp_max_lines must be >= 1, got {self.lmp_max_lines}")
        if not (self.learning_rate > 0 and self.max_grad_norm > 0 and self.adam_eps >= 0):
            raise ValueError("learning_rate and max_grad_norm must be > 0, adam_eps >= 0")
        if self.save_every_s < 0:
            raise ValueError(f"save_every_s must be >= 0, got {self.save_every_s}")
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

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def trajectory(self) -> dict[str, Any]:
        """The settings a resumed run must share with the checkpointed one."""
        d = {k: getattr(self, k) for k in TRAJECTORY_FIELDS}
        d["leftover"] = self.resolved_leftover
        return d

    def replace(self, **kw) -> "TrainConfig":
        return dataclasses.replace(self, **kw)
