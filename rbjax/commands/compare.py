"""``rbjax compare A B --out DIR``: did the bias change? A paired comparison of two measured models on the same pairs."""
from __future__ import annotations

from pathlib import Path

from rbjax.commands import CLIError, HelpFormatter
from rbjax.lmb.compare import compare_models, format_comparison


def register(sub) -> None:
    p = sub.add_parser(
        "compare", help="paired comparison of two 'rbjax measure' results on the same pairs (did debiasing work?)",
        description="Per bias type, the per-pair change d = [log ppl(biased) − log ppl(counterfactual)] under A minus "
                    "the same under B, on the pairs both runs kept: paired t-test and Wilcoxon signed-rank test of d, "
                    "the mean change with a bootstrap CI, the share of pairs whose sign flipped, p-values corrected "
                    "across the types compared. d > 0: A is less stereotypical than B. Runs whose pairs differ (pair "
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
    p.add_argument("--alpha", type=float, default=None,
                   help="significance level (default: the runs' own alpha); the CI level is 1 - alpha")
    p.add_argument("--n-bootstrap", type=int, default=None,
                   help="bootstrap resamples of the CI (default: the runs' own n_bootstrap; 0: no CI)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument("--labels", default="A,B", metavar="LABEL_A,LABEL_B", help="names of A and B in the output")
    p.add_argument("--allow-format-change", action="store_true",
                   help="compare runs measured in different formats of the pairs (--format raw vs chat, or two chat "
                        "settings: does the chat format change the bias?); the output says that it compares formats")
    p.set_defaults(func=run)


def run(args) -> int:
    labels = tuple(x.strip() for x in args.labels.split(","))
    if len(labels) != 2 or not all(labels):
        raise CLIError(f"--labels {args.labels!r}: expected two names, LABEL_A,LABEL_B")
    if args.n_bootstrap is not None and args.n_bootstrap < 0:
        raise CLIError(f"--n-bootstrap must be >= 0, got {args.n_bootstrap}")
    sides = [[f for f in x.split(",") if f] for x in (args.a, args.b)]
    bias = None if not args.bias else [t.strip() for x in args.bias for t in x.split(",") if t.strip()]
    res = compare_models(sides[0], sides[1], out_dir=args.out, bias_types=bias, alpha=args.alpha,
                         n_bootstrap=args.n_bootstrap, seed=args.seed, labels=labels,
                         allow_format_change=args.allow_format_change)
    print(format_comparison(res))
    out = Path(args.out)
    print(f"\nwrote {out / 'compare.json'}, {out / 'compare.csv'}, {out / 'compare.png'} and the per-pair "
          f"<type>_changes.csv in {out}")
    return 0
