"""``rbjax retrieve``: candidate comments and ±7-token windows from Reddit dumps (paper §2.2).

What is kept and how the windows are cut are the fields of :class:`rbjax.data.retrieval.config.RetrieveConfig`, the
options generated from them; the inputs and ``--fresh`` are :class:`RetrieveCommand`'s, the output, ``--overwrite`` and
``--no-progress`` :class:`rbjax.commands.settings.Output`'s, and how the files are read (``--jobs``, ``--executor``,
``--ray-address``: the result is the same whatever they are) :class:`rbjax.core.parallel.Executor`'s."""
from __future__ import annotations

import argparse
import dataclasses
import sys

from rbjax.commands import HelpFormatter
from rbjax.commands.options import add_config_arguments, config_values
from rbjax.commands.settings import Output
from rbjax.core.config import field
from rbjax.core.parallel import Executor
from rbjax.data.retrieval import RetrieveConfig, retrieve
from rbjax.specs import load_spec


@dataclasses.dataclass(frozen=True)
class RetrieveCommand:
    """The inputs of ``rbjax retrieve`` and whether to reuse the per-file parts of an earlier run (the output,
    ``--overwrite`` and ``--no-progress`` are :class:`rbjax.commands.settings.Output`'s, the executor
    :class:`rbjax.core.parallel.Executor`)."""

    bias: tuple[str, ...] | None = field(None, "bias type (religion1, religion2, race, gender, queerness) or a spec "
                                               "JSON file; repeat for several types in one pass", repeat=True,
                                         metavar="NAME_OR_SPEC")
    dump: tuple[str, ...] | None = field(None, "dump file(s) or quoted glob patterns ('RC_2019-*.zst', each sorted by "
                                               "name); repeatable. Files are merged in this order", repeat="extend",
                                         metavar="FILE_OR_GLOB")
    fresh: bool = field(False, "read every file again instead of reusing the per-file parts of an earlier run with "
                               "the same inputs")


#: --out of retrieve: a folder or a CSV (the shared help says "folder")
RETRIEVE_OUT_HELP = ("output folder (candidates_<bias>.csv, summary.json and per-file parts/ go there), or an output "
                     "CSV (parts and summary.json then go to <out>.parts/); with several --bias and a CSV, use {bias} "
                     "in the name")


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
    add_config_arguments(p, RetrieveCommand, ("bias", "dump"), required=("bias", "dump"))
    add_config_arguments(p, Output, ("out",), required=("out",), overrides={"out": {"help": RETRIEVE_OUT_HELP}})
    add_config_arguments(p, RetrieveConfig)
    add_config_arguments(p, Executor, ("jobs", "executor", "ray_address"))
    add_config_arguments(p, RetrieveCommand, ("fresh",))
    add_config_arguments(p, Output, ("overwrite", "progress"))
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
        progress=None if args.progress else False,
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
