"""One way to show progress: a tqdm bar on stderr (so stdout stays clean for tables and piping).

Every long loop of rbjax (scoring, training, sweeps, evaluation, retrieval) uses :func:`progress_bar`; ``enabled``
follows the ``--no-progress`` switch, ``None`` shows the bar only when stderr is a terminal.
"""
from __future__ import annotations

import sys

__all__ = ["progress_bar"]


def progress_bar(total: int | None = None, desc: str = "", unit: str = "it", *, enabled: bool | None = True,
                 initial: int = 0, leave: bool = False, **kw):
    """A ``tqdm.auto.tqdm`` bar on stderr (``disable`` when not ``enabled``); use as a context manager or close it."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, initial=initial, leave=leave, file=sys.stderr,
                disable=None if enabled is None else not enabled, dynamic_ncols=True, **kw)
