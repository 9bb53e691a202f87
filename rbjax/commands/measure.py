"""``rbjax measure``: language model bias (LMB) of a model on RedditBias (paper §3.1), CrowS-Pairs or a pair file."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from rbjax.commands import CLIError, HelpFormatter
from rbjax.commands.options import add_config_arguments, config_values
from rbjax.commands.settings import BenchmarkSource, ModelSource, Output, PlanSettings
from rbjax.core.config import field
from rbjax.core.io import check_output_dir
from rbjax.core.mesh import mesh_product
from rbjax.lmb.bbq import SUMMARY_FILE as BBQ_SUMMARY, format_bbq, measure_bbq
from rbjax.lmb.config import MeasureConfig
from rbjax.lmb.measure import format_table, measure_bias
from rbjax.lmb.pair_benchmark import SUMMARY_FILE, format_benchmark, measure_pair_benchmark
from rbjax.lmb.perplexity import SLOTS_PER_PHRASE
from rbjax.model.handle import ModelHandle
from rbjax.model.memory import plan_for_model

#: the MeasureConfig fields that are options of their own (``outlier_removal`` is ``--outlier-removal auto|on|off``)
MEASURE_OPTIONS = ("split", "batch_size", "precision", "mesh", "param_dtype", "seed", "bos", "n_std", "ddof", "alpha",
                   "n_bootstrap", "skip_unscorable", "allow_other_base")
#: the chat-format options (:class:`rbjax.model.chat.ChatSettings`), a group of their own
CHAT_OPTIONS = ("format", "role", "system", "prompt", "score_end_of_turn", "chat_template")


@dataclasses.dataclass(frozen=True)
class MeasureCommand:
    """The options of ``rbjax measure`` besides :class:`MeasureConfig` and the shared blocks
    (:mod:`rbjax.commands.settings`): the stored perplexities instead of a model, the outlier rule as a word, and
    ``--resume``."""

    stored_perplexities: bool = field(False, "no model: use the perplexity columns of the released files "
                                             "(DialoGPT-small)")
    outlier_removal: str = field("auto", MeasureConfig.__dataclass_fields__["outlier_removal"].metadata["help"],
                                 choices=("auto", "on", "off"))
    resume: bool = field(False, "reuse the per-type CSVs of an earlier run in --out whose inputs are all the same "
                                "(model and tokenizer file contents, data files, split, --bos, --precision, scoring "
                                "settings); any type whose inputs differ is scored again, never relabelled")


def register(sub) -> None:

    p = sub.add_parser(
        "measure", help="measure language model bias (LMB) on the RedditBias phrase pairs, CrowS-Pairs or a pair file",
        description="Perplexity of every biased phrase and its counterfactual, 3σ outlier pairs removed, "
                    "two-tailed paired t-test (negative t = stereotypical). Writes OUT/lmb.json, "
                    "OUT/<bias_type>_perplexities.csv and OUT/lmb.png. --benchmark crows-pairs / pairs: the same per "
                    "category, plus lm-evaluation-harness's pct_stereotype and likelihood_diff (OUT/benchmark.json, "
                    "OUT/<category>_loglikelihoods.csv beside the measure files; docs/pairs.md). --benchmark bbq: "
                    "accuracy and bias scores in two conventions (OUT/<category>_bbq.csv, OUT/benchmark.json; "
                    "docs/bbq.md).",
        formatter_class=HelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    add_config_arguments(src, ModelSource, ("model",))
    add_config_arguments(src, MeasureCommand, ("stored_perplexities",))
    add_config_arguments(p, BenchmarkSource)
    add_config_arguments(p, Output, ("out",), overrides={"out": {"default": "results"}})
    add_config_arguments(p, ModelSource, ("tokenizer", "adapter"))
    add_config_arguments(p, PlanSettings)
    add_config_arguments(p, MeasureConfig, MEASURE_OPTIONS)
    add_config_arguments(p.add_argument_group("chat format (docs/chat.md)"), MeasureConfig, CHAT_OPTIONS)
    add_config_arguments(p, MeasureCommand, ("outlier_removal", "resume"))
    add_config_arguments(p, Output, ("overwrite", "progress"))
    p.set_defaults(func=run)


def run(args) -> int:
    if not args.dry_run and args.out is not None:
        check_output_dir(args.out, "--out")  # a bad --out fails before the model is even read
    config = MeasureConfig(**config_values(args, MeasureConfig, MEASURE_OPTIONS + CHAT_OPTIONS),  # checked first
                           outlier_removal={"auto": None, "on": True, "off": False}[args.outlier_removal])
    model = None
    if args.model is not None:  # the plan before any weight is read; refuses what cannot fit
        # one handle for the plan, the keys and the loader: --model resolved and its config.json read once
        model = ModelHandle.open(args.model, args.tokenizer)
        # a batch: batch_size × SLOTS_PER_PHRASE token slots, planned as rows of 64 (the chat format: rows of up to
        # 256, which hold the template's shared prefix once)
        row = 256 if args.format == "chat" else 64
        plan = plan_for_model(model, mesh=args.mesh, training=False,
                              batch_size=max(1, args.batch_size * SLOTS_PER_PHRASE // row), seq_len=row,
                              precision=args.precision, param_dtype=args.param_dtype,
                              device_memory_gb=args.device_memory_gb,
                              n_devices=mesh_product(args.mesh) if args.dry_run and args.mesh else None)
        if args.dry_run:
            print(plan.format())
        plan.check(printed=args.dry_run)  # a plan that does not fit is an error (exit 1), --dry-run too
        if args.dry_run:
            return 0
    elif args.dry_run:
        raise ValueError("--dry-run plans a model's memory: give --model")
    if args.benchmark == "bbq":
        return _run_bbq(args, config, model)
    if args.benchmark != "redditbias":
        return _run_pair_benchmark(args, config, model)
    if args.pairs is not None:
        raise CLIError("--pairs FILE is read with --benchmark pairs")
    records = measure_bias(
        model=model, bias_types=",".join(args.bias) if args.bias else "all", config=config,
        data_dir=args.data_dir, out_dir=args.out, tokenizer=None if model is not None else args.tokenizer,
        stored_perplexities=args.stored_perplexities, resume=args.resume, progress=args.progress,
        overwrite=args.overwrite, adapter=args.adapter)
    print(format_table(records))
    out = Path(args.out)
    csvs = ", ".join(f"{r['bias_type']}_perplexities.csv" for r in records)
    print(f"\nwrote {out / 'lmb.json'}, {out / 'lmb.png'} and, in {out}: {csvs}")
    return 0


def _run_pair_benchmark(args, config: MeasureConfig, model: ModelHandle | None) -> int:
    """``--benchmark crows-pairs`` / ``--benchmark pairs``: :func:`rbjax.lmb.pair_benchmark.measure_pair_benchmark`."""
    if args.stored_perplexities:
        raise CLIError(f"--stored-perplexities is RedditBias's (its released perplexity columns); --benchmark "
                       f"{args.benchmark} needs --model")
    res = measure_pair_benchmark(
        model, args.benchmark, config, pairs_file=args.pairs,
        categories=",".join(args.bias) if args.bias else "all", data_dir=args.data_dir,
        out_dir=args.out, resume=args.resume, progress=args.progress, overwrite=args.overwrite,
        adapter=args.adapter)
    print(format_benchmark(res))
    out = Path(args.out)
    print(f"\nwrote {out / 'lmb.json'}, {out / SUMMARY_FILE}, {out / 'lmb.png'} and, per category, "
          f"<category>_perplexities.csv and <category>_loglikelihoods.csv in {out}")
    return 0


def _run_bbq(args, config: MeasureConfig, model: ModelHandle | None) -> int:
    """``--benchmark bbq``: :func:`rbjax.lmb.bbq.measure_bbq`."""
    if args.stored_perplexities or args.pairs is not None:
        raise CLIError("--benchmark bbq needs --model (and reads its rows from --data-dir or the download, not "
                       "--pairs / --stored-perplexities)")
    summary = measure_bbq(model, config, categories=",".join(args.bias) if args.bias else "all",
                          data_dir=args.data_dir, out_dir=args.out, resume=args.resume,
                          progress=args.progress, overwrite=args.overwrite, adapter=args.adapter)
    print(format_bbq(summary))
    out = Path(args.out)
    print(f"\nwrote {out / BBQ_SUMMARY} and, per category, <category>_bbq.csv in {out}")
    return 0
