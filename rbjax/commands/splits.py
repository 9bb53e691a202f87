"""``rbjax splits``: train / valid / test files from annotated phrases (paper §2.3; docs/data-building.md §3).

The options besides the inputs, the scoring model (``--model``, ``--tokenizer``, ``--batch-size``), ``--out-dir`` and
``--overwrite`` are the fields of :class:`rbjax.data.splits.SplitsConfig`."""
from __future__ import annotations

import argparse

from rbjax.commands.options import add_config_arguments, config_values
from rbjax.data.splits import SplitsConfig, make_splits
from rbjax.lmb import SCORING_BATCH_HELP, measure
from rbjax.specs import load_spec

#: the SplitsConfig fields that are options (swap_direction is a setting of the Python API only)
SPLITS_OPTIONS = ("train_size", "seed", "n_std", "ddof", "unknown", "swap_mode")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "splits",
        help="build train/valid/test files (released layout) from annotated phrases",
        description="Biased phrases -> train/held-out (0.6, gender 0.75, seed 1) -> counterfactuals -> pairwise "
                    "3-sigma outlier reduction with the perplexities of --model -> valid/test halves, written "
                    "in the released RedditBias layout under --out-dir (read by 'rbjax measure --data-dir').",
    )
    p.add_argument("--bias", required=True, metavar="NAME_OR_SPEC",
                   help="bias type (religion1 ... queerness) or a spec JSON file")
    p.add_argument("--annotated", required=True, help="annotated CSV (released layout or 'rbjax annotate import --out')")
    p.add_argument("--out-dir", required=True, help="root folder of the released layout to write")
    p.add_argument("--model", required=True, help="model for the outlier reduction: HF model folder or hub id (any supported family)")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder or hub id (default: the model folder)")
    p.add_argument("--batch-size", type=int, default=64, metavar="N", help=SCORING_BATCH_HELP + " (--model's scoring)")
    add_config_arguments(p, SplitsConfig, SPLITS_OPTIONS)
    p.add_argument("--overwrite", action="store_true",
                   help="replace files of this bias type under --out-dir that this command did not write (e.g. the "
                        "released RedditBias files); without it they are refused before anything is scored")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:

    spec = load_spec(args.bias)
    loaded: list = []

    def score_fn(phrases):  # the model is loaded on first use, after the inputs were checked
        if not loaded:
            loaded.append(measure.LoadedModel(args.model, args.tokenizer, args.batch_size))
        return measure.score_phrases(loaded[0], phrases)

    # make_splits checks the annotated file and --out-dir before the model is loaded
    res = make_splits(args.annotated, spec, args.out_dir, score_fn,
                      SplitsConfig(**config_values(args, SplitsConfig, SPLITS_OPTIONS)),
                      model=args.model if args.tokenizer is None else f"{args.model} (tokenizer {args.tokenizer})",
                      overwrite=args.overwrite)
    print(res.summary())
    for role, path in res.files.items():
        print(f"  {role}: {path}")
    return 0
