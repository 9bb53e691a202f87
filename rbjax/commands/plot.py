"""``rbjax plot``: Figure-1-style t-value plot from one or more ``rbjax measure`` result folders."""
from __future__ import annotations

from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("plot", help="plot LMB t-values of one or more result folders (paper Figure 1)")
    p.add_argument("folders", nargs="+", help="result folders (each with lmb.json); label with LABEL=FOLDER")
    p.add_argument("--out", default="lmb.png", help="output PNG")
    p.add_argument("--alpha", type=float, default=0.05)
    p.set_defaults(func=run)


def run(args) -> int:
    from rbjax.report.plot import load_results, plot_lmb

    results = {}
    for f in args.folders:
        label, _, path = f.rpartition("=") if "=" in f else (Path(f).name, "", f)
        results[label] = load_results(path)
    out = plot_lmb(results, args.out, alpha=args.alpha)
    print(f"wrote {out}")
    return 0
