"""The ``rbjax`` command line: one command, one subcommand per task.

Each subcommand lives in ``rbjax/commands/<name>.py`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a callable
``func(args) -> int``. The subcommands call the same Python API that users import.
"""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading

from rbjax import __version__
from rbjax.commands import CLIError, HelpFormatter  # noqa: F401 (CLIError: part of the CLI's API)
from rbjax.commands.options import OptionParser
from rbjax.core.compilation import CompileCounter, enable_compile_cache
from rbjax.core.distributed import initialize, requested
from rbjax.core.errors import SettingError
from rbjax.core.host_allocator import configure_host_allocator
from rbjax.core.interrupt import Interrupted
from rbjax.core.log import get_logger

#: subcommand modules, in the order shown by ``rbjax --help``
COMMANDS = ("measure", "compare", "plot", "debias", "sweep", "export", "evaluate", "run", "report", "retrieve", "annotate",
            "splits", "pairs")


class SubParser(OptionParser):
    """Subcommand parser: argparse with :class:`HelpFormatter` that records which options the user wrote
    (:func:`rbjax.commands.options.given_options`, for the precedence command line > file > default); the options are
    generated from settings dataclasses (:func:`rbjax.commands.options.add_config_arguments`: each command's settings,
    the shared blocks of :mod:`rbjax.commands.settings`; debias and sweep from :class:`rbjax.debias.config.DebiasRun`'s
    settings, :func:`rbjax.commands.debias.add_training_arguments`)."""

    def __init__(self, *args, **kwargs):
        kwargs["formatter_class"] = HelpFormatter
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rbjax",
        description="RedditBias in JAX: measure (LMB) and reduce (LMD/ADD/HD/CDA) social bias in dialog language models.",
    )
    parser.add_argument("--version", action="version", version=f"rbjax {__version__}")
    parser.add_argument("--compile-cache", metavar="DIR|off", default=None,
                        help="where compiled programs are kept between runs (default: $RBJAX_COMPILE_CACHE, else "
                             "compile-cache/ in rbjax's cache folder, $RBJAX_CACHE_DIR or ~/.cache/rbjax); off: "
                             "compile everything again in every run (docs/scale.md, \"Caches\")")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=SubParser)
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
    args = parser.parse_args(argv)  # a malformed option exits with argparse's message and status 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        configure_host_allocator()  # before JAX's CPU client exists: freed buffers reused (rbjax.core.host_allocator)
        if requested():  # RBJAX_DISTRIBUTED=1: join the multi-host job before any JAX work (docs/scale.md)
            initialize()
        cache = enable_compile_cache(args.compile_cache)  # the second run of the same shapes compiles nothing
        with CompileCounter() as counter:
            rc = int(args.func(args) or 0)
        if counter.built:
            where = f" from the compile cache {cache}" if cache is not None else ""
            get_logger(args.command).info(
                f"XLA: {counter.built} program(s), {counter.cache_hits} of them read{where}, {counter.compiled} "
                f"compiled ({counter.seconds:.1f} s)")
        return rc
    except KeyboardInterrupt as e:
        # rbjax.core.interrupt.Interrupted carries what was saved and how to resume
        print(str(e) if str(e) else f"rbjax {args.command}: interrupted", file=sys.stderr)
        return 130
    except SettingError as e:  # validation names the Python field; the user wrote a flag
        flag = option_for(parser, args, e.field)
        print(f"rbjax {args.command}: error: {e.renamed(flag) if flag else e}", file=sys.stderr)
        return 1
    except (CLIError, OSError, ValueError, RuntimeError) as e:
        # Errors raised by rbjax carry the file/row/problem; show them without a traceback.
        print(f"rbjax {args.command}: error: {e}", file=sys.stderr)
        return 1


def option_for(parser: argparse.ArgumentParser, args: argparse.Namespace, dest: str) -> str | None:
    """The option the user writes for the destination ``dest`` in the subcommand ``args`` ran (e.g.
    ``learning_rate`` → ``--lr``, ``batch_size`` → ``--batch-size``; the first long spelling), or None."""
    p = parser
    while True:  # down the chain of (nested) subcommands that were chosen
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = getattr(args, subs[0].dest, None) if subs else None
        if chosen is None or chosen not in subs[0].choices:
            break
        p = subs[0].choices[chosen]
    for a in p._actions:
        if a.dest == dest and a.option_strings:
            return next((o for o in a.option_strings if o.startswith("--")), a.option_strings[0])
    return None


def stop_on_sigterm() -> None:
    """SIGTERM (a job scheduler's stop, ``kill``) stops rbjax as Ctrl-C does: outside training and the long phases
    (reports, loading) it raises ``KeyboardInterrupt`` at once, so the command exits with 130 and a message instead
    of dying mid-write; training polls it between updates and saves first
    (:func:`rbjax.core.interrupt.deferred_interrupts`), and scoring, evaluation and generation stop after their batch
    in flight (:func:`rbjax.core.interrupt.interruptible`), each saying what it kept. A phase that stops at once
    (retrieval) replaces this handler's generic message with its own account (``final=False``)."""
    def stop(signum, frame):
        raise Interrupted("rbjax: SIGTERM — stopped; what was written before it is kept (every result file is "
                          "written whole or not at all), the work in progress is not", signal_name="SIGTERM",
                          final=False)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stop)


def console_main() -> None:  # pragma: no cover (the process exits)
    """The ``rbjax`` console script (and ``python -m rbjax``): :func:`main`, then exit with its code.

    After Ctrl-C the process leaves with ``os._exit``: everything rbjax keeps is already written (atomically), and a
    normal interpreter shutdown can crash in a JAX compile thread still running (a segfault instead of exit 130).
    """
    stop_on_sigterm()
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
