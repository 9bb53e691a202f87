"""The option blocks several commands share, as small settings dataclasses of the command line (their fields carry
the one default and the one help text of each option; :func:`rbjax.commands.options.add_config_arguments` turns them
into options, and a command picks the fields it takes and, where it must, marks one required or specialises it).

* :class:`ModelSource` — ``--model``, ``--tokenizer``, ``--adapter`` (measure, evaluate, splits);
* :class:`Output` — ``--out`` / ``--out-dir``, ``--overwrite``, ``--no-progress`` (every command that writes);
* :class:`PlanSettings` — ``--dry-run``, ``--device-memory-gb`` (measure, debias, sweep, evaluate, run);
* :class:`BenchmarkSource` — ``--benchmark``, ``--bias``, ``--pairs``, ``--data-dir`` (measure, pairs).

The executor block (``--executor``, ``--jobs``, ``--ray-address``) is :class:`rbjax.core.parallel.Executor`, a
setting of the Python API too. These classes hold what the command line gives; a command passes the values on to the
Python API, whose own settings classes (e.g. :class:`rbjax.lmb.config.MeasureConfig`) check them.
"""
from __future__ import annotations

import dataclasses

from rbjax.core.config import field
from rbjax.model.handle import MODEL_HELP, TOKENIZER_HELP
from rbjax.model.memory import DEVICE_MEMORY_HELP

__all__ = ["ModelSource", "Output", "PlanSettings", "BenchmarkSource", "BENCHMARKS", "PROGRESS_HELP"]

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
