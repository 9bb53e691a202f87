"""Ctrl-C and SIGTERM for long runs: finish the step in flight, save, say what was kept and how to resume.

:class:`Interrupted` is a ``KeyboardInterrupt`` that carries the message for the user (the CLI prints it and exits
with 130). :func:`deferred_interrupts` turns SIGINT/SIGTERM into a flag that a training loop polls between updates,
so a signal never lands in the middle of a checkpoint write (no half-written checkpoint, no orbax traceback); a
second Ctrl-C interrupts at once.
"""
from __future__ import annotations

import contextlib
import signal
import threading


class Interrupted(KeyboardInterrupt):
    """An interrupted run; ``str(exc)`` says what was saved and how to resume."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InterruptFlag:
    """Set when SIGINT/SIGTERM arrived inside :func:`deferred_interrupts` (``signal_name`` says which)."""

    def __init__(self):
        self.signal_name: str | None = None

    def __bool__(self) -> bool:
        return self.signal_name is not None


@contextlib.contextmanager
def deferred_interrupts(enabled: bool = True):
    """Within the block, SIGINT and SIGTERM set the yielded :class:`InterruptFlag` instead of raising.

    A second SIGINT while the flag is set raises ``KeyboardInterrupt`` immediately (the user insists). Outside
    the main thread (where Python cannot install handlers) or with ``enabled=False`` the flag never fires.
    """
    flag = InterruptFlag()
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = {}

    def handler(signum, frame):
        if flag and signum == signal.SIGINT:
            raise KeyboardInterrupt
        flag.signal_name = signal.Signals(signum).name

    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, handler)
    try:
        yield flag
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)
