"""One way to print progress messages: the standard ``logging`` module, under the ``rbjax`` logger.

Each command's messages go to stderr as ``rbjax <command>: <message>`` (what users have always seen), through a
handler installed once. Each module that prints takes its command's logger once, at the top
(``log = get_logger("debias")``), and calls ``log.info``. Library users can silence, redirect or format the
messages with ``logging`` as usual (``logging.getLogger("rbjax").setLevel(logging.WARNING)``).
"""
from __future__ import annotations

import logging
import sys

__all__ = ["get_logger"]

_ROOT = "rbjax"


class _StderrHandler(logging.StreamHandler):
    """Writes to the *current* ``sys.stderr`` (so pytest's capture and redirections see the messages)."""

    def __init__(self):
        super().__init__(sys.stderr)

    def emit(self, record):
        self.stream = sys.stderr
        super().emit(record)


def _root() -> logging.Logger:
    log = logging.getLogger(_ROOT)
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        h = _StderrHandler()
        h.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        log.addHandler(h)
        log.setLevel(logging.INFO)
        log.propagate = False
    return log


def get_logger(command: str) -> logging.Logger:
    """The logger of one command (``rbjax run``, ``rbjax evaluate``, …); messages print as ``rbjax <command>: …``."""
    _root()
    # a child of "rbjax" whose records print as "rbjax <command>" (logging's dotted name would be "rbjax.<command>")
    log = logging.getLogger(f"{_ROOT}.{command}")
    if not getattr(log, "_rbjax_named", False):
        log.addFilter(_Rename(f"{_ROOT} {command}"))
        log._rbjax_named = True  # type: ignore[attr-defined]
    return log


class _Rename(logging.Filter):
    def __init__(self, name: str):
        super().__init__()
        self.shown = name

    def filter(self, record):
        record.name = self.shown
        return True
