"""The dialog-quality tasks of ``rbjax evaluate``, one module each, behind a small registry (in the manner of
lm-evaluation-harness): a task is a :class:`~rbjax.dialog.tasks.common.Task` record — its name, its settings
dataclass, its runner, a help line and the files it writes.

* :mod:`rbjax.dialog.tasks.lmp` — ``lmp``: Reddit-6K perplexity (:class:`~rbjax.dialog.tasks.lmp.LMPSettings`).
* :mod:`rbjax.dialog.tasks.dst` — ``dst``: MultiWOZ 2.0 dialog state tracking
  (:class:`~rbjax.dialog.tasks.dst.DSTSettings`).
* :mod:`rbjax.dialog.tasks.crg` — ``crg``: DSTC-7 response generation (:class:`~rbjax.dialog.tasks.crg.CRGSettings`).
* :mod:`rbjax.dialog.tasks.common` — what they share: the settings base classes, the model handle, keyed result
  files, the fine-tuning adapter over the shared trainer.

:func:`rbjax.dialog.evaluate.evaluate` runs them; ``rbjax evaluate`` generates its options from the settings classes.
A new task is a module with its settings class, its runner and a ``TASK`` record, added to :data:`TASKS` below.
"""
from __future__ import annotations

from rbjax.dialog.tasks import crg, dst, lmp
from rbjax.dialog.tasks.common import Task

__all__ = ["TASKS", "Task", "get_task"]

_REGISTRY: dict[str, Task] = {t.name: t for t in (lmp.TASK, dst.TASK, crg.TASK)}
#: the tasks, in the order ``task="all"`` runs them
TASKS: tuple[str, ...] = tuple(_REGISTRY)


def get_task(name: str) -> Task:
    """The task called ``name``.

    Raises:
        ValueError: no such task (the known ones are named).
    """
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown dialog task {name!r}; expected one of {', '.join(TASKS)}") from None
