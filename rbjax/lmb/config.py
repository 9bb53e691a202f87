"""Settings of the LMB computations (paper §3.1): a measurement, the paired comparison of two measured models, and
the t-value plot.

:class:`MeasureConfig` is the one place where each setting of :func:`rbjax.lmb.measure.measure_bias` has its default,
help and check; ``rbjax measure``'s options are generated from its fields
(:func:`rbjax.commands.options.add_config_arguments`). Defaults are the paper's / the reference's: the test split,
3σ outlier pairs (population std, ``ddof=0``), α = 0.05 two-tailed, 10,000 bootstrap resamples for the CI.
:class:`CompareConfig` is the same for :func:`rbjax.lmb.compare.compare_runs` (``rbjax compare``) and
:class:`PlotConfig` for :func:`rbjax.lmb.plot.plot_lmb` (``rbjax plot``).
"""
from __future__ import annotations

import dataclasses

from rbjax.core.config import check_types, field, replace_settings
from rbjax.core.errors import SettingError
from rbjax.core.mesh import mesh_product, parse_mesh
from rbjax.core.precision import PRECISIONS
from rbjax.data.redditbias import SPLITS
from rbjax.lmb import SCORING_BATCH_HELP
from rbjax.model.chat import ChatSettings

__all__ = ["MeasureConfig", "CompareConfig", "PlotConfig"]


@dataclasses.dataclass(frozen=True)
class MeasureConfig(ChatSettings):
    """What an LMB measurement computes and how (frozen; the resume key and each record's ``settings`` come from
    it). Each field's ``metadata["help"]`` is its documentation. The chat-format fields (``format``, ``role``,
    ``system``, ``prompt``, ``score_end_of_turn``, ``chat_template``) come from
    :class:`rbjax.model.chat.ChatSettings` (docs/chat.md).

    Raises:
        rbjax.core.errors.SettingError: a value of the wrong type or out of range (names the field; the CLI shows
            its flag).
    """

    split: str = field("test", "test: the paper's LMB split; valid: debiasing model selection; valid+test: both",
                       choices=SPLITS)
    batch_size: int = field(64, SCORING_BATCH_HELP)
    precision: str = field("fp32", "compute precision: fp32 (parity with PyTorch) or bf16 (bf16 matmuls, fp32 "
                                   "accumulation and log-sum-exp; faster on bf16 hardware); recorded in lmb.json",
                           choices=PRECISIONS)
    mesh: str | None = field(None, "device mesh, e.g. data=2,fsdp=4 or fsdp=4,tensor=2 (axes data, fsdp, tensor; "
                                   "sizes multiply to the device count; docs/scale.md): fsdp/tensor split the "
                                   "parameters, data×fsdp the rows. Default: rows over this process's devices, "
                                   "parameters replicated; recorded in lmb.json", metavar="AXIS=N,...")
    param_dtype: str = field("fp32", "parameter storage: bf16 halves the weights' memory (computation and "
                                     "log-sum-exp stay as --precision says; docs/scale.md measures the change); "
                                     "recorded in lmb.json", choices=PRECISIONS)
    seed: int = field(0, "bootstrap seed")
    bos: bool | None = field(None, "--bos: put the BOS token (GPT-2: <|endoftext|>) before every phrase and score "
                                   "every token; --no-bos: never. Default: as the model's own tokenizer encodes a "
                                   "phrase (Llama, Mistral, Gemma add a BOS; GPT-2/DialoGPT as the reference, Qwen2, "
                                   "Pythia do not); recorded in lmb.json. In the chat format the template decides")
    n_std: float = field(3.0, "outlier interval width in standard deviations")
    ddof: int = field(0, "std convention: 0 population (reference), 1 sample", choices=(0, 1))
    alpha: float = field(0.05, "significance level (two-tailed); CI level is 1 - alpha")
    n_bootstrap: int = field(10000, "bootstrap resamples for the CI (0: no CI)")
    outlier_removal: bool | None = field(None, "3σ outlier-pair removal before the primary test; auto = on for a "
                                               "model, off for --stored-perplexities (the released files were "
                                               "already reduced with those values)")
    skip_unscorable: bool = field(False, "exclude pairs with a phrase of < 2 tokens instead of failing")
    allow_other_base: bool = field(False, "score an rbjax --adapter on a base whose weights are not those it was "
                                          "trained on (refused by default: the adapter records its base's weights "
                                          "key); recorded in the results as adapter_base")

    def __post_init__(self):
        check_types(self)
        self.check_chat_settings()
        if self.split not in SPLITS:
            raise SettingError("split", f"must be {', '.join(SPLITS[:-1])} or {SPLITS[-1]}, got {self.split!r}")
        if self.batch_size < 1:
            raise SettingError("batch_size", f"must be >= 1, got {self.batch_size!r}")
        for name in ("precision", "param_dtype"):  # (both name a dtype of rbjax.core.precision.DTYPES)
            if getattr(self, name) not in PRECISIONS:
                raise SettingError(name, f"must be {' or '.join(map(repr, PRECISIONS))}, got {getattr(self, name)!r}")
        if not 0 < self.alpha < 1:
            raise SettingError("alpha", f"must be between 0 and 1, got {self.alpha}")
        if not self.n_std > 0:
            raise SettingError("n_std", f"must be > 0, got {self.n_std}")
        if self.n_bootstrap < 0:
            raise SettingError("n_bootstrap", f"must be an integer >= 0 (0 = no bootstrap CI), got {self.n_bootstrap!r}")
        if self.ddof not in (0, 1):
            raise SettingError("ddof", f"must be 0 (population std) or 1 (sample std), got {self.ddof!r}")
        if self.is_chat and self.bos is not None:
            raise SettingError("bos", "has no effect with --format chat: the chat template decides whether a BOS "
                                      "starts the chat")
        if self.mesh is not None:  # the syntax here; the device count when the mesh is built
            try:
                sizes = parse_mesh(self.mesh, mesh_product(self.mesh), flag="{name}")
            except ValueError as e:
                raise SettingError("mesh", str(e)) from None
            if sizes is not None and sizes["grid"] > 1:
                raise SettingError("mesh", f"{self.mesh!r}: a measurement scores one model, it has no grid points "
                                           "to spread; use data, fsdp and tensor")

    def replace(self, **changes) -> MeasureConfig:
        """A copy with ``changes`` (checked again).

        Raises:
            TypeError: a name that is not a setting of the measurement.
        """
        return replace_settings(self, "measurement", **changes)


def _check_alpha(alpha) -> None:
    if alpha is not None and not 0 < alpha < 1:
        raise SettingError("alpha", f"must be between 0 and 1, got {alpha}")


def _names(text: str) -> tuple[str, ...]:
    """``"A,B"`` → ``("A", "B")`` (the ``--labels`` option)."""
    return tuple(x.strip() for x in text.split(","))


@dataclasses.dataclass(frozen=True)
class CompareConfig:
    """How two measured models are compared (:func:`rbjax.lmb.compare.compare_runs`, ``rbjax compare``; frozen).
    Each field's ``metadata["help"]`` is its documentation.

    Raises:
        rbjax.core.errors.SettingError: a value of the wrong type or out of range (names the field; the CLI shows
            its flag).
    """

    alpha: float | None = field(None, "significance level (default: the runs' own alpha); the CI level is 1 - alpha",
                                metavar="X")
    n_bootstrap: int | None = field(None, "bootstrap resamples of the CI (default: the runs' own n_bootstrap; 0: no "
                                          "CI)", metavar="N")
    seed: int = field(0, "bootstrap seed")
    labels: tuple[str, str] | None = field(None, "names of A and B in the output (default: their folder names, as "
                                                 "many trailing path parts as tell them apart)",
                                           metavar="LABEL_A,LABEL_B", parse=_names)
    allow_format_change: bool = field(False, "compare runs measured in different formats of the pairs (--format raw "
                                             "vs chat, or two chat settings: does the chat format change the bias?); "
                                             "the output says that it compares formats")

    def __post_init__(self):
        v = self.labels
        if v is not None and (not isinstance(v, (list, tuple)) or len(v) != 2
                              or not all(isinstance(x, str) and x for x in v)):
            raise SettingError("labels", f"must be two names, LABEL_A,LABEL_B, got {v!r}")
        check_types(self)
        _check_alpha(self.alpha)
        if self.n_bootstrap is not None and self.n_bootstrap < 0:
            raise SettingError("n_bootstrap", f"must be >= 0, got {self.n_bootstrap}")

    def replace(self, **changes) -> CompareConfig:
        """A copy with ``changes`` (checked again).

        Raises:
            TypeError: a name that is not a setting of the comparison.
        """
        return replace_settings(self, "comparison", **changes)


@dataclasses.dataclass(frozen=True)
class PlotConfig:
    """How the LMB t-values are drawn (:func:`rbjax.lmb.plot.plot_lmb`, ``rbjax plot``; frozen). Each field's
    ``metadata["help"]`` is its documentation.

    Raises:
        rbjax.core.errors.SettingError: a value of the wrong type or out of range (names the field; the CLI shows
            its flag).
    """

    alpha: float | None = field(None, "significance level of the marks and threshold lines (default: the records' "
                                      "own alpha)", metavar="X")
    title: str | None = field(None, "plot title (default: a description of the test)", metavar="TEXT")
    allow_mixed: bool = field(False, "plot folders with different splits (test/valid) or outlier handling (3σ rule "
                                     "on a model's perplexities vs. the already reduced stored perplexities) "
                                     "together; each series is labelled")

    def __post_init__(self):
        check_types(self)
        _check_alpha(self.alpha)

    def replace(self, **changes) -> PlotConfig:
        """A copy with ``changes`` (checked again).

        Raises:
            TypeError: a name that is not a setting of the plot.
        """
        return replace_settings(self, "plot", **changes)
