"""One dump file, the work unit of a retrieval run (runs in this process, a worker process or on a Ray node):
:func:`scan_dump` gives every window of the file before de-duplication (a :class:`FilePart`); the settings
that decide what a file gives and the code digest that keys every part."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path

from rbjax.data import dumps
from rbjax.data.dumps import DumpStats, UnreadableDumpsError, iter_records
from rbjax.data.retrieval.query import (
    CANDIDATE_COLUMNS,
    MAX_CHARS,
    WINDOW,
    QueryMatcher,
    clean_comment,
    make_prefilter,
)

#: Version of the retrieval logic and of the per-file part format. Parts written under another
#: version (or by other source code, see :func:`code_digest`) are redone.
RETRIEVAL_VERSION = 1
#: Columns of a per-file part: the record's ordinal in the file, then :data:`CANDIDATE_COLUMNS`.
PART_COLUMNS: tuple[str, ...] = ("record", *CANDIDATE_COLUMNS)

#: The modules of this package whose source decides what a part holds: the query (cleaning, matching, prefilter),
#: this scan, and the part files (written, checked and read back). The layout, the merge and the driver are not
#: among them: they decide where parts go and how they are combined, not what a part holds, so changing them keeps
#: every part (the merge is redone on every run anyway).
_DIGEST_MODULES = ("query.py", "scan.py", "parts.py")

_CODE_DIGEST: str | None = None


def code_digest_sources() -> tuple[Path, ...]:
    """The source files :func:`code_digest` hashes, in order: :data:`_DIGEST_MODULES` of this package, then
    :mod:`rbjax.data.dumps` (the reader)."""
    here = Path(__file__).parent
    return (*(here / name for name in _DIGEST_MODULES), Path(dumps.__file__))


def code_digest() -> str:
    """sha256 of the source of the retrieval code that shapes a part (:func:`code_digest_sources`): part of every
    part's key, and checked against what each worker runs (a Ray node with other rbjax code is refused)."""
    global _CODE_DIGEST
    if _CODE_DIGEST is None:
        h = hashlib.sha256()
        for f in code_digest_sources():
            h.update(f.read_bytes())
        _CODE_DIGEST = h.hexdigest()
    return _CODE_DIGEST


def _spec_record(spec) -> dict:
    """The fields of a bias specification that retrieval reads (all of them shape the windows
    or the prefilter's counters)."""
    return {"name": spec.name, "queries": list(spec.queries), "targets_t1": list(spec.targets_t1),
            "targets_t2": list(spec.targets_t2), "pairs": [list(p) for p in spec.pairs],
            "phrase_words": list(getattr(spec, "phrase_words", ()) or ()),
            "attributes_a1": list(spec.attributes_a1)}


@dataclasses.dataclass(frozen=True)
class ScanSettings:
    """Everything besides the dump file that decides what a file gives (see
    :func:`rbjax.data.retrieval.run.retrieve`).

    ``start``/``end`` are epoch seconds (``None`` = open), ``subreddits`` normalised names.
    De-duplication and ``require_attribute_in_window`` are not here: they are applied when the
    parts are merged, so parts are shared between runs that differ only in them.
    """

    specs: tuple
    window: int = WINDOW
    max_chars: int = MAX_CHARS
    clean_mode: str = "paper"
    start: float | None = None
    end: float | None = None
    subreddits: tuple[str, ...] | None = None
    prefilter: bool = True

    def record(self) -> dict:
        return {"retrieval_version": RETRIEVAL_VERSION, "code_sha256": code_digest(),
                "specs": [_spec_record(s) for s in self.specs], "window": self.window,
                "max_chars": self.max_chars, "clean_mode": self.clean_mode, "start": self.start, "end": self.end,
                "subreddits": None if self.subreddits is None else list(self.subreddits),
                "drop_deleted": True, "prefilter": self.prefilter}


@dataclasses.dataclass(frozen=True)
class FileTask:
    """One dump file to scan: absolute path, its size and mtime when the run listed it, settings."""

    path: str
    size: int
    mtime_ns: int
    settings: ScanSettings

    @property
    def name(self) -> str:  # for rbjax.core.parallel's messages
        return self.path

    def inputs(self) -> dict:
        """The record of what produces this file's part (compared on resume; JSON-normalised)."""
        rec = {"file": {"path": self.path, "size": self.size, "mtime_ns": self.mtime_ns}, **self.settings.record()}
        return json.loads(json.dumps(rec))


@dataclasses.dataclass
class FilePart:
    """What one dump file gives, before de-duplication (the result of :func:`scan_dump`).

    Attributes:
        path, size, mtime_ns: the file as the worker saw it.
        windows: per bias type, every window of every matching comment in file order, as rows
            of :data:`PART_COLUMNS` (strings).
        stats: the reader's counters for this file.
        too_long, empty: records dropped after cleaning (too long / empty).
        seconds, cpu_seconds: wall and CPU time of the scan.
        worker: ``host``, ``pid``, ``peak_rss_mib`` (the worker process's peak so far) and
            ``code_sha256`` (:func:`code_digest` on the worker).
    """

    path: str
    size: int
    mtime_ns: int
    windows: dict[str, list[list[str]]]
    stats: DumpStats
    too_long: int
    empty: int
    seconds: float
    cpu_seconds: float
    worker: dict


def peak_rss_mib() -> float | None:
    """This process's peak resident memory (``VmHWM``) in MiB; ``None`` where unknown."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def file_stat(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def scan_dump(task: FileTask, progress=None) -> FilePart:
    """Retrieve every window of one dump file, without de-duplication (paper §2.2).

    The work unit of :func:`rbjax.data.retrieval.run.retrieve`: a top-level function, run in worker
    processes or as a Ray task on the node that reads the file.

    Args:
        task: the file and settings.
        progress: optional object with ``update(n_lines)`` (only in the calling process).

    Returns:
        A :class:`FilePart`. A file from which not one record can be read is not an error
        here: its ``stats.unreadable`` says why, and the merge decides.

    Raises:
        FileNotFoundError: the file is gone.
        ValueError: the file's size or mtime is not what the run listed (it is being written
            or was replaced), before or after the scan.
    """
    path, s = task.path, task.settings
    if file_stat(path) != (task.size, task.mtime_ns):
        raise ValueError(f"dump file {path} changed since the run listed it (size or modification time); "
                         "is it still being written?")
    matchers = [QueryMatcher(spec, window=s.window) for spec in s.specs]
    pf = make_prefilter(matchers) if s.prefilter else None
    stats = DumpStats()
    windows: dict[str, list[list[str]]] = {m.name: [] for m in matchers}
    too_long = empty = 0
    t0, c0 = time.perf_counter(), time.process_time()
    records = iter_records(path, start=s.start, end=s.end, subreddits=s.subreddits, prefilter=pf, stats=stats,
                           progress=progress)
    try:
        for k, rec in enumerate(records):
            text = clean_comment(rec["body"], s.clean_mode)
            if not text:
                empty += 1
                continue
            if len(text) >= s.max_chars:
                too_long += 1
                continue
            row_head = None
            for m in matchers:
                wins = m.match(text)
                if not wins:
                    continue
                if row_head is None:
                    created = rec.get("created_utc")
                    row_head = (str(k), str(rec.get("id", "")), str(rec.get("subreddit") or ""),
                                "" if created is None else str(created))
                comment_attrs = "|".join(m.attributes_in(text))
                rk, cid, sub, created_s = row_head
                out = windows[m.name]
                for phrase, target, query, attrs, a_in, q_in in wins:
                    out.append([rk, cid, m.name, sub, created_s, text, phrase, target, query, "|".join(attrs),
                                comment_attrs, str(a_in), str(q_in)])
    except UnreadableDumpsError:
        pass  # stats.unreadable names the problem
    if file_stat(path) != (task.size, task.mtime_ns):
        raise ValueError(f"dump file {path} changed while it was read (size or modification time)")
    import socket

    return FilePart(path=path, size=task.size, mtime_ns=task.mtime_ns, windows=windows, stats=stats,
                    too_long=too_long, empty=empty, seconds=time.perf_counter() - t0,
                    cpu_seconds=time.process_time() - c0,
                    worker={"host": socket.gethostname(), "pid": os.getpid(), "peak_rss_mib": peak_rss_mib(),
                            "code_sha256": code_digest()})
