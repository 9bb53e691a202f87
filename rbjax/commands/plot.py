"""``rbjax plot``: Figure-1-style t-value plot from one or more ``rbjax measure`` result folders (the options besides
the folders, ``--out`` and ``--overwrite`` are the fields of :class:`rbjax.lmb.config.PlotConfig`)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from rbjax.commands import HelpFormatter
from rbjax.commands.options import add_config_arguments, config_values
from rbjax.core.io import check_output_file
from rbjax.core.keys import digest
from rbjax.core.reuse import claim_outputs, record_outputs
from rbjax.lmb.config import PlotConfig
from rbjax.lmb.plot import load_results, plot_lmb


def register(sub) -> None:

    p = sub.add_parser(
        "plot", help="plot LMB t-values of one or more result folders (paper Figure 1)",
        description="One bar per result folder and bias type: the primary t-value of its lmb.json (t < 0: "
                    "stereotypical), solid and starred when p < alpha, hatched otherwise, 'n/a' where a folder has "
                    "no t-value for a type; dashed lines at the two-tailed critical t. Every series is labelled "
                    "with its split and outlier handling; folders that differ in either are refused unless "
                    "--allow-mixed is given.",
        formatter_class=HelpFormatter)
    p.add_argument("folders", nargs="+", metavar="[LABEL=]FOLDER",
                   help="result folders (or lmb.json files) of 'rbjax measure' or a debias run's lmb_valid; "
                        "LABEL=FOLDER names the series (default: the folder's name)")
    p.add_argument("--out", required=True,
                   help="file to write: .png, .pdf or .svg (required: the plot is never written to an implicit place)")
    add_config_arguments(p, PlotConfig)
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --out file that is not this plot of the same folders and options "
                        "(without it such a file is refused)")
    p.set_defaults(func=run)


def run(args) -> int:
    config = PlotConfig(**config_values(args, PlotConfig))
    check_output_file(args.out, "--out")  # before reading anything
    results = {}
    for f in args.folders:
        named = "=" in f and not Path(f).exists()  # a folder may have "=" in its name
        label, _, path = f.partition("=") if named else (Path(f).name or f, "", f)
        if not label or not path:
            raise ValueError(f"{f!r}: expected FOLDER or LABEL=FOLDER")
        if label in results:
            raise ValueError(f"two series are labelled {label!r}; name them with LABEL=FOLDER")
        results[label] = load_results(path)
    key = {"command": "plot", "series": {k: digest(v) for k, v in results.items()}, **dataclasses.asdict(config)}
    claim_outputs([args.out], key, overwrite=args.overwrite)
    out = plot_lmb(results, args.out, config)
    record_outputs([out], key)
    print(f"wrote {out.resolve()}")
    return 0
