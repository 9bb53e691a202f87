"""``rbjax splits``: train / valid / test files from annotated phrases (paper §2.3; docs/data-building.md §3).

The options besides the inputs (:class:`SplitsCommand`), the scoring model (``--model``, ``--tokenizer``:
:class:`rbjax.commands.settings.ModelSource`; ``--batch-size``: :class:`rbjax.lmb.config.MeasureConfig`'s),
``--out-dir`` and ``--overwrite`` (:class:`rbjax.commands.settings.Output`) are the fields of
:class:`rbjax.data.splits.SplitsConfig`."""
from __future__ import annotations

import argparse
import dataclasses

from rbjax.commands.options import add_config_arguments, config_values
from rbjax.commands.settings import ModelSource, Output
from rbjax.core.config import field
from rbjax.data.splits import SplitsConfig, make_splits
from rbjax.lmb import measure
from rbjax.lmb.config import MeasureConfig
from rbjax.specs import load_spec

#: the SplitsConfig fields that are options (swap_direction is a setting of the Python API only)
SPLITS_OPTIONS = ("train_size", "seed", "n_std", "ddof", "unknown", "swap_mode")


@dataclasses.dataclass(frozen=True)
class SplitsCommand:
    """The inputs of ``rbjax splits`` (the output folder and ``--overwrite`` are
    :class:`rbjax.commands.settings.Output`'s, the scoring model :class:`~rbjax.commands.settings.ModelSource`'s, its
    batch size :class:`rbjax.lmb.config.MeasureConfig`'s)."""

    bias: str | None = field(None, "bias type (religion1 ... queerness) or a spec JSON file", metavar="NAME_OR_SPEC")
    annotated: str | None = field(None, "annotated CSV (released layout or 'rbjax annotate import --out')",
                                  metavar="ANNOTATED")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "splits",
        help="build train/valid/test files (released layout) from annotated phrases",
        description="Biased phrases -> train/held-out (0.6, gender 0.75, seed 1) -> counterfactuals -> pairwise "
                    "3-sigma outlier reduction with the perplexities of --model -> valid/test halves, written "
                    "in the released RedditBias layout under --out-dir (read by 'rbjax measure --data-dir').",
    )
    add_config_arguments(p, SplitsCommand, required=("bias", "annotated"))
    add_config_arguments(p, Output, ("out_dir",), required=("out_dir",))
    add_config_arguments(p, ModelSource, ("model", "tokenizer"), required=("model",))
    add_config_arguments(p, MeasureConfig, ("batch_size",))
    add_config_arguments(p, SplitsConfig, SPLITS_OPTIONS)
    add_config_arguments(p, Output, ("overwrite",))
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
