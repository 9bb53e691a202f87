"""``rbjax retrieve``: candidate comments and ±7-token windows from Reddit dumps (paper §2.2).

What is kept and how the windows are cut are the fields of :class:`rbjax.data.retrieval.config.RetrieveConfig`, the
options generated from them; written here are the inputs and output (``--bias``, ``--dump``, ``--out``) and how the
files are read (``--jobs``, ``--executor``, ``--ray-address``, ``--fresh``, ``--no-progress``: the result is the same
whatever they are), and ``--overwrite``."""
from __future__ import annotations

import argparse
import sys

from rbjax.commands import HelpFormatter
from rbjax.commands.options import add_config_arguments, config_values
from rbjax.data.retrieval import RetrieveConfig, retrieve
from rbjax.specs import load_spec


def register(subparsers) -> None:

    p = subparsers.add_parser(
        "retrieve",
        help="retrieve candidate comments/phrases for a bias type from Reddit comment dumps",
        formatter_class=HelpFormatter,
        description=(
            "Stream Reddit comment dumps (.zst with windows up to 2 GiB, .jsonl, .json, .gz, .bz2, .xz) "
            "and keep comments that contain a T1 query (with the spec's forms of 'to be') and an A1 "
            "attribute; clean them (URLs, user names, extra spaces, lower case), keep those shorter than "
            "150 characters, and write one CSV row per ±7-token window around a T1 target term. Files are read in "
            "parallel (--jobs, or --executor ray); each finished file is kept as a part, so a rerun skips the files "
            "already done with the same inputs; the parts are merged in file order into one deterministic result."
        ),
    )
    p.add_argument("--bias", action="append", required=True, metavar="NAME_OR_SPEC",
                   help="bias type (religion1, religion2, race, gender, queerness) or a spec JSON file; "
                        "repeat for several types in one pass")
    p.add_argument("--dump", action="extend", nargs="+", required=True, metavar="FILE_OR_GLOB",
                   help="dump file(s) or quoted glob patterns ('RC_2019-*.zst', each sorted by name); repeatable. "
                        "Files are merged in this order")
    p.add_argument("--out", required=True,
                   help="output folder (candidates_<bias>.csv, summary.json and per-file parts/ go there), or an "
                        "output CSV (parts and summary.json then go to <out>.parts/); with several --bias and a CSV, "
                        "use {bias} in the name")
    add_config_arguments(p, RetrieveConfig)
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="files read at once. Local: worker processes (default: the cores available, bounded by "
                        "memory: a worker needs its file's zstd window, up to 2 GiB; 1 = this process). Ray: files in "
                        "flight (default: all; the cluster schedules them)")
    p.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="'local': processes on this machine; 'ray': one task per file on a Ray cluster (needs "
                        "pip install 'rbjax[ray]'; the dumps must be at the same absolute path on every node)")
    p.add_argument("--ray-address", default=None, metavar="ADDRESS",
                   help="Ray cluster to attach to ('auto', 'ray://host:10001'); default: RAY_ADDRESS, else a new "
                        "local cluster")
    p.add_argument("--fresh", action="store_true",
                   help="read every file again instead of reusing the per-file parts of an earlier run with the "
                        "same inputs")
    p.add_argument("--overwrite", action="store_true",
                   help="replace candidate CSVs or summary.json in --out that are not this retrieval's own unchanged "
                        "output of the same specification(s) and settings — a rerun over added or changed dumps "
                        "updates them in place (without it they are refused before any file is read)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:

    config = RetrieveConfig(**config_values(args, RetrieveConfig))
    specs = [load_spec(b) for b in args.bias]
    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {args.jobs}")
    res = retrieve(
        specs,
        args.dump,
        args.out,
        config,
        progress=False if args.no_progress else None,
        jobs=args.jobs,
        executor=args.executor,
        ray_address=args.ray_address,
        resume=not args.fresh,
        overwrite=args.overwrite,
    )
    print(res.summary())
    if res.stats.errors:
        print("warning: some dump files were damaged or truncated; see 'stream error' above", file=sys.stderr)
    return 0
