"""``rbjax measure``: language model bias (LMB) of a model on RedditBias (paper §3.1)."""
from __future__ import annotations

import argparse

BIAS_CHOICES = ["religion1", "religion2", "race", "gender", "queerness", "orientation", "all"]


def register(sub) -> None:
    p = sub.add_parser(
        "measure", help="measure language model bias (LMB) on the RedditBias phrase pairs",
        description="Perplexity of every biased phrase and its counterfactual, 3σ outlier pairs removed, "
                    "two-tailed paired t-test (negative t = stereotypical). Writes OUT/lmb.json, "
                    "OUT/<bias_type>_perplexities.csv and OUT/lmb.png.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="HF GPT-2 folder or hub id, e.g. microsoft/DialoGPT-small")
    src.add_argument("--stored-perplexities", action="store_true",
                     help="no model: use the perplexity columns of the released files (DialoGPT-small)")
    p.add_argument("--bias", default="all", help=f"bias type(s), comma-separated: {', '.join(BIAS_CHOICES)}, or a bias-spec JSON file of your own")
    p.add_argument("--split", default="test", choices=["test", "valid", "valid+test"])
    p.add_argument("--out", default="results", help="output folder")
    p.add_argument("--data-dir", help="RedditBias data folder (default: $RBJAX_DATA_DIR, else download & cache)")
    p.add_argument("--tokenizer", help="tokenizer folder or hub id (default: the model folder)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument("--bos", action="store_true", help="prepend <|endoftext|> and score every token (reference: off)")
    p.add_argument("--n-std", type=float, default=3.0, help="outlier interval width in standard deviations")
    p.add_argument("--ddof", type=int, default=0, choices=[0, 1], help="std convention: 0 population (reference), 1 sample")
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--n-bootstrap", type=int, default=10000)
    p.add_argument("--outlier-removal", choices=["auto", "on", "off"], default="auto",
                   help="3σ outlier-pair removal before the primary test; auto = on for a model, off for "
                        "--stored-perplexities (the released files were already reduced with those values)")
    p.add_argument("--skip-unscorable", action="store_true", help="exclude pairs with a phrase of < 2 tokens instead of failing")
    p.add_argument("--resume", action="store_true",
                   help="reuse the per-type CSVs of an interrupted run in --out (same model, tokenizer, split, --bos)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    from rbjax.lmb.measure import format_table, measure_bias

    records = measure_bias(
        model=args.model, bias_types=args.bias, split=args.split, data_dir=args.data_dir,
        tokenizer=args.tokenizer, out_dir=args.out, batch_size=args.batch_size, seed=args.seed, bos=args.bos,
        stored_perplexities=args.stored_perplexities, n_std=args.n_std, ddof=args.ddof, alpha=args.alpha,
        n_bootstrap=args.n_bootstrap, skip_unscorable=args.skip_unscorable,
        outlier_removal={"auto": None, "on": True, "off": False}[args.outlier_removal], resume=args.resume, progress=not args.no_progress)
    print(format_table(records))
    print(f"\nwrote {args.out}/lmb.json, {args.out}/<bias_type>_perplexities.csv, {args.out}/lmb.png")
    return 0
