"""Configuration of a debiasing run (paper §4, §5.1; reference-debias.md §7).

:class:`TrainConfig` is a frozen, JSON-serialisable dataclass: everything that defines one run — the trainer's
settings (:class:`rbjax.train.config.TrainerConfig`: optimiser, schedule, batches, precision, layout, mesh,
checkpoints) and the debiasing ones (method, bias type, semantics, λ, evaluation after training). Its fields are also
the command-line options of ``rbjax debias`` and ``rbjax sweep`` (built from the dataclass by
:func:`rbjax.commands.debias.add_training_arguments`, so the help and the defaults live in the field metadata, and
nowhere else).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from rbjax.core.config import field
from rbjax.core.errors import SettingError
from rbjax.lmb import SCORING_BATCH_HELP
from rbjax.specs import canonical_bias_type, is_spec_path, load_spec
from rbjax.train.config import TrainerConfig

__all__ = ["METHODS", "LOSS_METHODS", "SEMANTICS", "TRAJECTORY_FIELDS", "TrainConfig", "resolve_bias_type",
           "bias_spec"]

#: debiasing methods (``lm``: plain LM fine-tuning on the training phrases, a control / benchmark baseline)
METHODS = ("lmd", "add", "hd", "cda", "lm")
LOSS_METHODS = ("lmd", "add", "hd")
SEMANTICS = ("paper", "reference")

#: fields of :class:`TrainConfig` that determine the training trajectory; a resumed run must match them (together
#: with the content of the model, tokenizer, data and bias specification: see :mod:`rbjax.train.loop`)
TRAJECTORY_FIELDS = ("method", "bias_type", "train_file", "semantics", "lambda_lm", "lambda_d",
                     *TrainerConfig.trajectory_fields)


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
class TrainConfig(TrainerConfig):
    """Everything that defines one debiasing run (frozen, JSON-serialisable; stored in ``OUT/config.json``): the
    trainer's settings (:class:`rbjax.train.config.TrainerConfig`) and the fields below. Each field's
    ``metadata["help"]`` is its documentation (shown by ``rbjax debias --help``).

    Raises:
        rbjax.core.errors.SettingError (a ValueError) naming the field; ValueError: reference semantics for a bias
        type of the user's own.
    """

    method: str = field("hd", "lmd: equalising loss (§4.1); add: attribute distance (§4.2); hd: hard debiasing "
                              "(§4.3); cda: counterfactual data augmentation (§4.4); lm: plain LM fine-tuning "
                              "(control)", choices=METHODS)
    bias_type: str = field("religion1", "bias type: religion1, religion2, race, gender, queerness (orientation), or "
                                        "a bias-specification JSON file of your own (with --data-dir holding its "
                                        "text_files/<name>/<name>_bias_manual_train.txt, as `rbjax splits` writes)",
                           flag="--bias", metavar="TYPE")
    data_dir: str | None = field(None, "RedditBias data folder (default: $RBJAX_DATA_DIR, else download and cache)",
                                 metavar="DIR")
    train_file: str | None = field(None, "train on this text file (one phrase a line) instead of the bias type's "
                                         "training phrases", metavar="FILE")
    semantics: str = field("paper", "paper: the paper's losses, triggers and swapping; reference: reproduce the "
                                    "official PyTorch code (see docs/debiasing.md)", choices=SEMANTICS)
    lambda_lm: float = field(0.01, "λ_LM of eq. 2 (the grid: 0.001, 0.01)", grid=True)
    lambda_d: float = field(10.0, "λ_D of eq. 2 (the grid: 10, 50, 100)", grid=True)
    export: bool = field(True, "write OUT/model (an HF folder)", negate="--no-export")
    evaluate: bool = field(True, "LMB on the valid split after training", negate="--no-eval")
    eval_bias: str = field("all", "bias types of the post-training LMB (comma list or all; the debiased type is "
                                  "always included)")
    lmp: bool = field(True, "the Reddit-6K perplexity (LMP, §3.2) after training", negate="--no-lmp")
    lmp_file: str | None = field(None, "LMP reference file (default: RedditBias text_files/humanref6k.txt)",
                                 metavar="FILE")
    lmp_max_lines: int | None = field(None, "score only the first N LMP lines (smoke runs)", metavar="N")
    eval_batch_size: int = field(64, "LMB and LMP after training: " + SCORING_BATCH_HELP)

    trajectory_fields = TRAJECTORY_FIELDS

    @property
    def default_batch_size(self) -> int:
        """The method's default micro-batch size (the reference's CDA run uses batch size 2)."""
        return 2 if self.method == "cda" else 8

    def __post_init__(self):
        super().__post_init__()
        for name, allowed in (("method", METHODS), ("semantics", SEMANTICS)):
            if getattr(self, name) not in allowed:
                raise SettingError(name, f"must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        for name in ("eval_batch_size", "lmp_max_lines"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise SettingError(name, f"must be >= 1, got {v!r}")
        for name in ("lambda_lm", "lambda_d"):
            if getattr(self, name) < 0:
                raise SettingError(name, f"must be >= 0, got {getattr(self, name)}")
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
        """``drop`` or ``carry`` (the default follows the semantics: the reference Trainer carries)."""
        if self.leftover is not None:
            return self.leftover
        return "carry" if self.semantics == "reference" else "drop"

    @property
    def loss_weights(self) -> tuple[float, float]:
        """``(λ_LM, λ_D)`` of eq. 2."""
        return self.lambda_lm, self.lambda_d

    def describe(self) -> str:
        name = self.bias_type
        return f"{self.method} {Path(name).stem if name.endswith('.json') else name}"
