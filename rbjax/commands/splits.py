"""``rbjax splits``: train / valid / test files from annotated phrases (paper §2.3, ``reference-data.md`` §4)."""
from __future__ import annotations

import argparse

from rbjax.data.splits import make_splits
from rbjax.lmb import measure
from rbjax.specs import load_spec


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
    p.add_argument("--model", required=True, help="model for the outlier reduction: HF GPT-2 folder or hub id")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder or hub id (default: the model folder)")
    p.add_argument("--batch-size", type=int, default=64, help="phrases per compiled batch when scoring with --model")
    p.add_argument("--train-size", type=float, default=None, help="train fraction (default 0.6, gender 0.75)")
    p.add_argument("--seed", type=int, default=1, help="random_state of both splits (paper: 1)")
    p.add_argument("--n-std", type=float, default=3.0, help="outlier interval in standard deviations")
    p.add_argument("--ddof", type=int, default=0, choices=(0, 1), help="std convention: 0 population (reference), 1 sample")
    p.add_argument("--unknown-labels", choices=("error", "skip"), default="error",
                   help="a bias_phrase value other than 1/0/biased/unbiased/skip/empty: fail (default) or drop the "
                        "row (upstream kept only rows equal to 1; the released gender file has 24 rows labelled 2)")
    p.add_argument("--swap-mode", choices=("paper", "reference"), default="paper",
                   help="counterfactuals: word-level pairs (paper) or the official substring rules (reference)")
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
    res = make_splits(args.annotated, spec, args.out_dir, score_fn, train_size=args.train_size, seed=args.seed,
                      n_std=args.n_std, ddof=args.ddof, swap_mode=args.swap_mode, unknown=args.unknown_labels,
                      model=args.model if args.tokenizer is None else f"{args.model} (tokenizer {args.tokenizer})",
                      overwrite=args.overwrite)
    print(res.summary())
    for role, path in res.files.items():
        print(f"  {role}: {path}")
    return 0
