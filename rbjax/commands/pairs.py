"""``rbjax pairs``: a benchmark's pairs written in the pair-file format (docs/pairs.md): a RedditBias split, CrowS-Pairs,
or any CSV in CrowS-Pairs' layout (a translated or corrected copy)."""
from __future__ import annotations

import dataclasses

from rbjax.commands import CLIError, HelpFormatter
from rbjax.commands.options import add_config_arguments
from rbjax.commands.settings import BENCHMARKS, BenchmarkSource, Output
from rbjax.core.config import field
from rbjax.core.io import check_output_file
from rbjax.core.reuse import claim_outputs, record_outputs
from rbjax.data.pairs import CROWS_PAIRS, load_crows_pairs, read_crows_pairs_layout, redditbias_as_pairs, write_pair_file
from rbjax.lmb.config import MeasureConfig


@dataclasses.dataclass(frozen=True)
class PairsCommand:
    """The option of ``rbjax pairs`` besides the shared blocks (:mod:`rbjax.commands.settings`: --out, --overwrite,
    --benchmark, --bias, --data-dir; --split is :class:`rbjax.lmb.config.MeasureConfig`'s): a CSV in CrowS-Pairs'
    layout."""

    crows_pairs_csv: str | None = field(None, "a CSV in CrowS-Pairs' layout (sent_more, sent_less, stereo_antistereo, "
                                              "bias_type), e.g. a translation: converted without a checksum (implies "
                                              "--benchmark crows-pairs)", metavar="FILE")


def register(sub) -> None:
    p = sub.add_parser(
        "pairs", help="write a benchmark's pairs as a pair file (CSV/JSONL) for 'rbjax measure --benchmark pairs'",
        description="Writes the pairs of RedditBias (a split: sentence_1 = the biased phrase, sentence_2 its "
                    "counterfactual, stereotypical = 1, category = the bias type), of CrowS-Pairs (as upstream "
                    "metric.py reads it: sent_more is the stereotype-consistent sentence), or of a CSV in CrowS-Pairs' "
                    "layout (--crows-pairs-csv, not checksummed) in the pair-file format of docs/pairs.md.",
        formatter_class=HelpFormatter)
    add_config_arguments(p, Output, ("out",), required=("out",),
                         overrides={"out": {"metavar": "FILE", "help": "the pair file to write: .csv or .jsonl"}})
    add_config_arguments(p, BenchmarkSource, ("benchmark", "bias", "data_dir"),
                         overrides={"benchmark": {"choices": BENCHMARKS[:2]}})
    add_config_arguments(p, MeasureConfig, ("split",))
    add_config_arguments(p, PairsCommand)
    add_config_arguments(p, Output, ("overwrite",))
    p.set_defaults(func=run)


def run(args) -> int:
    out = check_output_file(args.out, "--out")
    if args.crows_pairs_csv is not None:
        if args.data_dir or args.bias or args.split != "test":
            raise CLIError("--crows-pairs-csv reads that file alone: --data-dir, --bias and --split do not apply")
        pf = read_crows_pairs_layout(args.crows_pairs_csv)
    elif args.benchmark == CROWS_PAIRS:
        if args.bias or args.split != "test":
            raise CLIError("--bias and --split are RedditBias settings; CrowS-Pairs is written whole")
        pf = load_crows_pairs(args.data_dir)
    else:
        bias = "all" if not args.bias else ",".join(args.bias)
        pf = redditbias_as_pairs(bias, args.split, args.data_dir)
    key = {"command": "pairs", "benchmark": pf.benchmark, "source": str(pf.path), "n_pairs": len(pf),
           "categories": pf.category_names()}
    claim_outputs([out], key, overwrite=args.overwrite)
    write_pair_file(pf, out)
    record_outputs([out], key)
    print(f"wrote {len(pf)} pairs ({', '.join(f'{c}: {pf.categories.count(c)}' for c in pf.category_names())}) "
          f"to {out}")
    for n in pf.notes:
        print(f"note: {n}")
    return 0
