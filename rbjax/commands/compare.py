"""``rbjax compare A B --out DIR``: did the bias change? A paired comparison of two measured models on the same pairs.

The options besides the folders and ``--bias`` (:class:`CompareCommand`) and ``--out``
(:class:`rbjax.commands.settings.Output`) are the fields of :class:`rbjax.lmb.config.CompareConfig`.
Two ``rbjax measure --benchmark bbq`` runs are compared by :func:`rbjax.lmb.bbq_compare.compare_bbq` (``--bias``
names categories); a CompareConfig field it does not take (:data:`BBQ_FIELDS`), given another value than its
default, is refused rather than ignored."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from rbjax.commands import HelpFormatter
from rbjax.commands.options import add_config_arguments, config_values
from rbjax.commands.settings import Output
from rbjax.core.config import field
from rbjax.lmb.bbq_compare import compare_bbq, format_bbq_comparison, is_bbq_run
from rbjax.lmb.compare import compare_models, format_comparison
from rbjax.lmb.config import CompareConfig


@dataclasses.dataclass(frozen=True)
class CompareCommand:
    """What ``rbjax compare`` compares: the two sides' measure folders and the bias types (``--out`` is
    :class:`rbjax.commands.settings.Output`'s, the statistics :class:`CompareConfig`)."""

    a: str | None = field(None, "measure output folder of model A (e.g. the debiased model); several seeds of one "
                                "model: A1,A2,... (their per-pair effects are averaged)", positional=True, metavar="A")
    b: str | None = field(None, "measure output folder of model B (e.g. the starting model); B1,B2,... for seeds",
                          positional=True, metavar="B")
    bias: tuple[str, ...] | None = field(None, "bias type(s) to compare, comma-separated or repeated (default: every "
                                               "type both measured; BBQ runs: categories)", repeat=True,
                                         metavar="BIAS")


def register(sub) -> None:
    p = sub.add_parser(
        "compare", help="paired comparison of two 'rbjax measure' results on the same pairs (did debiasing work?)",
        description="Per bias type, the per-pair change d = [log ppl(biased) − log ppl(counterfactual)] under A minus "
                    "the same under B, on the pairs both runs kept: paired t-test and Wilcoxon signed-rank test of d, "
                    "the mean change with a bootstrap CI, the share of pairs whose sign flipped, p-values corrected "
                    "across the types compared. d > 0: A lies toward the anti-stereotypical side of B; each side's own mean "
                    "effect is printed, and the verdict says whether the bias moved toward zero, past zero or away "
                    "from it. Runs whose pairs differ (pair "
                    "phrases, data files, split, outlier handling, tokenizer, BOS, format) are refused with the reason. "
                    "Writes OUT/compare.json, OUT/compare.csv, OUT/compare.png and OUT/<type>_changes.csv. Two "
                    "'rbjax measure --benchmark bbq' runs of the same rows: per category, the exact McNemar test of "
                    "the per-row correctness (Bonferroni across the categories) and the change of each accuracy and "
                    "bias score with a paired bootstrap CI, each side's score beside it and whether it moved toward "
                    "zero, past zero or away (OUT/compare_bbq.json; docs/bbq.md).",
        formatter_class=HelpFormatter)
    add_config_arguments(p, CompareCommand, ("a", "b"))
    add_config_arguments(p, Output, ("out",), required=("out",))
    add_config_arguments(p, CompareCommand, ("bias",))
    add_config_arguments(p, CompareConfig)
    p.set_defaults(func=run)


#: the CompareConfig fields a BBQ comparison takes (:func:`rbjax.lmb.bbq_compare.compare_bbq`'s arguments)
BBQ_FIELDS = ("alpha", "n_bootstrap", "seed", "labels", "allow_format_change")


def _bbq_settings(config: CompareConfig) -> dict:
    """compare_bbq's arguments from ``config``.

    Raises:
        ValueError: a CompareConfig field that a BBQ comparison has no use for, set to another value than its
            default (named by its flag).
    """
    for f in dataclasses.fields(CompareConfig):
        if f.name not in BBQ_FIELDS and getattr(config, f.name) != f.default:
            raise ValueError(f"--{f.name.replace('_', '-')} does not apply to a comparison of two BBQ runs (it takes "
                             f"{', '.join('--' + x.replace('_', '-') for x in BBQ_FIELDS)})")
    kw = {k: getattr(config, k) for k in BBQ_FIELDS}
    kw["labels"] = tuple(kw["labels"]) if kw["labels"] else None
    return kw


def run(args) -> int:
    config = CompareConfig(**config_values(args, CompareConfig))
    sides = [[f for f in x.split(",") if f] for x in (args.a, args.b)]
    bias = None if not args.bias else [t.strip() for x in args.bias for t in x.split(",") if t.strip()]
    bbq = [f for side in sides for f in side if is_bbq_run(f)]
    if bbq:
        if len(sides[0]) != 1 or len(sides[1]) != 1:
            raise ValueError("a BBQ comparison takes one run on each side (A and B: one 'rbjax measure --benchmark "
                             "bbq' folder each); several seeds of a model (A1,A2,...) are compared one at a time")
        if len(bbq) != 2:
            other = next(f for side in sides for f in side if f not in bbq)
            raise ValueError(f"{bbq[0]} is a BBQ run but {other} is not: compare two 'rbjax measure --benchmark "
                             "bbq' runs of the same rows")
        res = compare_bbq(sides[0][0], sides[1][0], out_dir=args.out, categories=bias, **_bbq_settings(config))
        print(format_bbq_comparison(res))
        print(f"\nwrote {Path(args.out) / 'compare_bbq.json'}")
        return 0
    res = compare_models(sides[0], sides[1], out_dir=args.out, config=config, bias_types=bias)
    print(format_comparison(res))
    out = Path(args.out)
    print(f"\nwrote {out / 'compare.json'}, {out / 'compare.csv'}, {out / 'compare.png'} and the per-pair "
          f"<type>_changes.csv in {out}")
    return 0
