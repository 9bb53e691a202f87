"""The ``rbjax`` command line: one command, one subcommand per task.

Each subcommand lives in ``rbjax/commands/<name>.py`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a callable
``func(args) -> int``. The subcommands call the same Python API that users import.
"""
from __future__ import annotations

import argparse
import importlib
import sys

#: subcommand modules, in the order shown by ``rbjax --help``
COMMANDS = ("measure", "plot", "debias", "sweep", "retrieve", "annotate", "splits", "evaluate")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows ``(default: X)`` only where there is a real default not already spelled out in the help."""

    def _get_help_string(self, action):
        h = action.help or ""
        if not h or "default" in h.lower() or action.default is None or action.default is False \
                or action.default == argparse.SUPPRESS:
            return h
        return super()._get_help_string(action)


class CLIError(Exception):
    """An error the user can fix; printed without a traceback."""


def build_parser() -> argparse.ArgumentParser:
    from rbjax import __version__

    parser = argparse.ArgumentParser(
        prog="rbjax",
        description="RedditBias in JAX: measure (LMB) and reduce (LMD/ADD/HD/CDA) social bias in dialog language models.",
    )
    parser.add_argument("--version", action="version", version=f"rbjax {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
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
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("rbjax: interrupted", file=sys.stderr)
        return 130
    except (CLIError, OSError, ValueError, RuntimeError) as e:
        # Errors raised by rbjax carry the file/row/problem; show them without a traceback.
        print(f"rbjax {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
