"""``rbjax measure``: language model bias (LMB) of a model on RedditBias (paper §3.1), CrowS-Pairs or a pair file."""
from __future__ import annotations

from pathlib import Path

from rbjax.commands import CLIError, HelpFormatter
from rbjax.commands.options import add_config_arguments, config_values
from rbjax.core.io import check_output_dir
from rbjax.core.mesh import mesh_product
from rbjax.lmb.bbq import SUMMARY_FILE as BBQ_SUMMARY, format_bbq, measure_bbq
from rbjax.lmb.config import MeasureConfig
from rbjax.lmb.measure import format_table, measure_bias
from rbjax.lmb.pair_benchmark import SUMMARY_FILE, format_benchmark, measure_pair_benchmark
from rbjax.lmb.perplexity import SLOTS_PER_PHRASE
from rbjax.model.handle import ModelHandle
from rbjax.model.memory import plan_for_model

BIAS_CHOICES = ["religion1", "religion2", "race", "gender", "queerness", "orientation", "all"]
#: the MeasureConfig fields that are options of their own (``outlier_removal`` is ``--outlier-removal auto|on|off``)
MEASURE_OPTIONS = ("split", "batch_size", "precision", "mesh", "param_dtype", "seed", "bos", "n_std", "ddof", "alpha",
                   "n_bootstrap", "skip_unscorable", "allow_other_base")
#: the chat-format options (:class:`rbjax.model.chat.ChatSettings`), a group of their own
CHAT_OPTIONS = ("format", "role", "system", "prompt", "score_end_of_turn", "chat_template")


def register(sub) -> None:

    p = sub.add_parser(
        "measure", help="measure language model bias (LMB) on the RedditBias phrase pairs, CrowS-Pairs or a pair file",
        description="Perplexity of every biased phrase and its counterfactual, 3σ outlier pairs removed, "
                    "two-tailed paired t-test (negative t = stereotypical). Writes OUT/lmb.json, "
                    "OUT/<bias_type>_perplexities.csv and OUT/lmb.png. --benchmark crows-pairs / pairs: the same per "
                    "category, plus lm-evaluation-harness's pct_stereotype and likelihood_diff (docs/pairs.md).",
        formatter_class=HelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="HF model folder (GPT-2, Llama/Mistral/Qwen2, GPT-NeoX, Gemma 2), hub id (e.g. "
                     "microsoft/DialoGPT-small, Qwen/Qwen2.5-0.5B-Instruct) or finished rbjax debias run folder")
    src.add_argument("--stored-perplexities", action="store_true",
                     help="no model: use the perplexity columns of the released files (DialoGPT-small)")
    p.add_argument("--bias", action="append", metavar="BIAS",
                   help=f"bias type(s): {', '.join(BIAS_CHOICES)}, or a bias-spec JSON file of your own; "
                        "comma-separated or repeated (default: all); with --benchmark crows-pairs or pairs: the "
                        "categories to measure")
    p.add_argument("--benchmark", choices=("redditbias", "crows-pairs", "pairs", "bbq"), default="redditbias",
                   help="redditbias: the paper's LMB; crows-pairs: CrowS-Pairs (nyu-mll/crows-pairs, verified; "
                        "--data-dir its folder); pairs: the pair file --pairs FILE (docs/pairs.md). The pair "
                        "benchmarks are reported in two conventions: lm-evaluation-harness's (pct_stereotype, "
                        "likelihood_diff) and rbjax's LMB statistics, per category (OUT/benchmark.json, "
                        "OUT/<category>_loglikelihoods.csv beside the measure files); bbq: BBQ, multiple choice by "
                        "log-likelihood as lm-evaluation-harness's bbq task, accuracy and bias scores in two "
                        "conventions (OUT/<category>_bbq.csv, OUT/benchmark.json; docs/bbq.md; --data-dir: any folder "
                        "of BBQ .jsonl files, default the verified nyu-mll/BBQ files; --bias: categories)")
    p.add_argument("--pairs", metavar="FILE", help="the pair file of --benchmark pairs (.csv or .jsonl: id, "
                                                   "category, sentence_1, sentence_2, stereotypical)")
    p.add_argument("--out", default="results", help="output folder")
    p.add_argument("--data-dir", help="RedditBias data folder laid out like umanlp/RedditBias "
                                      "(default: $RBJAX_DATA_DIR, else download from the pinned commit and cache); "
                                      "with --benchmark crows-pairs: a folder holding crows_pairs_anonymized.csv "
                                      "(default: $RBJAX_CROWS_PAIRS_DIR, else the verified download)")
    p.add_argument("--tokenizer", help="tokenizer folder or hub id (default: the model folder)")
    p.add_argument("--adapter", metavar="FOLDER",
                   help="a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors: rbjax's "
                        "OUT/adapter, or one trained elsewhere) scored on --model, the base, without merging")
    p.add_argument("--device-memory-gb", type=float, metavar="GB",
                   help="memory of one device for the memory plan (default: what the device reports; a CPU reports "
                        "none and is not checked)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the memory plan (per-device parameters, activations) and stop, loading no weights; "
                        "exit status 1 when it does not fit")
    add_config_arguments(p, MeasureConfig, MEASURE_OPTIONS)
    add_config_arguments(p.add_argument_group("chat format (docs/chat.md)"), MeasureConfig, CHAT_OPTIONS)
    p.add_argument("--outlier-removal", dest="outlier_removal", choices=["auto", "on", "off"], default="auto",
                   help=MeasureConfig.__dataclass_fields__["outlier_removal"].metadata["help"])
    p.add_argument("--resume", action="store_true",
                   help="reuse the per-type CSVs of an earlier run in --out whose inputs are all the same (model and "
                        "tokenizer file contents, data files, split, --bos, --precision, scoring settings); any "
                        "type whose inputs differ is scored again, never relabelled")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the results of another run in --out (another model, data, bias types or settings) "
                        "or files rbjax did not write; without it such a folder is refused before anything is scored")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
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
        stored_perplexities=args.stored_perplexities, resume=args.resume, progress=not args.no_progress,
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
        out_dir=args.out, resume=args.resume, progress=not args.no_progress, overwrite=args.overwrite,
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
                          progress=not args.no_progress, overwrite=args.overwrite, adapter=args.adapter)
    print(format_bbq(summary))
    out = Path(args.out)
    print(f"\nwrote {out / BBQ_SUMMARY} and, per category, <category>_bbq.csv in {out}")
    return 0
