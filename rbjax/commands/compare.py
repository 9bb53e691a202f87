"""``rbjax compare A B --out DIR``: did the bias change? A paired comparison of two measured models on the same pairs.

The options besides the folders, ``--out`` and ``--bias`` are the fields of :class:`rbjax.lmb.config.CompareConfig`."""
from __future__ import annotations

from pathlib import Path

from rbjax.commands import HelpFormatter
from rbjax.commands.options import add_config_arguments, config_values
from rbjax.lmb.bbq_compare import compare_bbq, format_bbq_comparison, is_bbq_run
from rbjax.lmb.compare import compare_models, format_comparison
from rbjax.lmb.config import CompareConfig


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
                    "Writes OUT/compare.json, OUT/compare.csv, OUT/compare.png and OUT/<type>_changes.csv.",
        formatter_class=HelpFormatter)
    p.add_argument("a", metavar="A", help="measure output folder of model A (e.g. the debiased model); several seeds "
                                          "of one model: A1,A2,... (their per-pair effects are averaged)")
    p.add_argument("b", metavar="B", help="measure output folder of model B (e.g. the starting model); B1,B2,... "
                                          "for seeds")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--bias", action="append", metavar="BIAS",
                   help="bias type(s) to compare, comma-separated or repeated (default: every type both measured)")
    add_config_arguments(p, CompareConfig)
    p.set_defaults(func=run)


def run(args) -> int:
    config = CompareConfig(**config_values(args, CompareConfig))
    sides = [[f for f in x.split(",") if f] for x in (args.a, args.b)]
    bias = None if not args.bias else [t.strip() for x in args.bias for t in x.split(",") if t.strip()]
    if len(sides[0]) == len(sides[1]) == 1 and is_bbq_run(sides[0][0]) and is_bbq_run(sides[1][0]):
        res = compare_bbq(sides[0][0], sides[1][0], out_dir=args.out, categories=bias,
                          n_bootstrap=10000 if config.n_bootstrap is None else config.n_bootstrap,
                          alpha=0.05 if config.alpha is None else config.alpha, seed=config.seed,
                          labels=tuple(config.labels), allow_format_change=config.allow_format_change)
        print(format_bbq_comparison(res))
        print(f"\nwrote {Path(args.out) / 'compare_bbq.json'}")
        return 0
    res = compare_models(sides[0], sides[1], out_dir=args.out, config=config, bias_types=bias)
    print(format_comparison(res))
    out = Path(args.out)
    print(f"\nwrote {out / 'compare.json'}, {out / 'compare.csv'}, {out / 'compare.png'} and the per-pair "
          f"<type>_changes.csv in {out}")
    return 0
