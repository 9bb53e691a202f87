"""The settings of a debiasing run (paper §4, §5.1; docs/debiasing.md): :class:`DebiasRun`, nested as levanter's
``TrainLmConfig(trainer=…, optimizer=…, model=…)``.

* :class:`DebiasRun` — what to start from (``model``, ``tokenizer``), where to write (``out_dir``), the device
  ``mesh``, whether to ``export`` the model, and its sections:
* ``debias`` — :class:`DebiasConfig`: the method, bias type, training data, semantics and λ of eq. 2;
* ``trainer`` — :class:`rbjax.train.config.TrainerConfig`: batches, epochs, precision, layout, checkpoints;
* ``optimizer`` — :class:`rbjax.train.config.OptimizerConfig`: learning rate, Adam, clip;
* ``adapter`` — :class:`rbjax.train.config.AdapterConfig`: low-rank adapters on a frozen base (``--adapter lora``),
  or every weight trained (the default);
* ``evaluation`` — :class:`EvalConfig`: LMB on the valid split and LMP after training.

Every setting's name is unique across the sections (:func:`rbjax.core.config.leaves`), so the command-line options of
``rbjax debias`` / ``rbjax sweep``, the study's ``[training]`` keys and the ``config`` that results record are flat:
``--lr`` is ``optimizer.learning_rate``, ``--method`` is ``debias.method`` (:meth:`DebiasRun.from_flat`,
:meth:`DebiasRun.to_dict`). Each field carries its default and help once.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from rbjax.core.config import check_types, field, from_flat, replace_flat, section, to_flat
from rbjax.core.errors import SettingError
from rbjax.core.mesh import mesh_product, parse_mesh
from rbjax.lmb import SCORING_BATCH_HELP
from rbjax.model.chat import ChatSettings
from rbjax.model.handle import MODEL_HELP, TOKENIZER_HELP
from rbjax.specs import canonical_bias_type, is_spec_path, load_spec
from rbjax.train.config import AdapterConfig, OptimizerConfig, TrainerConfig

__all__ = ["METHODS", "LOSS_METHODS", "SEMANTICS", "DebiasConfig", "EvalConfig", "DebiasRun", "resolve_bias_type",
           "bias_spec"]

#: debiasing methods (``lm``: plain LM fine-tuning on the training phrases, a control / benchmark baseline)
METHODS = ("lmd", "add", "hd", "cda", "lm")
LOSS_METHODS = ("lmd", "add", "hd")
SEMANTICS = ("paper", "reference")
#: the memory plan's allowance for a chat template's own tokens before a phrase (BOS, role headers, a default system
#: prompt such as Qwen's ≈ 30 tokens), before the tokenizer is read (:attr:`DebiasRun.plan_seq_len`)
CHAT_PLAN_CONTEXT = 48


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
class DebiasConfig(ChatSettings):
    """The debiasing method of a run and its training data (paper §4): the ``debias`` section of
    :class:`DebiasRun`. Its chat-format fields (``format``, ``role``, ``system``, ``prompt``,
    ``score_end_of_turn``, ``chat_template``, from :class:`rbjax.model.chat.ChatSettings`) wrap each training
    phrase as a turn of the model's chat template; the LM loss, the LMD triggers and the ADD/HD attribute
    occurrences are then computed on the phrase's tokens only, and the post-training LMB is measured in the same
    format (docs/chat.md, "Debiasing in chat format").

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
    lambda_lm: float = field(0.01, "λ_LM of eq. 2 (the grid: 0.001, 0.01)")
    lambda_d: float = field(10.0, "λ_D of eq. 2 (the grid: 10, 50, 100)")

    def __post_init__(self):
        check_types(self)
        self.check_chat_settings()
        for name, allowed in (("method", METHODS), ("semantics", SEMANTICS)):
            if getattr(self, name) not in allowed:
                raise SettingError(name, f"must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        for name in ("lambda_lm", "lambda_d"):
            if getattr(self, name) < 0:
                raise SettingError(name, f"must be >= 0, got {getattr(self, name)}")
        try:
            object.__setattr__(self, "bias_type", resolve_bias_type(self.bias_type))
        except ValueError as e:
            raise SettingError("bias_type", f"{self.bias_type!r}: {e}") from None
        if self.is_chat and self.semantics == "reference":
            raise SettingError("semantics", "reference reproduces the official code on DialoGPT's bare phrases; the "
                                            "chat format trains with --semantics paper")
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
    def hparams(self) -> dict[str, float]:
        """The objective's hyper-parameters (:class:`rbjax.debias.objective.DebiasObjective`): λ_LM and λ_D of eq. 2
        for LMD, ADD and HD; none for CDA and LM (the LM loss alone)."""
        return {"lambda_lm": self.lambda_lm, "lambda_d": self.lambda_d} if self.method in LOSS_METHODS else {}

    @property
    def default_batch_size(self) -> int:
        """The method's default micro-batch size (the reference's CDA run uses batch size 2)."""
        return 2 if self.method == "cda" else 8

    @property
    def default_leftover(self) -> str:
        """The reference Trainer carries an epoch's leftover micro-batches; the paper's default drops them."""
        return "carry" if self.semantics == "reference" else "drop"

    def name(self) -> str:
        """A few words naming the run (its progress bar): ``"hd religion1"``."""
        b = self.bias_type
        return f"{self.method} {Path(b).stem if b.endswith('.json') else b}"


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """What a finished run is evaluated on, in memory (the ``evaluation`` section of :class:`DebiasRun`): LMB on the
    valid split (§3.1) and the Reddit-6K perplexity (LMP, §3.2)."""

    evaluate: bool = field(True, "LMB on the valid split after training", negate="--no-eval")
    eval_bias: str = field("all", "bias types of the post-training LMB (comma list or all; the debiased type is "
                                  "always included)")
    lmp: bool = field(True, "the Reddit-6K perplexity (LMP, §3.2) after training", negate="--no-lmp")
    lmp_file: str | None = field(None, "LMP reference file (default: RedditBias text_files/humanref6k.txt)",
                                 metavar="FILE")
    lmp_max_lines: int | None = field(None, "score only the first N LMP lines (smoke runs)", metavar="N")
    eval_batch_size: int = field(64, "LMB and LMP after training: " + SCORING_BATCH_HELP)

    def __post_init__(self):
        check_types(self)
        for name in ("eval_batch_size", "lmp_max_lines"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise SettingError(name, f"must be >= 1, got {v!r}")


@dataclasses.dataclass(frozen=True)
class DebiasRun:
    """Everything that defines one debiasing run (frozen; recorded flat in ``OUT/config.json`` and
    ``OUT/results.json``, module docstring). Build it from flat names with :meth:`from_flat`.

    ``trainer.batch_size`` left unset takes the method's default (:attr:`DebiasConfig.default_batch_size`), and
    ``trainer.leftover`` its semantics' (:attr:`DebiasConfig.default_leftover`) in :attr:`trainer_config`, the
    trainer's settings as the run trains.

    Raises:
        rbjax.core.errors.SettingError naming the field: a bad value (from its section); ValueError: see
        :class:`DebiasConfig`.
    """

    model: str = field("microsoft/DialoGPT-small", MODEL_HELP, metavar="MODEL")  # the model to start from
    tokenizer: str | None = field(None, TOKENIZER_HELP, metavar="PATH")
    out_dir: str = field("runs/debias", "run folder (an unfinished run there is resumed; a finished one is reused)",
                         flag="--out", metavar="DIR")
    mesh: str | None = field(None, "device mesh, e.g. data=2,fsdp=4 or grid=2,fsdp=4 (axes grid, data, fsdp, "
                                   "tensor; sizes multiply to the device count; fsdp/tensor split parameters, "
                                   "gradients and Adam state; docs/scale.md). Default: grid × data chosen "
                                   "automatically, parameters replicated", metavar="AXIS=N,...")
    export: bool = field(True, "write OUT/model (an HF folder) after training", negate="--no-export")
    debias: DebiasConfig = section(DebiasConfig, helps={
        "format": "raw: train on each phrase as bare text (the paper); chat: as a turn of the model's own chat template "
                  "(the template's tokens are context: no LM loss, triggers or attributes there; docs/chat.md); the "
                  "post-training LMB is measured in the same format",
        "score_end_of_turn": "chat format: the template's end-of-turn token after the phrase (e.g. <|eot_id|>) is a "
                             "target of the LM loss and is scored in the post-training LMB; off: the phrase's own "
                             "tokens only"})
    trainer: TrainerConfig = section(TrainerConfig, helps={
        "batch_size": "micro-batch size (default: 8; cda: 2, the reference's CDA run; the grid: 4, 8, 16)",
        "grad_accum": "micro-batches per update (the grid: 1, 5, 8)"})
    optimizer: OptimizerConfig = section(OptimizerConfig)
    adapter: AdapterConfig = section(AdapterConfig)
    evaluation: EvalConfig = section(EvalConfig)

    def __post_init__(self):
        check_types(self)
        if self.mesh is not None:  # the syntax here; the device count when the mesh is built
            try:
                parse_mesh(self.mesh, mesh_product(self.mesh), flag="{name}")
            except ValueError as e:
                raise SettingError("mesh", str(e)) from None
        if self.trainer.batch_size is None:
            object.__setattr__(self, "trainer", self.trainer.replace(batch_size=self.debias.default_batch_size))

    @property
    def trainer_config(self) -> TrainerConfig:
        """The trainer's settings as the run trains: ``leftover`` unset means the semantics' default."""
        t = self.trainer
        return t if t.leftover is not None else t.replace(leftover=self.debias.default_leftover)

    @classmethod
    def from_flat(cls, values: dict | None = None, /, **kw) -> "DebiasRun":
        """A run from flat setting names (``method="hd", learning_rate=1e-4, batch_size=4``); the others default.

        Raises:
            TypeError: a name that is not a setting. SettingError, ValueError: a bad value.
        """
        return from_flat(cls, values, **kw)

    def replace(self, **changes) -> "DebiasRun":
        """A copy with settings changed by flat name (``cfg.replace(batch_size=4, evaluate=False)``)."""
        return replace_flat(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The settings by flat name (what ``config.json`` and ``results.json`` record)."""
        return to_flat(self)

    def describe(self) -> str:
        """A few words naming the run on its progress bar."""
        return self.debias.name()

    @property
    def plan_seq_len(self) -> int:
        """The tokens of a training row, for a memory plan made before the tokenizer is read: ``block_size`` in the
        raw format; in the chat format also an allowance for the template's tokens before the phrase
        (:data:`CHAT_PLAN_CONTEXT`, two tokens a word of the system prompt and user message) and its end-of-turn
        token. The run itself trains on rows as wide as its longest rendered example."""
        d = self.debias
        if not d.is_chat:
            return self.trainer.block_size
        words = sum(len(str(v).split()) for v in (d.system, d.prompt) if v is not None)
        return self.trainer.block_size + CHAT_PLAN_CONTEXT + 2 * words + 1
