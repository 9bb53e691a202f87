"""``rbjax plot``: Figure-1-style t-value plot from one or more ``rbjax measure`` result folders (the options besides
the folders (:class:`PlotCommand`), ``--out`` and ``--overwrite`` (:class:`rbjax.commands.settings.Output`) are the
fields of :class:`rbjax.lmb.config.PlotConfig`)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from rbjax.commands import HelpFormatter
from rbjax.commands.options import add_config_arguments, config_values
from rbjax.commands.settings import Output
from rbjax.core.config import field
from rbjax.core.io import check_output_file
from rbjax.core.keys import digest
from rbjax.core.reuse import claim_outputs, record_outputs
from rbjax.lmb.config import PlotConfig
from rbjax.lmb.plot import load_results, plot_lmb


@dataclasses.dataclass(frozen=True)
class PlotCommand:
    """The series of ``rbjax plot`` (``--out`` and ``--overwrite`` are :class:`rbjax.commands.settings.Output`'s, the
    plot's settings :class:`PlotConfig`)."""

    folders: tuple[str, ...] | None = field(None, "result folders (or lmb.json files) of 'rbjax measure' or a debias "
                                                  "run's lmb_valid; LABEL=FOLDER names the series (default: the "
                                                  "folder's name)", positional=True, metavar="[LABEL=]FOLDER")


#: --out of plot: a file (the shared help says "folder")
PLOT_OUT_HELP = "file to write: .png, .pdf or .svg (required: the plot is never written to an implicit place)"


def register(sub) -> None:

    p = sub.add_parser(
        "plot", help="plot LMB t-values of one or more result folders (paper Figure 1)",
        description="One bar per result folder and bias type: the primary t-value of its lmb.json (t < 0: "
                    "stereotypical), solid and starred when p < alpha, hatched otherwise, 'n/a' where a folder has "
                    "no t-value for a type; dashed lines at the two-tailed critical t. Every series is labelled "
                    "with its split and outlier handling; folders that differ in either are refused unless "
                    "--allow-mixed is given.",
        formatter_class=HelpFormatter)
    add_config_arguments(p, PlotCommand)
    add_config_arguments(p, Output, ("out",), required=("out",), overrides={"out": {"help": PLOT_OUT_HELP}})
    add_config_arguments(p, PlotConfig)
    add_config_arguments(p, Output, ("overwrite",))
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
