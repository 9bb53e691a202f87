"""Shared setup of the scripts in ``benchmarks/``: the load monitor that voids a figure taken beside another job.

A speed ratio taken while another job runs on the machine measures the scheduler as much as our code: PyTorch's
thread pool degrades more under contention than XLA's, so such a ratio flatters rbjax. Every benchmark script
therefore wraps each timed section in :meth:`LoadMonitor.section`, which records

* the section's wall time;
* the **foreign CPU**: the machine's busy CPU seconds (``psutil.cpu_times()``: all CPU time but idle and iowait)
  minus the CPU seconds of this process tree over the same interval, reported in cores (foreign seconds / wall
  seconds). The tree is this process (all its threads), the children it has waited for, and every live descendant
  with the children *it* has waited for: the worker processes a script starts are its own work, not foreign load;
* the load average when the section starts (``os.getloadavg()``), beside the one when the monitor was made.

:meth:`LoadMonitor.finish` adds a ``"load"`` block to the script's JSON and files its ratios under ``"ratios"`` only
when no section they depend on had more foreign CPU than the threshold; otherwise under ``"void_ratios"``, with a
``VOID`` line on stderr naming the section and its foreign CPU. Printed ratios go through
:meth:`LoadMonitor.ratio_text`, which marks them ``VOID`` the same way.

The threshold is :data:`DEFAULT_THRESHOLD` (0.10 cores: a tenth of one core, on average over the section), or the
environment variable :data:`THRESHOLD_ENV` (cores, a number >= 0), or the ``threshold`` argument.

Accuracy: the kernel counts CPU time in clock ticks (usually 10 ms), so a section of a second or less can read a few
hundredths of a core of foreign CPU from rounding alone; the scripts' timed sections last many seconds. ``steal``
(time the hypervisor gave another guest) counts as busy, hence foreign: it is contention too. A descendant that
detaches itself from the tree (a daemon re-parented to init) counts as foreign: the section is then void, never
flattered. The own tree is read before the list of descendants, so a child reaped between the two reads is missed
(counted foreign) rather than counted twice.
"""
from __future__ import annotations

import math
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple

try:
    import psutil
except ImportError as e:  # pragma: no cover - psutil is in the test extra, with torch and transformers
    raise ImportError("benchmarks/ needs psutil to measure foreign CPU load: pip install 'rbjax[test]'") from e

#: environment variable overriding :data:`DEFAULT_THRESHOLD` (cores of foreign CPU, a number >= 0)
THRESHOLD_ENV = "RBJAX_BENCH_MAX_FOREIGN_CPU"
#: foreign CPU, in cores averaged over a section, above which the section's figures are void
DEFAULT_THRESHOLD = 0.10


class Reading(NamedTuple):
    """One reading of the clocks: wall time, the machine's busy CPU seconds, this process tree's CPU seconds."""

    wall: float
    busy: float
    own: float


def busy_seconds(times) -> float:
    """Busy CPU seconds of the whole machine (all CPUs) in a ``psutil.cpu_times()`` reading.

    All fields but ``idle`` and ``iowait``; on Linux ``guest`` and ``guest_nice`` are left out because the kernel
    already counts them in ``user`` and ``nice`` (psutil's own ``cpu_percent`` does the same).
    """
    total = sum(times)
    for f in ("guest", "guest_nice", "idle", "iowait"):
        total -= getattr(times, f, 0.0)
    return total


def own_tree_seconds(proc: "psutil.Process | None" = None) -> float:
    """CPU seconds (user + system) of ``proc`` (default: this process) and its tree.

    The process itself (every thread), the children it has waited for (``children_user``/``children_system``), and
    each live descendant (``children(recursive=True)``) with the children that descendant has waited for. A
    descendant that vanishes while it is read is skipped (its time is then counted foreign: the safe side).
    """
    proc = proc or psutil.Process()
    t = proc.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    try:
        kids = proc.children(recursive=True)
    except psutil.Error:
        kids = []
    for kid in kids:
        try:
            c = kid.cpu_times()
        except psutil.Error:  # gone, a zombie without times, or not ours to read
            continue
        total += c.user + c.system + c.children_user + c.children_system
    return total


def read_clocks() -> Reading:
    """The clocks now: the own tree first, then the machine (see the module docstring on races)."""
    own = own_tree_seconds()
    return Reading(time.perf_counter(), busy_seconds(psutil.cpu_times()), own)


def load_average() -> list[float] | None:
    """``os.getloadavg()`` as a list (1, 5, 15 minutes), or None where the platform has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def threshold_from_env(default: float = DEFAULT_THRESHOLD) -> float:
    """The foreign-CPU threshold in cores: :data:`THRESHOLD_ENV` when set, else ``default``.

    Raises ValueError naming the variable when its value is not a number >= 0.
    """
    raw = os.environ.get(THRESHOLD_ENV, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{THRESHOLD_ENV}={raw!r}: the foreign-CPU threshold must be a number of cores >= 0")
    return value


@dataclass
class Section:
    """One timed section's figures: wall seconds, foreign CPU seconds, load average at its start."""

    name: str
    wall_s: float
    foreign_cpu_s: float
    load_average_start: list[float] | None
    threshold: float

    @property
    def foreign_cores(self) -> float:
        """Foreign CPU in cores, averaged over the section (0 for an empty section; never negative)."""
        return max(self.foreign_cpu_s, 0.0) / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def void(self) -> bool:
        """True when the section's foreign CPU exceeds the threshold."""
        return self.foreign_cores > self.threshold

    def describe(self) -> str:
        return (f"section {self.name!r}: foreign CPU {self.foreign_cores:.2f} cores over {self.wall_s:.3g} s "
                f"(threshold {self.threshold:.2f})")

    def as_dict(self) -> dict:
        return {"name": self.name, "wall_s": round(self.wall_s, 3), "foreign_cpu_s": round(self.foreign_cpu_s, 3),
                "foreign_cores": round(self.foreign_cores, 3), "load_average_start": self.load_average_start,
                "void": self.void}


class LoadMonitor:
    """Records the foreign CPU of a script's timed sections and voids the ratios taken under foreign load.

    ``threshold``: cores of foreign CPU (averaged over a section) above which it is void; default
    :func:`threshold_from_env`. ``read`` and ``loadavg`` replace the clocks (tests inject readings); ``stream``
    receives the VOID lines (default stderr).

    Typical use::

        mon = LoadMonitor()
        with mon.section("rounds"):      # both sides' interleaved rounds, or one section per side
            ...
        print(f"rbjax / PyTorch: {mon.ratio_text(r)}", file=sys.stderr)
        mon.finish(result, {"rbjax_over_torch": r})   # result["load"], result["ratios"] or ["void_ratios"]
    """

    def __init__(self, threshold: float | None = None, *, read: Callable[[], Reading] = read_clocks,
                 loadavg: Callable[[], list[float] | None] = load_average, stream=None):
        self.threshold = threshold_from_env() if threshold is None else float(threshold)
        if not math.isfinite(self.threshold) or self.threshold < 0:
            raise ValueError(f"threshold must be a number of cores >= 0, got {threshold!r}")
        self._read, self._loadavg, self._stream = read, loadavg, stream
        self.load_average_start = loadavg()
        self.sections: list[Section] = []

    @property
    def stream(self):
        return self._stream if self._stream is not None else sys.stderr

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        """Time the body as one section named ``name`` (names may repeat; sections may nest)."""
        load = self._loadavg()
        start = self._read()
        try:
            yield
        finally:
            end = self._read()
            sec = Section(name, end.wall - start.wall, (end.busy - start.busy) - (end.own - start.own), load,
                          self.threshold)
            self.sections.append(sec)
            if sec.void:
                print(f"[load] {sec.describe()}: figures timed here are VOID", file=self.stream, flush=True)

    def void_sections(self, names=None) -> list[Section]:
        """The void sections among those named ``names`` (an iterable of names; None: every section so far)."""
        wanted = None if names is None else set(names)
        return [s for s in self.sections if s.void and (wanted is None or s.name in wanted)]

    @property
    def void(self) -> bool:
        """True when any section so far is void."""
        return bool(self.void_sections())

    def ratio_text(self, value: float, spec: str = ".2f", unit: str = "×", sections=None) -> str:
        """``value`` formatted for printing, marked VOID when a section of ``sections`` (default all) is void."""
        text = f"{value:{spec}}{unit}"
        bad = self.void_sections(sections)
        if not bad:
            return text
        worst = max(bad, key=lambda s: s.foreign_cores)
        return f"VOID {text} (foreign CPU {worst.foreign_cores:.2f} cores in section {worst.name!r})"

    def report(self) -> dict:
        """The ``"load"`` block: load average at the start, every section, the threshold, void flag and reason."""
        bad = self.void_sections()
        return {"load_average_start": self.load_average_start, "cpus": os.cpu_count(),
                "threshold_cores": self.threshold, "sections": [s.as_dict() for s in self.sections],
                "void": bool(bad), "reason": "; ".join(s.describe() for s in bad) or None}

    def split(self, ratios: dict, depends: dict | None = None) -> tuple[dict, dict]:
        """``(kept, void)``: the ratios none of whose sections is void, and the others.

        ``depends`` maps a ratio's name to the names of the sections it was timed in; a ratio missing from it (or
        every ratio, when ``depends`` is None) depends on every section.
        """
        kept, void = {}, {}
        for k, v in ratios.items():
            names = None if depends is None or k not in depends else depends[k]
            (void if self.void_sections(names) else kept)[k] = v
        return kept, void

    def finish(self, result: dict, ratios: dict | None = None, depends: dict | None = None) -> dict:
        """Add the ``"load"`` block to ``result`` and file ``ratios`` (see :meth:`split`): the kept ones under
        ``result["ratios"]`` (set, maybe empty, unless ``ratios`` is None: a script without ratios), the void ones
        under ``result["void_ratios"]`` (set only when there are any; a ``ratios`` dict already in ``result`` is
        replaced). Prints a VOID line to stderr per void section and names
        the ratios set aside. Returns ``result``."""
        result["load"] = self.report()
        kept, void = self.split(ratios or {}, depends)
        if ratios is not None:
            result.pop("void_ratios", None)
            result["ratios"] = kept
        if void:
            result["void_ratios"] = void
        for s in self.void_sections():
            print(f"VOID: {s.describe()}", file=self.stream, flush=True)
        if void:
            print(f"VOID: ratios kept out of 'ratios' (see 'void_ratios'): {', '.join(void)}", file=self.stream,
                  flush=True)
        return result
