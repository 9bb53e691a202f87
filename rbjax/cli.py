"""The ``rbjax`` command line: one command, one subcommand per task.

Each subcommand lives in ``rbjax/commands/<name>.py`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a callable
``func(args) -> int``. The subcommands call the same Python API that users import.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

import simple_parsing

from rbjax import __version__
from rbjax.commands import CLIError, HelpFormatter  # noqa: F401 (CLIError: part of the CLI's API)
from rbjax.core.distributed import initialize, requested

#: subcommand modules, in the order shown by ``rbjax --help``
COMMANDS = ("measure", "plot", "debias", "sweep", "evaluate", "run", "report", "retrieve", "annotate", "splits")


def _subparser_class():
    class SubParser(simple_parsing.ArgumentParser):
        """Subcommand parser: argparse plus simple_parsing's ``add_arguments(dataclass)`` (debias and sweep build
        their options from :class:`rbjax.debias.config.TrainConfig`). Options are spelled with dashes, there is
        no ``--config_path``, and help shows ``(default: X)`` only where the help text does not say it."""

        def __init__(self, *args, **kwargs):
            kwargs.setdefault("add_option_string_dash_variants", simple_parsing.DashVariant.DASH)
            kwargs.setdefault("add_config_path_arg", False)
            kwargs["formatter_class"] = HelpFormatter
            super().__init__(*args, **kwargs)

    return SubParser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rbjax",
        description="RedditBias in JAX: measure (LMB) and reduce (LMD/ADD/HD/CDA) social bias in dialog language models.",
    )
    parser.add_argument("--version", action="version", version=f"rbjax {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_subparser_class())
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"rbjax.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"rbjax.commands.{name}":
                continue  # subcommand not part of this build
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)  # options built from a config dataclass are validated while parsing
    except (ValueError, FileNotFoundError) as e:
        cmd = next((a for a in (argv if argv is not None else sys.argv[1:]) if not a.startswith("-")), "")
        print(f"rbjax {cmd}: error: {e}", file=sys.stderr)
        return 1
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        if requested():  # RBJAX_DISTRIBUTED=1: join the multi-host job before any JAX work (docs/scale.md)
            initialize()
        return int(args.func(args) or 0)
    except KeyboardInterrupt as e:
        # rbjax.core.interrupt.Interrupted carries what was saved and how to resume
        print(str(e) if str(e) else f"rbjax {args.command}: interrupted", file=sys.stderr)
        return 130
    except (CLIError, OSError, ValueError, RuntimeError) as e:
        # Errors raised by rbjax carry the file/row/problem; show them without a traceback.
        print(f"rbjax {args.command}: error: {e}", file=sys.stderr)
        return 1


def console_main() -> None:  # pragma: no cover (the process exits)
    """The ``rbjax`` console script (and ``python -m rbjax``): :func:`main`, then exit with its code.

    After Ctrl-C the process leaves with ``os._exit``: everything rbjax keeps is already written (atomically), and a
    normal interpreter shutdown can crash in a JAX compile thread still running (a segfault instead of exit 130).
    """
    rc = main()
    if rc == 130:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    sys.exit(rc)


if __name__ == "__main__":  # pragma: no cover
    # `python -m rbjax.cli` runs this file as `__main__`, a second copy of the module beside `rbjax.cli`: the
    # subcommands raise `rbjax.cli.CLIError`, which this copy's `main` would not catch (a traceback instead of the
    # message). Dispatch through the imported module. (`python -m rbjax` is the documented spelling.)
    import rbjax.cli

    rbjax.cli.console_main()
