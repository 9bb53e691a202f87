"""The retrieval run (:func:`retrieve`): list the files, reuse or scan each one (in this process, in worker
processes or on Ray), write each part as it comes back, merge the parts, write ``summary.json``."""
from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rbjax import __version__
from rbjax.core import parallel
from rbjax.core.interrupt import interruptible
from rbjax.core.io import atomic_write_json, check_output_dir, check_output_file
from rbjax.core.log import get_logger
from rbjax.core.progress import progress_bar
from rbjax.core.reuse import claim_outputs, record_outputs
from rbjax.data.dumps import (
    WORKER_BASE_BYTES,
    DumpStats,
    RecordFilter,
    UnreadableDumpsError,
    decoder_memory,
    expand_paths,
)
from rbjax.data.retrieval.config import RetrieveConfig
from rbjax.data.retrieval.layout import output_layout
from rbjax.data.retrieval.merge import merge_parts
from rbjax.data.retrieval.parts import file_entry, load_part, part_folder, write_part
from rbjax.data.retrieval.query import QueryMatcher
from rbjax.data.retrieval.scan import (
    RETRIEVAL_VERSION,
    FilePart,
    FileTask,
    ScanSettings,
    code_digest,
    file_stat,
    scan_dump,
)


@dataclasses.dataclass
class RetrievalResult:
    """Summary of one retrieval run.

    Attributes:
        stats: the dump reader's counters, summed over all files (reused ones included).
        candidates: rows written, per bias type.
        comments_matched: comments with at least one window written, per bias type.
        duplicates: windows dropped as repeated phrases (or repeated comment ids), per type.
        too_long: records whose cleaned body had ``max_chars`` characters or more.
        empty: records whose cleaned body was empty.
        seconds: wall time of the run.
        outputs: output CSV per bias type.
        files: one dict per dump file, in merge order: ``path``, ``status`` (``"read"`` or
            ``"reused"``), ``reason``, the counters (``lines``, ``prefiltered``, ``parsed``,
            ``corrupt``, ``kept`` ...), ``windows`` per type (before de-duplication),
            ``errors``, ``seconds``, ``worker`` and ``part`` (its folder).
        lines_read: lines read in this run (files reused from an earlier run not counted).
        jobs: worker processes (local) or the in-flight limit (Ray, ``None`` = all).
        executor: ``"local"`` or ``"ray"``.
        summary_path: the JSON summary of the run.
    """

    stats: DumpStats
    candidates: dict[str, int]
    comments_matched: dict[str, int]
    duplicates: dict[str, int]
    too_long: int
    empty: int
    seconds: float
    outputs: dict[str, Path]
    files: list[dict] = dataclasses.field(default_factory=list)
    lines_read: int | None = None
    jobs: int | None = 1
    executor: str = "local"
    summary_path: Path | None = None

    @property
    def comments_per_second(self) -> float:
        """Lines (comments) read per second in this run, including those skipped by the prefilter."""
        n = self.stats.lines if self.lines_read is None else self.lines_read
        return n / self.seconds if self.seconds > 0 else float("nan")

    def summary(self, per_file_limit: int = 20) -> str:
        read = [f for f in self.files if f["status"] == "read"]
        reused = [f for f in self.files if f["status"] == "reused"]
        n_read = self.stats.lines if self.lines_read is None else self.lines_read
        how = f"{self.executor}, {self.jobs} job{'s' if self.jobs != 1 else ''}" if self.jobs else self.executor
        lines = [f"read {n_read:,} comments from {len(read)} file{'s' if len(read) != 1 else ''} in "
                 f"{self.seconds:.1f} s ({self.comments_per_second:,.0f} comments/s; {how})"]
        if reused:
            lines.append(f"reused {len(reused)} file{'s' if len(reused) != 1 else ''} done by an earlier run with "
                         f"the same inputs ({sum(f['lines'] for f in reused):,} comments)")
        lines += [self.stats.summary(),
                  f"cleaned body too long (>= limit): {self.too_long:,}; empty after cleaning: {self.empty:,}"]
        if 1 < len(self.files) <= per_file_limit:
            lines.append("per file:")
            for f in self.files:
                lines.append(f"  {f['path']}: {f['status']}, lines {f['lines']:,}, prefiltered {f['prefiltered']:,}, "
                             f"corrupt {f['corrupt']:,}, kept {f['kept']:,}, windows "
                             + ", ".join(f"{n} {k:,}" for n, k in f["windows"].items())
                             + (", stream error" if f["errors"] else ""))
        for name, n in self.candidates.items():
            lines.append(
                f"{name}: {n:,} candidates from {self.comments_matched[name]:,} comments "
                f"({self.duplicates[name]:,} duplicates dropped) -> {self.outputs[name]}"
            )
        if self.summary_path is not None:
            lines.append(f"summary (per file and total counters): {self.summary_path}")
        return "\n".join(lines)


class _RunProgress:
    """tqdm bar over the compressed bytes of the files to read: files done/total, comments/s
    overall and the time left. In-process runs also pass line counts while a file is read."""

    def __init__(self, enabled: bool | None, n_files: int, n_done: int, total_bytes: int):
        self.bar = None
        self.n_files, self.done = n_files, n_done
        self.lines_done = 0  # lines of files finished in this run
        self.lines_live = 0  # lines of the file being read in this process
        self.t0 = self._shown = time.perf_counter()
        if enabled is False:
            return

        self.bar = progress_bar(total_bytes, self._desc(), "B", enabled=enabled, leave=True, unit_scale=True,
                                unit_divisor=1024, smoothing=0.1)

    def _desc(self) -> str:
        return f"retrieve: files {self.done}/{self.n_files}"

    def _postfix(self) -> None:
        if self.bar is not None:
            dt = time.perf_counter() - self.t0
            n = self.lines_done + self.lines_live
            self.bar.set_postfix_str(f"{n:,} comments, {n / dt if dt > 0 else 0:,.0f}/s", refresh=False)

    def update(self, n: int) -> None:
        """Lines read in the current (in-process) file."""
        self.lines_live += n
        if self.bar is not None:
            now = time.perf_counter()
            if now - self._shown > 0.5:
                self._shown = now
                self._postfix()
                self.bar.refresh()

    def file_done(self, size: int, lines: int) -> None:
        self.done += 1
        self.lines_done += lines
        self.lines_live = 0
        if self.bar is not None:
            self.bar.set_description_str(self._desc(), refresh=False)
            self._postfix()
            self.bar.update(size)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _versions() -> dict:
    import platform


    out = {"rbjax": __version__, "retrieval_version": RETRIEVAL_VERSION, "python": platform.python_version(),
           "platform": platform.platform()}
    try:
        import zstandard

        out["zstandard"] = zstandard.__version__
    except ImportError:  # pragma: no cover
        pass
    return out


def retrieve(
    specs,
    dumps: str | Path | Sequence[str | Path],
    out: str | Path,
    config: RetrieveConfig | None = None,
    *,
    progress: bool | None = None,
    jobs: int | None = 1,
    executor: str = "local",
    ray_address: str | None = None,
    resume: bool = True,
    on_file: Callable[[dict], None] | None = None,
    log: Callable[[str], None] | None = None,
    overwrite: bool = False,
    **settings,
) -> RetrievalResult:
    """Retrieve candidate comments and windows for one or more bias types (paper §2.2).

    Each dump file is scanned on its own (:func:`scan_dump`: in this process, in worker
    processes, or as a Ray task) and its windows and counters are written as a *part* under
    the parts folder (:func:`output_layout`) with a record of what produced them: the file's
    absolute path, size and mtime, the bias specifications, the settings and the retrieval
    code (:data:`RETRIEVAL_VERSION`, :func:`code_digest`). A rerun reuses the parts whose
    record matches and reads again the files whose inputs changed, so an interrupted run loses
    at most the files in flight. The parts are then merged in file order, with
    de-duplication, into one CSV per bias type: the result does not depend on ``jobs``, the
    executor or the order in which files finish.

    Long because: this docstring is the reference of every retrieval setting (about 90 lines); the body is about 35
    lines, the sequence of the steps below it.

    Args:
        specs: a :class:`~rbjax.specs.BiasSpec` or a list of them.
        dumps: dump file(s) or glob patterns (``"RC_2019-*.zst"``, each pattern sorted; see
            :func:`rbjax.data.dumps.expand_paths`): ``.zst`` (2 GiB windows accepted),
            ``.jsonl``, ``.json`` ... Files are merged in this order.
        out: output CSV, or a folder (see :func:`output_layout`).
        config: what is kept and how (:class:`rbjax.data.retrieval.config.RetrieveConfig`; default: the paper's):

            * ``start``, ``end``: ``created_utc`` range, ``start`` inclusive, ``end`` exclusive (ISO date
              or epoch seconds); ``None`` = open.
            * ``subreddits``: keep only these subreddits; ``None`` = all.
            * ``window``: tokens each side of the target term (paper: 7).
            * ``max_chars``: keep cleaned comments shorter than this (paper: 150).
            * ``clean_mode``: ``"paper"`` or ``"reference"`` (see :func:`clean_comment`).
            * ``require_attribute_in_window``: drop windows without an A1 attribute (what upstream did
              for every type except religion1); default keeps them, flagged.
            * ``dedupe``: keep each phrase once per bias type, and each comment id once (over all files).
            * ``prefilter``: use the raw-bytes target-word prefilter (exact; see the package notes).
        **settings: :class:`~rbjax.data.retrieval.config.RetrieveConfig` fields that override ``config``
            (``window=3``); any other name is a ``TypeError``.
        progress: tqdm bar on stderr; ``None`` = only when stderr is a terminal.
        jobs: local executor: worker processes (``1`` = this process; ``None`` = the cores
            available, bounded by memory, see :func:`rbjax.core.parallel.plan_jobs`: a worker
            needs the zstd window of its file, up to 2 GiB). Ray: the most files in flight
            (``None`` = all; each task asks Ray for 1 CPU and its file's memory).
        executor: ``"local"`` or ``"ray"`` (files must be at the same absolute path on every node).
        ray_address: Ray cluster to attach to (see :func:`rbjax.core.parallel.as_completed`).
        resume: reuse the parts of files already done with the same inputs; ``False`` reads
            every file again.
        on_file: called with each file's entry (see :attr:`RetrievalResult.files`) right
            after its part is written.
        log: where notes go (the jobs bound); default: the ``rbjax retrieve`` logger (:func:`rbjax.core.log.get_logger`).
        overwrite: replace candidate CSVs / ``summary.json`` that are not this retrieval's own unchanged output of
            the same specification(s) and settings (a rerun over added or changed dumps updates them in place);
            without it they are refused before any file is read
            (:func:`rbjax.core.reuse.claim_outputs`).

    Returns:
        A :class:`RetrievalResult` (counts, timing, output paths, per-file entries).

    Raises:
        FileNotFoundError: a dump file is missing, or a pattern matches nothing.
        ValueError: a setting of the wrong type or out of range (:class:`rbjax.core.errors.SettingError`, naming
            it), a bad date bound, ``jobs``, executor, or a spec without queries/attributes; an output
            path that is a folder or lies under a file; a file that changes while it is read; or not one
            record could be read from any dump
            (:class:`~rbjax.data.dumps.UnreadableDumpsError`: every file failed to decompress
            or parse; then no CSV is written). A readable dump without matches is not an
            error: the CSV then has only its header.
        rbjax.core.reuse.OutputExists: see ``overwrite``.
        rbjax.core.parallel.TaskError: a file's scan failed or its worker died (parts of the files
            finished before are kept).
        RuntimeError: ``executor="ray"`` without Ray, or a Ray worker running other rbjax code.
        TypeError: a keyword that is not a setting.
        rbjax.core.interrupt.Interrupted: Ctrl-C / SIGTERM (at once, the file in flight dropped); the message says
            how many files are finished and kept as parts.
    """

    cfg = (config or RetrieveConfig()).replace(**settings)
    log = log or get_logger("retrieve").info
    specs, filt = _checked_inputs(specs, cfg, executor, jobs)
    names = [s.name for s in specs]
    dumps = [dumps] if isinstance(dumps, (str, os.PathLike)) else list(dumps)
    files = expand_paths(dumps)  # missing dump files are named before anything is created
    layout = output_layout(out, names)
    for p in layout.csvs.values():
        check_output_file(p, "output CSV")
    check_output_dir(layout.parts_dir, "parts folder")
    settings = ScanSettings(specs=tuple(specs), window=int(cfg.window), max_chars=int(cfg.max_chars),
                            clean_mode=cfg.clean_mode, start=filt.t0, end=filt.t1,
                            subreddits=None if filt.subs is None else tuple(sorted(filt.subs)),
                            prefilter=bool(cfg.prefilter))
    t0 = time.perf_counter()
    tasks = []
    for p in files:
        size, mtime = file_stat(str(p))
        tasks.append(FileTask(os.path.abspath(p), size, mtime, settings))
    # The folder is this query's resumable retrieval: a rerun with the same specification(s) and settings updates it
    # in place over added or changed dumps (each changed file is read again, below). Without --overwrite it refuses
    # anything else: other settings or specifications, or a file edited since rbjax wrote it.
    run_key = {"command": "retrieve", "dedupe": cfg.dedupe,
               "require_attribute_in_window": cfg.require_attribute_in_window,
               "settings": {k: v for k, v in settings.record().items() if k not in ("retrieval_version",
                                                                                    "code_sha256")}}
    targets = [*layout.csvs.values(), layout.summary]
    claim_outputs(targets, run_key, overwrite=overwrite)
    files_done = _FilesDone(tasks, layout.parts_dir, names)
    todo = files_done.reuse_parts(resume)
    n_jobs, resources = _plan_workers(executor, jobs, [tasks[i] for i in todo], log)
    _scan_files(files_done, todo, executor=executor, n_jobs=n_jobs, resources=resources, ray_address=ray_address,
                progress=progress, on_file=on_file)
    res, totals = _merged_result(files_done, layout, cfg, t0, executor=executor, n_jobs=n_jobs)
    _write_summary(layout, res, totals, settings, cfg, dumps)
    record_outputs(targets, run_key)
    return res


def _checked_inputs(specs, cfg: RetrieveConfig, executor: str, jobs: int | None) -> tuple[list, RecordFilter]:
    """The bias specifications as a list and the record filter, once the executor, ``jobs``, the specifications
    (each named once, each with queries and attributes) and the date bounds are checked: before anything is read.

    Raises:
        ValueError: see :func:`retrieve`.
    """
    if not isinstance(specs, (list, tuple)):
        specs = [specs]
    if executor not in parallel.EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; expected one of {', '.join(parallel.EXECUTORS)}")
    if jobs is not None and jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"bias types given more than once: {names}")
    for s in specs:
        QueryMatcher(s, window=cfg.window)  # a spec without queries/attributes is named now
    return list(specs), RecordFilter(cfg.start, cfg.end, cfg.subreddits)  # bad dates are named before anything is read


def _write_summary(layout, res: RetrievalResult, totals: dict, settings: ScanSettings, cfg: RetrieveConfig,
                   dumps: list) -> None:
    """Write the run's ``summary.json``: outputs, counts, totals, settings, the run's executor and speed, the files'
    entries, versions."""
    names = list(layout.csvs)
    atomic_write_json(layout.summary, {
        "bias_types": names,
        "outputs": {n: str(p) for n, p in layout.csvs.items()},
        "candidates": res.candidates, "comments_matched": res.comments_matched, "duplicates": res.duplicates,
        "totals": totals, "corrupt_examples": res.stats.corrupt_examples, "stream_errors": res.stats.errors,
        "unreadable": res.stats.unreadable,
        "settings": {**settings.record(), "dedupe": cfg.dedupe,
                     "require_attribute_in_window": cfg.require_attribute_in_window,
                     "dumps": [str(d) for d in dumps]},
        "run": {"executor": res.executor, "jobs": res.jobs, "seconds": res.seconds, "lines_read": res.lines_read,
                "comments_per_second": res.comments_per_second if res.lines_read else None,
                "files_read": sum(e["status"] == "read" for e in res.files),
                "files_reused": sum(e["status"] == "reused" for e in res.files)},
        "files": res.files,
        "versions": _versions(),
    })


class _FilesDone:
    """The dump files of a run and, for each, its part's record and its entry (:attr:`RetrievalResult.files`) once
    it is reused or read (``None`` until then)."""

    def __init__(self, tasks: list[FileTask], parts_dir: Path, names: list[str]):
        self.tasks, self.parts_dir, self.names = tasks, parts_dir, names
        self.entries: list[dict | None] = [None] * len(tasks)
        self.records: list[dict | None] = [None] * len(tasks)
        self.reasons: dict[int, str] = {}

    def folder(self, i: int) -> Path:
        return part_folder(self.parts_dir, self.tasks[i].path)

    def reuse_parts(self, resume: bool) -> list[int]:
        """Take the parts of the files already done with the same inputs (``resume``); returns the indices of the
        files to read (:attr:`reasons` says why each one is read)."""
        todo = []
        for i, task in enumerate(self.tasks):
            rec, why = load_part(self.folder(i), task.inputs(), self.names) if resume else (None, "resume off")
            if rec is not None:
                self.records[i] = rec
                self.entries[i] = dict(file_entry(task.path, rec, "reused", why), part=str(self.folder(i)))
            else:
                todo.append(i)
                self.reasons[i] = why
        return todo

    def read(self, i: int, part: FilePart) -> dict:
        """Write file ``i``'s part, just read; returns its entry."""
        task = self.tasks[i]
        rec = write_part(self.folder(i), part, task.inputs(), self.names)
        self.records[i] = rec
        self.entries[i] = dict(file_entry(task.path, rec, "read", self.reasons[i]), part=str(self.folder(i)))
        return self.entries[i]

    def stopped(self, sig: str) -> str:
        """What an interrupt keeps: the parts of the files finished (this run or before)."""
        done = sum(e is not None for e in self.entries)
        now = sum(e is not None and e["status"] == "read" for e in self.entries)
        return (f"rbjax retrieve: {sig} — stopped; {done} of {len(self.tasks)} dump file(s) are finished and kept as "
                f"parts in {self.parts_dir} ({now} read in this run, {done - now} from before); the file(s) in flight "
                "are read again and the candidates CSVs and summary are written by the next run. Run the same "
                "command again: it reuses the finished files.")


def _plan_workers(executor: str, jobs: int | None, todo: list[FileTask], log: Callable[[str], None]):
    """``(n_jobs, resources)``: local worker processes for the files to read, bounded by memory (a note goes to
    ``log``), and no per-task resources; on Ray, ``jobs`` and each task's CPU and memory."""
    if executor == "local":
        need = max((decoder_memory(t.path) for t in todo), default=0) + WORKER_BASE_BYTES
        n_jobs, note = parallel.plan_jobs(len(todo), need, jobs)
        if note:
            log(note)
        return min(n_jobs, max(1, len(todo))), None

    def resources(task: FileTask) -> dict:
        return {"num_cpus": 1, "memory": decoder_memory(task.path) + WORKER_BASE_BYTES}
    return jobs, resources


def _scan_files(files: _FilesDone, todo: list[int], *, executor: str, n_jobs: int | None, resources,
                ray_address: str | None, progress: bool | None, on_file: Callable[[dict], None] | None) -> None:
    """Read the files ``todo`` (in this process, worker processes or Ray tasks), writing each part as it comes back.

    Raises:
        RuntimeError: a worker runs other retrieval code. rbjax.core.interrupt.Interrupted: a signal (the message
            says what is kept). rbjax.core.parallel.TaskError: a scan failed.
    """
    tasks = files.tasks
    bar = _RunProgress(progress, len(tasks), len(tasks) - len(todo), sum(tasks[i].size for i in todo))
    in_process = executor == "local" and n_jobs == 1
    fn = functools.partial(scan_dump, progress=bar) if in_process else scan_dump
    digest = code_digest()

    def on_result(k: int, part: FilePart) -> None:
        i = todo[k]
        task = tasks[i]
        if part.worker.get("code_sha256") != digest:
            raise RuntimeError(f"the worker that read {task.path} (host {part.worker.get('host')}) runs other rbjax "
                               "retrieval code than this machine; install the same rbjax version on every node")
        entry = files.read(i, part)
        bar.file_done(task.size, part.stats.lines)
        if on_file is not None:
            on_file(entry)

    # a dump file can take hours: a signal stops at once (the files finished are kept), with this account
    try:
        with interruptible(files.stopped, defer=False):
            if todo:  # (all reused: no worker, no Ray cluster)
                parallel.run_tasks(fn, [tasks[i] for i in todo], executor=executor, jobs=n_jobs,
                                   resources=resources, ray_address=ray_address, on_result=on_result)
    finally:
        bar.close()


def _merged_result(files: _FilesDone, layout, cfg: RetrieveConfig, t0: float, *, executor: str,
                   n_jobs: int | None) -> tuple[RetrievalResult, dict]:
    """Merge the parts into the candidates CSVs; returns the run's result and the summary's ``totals``.

    Raises:
        rbjax.data.dumps.UnreadableDumpsError: no file could be read (no CSV is written).
    """
    stats = DumpStats()
    too_long = empty = 0
    for rec in files.records:
        stats.add(DumpStats.from_dict(rec["stats"]))
        too_long += rec["too_long"]
        empty += rec["empty"]
    if len(stats.unreadable) == len(files.tasks):
        raise UnreadableDumpsError(stats, note="no candidates CSV was written")
    merged = merge_parts(layout.csvs, [(files.folder(i), rec) for i, rec in enumerate(files.records)],
                         dedupe=cfg.dedupe, require_attribute_in_window=cfg.require_attribute_in_window)
    seconds = time.perf_counter() - t0
    entries, names = files.entries, files.names
    lines_read = sum(e["lines"] for e in entries if e["status"] == "read")
    res = RetrievalResult(
        stats=stats, candidates={n: merged[n]["candidates"] for n in names},
        comments_matched={n: merged[n]["matched"] for n in names},
        duplicates={n: merged[n]["duplicates"] for n in names}, too_long=too_long, empty=empty, seconds=seconds,
        outputs=dict(layout.csvs), files=entries, lines_read=lines_read, jobs=n_jobs, executor=executor,
        summary_path=layout.summary)
    totals = {k: v for k, v in stats.to_dict().items() if not isinstance(v, list)}
    totals.update(kept=stats.yielded, too_long=too_long, empty=empty)
    return res, totals

