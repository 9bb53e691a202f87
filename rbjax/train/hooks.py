"""Hooks of the training loop: everything :meth:`rbjax.train.loop.Trainer.run` does around its updates.

The loop steps and calls hooks (levanter's ``trainer.add_hook`` is the model); each concern of a run is one hook
it is handed:

* :class:`Checkpoints` — resume from the newest complete checkpoint of the same run (``restore``), then the
  checkpoint policy: every ``save_every`` updates, every ``save_every_s`` seconds, at the last update, and when the
  run stops early.
* :class:`MetricsFile` — ``metrics.jsonl``, one line per update and point (cut back to the resumed update first).
* :class:`ProgressBar` — the tqdm bar with the loss, the objective's metrics and tokens/s.
* :class:`SignalHandling` — SIGINT/SIGTERM deferred to the end of the update in flight, then a checkpoint and
  :class:`rbjax.core.interrupt.Interrupted` (what was saved, how to resume).
* :class:`NonFiniteGuard` — a run stops with an error after :data:`MAX_CONSECUTIVE_SKIPS` skipped updates in a row.
* :class:`Callback` — ``run(callback=…)``'s events (``micro`` before every micro-batch, ``update`` after every
  update); :class:`Every` — a function of a :class:`StepInfo`, every ``n`` updates (``Trainer.add_hook(fn,
  every=n)``).

A hook subclasses :class:`Hook` and overrides what it needs; every method is called for every hook in the order
the trainer holds them (``on_end`` in reverse), with the :class:`RunContext` of the run. A hook stops the run after
the current update with :meth:`RunContext.request_stop` (or :meth:`StepInfo.stop`): the remaining hooks of that
update still run (the checkpoint policy saves), and the :class:`rbjax.train.loop.TrainResult` is then not
``finished`` and its summary names the reason (``stopped_by``).
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np

from rbjax.core.interrupt import Interrupted, deferred_interrupts
from rbjax.core.io import atomic_write_text, to_json
from rbjax.core.keys import canonical
from rbjax.core.log import get_logger
from rbjax.core.progress import progress_bar
from rbjax.core.reuse import why_not_reusable
from rbjax.train.checkpoint import Checkpointer
from rbjax.train.frozen import combine

__all__ = ["Hook", "RunContext", "StepInfo", "Checkpoints", "MetricsFile", "ProgressBar", "SignalHandling",
           "NonFiniteGuard", "Callback", "Every", "MAX_CONSECUTIVE_SKIPS", "end_hooks"]

log = get_logger("train")

#: a run stops when a point skipped this many updates in a row for non-finite gradients
MAX_CONSECUTIVE_SKIPS = 25


@dataclasses.dataclass
class RunContext:
    """One call of :meth:`rbjax.train.loop.Trainer.run`, as its hooks see it (and change it).

    Attributes:
        trainer: the :class:`rbjax.train.loop.Trainer`.
        out: the run's folder (``None``: nothing is written).
        description: the progress bar's text.
        start: updates done before this session (a hook's ``restore`` sets it when it resumes).
        end: the update the session stops after (``t_total``, or ``stop_after``).
        state: the current train state (a hook's ``restore`` may replace it; the loop updates it).
        summary: the summary the :class:`~rbjax.train.loop.TrainResult` returns (hooks may add to it).
        session: this session's tag in the metric lines (a wall-clock time, seconds).
        resumed_from: the update count restored from a checkpoint (``None``: a fresh start).
        done: updates done in total so far.
        last: the metric records of the latest update (one per point).
        t_run: ``time.perf_counter()`` when the updates started (``elapsed_s`` counts from it).
        checkpoints: the run's :class:`Checkpoints` hook, if any (the others save through it).
        stop_reason: set by :meth:`request_stop`.
    """

    trainer: Any
    out: Path | None
    description: str
    start: int
    end: int
    state: Any
    summary: dict
    session: float
    resumed_from: int | None = None
    done: int = 0
    last: list = dataclasses.field(default_factory=list)
    t_run: float = 0.0
    checkpoints: Checkpoints | None = None
    stop_reason: str | None = None

    t_total = property(lambda self: self.trainer.t_total)
    stacked = property(lambda self: self.trainer.stacked)
    n_points = property(lambda self: len(self.trainer.points))

    def request_stop(self, reason: str = "a hook") -> None:
        """Stop after the current update (its remaining hooks still run; a checkpoint is written)."""
        if self.stop_reason is None:
            self.stop_reason = reason


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """One update, as ``on_update`` sees it.

    Attributes:
        update: its number (1-based; equals the updates done in total).
        epoch: the epoch reached (fractional, as in the metric lines).
        records: the metric lines of the update, one per point (``metrics.jsonl``'s fields).
        state: the train state after it (stacked for a chunk).
        duration_s: wall seconds of the update (its ``before_update`` hooks included).
    """

    update: int
    epoch: float
    records: list
    state: Any
    duration_s: float
    run: RunContext = dataclasses.field(repr=False)

    @property
    def metrics(self):
        """The record of a single run; the list of records of a chunk."""
        return self.records if self.run.stacked else self.records[0]

    @property
    def params(self):
        """The whole parameter tree after the update: the trained part with the frozen one (stacked for a chunk)."""
        return combine(self.run.trainer.frozen, self.state.params)

    def stop(self, reason: str = "a hook") -> None:
        """Stop the run after this update (:meth:`RunContext.request_stop`)."""
        self.run.request_stop(reason)


class Hook:
    """A part of a training run outside the step. Every method does nothing unless overridden.

    ``restore`` runs before compilation (it may set ``run.state``, ``run.start``, ``run.resumed_from``);
    ``on_start`` after compilation, just before the first update; ``before_update`` before each update (``update``:
    the 1-based number of the update about to run); ``on_update`` after each; ``on_end`` always, last, in reverse
    order (``error``: the exception the run ends with, ``None`` when it ends normally; an ``on_end`` may raise
    then, after every hook's ``on_end`` has run).
    """

    def restore(self, run: RunContext) -> None:
        pass

    def on_start(self, run: RunContext) -> None:
        pass

    def before_update(self, run: RunContext, update: int) -> None:
        pass

    def on_update(self, run: RunContext, info: StepInfo) -> None:
        pass

    def on_end(self, run: RunContext, error: BaseException | None) -> None:
        pass


def end_hooks(hooks: list[Hook], run: RunContext, error: BaseException | None) -> None:
    """Call every hook's ``on_end`` (in reverse order), each even when an earlier one raised; the first exception
    raised by one is raised afterwards when the run ended normally (else logged: the run's own error wins)."""
    first = None
    for h in reversed(hooks):
        try:
            h.on_end(run, error)
        except BaseException as e:  # noqa: BLE001 (an Interrupted is a KeyboardInterrupt)
            if first is None:
                first = e
            elif error is None:
                log.info(f"{type(h).__name__}.on_end failed after an earlier hook's error: {type(e).__name__}: {e}")
    if first is not None:
        if error is None:
            raise first
        log.info(f"a hook's on_end failed while the run stopped with {type(error).__name__}: "
                 f"{type(first).__name__}: {first}")


class Checkpoints(Hook):
    """Resume and the checkpoint policy (orbax, :class:`rbjax.train.checkpoint.Checkpointer` in ``directory``).

    ``restore``: the newest complete checkpoint whose key equals the run's (:meth:`rbjax.train.loop.Trainer.key`) is
    restored; an incomplete step folder is set aside (``<step>.incomplete``, listed in the summary's
    ``incomplete_checkpoints``); a checkpoint of another run is refused. Then a checkpoint is saved after every
    ``save_every``-th update, when ``save_every_s`` seconds passed since the last save, at the session's last
    update, and when a hook stops the run.

    Raises:
        ValueError: the folder holds checkpoints of a different run (the difference named).
    """

    def __init__(self, directory: str | Path, keep: int, save_every: int, save_every_s: float | None = None):
        self.directory = Path(directory)
        self.keep, self.save_every, self.save_every_s = keep, save_every, save_every_s
        self.ckpt: Checkpointer | None = None
        self.key = None
        self.saved_at = self.last_save = None

    def restore(self, run: RunContext) -> None:
        run.checkpoints = self
        ckpt = self.ckpt = Checkpointer(self.directory, self.keep)
        self.key = key = canonical(run.trainer.key())
        set_aside = run.summary.setdefault("incomplete_checkpoints", [])
        for step in ckpt.steps():  # the newest complete checkpoint
            why = ckpt.problem(step)
            if why is None:
                try:
                    meta = ckpt.restore_meta(step)
                except Exception as e:  # noqa: BLE001 (orbax/tensorstore raise several types for damaged files)
                    why = f"its metadata cannot be read ({type(e).__name__})"
            if why is None:
                reason, other = why_not_reusable(meta, key, finished=True)  # a committed checkpoint is complete
                if other:
                    self.close()
                    raise ValueError(
                        f"{ckpt.directory}: holds checkpoints of a different run "
                        f"({reason}); use another --out or --overwrite")
                try:
                    run.state, meta = ckpt.restore(step, run.state)
                    run.start = run.resumed_from = int(meta["update"])
                    break
                except ValueError as e:  # same run, unreadable arrays: damaged (e.g. array data missing)
                    why = f"its arrays cannot be read: {e}"
            moved = ckpt.set_aside(step) if jax.process_index() == 0 else ckpt.directory / str(step)
            set_aside.append({"folder": str(ckpt.directory / str(step)), "moved_to": str(moved), "reason": why})
            log.info(f"skipped the incomplete checkpoint {ckpt.directory / str(step)} ({why}); kept as "
                     f"{moved.name}, resuming from the newest complete one")
        self.saved_at, self.last_save = run.start, time.perf_counter()

    def save(self, run: RunContext) -> None:
        """Save a checkpoint of ``run.done`` updates (nothing when one of that count is saved already)."""
        if self.ckpt is not None and self.saved_at != run.done:
            self.ckpt.save(run.done, run.state, {"update": run.done, "key": self.key, "metrics": run.last})
            self.saved_at, self.last_save = run.done, time.perf_counter()

    def on_update(self, run: RunContext, info: StepInfo) -> None:
        done = info.update
        if done % self.save_every == 0 or done == run.end or run.stop_reason is not None or (
                self.save_every_s and time.perf_counter() - self.last_save >= self.save_every_s):
            self.save(run)

    def close(self) -> None:
        if self.ckpt is not None:
            self.ckpt.close()
            self.ckpt = None

    def on_end(self, run: RunContext, error: BaseException | None) -> None:
        self.close()


class MetricsFile(Hook):
    """``metrics.jsonl`` at ``path``: one strict-JSON line per update and point (a non-finite value is ``null``),
    written and flushed after each update by the primary process (across hosts, one writes). At the start the lines
    of updates after the resumed one are dropped (they are redone), and a line cut by a kill with everything after
    it."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.file = None

    def on_start(self, run: RunContext) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if jax.process_index() == 0:
            _truncate_metrics(self.path, run.start)
            self.file = open(self.path, "a", encoding="utf-8")

    def on_update(self, run: RunContext, info: StepInfo) -> None:
        if self.file is not None:
            self.file.write("".join(to_json(r) + "\n" for r in info.records))
            self.file.flush()

    def on_end(self, run: RunContext, error: BaseException | None) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def _truncate_metrics(path: Path, upto: int) -> None:
    """Keep only the metric lines of updates ≤ ``upto`` (those after the resumed checkpoint are redone)."""
    if not path.exists():
        return
    keep = []
    for ln in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(ln).get("step", 0) <= upto:
                keep.append(ln)
        except json.JSONDecodeError:
            break  # a line cut by a kill: drop it and everything after

    atomic_write_text(path, "".join(k + "\n" for k in keep))


class ProgressBar(Hook):
    """The run's bar on stderr (:func:`rbjax.core.progress.progress_bar`): updates of ``t_total`` from the resumed
    count, with the first point's total loss, the objective's metrics and tokens/s; ``enabled`` as the trainer's
    ``progress`` setting."""

    def __init__(self, enabled: bool | None = True):
        self.enabled = enabled
        self.bar = None

    def on_start(self, run: RunContext) -> None:
        desc = run.description + (f" ×{run.n_points}" if run.stacked else "")
        self.bar = progress_bar(run.t_total, desc, "upd", enabled=self.enabled, initial=run.start, leave=True)

    def on_update(self, run: RunContext, info: StepInfo) -> None:
        first = info.records[0]
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{first['total']:.4g}",
                             **{k.removesuffix("_loss"): f"{first[k]:.3g}" for k in run.trainer.objective.metric_names},
                             tok_s=f"{first['tokens_per_s']:.0f}")

    def on_end(self, run: RunContext, error: BaseException | None) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class SignalHandling(Hook):
    """SIGINT/SIGTERM during the updates (:func:`rbjax.core.interrupt.deferred_interrupts`): the update in flight
    finishes, the run's checkpoint is saved and :class:`~rbjax.core.interrupt.Interrupted` says what was saved and
    how to resume; a second Ctrl-C aborts at once. A signal after the last update's check (e.g. during its checkpoint
    write) is honoured when the run ends, before what follows training.

    Raises:
        rbjax.core.interrupt.Interrupted: as above.
    """

    def __init__(self):
        self._cm = None
        self.flag = None

    def on_start(self, run: RunContext) -> None:
        self._cm = deferred_interrupts(enabled=True)
        self.flag = self._cm.__enter__()

    def on_update(self, run: RunContext, info: StepInfo) -> None:
        if not self.flag:
            return
        ck = run.checkpoints
        if ck is not None:
            ck.save(run)
        where = (f"a checkpoint of update {run.done}/{run.t_total} is saved in {ck.directory}; "
                 "run the same command again to resume from it") if ck is not None else \
            "nothing was saved (checkpoints are off)"
        raise Interrupted(f"rbjax: {self.flag.signal_name} — training stopped after update "
                          f"{run.done}/{run.t_total}; {where}.")

    def on_end(self, run: RunContext, error: BaseException | None) -> None:
        if self._cm is None:
            return
        self._cm.__exit__(None, None, None)  # the previous handlers back
        self._cm = None
        if error is None and self.flag:
            ck = run.checkpoints
            where = (f"its checkpoint is saved in {ck.directory}; run the same command again to go on from it")\
                if ck is not None else "nothing was saved (checkpoints are off)"
            raise Interrupted(f"rbjax: {self.flag.signal_name} — training stopped after update "
                              f"{run.done}/{run.t_total}, before what follows it; {where}.")


class NonFiniteGuard(Hook):
    """Stops the run with an error once a point skipped ``limit`` updates in a row for a non-finite gradient or
    loss (the records' ``skipped``).

    Raises:
        RuntimeError: naming the update (and the grid point of a chunk) and the checkpoint kept.
    """

    def __init__(self, limit: int = MAX_CONSECUTIVE_SKIPS):
        self.limit = limit
        self.consecutive = None

    def on_start(self, run: RunContext) -> None:
        self.consecutive = np.zeros(run.n_points, np.int64)

    def on_update(self, run: RunContext, info: StepInfo) -> None:
        for i, rec in enumerate(info.records):
            self.consecutive[i] = self.consecutive[i] + 1 if rec["skipped"] else 0
        if self.consecutive.max() >= self.limit:
            i = int(self.consecutive.argmax())
            ck = run.checkpoints
            raise RuntimeError(
                f"update {info.update}: {self.limit} updates in a row had non-finite gradients"
                f"{f' (grid point {i})' if run.stacked else ''} and were skipped"
                + (f"; the last good checkpoint is kept in {ck.directory}" if ck is not None else "")
                + " — lower the learning rate or the objective's loss weights (e.g. λ_D)")


class Callback(Hook):
    """``run(callback=fn)``: ``fn`` is called before every micro-batch with ``{"kind": "micro", "update",
    "micro_batch", "epoch", "batch_index", "rows", "params"}`` (``params``: the parameters the gradient is taken at)
    and after every update with ``{"kind": "update", "update", "params", "lr", "grad_norm", "metrics"}``
    (``metrics``: the record of a run, the list of a chunk's)."""

    def __init__(self, fn: Callable[[dict], Any]):
        self.fn = fn

    def before_update(self, run: RunContext, update: int) -> None:
        tr = run.trainer
        for j, (e, b) in enumerate(tr.plan.plan[update - 1]):
            self.fn({"kind": "micro", "update": update, "micro_batch": j, "epoch": e, "batch_index": b,
                     "rows": tr.plan.batch_rows(e, b), "params": combine(tr.frozen, run.state.params)})

    def on_update(self, run: RunContext, info: StepInfo) -> None:
        self.fn({"kind": "update", "update": info.update, "params": info.params, "lr": info.records[0]["lr"],
                 "grad_norm": info.records[0]["grad_norm"], "metrics": info.metrics})


class Every(Hook):
    """``fn(info)`` after every ``every``-th update (``info``: :class:`StepInfo`; ``info.stop()`` ends the run)."""

    def __init__(self, fn: Callable[[StepInfo], Any], every: int = 1):
        if every < 1:
            raise ValueError(f"a hook's every must be ≥ 1, got {every}")
        self.fn, self.every = fn, int(every)

    def on_update(self, run: RunContext, info: StepInfo) -> None:
        if info.update % self.every == 0:
            self.fn(info)
