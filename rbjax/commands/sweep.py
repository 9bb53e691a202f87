"""``rbjax sweep``: the paper's 54-point grid for one method and bias type, selected on the validation split."""
from __future__ import annotations

import argparse


def _floats(s: str) -> tuple[float, ...]:
    try:
        v = tuple(float(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of numbers, got {s!r}") from None
    if not v:
        raise argparse.ArgumentTypeError("empty list")
    return v


def _ints(s: str) -> tuple[int, ...]:
    v = _floats(s)
    if any(x != int(x) or x < 1 for x in v):
        raise argparse.ArgumentTypeError(f"expected a comma list of positive integers, got {s!r}")
    return tuple(int(x) for x in v)


def register(sub) -> None:
    from rbjax.commands.debias import add_training_arguments

    p = sub.add_parser(
        "sweep", help="run the paper's hyper-parameter grid for one method and bias type and select on the valid split",
        description="Batch {4,8,16} x accumulation {1,5,8} x λ_LM {0.001,0.01} x λ_D {10,50,100} (54 runs; 9 for cda), "
                    "each trained from the same model and seed, then LMB on the valid split and the Reddit-6K "
                    "perplexity. Records OUT/sweep.jsonl (a killed sweep resumes), OUT/sweep.csv and "
                    "OUT/selection.json with two selections: the reference rule (highest dev ttest_rel p-value) and "
                    "rbjax's default (smallest |dev t| among runs whose LMP is within --lmp-tolerance of the "
                    "starting model's). See docs/debiasing.md.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_training_arguments(p, grid=True)
    p.add_argument("--batch-sizes", type=_ints, default=(4, 8, 16), help="grid axis")
    p.add_argument("--grad-accums", type=_ints, default=(1, 5, 8), help="grid axis")
    p.add_argument("--lambda-lms", type=_floats, default=(0.001, 0.01), help="grid axis")
    p.add_argument("--lambda-ds", type=_floats, default=(10.0, 50.0, 100.0), help="grid axis")
    p.add_argument("--lmp-tolerance", type=float, default=0.10,
                   help="default rule: allowed relative LMP increase over the starting model")
    p.add_argument("--max-points", type=int, help="run only the first N grid points (smoke runs)")
    p.add_argument("--keep-point-checkpoints", action="store_true", help="keep every point's checkpoints")
    p.add_argument("--n-bootstrap", type=int, default=1000)
    p.add_argument("--dev-max-pairs", type=int, help="score only the first N valid pairs (smoke runs)")
    p.add_argument("--final", choices=["none", "default", "reference", "both"], default="none",
                   help="retrain the selected run(s) with export and full evaluation into OUT/selected_<rule>")
    p.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    from rbjax.commands.debias import config_from_args
    from rbjax.debias.sweep import format_selection, run_sweep

    if args.overwrite:
        import shutil

        for name in ("sweep.jsonl", "sweep.csv", "selection.json", "baseline.json", "sweep_settings.json", "points"):
            p = Path(args.out) / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    base = config_from_args(args, batch_size=args.batch_sizes[0], grad_accum=args.grad_accums[0],
                            lambda_lm=args.lambda_lms[0], lambda_d=args.lambda_ds[0])
    grid = {"batch_size": args.batch_sizes, "grad_accum": args.grad_accums, "lambda_lm": args.lambda_lms,
            "lambda_d": args.lambda_ds}
    sel = run_sweep(base, args.out, grid=grid, lmp_tolerance=args.lmp_tolerance,
                    keep_checkpoints=args.keep_point_checkpoints, max_points=args.max_points,
                    n_bootstrap=args.n_bootstrap, final=args.final, dev_max_pairs=args.dev_max_pairs,
                    progress=not args.no_progress)
    print(format_selection(sel))
    print(f"\nwrote {Path(args.out) / 'selection.json'}, {Path(args.out) / 'sweep.csv'}, {Path(args.out) / 'sweep.jsonl'}")
    return 0
