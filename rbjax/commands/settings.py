"""The option blocks several commands share, as small settings dataclasses of the command line (their fields carry
the one default and the one help text of each option; :func:`rbjax.commands.options.add_config_arguments` turns them
into options, and a command picks the fields it takes and, where it must, marks one required or specialises it).

* :class:`ModelSource` — ``--model``, ``--tokenizer``, ``--adapter`` (measure, evaluate, splits);
* :class:`Output` — ``--out`` / ``--out-dir``, ``--overwrite``, ``--no-progress`` (every command that writes);
* :class:`PlanSettings` — ``--dry-run``, ``--device-memory-gb`` (measure, debias, sweep, evaluate, run);
* :class:`BenchmarkSource` — ``--benchmark``, ``--bias``, ``--pairs``, ``--data-dir`` (measure, pairs);
* :class:`NoTrainingOptions` — the options of ``rbjax debias --method sentence-debias|inlp|self-debias``
  (:data:`NO_TRAINING_OPTIONS` says which method reads which).

The executor block (``--executor``, ``--jobs``, ``--ray-address``) is :class:`rbjax.core.parallel.Executor`, a
setting of the Python API too. These classes hold what the command line gives; a command passes the values on to the
Python API, whose own settings classes (e.g. :class:`rbjax.lmb.config.MeasureConfig`) check them.
"""
from __future__ import annotations

import dataclasses

from rbjax.core.config import field
from rbjax.model.handle import MODEL_HELP, TOKENIZER_HELP
from rbjax.model.memory import DEVICE_MEMORY_HELP

__all__ = ["ModelSource", "Output", "PlanSettings", "BenchmarkSource", "BENCHMARKS", "PROGRESS_HELP",
           "NoTrainingOptions", "NO_TRAINING_OPTIONS"]

#: what ``--no-progress`` turns off (the dialog tasks' and the trainer's ``progress`` field say the same)
PROGRESS_HELP = "progress bars on stderr"
#: the benchmarks ``rbjax measure --benchmark`` scores (``rbjax pairs`` writes the first two)
BENCHMARKS = ("redditbias", "crows-pairs", "pairs", "bbq")


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """The model a command loads: ``--model`` (a folder, hub id or debias run folder), ``--tokenizer``, ``--adapter``."""

    model: str | None = field(None, MODEL_HELP, metavar="MODEL")
    tokenizer: str | None = field(None, TOKENIZER_HELP, metavar="PATH")
    adapter: str | None = field(None, "a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors: "
                                      "rbjax's OUT/adapter, or one trained elsewhere) applied to --model, the base, "
                                      "without merging", metavar="FOLDER")


@dataclasses.dataclass(frozen=True)
class Output:
    """Where a command writes and what it may replace there."""

    out: str | None = field(None, "output folder (the command's description names the files written there)",
                            metavar="OUT")
    out_dir: str | None = field(None, "output folder (the command's description names the files written there)",
                                metavar="OUT_DIR")
    overwrite: bool = field(False, "replace what a run of other inputs, or another program, wrote where this command "
                                   "writes, instead of refusing it before any work (debias, sweep: also a run of the "
                                   "same inputs, which is otherwise resumed or reused); a model or run folder is "
                                   "replaced as a whole or not at all")
    progress: bool = field(True, PROGRESS_HELP, negate="--no-progress")


@dataclasses.dataclass(frozen=True)
class PlanSettings:
    """The memory plan (:mod:`rbjax.model.memory`) a command prints or checks before it loads any weight."""

    dry_run: bool = field(False, "print the plan and stop, loading no weights: the memory plan of the command's "
                                 "computations on --mesh (per device: parameters and activations; training: "
                                 "gradients and optimiser state; generation: the KV cache), exit status 1 when it "
                                 "does not fit; rbjax run: the stages, the number of training runs, an estimate of "
                                 "their cost and each sweep's memory plan, printed")
    device_memory_gb: float | None = field(None, DEVICE_MEMORY_HELP, metavar="GB")


@dataclasses.dataclass(frozen=True)
class BenchmarkSource:
    """Which pairs (or BBQ rows) a command reads: the benchmark, its bias types or categories, its data."""

    benchmark: str = field("redditbias", "redditbias: the paper's phrase pairs (LMB); crows-pairs: CrowS-Pairs "
                                         "(nyu-mll/crows-pairs, verified); pairs: the pair file --pairs FILE "
                                         "(docs/pairs.md); bbq: BBQ, multiple choice by log-likelihood as "
                                         "lm-evaluation-harness's bbq task (docs/bbq.md)", choices=BENCHMARKS)
    bias: tuple[str, ...] | None = field(None, "bias type(s): religion1, religion2, race, gender, queerness, "
                                               "orientation, all, or a bias-spec JSON file of your own; "
                                               "comma-separated or repeated (default: all); rbjax measure "
                                               "--benchmark crows-pairs, pairs or bbq: the categories to measure",
                                         repeat=True,
                                         metavar="BIAS")
    pairs: str | None = field(None, "the pair file of --benchmark pairs (.csv or .jsonl: id, category, sentence_1, "
                                    "sentence_2, stereotypical)", metavar="FILE")
    data_dir: str | None = field(None, "the benchmark's data folder — RedditBias: laid out like umanlp/RedditBias "
                                       "(default: $RBJAX_DATA_DIR, else the download of the pinned commit, cached); "
                                       "CrowS-Pairs: holding crows_pairs_anonymized.csv (default: "
                                       "$RBJAX_CROWS_PAIRS_DIR, else the verified download); BBQ: any folder of BBQ "
                                       ".jsonl files (default: the verified nyu-mll/BBQ files)", metavar="DATA_DIR")


@dataclasses.dataclass(frozen=True)
class NoTrainingOptions:
    """The options of the debiasing methods that train nothing (``rbjax debias --method sentence-debias|inlp|
    self-debias``; docs/debiasing.md §10–11). Each is read by the methods :data:`NO_TRAINING_OPTIONS` names and
    refused, by its flag, with any other method."""

    corpus: str | None = field(None, "sentence-debias, inlp: sentences of your own (one a line), swapped with the "
                                     "bias type's target pairs into counterfactual pairs (default: the bias type's "
                                     "training phrases)", metavar="FILE")
    pairs: str | None = field(None, "sentence-debias, inlp: ready-made counterfactual sets: a CSV with a header naming "
                                    "the groups, one column each", metavar="FILE")
    k: int = field(1, "sentence-debias: principal directions removed (bias-bench's: 1)", metavar="N")
    inlp_iterations: int = field(80, "inlp: classifiers at most (bias-bench's: 80)", metavar="N")
    inlp_epsilon: float = field(0.01, "inlp: stop once a classifier's held-out accuracy is within X of chance",
                                metavar="X")
    inlp_dev_fraction: float = field(0.3, "inlp: share of the counterfactual sets held out", metavar="X")
    self_debias_prefix: tuple[str, ...] | None = field(None, "self-debias: a self-debiasing prefix of your own (repeatable: "
                                                    "several are combined by their elementwise maximum); default: "
                                                    "bias-bench's for --bias", flag="--prefix", repeat=True,
                                                metavar="TEXT", alias=False)
    decay_constant: float = field(50.0, "self-debias: the decay constant λ (bias-bench's: 50)", metavar="λ")
    self_debias_epsilon: float = field(0.01, "self-debias: the least factor a probability is multiplied by "
                                             "(bias-bench's: 0.01)", metavar="ε")


#: which method reads each :class:`NoTrainingOptions` field
NO_TRAINING_OPTIONS = {"corpus": ("sentence-debias", "inlp"), "pairs": ("sentence-debias", "inlp"),
                       "k": ("sentence-debias",), "inlp_iterations": ("inlp",), "inlp_epsilon": ("inlp",),
                       "inlp_dev_fraction": ("inlp",), "self_debias_prefix": ("self-debias",),
                       "decay_constant": ("self-debias",), "self_debias_epsilon": ("self-debias",)}
