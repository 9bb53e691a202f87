"""Ctrl-C and SIGTERM for long runs: finish the step in flight, save, say what was kept and how to resume.

:class:`Interrupted` is a ``KeyboardInterrupt`` that carries the message for the user (the CLI prints it and exits
with 130). :func:`deferred_interrupts` turns SIGINT/SIGTERM into a flag that a training loop polls between updates,
so a signal never lands in the middle of a checkpoint write (no half-written checkpoint, no orbax traceback); a
second Ctrl-C interrupts at once. :func:`interruptible` is the same for any other long phase (scoring batches,
evaluation batches, generation batches, dump files): it stops between two units, keeps what is finished, and its
:class:`Interrupted` names what was kept and how to resume.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Callable


class Interrupted(KeyboardInterrupt):
    """An interrupted run; ``str(exc)`` says what was saved and how to resume.

    ``signal_name``: the signal, when known. ``final``: the message already says what was kept (an enclosing
    :func:`interruptible` phase leaves it as it is); ``False`` for the ``rbjax`` command's generic SIGTERM stop,
    which a phase replaces with its own account.
    """

    def __init__(self, message: str, *, signal_name: str | None = None, final: bool = True):
        super().__init__(message)
        self.message = message
        self.signal_name = signal_name
        self.final = final

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


class Phase:
    """A long phase under :func:`interruptible`: :meth:`check` between its units (a batch scored, a category
    written, a file read) stops it once SIGINT/SIGTERM has arrived."""

    def __init__(self, flag: InterruptFlag, message: Callable[[str], str]):
        self.flag = flag
        self._message = message

    def message(self, signal_name: str | None = None) -> str:
        """What the user reads: ``message(signal name)``, evaluated now (so it lists what is finished now)."""
        return self._message(signal_name or self.flag.signal_name or "SIGINT")

    def check(self) -> None:
        """Raise :class:`Interrupted` (with :meth:`message`) when a signal has arrived; else nothing."""
        if self.flag:
            raise Interrupted(self.message())


_PHASES: list[Phase] = []  # the main thread's open phases, innermost last


def poll() -> None:
    """Between two units of a long loop (a scored batch, an evaluated batch, a generated batch): raise
    :class:`Interrupted` when SIGINT/SIGTERM reached the innermost :func:`interruptible` phase. Outside any phase,
    and outside the main thread, nothing happens (the loop runs on; a signal acts as it would anyway)."""
    if _PHASES and threading.current_thread() is threading.main_thread():
        _PHASES[-1].check()


@contextlib.contextmanager
def interruptible(message: Callable[[str], str], defer: bool = True):
    """A long phase (scoring, evaluation, generation, retrieval) that stops between its units on SIGINT/SIGTERM and
    says what it kept.

    Within the block the signals set a flag (:func:`deferred_interrupts`); :func:`poll` (in the loops of the scorer,
    the DST classifier, generation) or the yielded :class:`Phase`'s ``check()``, called between units, raises
    :class:`Interrupted` with ``message(signal_name)`` — a callable, so that the text names what is finished at that
    moment (the files kept, how to resume). A signal that arrives after the last check is honoured when the block
    ends. A ``KeyboardInterrupt`` raised inside (a second Ctrl-C, which stops at once; the ``rbjax`` command's
    SIGTERM outside a deferring block) becomes the same :class:`Interrupted`; one raised by a phase or a training
    run within this one (``final``) passes unchanged.

    Args:
        message: ``signal name ("SIGINT"/"SIGTERM") -> str``, the whole message (e.g. ``"rbjax measure: SIGINT —
            stopped; the scores of … are kept in …"``).
        defer: ``False`` for units too long to wait for (a dump file of hours): a signal interrupts at once, as
            outside, and only the message is this phase's.
    Raises:
        Interrupted: as above.
    """
    with deferred_interrupts(defer) as flag:
        phase = Phase(flag, message)
        pushed = threading.current_thread() is threading.main_thread()
        if pushed:
            _PHASES.append(phase)
        try:
            yield phase
        except KeyboardInterrupt as e:
            if isinstance(e, Interrupted) and e.final:
                raise
            raise Interrupted(phase.message(getattr(e, "signal_name", None))) from None
        finally:
            if pushed:
                _PHASES.remove(phase)
    phase.check()  # the handlers are restored: a signal after the last check stops here
