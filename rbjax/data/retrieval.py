"""Candidate retrieval from Reddit comment dumps (paper §2.2).

The paper's procedure, over dumps instead of the (defunct) Pushshift API:

1. **Query** = a T1 target query (``spec.queries``: the T1 terms with the correct form of
   "to be" where the specification says so, e.g. ``"jews are"``, ``"torah is"``) × an A1
   attribute (``spec.attributes_a1``): a comment is retrieved when it contains both, as
   whole words, anywhere. ``*`` in an attribute is a wildcard (``greed*`` matches
   ``greedy``, ``greediness``); multi-word attributes (quoted in the paper's lists, e.g.
   ``"beady eyes"``) must occur as that word sequence.
2. **Cleaning**: remove URLs (including the link part of ``[text](url)``), user names
   (``u/name``, ``/u/name``, ``@name``) and extra spaces, lower-case; HTML entities of the
   dumps (``&amp;``) are decoded. Only comments shorter than ``max_chars`` (150)
   characters *after* cleaning are kept.
3. **Window**: split the cleaned comment on single spaces; for every occurrence of a T1
   target term (``spec.phrase_words`` when the spec has them, else ``spec.targets_t1``),
   the phrase is tokens ``[i-7, i+8)`` around the term's first token ``i``. Flags record
   whether an A1 attribute and a query lie inside the window. Identical phrases are kept
   once (per bias type), as upstream did.

Speed: every query needs one literal word; a raw-bytes prefilter checks the
lower-cased line for these words before any JSON parsing, so the vast majority of lines
cost a ``bytes.lower`` and one regex scan. The prefilter is exact for ASCII query words
(a line it rejects cannot contain a query after cleaning); it is switched off when a query
has non-ASCII letters. Corner cases it would miss: a query word written with HTML numeric
entities (``&#106;ews``) or JSON ``\\u00XX`` escapes of ASCII letters (no dump writer does this),
or with non-ASCII letters whose lower case is ASCII (the Kelvin sign).

Output (CSV, written to a temporary file and moved into place at the end) has the columns
of :data:`CANDIDATE_COLUMNS`.

Many files (:func:`retrieve`): each dump file is one task (:func:`scan_dump`), run in this
process, in spawned worker processes or on a Ray cluster (:mod:`rbjax.core.parallel`). A task
returns every window of its file *before* de-duplication; the calling process writes it as a
part (``<parts>/<file name>-<hash of its path>/windows_<k>.csv`` + ``part.json``, the record
of what produced it, written last) as soon as it comes back. The merge then replays the
de-duplication over the parts in file order, exactly as one pass over the files would, so
the candidates CSV is byte-identical whatever the number of jobs, the executor or the order
in which files finish.
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import functools
import html
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from rbjax import __version__
from rbjax.core import parallel
from rbjax.core.io import atomic_csv_writer, atomic_write_json, check_output_dir, check_output_file, sha256_file
from rbjax.core.progress import progress_bar
from rbjax.core.reuse import claim_outputs, record_outputs
from rbjax.data import dumps
from rbjax.data.dumps import (
    WORKER_BASE_BYTES,
    DumpStats,
    RecordFilter,
    UnreadableDumpsError,
    decoder_memory,
    expand_paths,
    iter_records,
)

#: Columns of a candidates CSV. ``attribute`` = A1 entries (as written in the spec) found in
#: the window, ``|``-separated; ``comment_attributes`` = those found anywhere in the comment.
#: Flags are written ``True``/``False`` as in the released files.
CANDIDATE_COLUMNS: tuple[str, ...] = (
    "id",
    "bias_type",
    "subreddit",
    "created_utc",
    "comment",
    "phrase",
    "target",
    "query",
    "attribute",
    "comment_attributes",
    "attribute_in_window",
    "query_in_window",
)

#: Tokens each side of the target term (paper §2.2: ±7).
WINDOW = 7
#: Comments must be shorter than this after cleaning (paper §2.2).
MAX_CHARS = 150

_MD_LINK = re.compile(r"\[([^\]\n]*)\]\(\s*(?:https?://|www\.)[^)\s]*\s*\)", re.IGNORECASE)
_URL = re.compile(r"(?:\bhttps?://|\bwww\.)\S+", re.IGNORECASE)
_USER = re.compile(r"(?<![\w/])/?u/[A-Za-z0-9_-]+|(?<![\w@])@[A-Za-z0-9_]+", re.IGNORECASE)
_SPACES = re.compile(r"\s+")
_REFERENCE_DROP = re.compile(r"[^a-z0-9 .!?-]+")


def clean_comment(text: str, mode: str = "paper") -> str:
    """Clean one comment as the paper does (§2.2).

    Args:
        text: raw comment body.
        mode: ``"paper"`` — remove URLs, user names (``u/…``, ``/u/…``, ``@…``) and extra
            whitespace (runs become one space, ends stripped), decode HTML entities,
            lower-case; non-ASCII letters are kept. ``"reference"`` — the same, then drop
            every character outside ``a-z 0-9 space . ! ? -`` (the character set of the
            released phrase files; apostrophes vanish, ``you'd`` → ``youd``). The exact
            upstream cleaning script is not published; this mode approximates its output.

    Returns:
        The cleaned, lower-case text (may be empty).

    Raises:
        ValueError: unknown ``mode``.
    """
    if mode not in ("paper", "reference"):
        raise ValueError(f"unknown cleaning mode {mode!r}; expected 'paper' or 'reference'")
    if "&" in text:
        text = html.unescape(text)
    if "](" in text:
        text = _MD_LINK.sub(r" \1 ", text)
    if "://" in text or "www." in text or "WWW." in text:
        text = _URL.sub(" ", text)
    if "u/" in text or "@" in text or "U/" in text:
        text = _USER.sub(" ", text)
    text = _SPACES.sub(" ", text).strip().lower()
    if mode == "reference":
        text = _REFERENCE_DROP.sub("", text).strip()
    return text


def _term_body(term: str) -> str:
    """Regex for one spec term without the leading boundary: ``*`` = any word characters,
    quotes ignored, words separated by one or more spaces, a trailing word boundary unless
    the term ends with ``*``."""
    term = term.strip().strip('"').strip().replace('"', "")
    parts = [r"\w*".join(re.escape(piece) for piece in w.split("*")) for w in term.split()]
    tail = "" if term.endswith("*") else r"(?!\w)"
    return " +".join(parts) + tail


def _term_pattern(term: str) -> str:
    """Regex for one spec term as whole words (see :func:`_term_body`)."""
    return r"(?<!\w)" + _term_body(term)


def _alternation(terms: Iterable[str]) -> re.Pattern | None:
    """One regex for several terms, longest first; the leading word boundary is factored
    out of the alternation, which makes ``re`` about 20x faster on these lists."""
    uniq = sorted({t for t in terms if t and t.strip().strip('"*')}, key=lambda t: (-len(t), t))
    if not uniq:
        return None
    return re.compile(r"(?<!\w)(?:" + "|".join(_term_body(t) for t in uniq) + ")")


#: Words that never make a good prefilter needle (forms of "to be", function words).
_GENERIC_WORDS = frozenset("is are was were be been am should the a an his her their of and".split())


def _chunks(text: str) -> list[str]:
    return [c for c in re.split(r"[^a-z0-9]+", text.lower()) if c]


def _needle(query: str, generic: frozenset[str] | set[str] = _GENERIC_WORDS,
            group_words: frozenset[str] | set[str] = frozenset()) -> str | None:
    """The literal word of a query used by the bytes prefilter.

    Preference: a word that names the T1 group (``group_words``: the first specific word of
    each T1 target), then any word not in ``generic`` (forms of "to be", function words,
    the T2 side's words), then any word; the longest within a tier. So
    ``"jewish people are"`` gives ``jewish`` and ``"queer person is"`` gives ``queer``.
    ``None`` when the query has non-ASCII letters or no literal word.
    """
    q = query.lower()
    if not q.isascii():
        return None
    chunks = _chunks(q.replace("*", " "))
    if not chunks:
        return None
    for tier in ([c for c in chunks if c in group_words], [c for c in chunks if c not in generic], chunks):
        if tier:
            return max(tier, key=len)
    return None  # pragma: no cover


def _trie_regex(words: Iterable[str]) -> str:
    """A regex matching any of ``words`` as a substring, written as a prefix trie (fast in ``re``)."""
    root: dict = {}
    for w in words:
        node = root
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict) -> str:
        alts = [re.escape(ch) + emit(sub) for ch, sub in sorted(node.items()) if ch != ""]
        if not alts:
            return ""
        if "" in node:  # a word ends here: any longer continuation is optional for substring search
            return ""
        return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"

    return emit(root)


@dataclasses.dataclass
class Candidate:
    """One retrieved window (one output row); fields as :data:`CANDIDATE_COLUMNS`."""

    id: str
    bias_type: str
    subreddit: str
    created_utc: str
    comment: str
    phrase: str
    target: str
    query: str
    attribute: str
    comment_attributes: str
    attribute_in_window: bool
    query_in_window: bool

    def row(self) -> list[str]:
        return [
            self.id,
            self.bias_type,
            self.subreddit,
            self.created_utc,
            self.comment,
            self.phrase,
            self.target,
            self.query,
            self.attribute,
            self.comment_attributes,
            str(self.attribute_in_window),
            str(self.query_in_window),
        ]


class QueryMatcher:
    """Compiled T1-query × A1-attribute matcher for one bias specification (paper §2.2).

    Args:
        spec: a :class:`rbjax.specs.BiasSpec` (packaged or user-written).
        window: tokens each side of the target term (paper: 7).

    Raises:
        ValueError: the spec has no queries or no A1 attributes.
    """

    def __init__(self, spec, window: int = WINDOW):
        self.spec = spec
        self.name = spec.name
        self.window = int(window)
        queries = tuple(spec.queries) or tuple(spec.targets_t1)
        if not queries:
            raise ValueError(f"bias specification {spec.name!r} has no queries / T1 targets")
        if not spec.attributes_a1:
            raise ValueError(f"bias specification {spec.name!r} has no A1 attributes")
        self.queries = queries
        centre_terms = tuple(getattr(spec, "phrase_words", None) or ()) or tuple(spec.targets_t1) or queries
        self.query_re = _alternation(queries)
        self.target_re = _alternation(centre_terms)
        self.attr_re = _alternation(spec.attributes_a1)
        # per-entry patterns, to name which spec entries a matched text came from
        # (displayed without the paper's quotes: '"beady eyes"' -> 'beady eyes')
        self._attr_entries = [(a.strip().replace('"', ""), re.compile(_term_pattern(a)))
                              for a in spec.attributes_a1 if a.strip().strip('"*')]
        self._attr_cache: dict[str, tuple[str, ...]] = {}
        generic = set(_GENERIC_WORDS)
        for t in tuple(spec.targets_t2) + tuple(b for _, b in spec.pairs):
            generic.update(_chunks(t))
        group_words = set()
        for t in centre_terms + tuple(spec.targets_t1):
            specific = [c for c in _chunks(t) if c not in generic]
            if specific:
                group_words.add(specific[0])
        needles = [_needle(q, generic, group_words) for q in queries]
        self.needles: tuple[str, ...] | None = None if any(n is None for n in needles) else tuple(sorted(set(needles)))
        # cheap substring check before the full (word-bounded, many-alternative) query regex
        self._quick = re.compile(_trie_regex(self.needles)).search if self.needles else None

    def _entries(self, matched: str) -> tuple[str, ...]:
        hit = self._attr_cache.get(matched)
        if hit is None:
            hit = tuple(a for a, rx in self._attr_entries if rx.search(matched))
            if len(self._attr_cache) < 100_000:
                self._attr_cache[matched] = hit
        return hit

    def attributes_in(self, text: str) -> list[str]:
        """A1 entries (as written in the spec) that occur in ``text``, in spec order, unique."""
        found: set[str] = set()
        for m in self.attr_re.finditer(text):
            found.update(self._entries(m.group(0)))
        return [a for a, _ in self._attr_entries if a in found]

    def match(self, text: str) -> list[tuple[str, str, str, list[str], bool, bool]]:
        """Windows of one *cleaned* comment.

        Args:
            text: the cleaned comment (see :func:`clean_comment`).

        Returns:
            A list of ``(phrase, target, query, window_attributes, attribute_in_window,
            query_in_window)``, one per distinct window; empty when the comment does not
            contain both a query and an A1 attribute (the retrieval query).
        """
        if self._quick is not None and self._quick(text) is None:
            return []
        qm = self.query_re.search(text)
        if qm is None or self.attr_re.search(text) is None:
            return []
        tokens = text.split(" ")
        w = self.window
        centres = list(self.target_re.finditer(text)) if self.target_re is not None else []
        if not centres:
            centres = list(self.query_re.finditer(text))
        out = []
        seen = set()
        for m in centres:
            i = text.count(" ", 0, m.start())
            phrase = " ".join(tokens[max(0, i - w) : i + w + 1])
            if phrase in seen:
                continue
            seen.add(phrase)
            attrs = self.attributes_in(phrase)
            q_in = self.query_re.search(phrase)
            out.append((phrase, m.group(0), (q_in or qm).group(0), attrs, bool(attrs), q_in is not None))
        return out


_BODY_KEY = b'"body":'


def raw_body(line: bytes) -> bytes:
    """The still-escaped JSON string value of ``"body"`` in a raw NDJSON line.

    Returns the whole line when the line does not have exactly one ``"body":`` key whose
    value is a string (the caller then checks the whole line, which is always safe).
    """
    i = line.find(_BODY_KEY)
    if i < 0 or line.find(_BODY_KEY, i + 7) >= 0:
        return line
    j = i + 7
    n = len(line)
    while j < n and line[j] in b" \t":
        j += 1
    if j >= n or line[j] != 34:  # '"'
        return line
    k = line.find(b'"', j + 1)
    while k > 0 and line[k - 1] == 92:  # an escaped quote unless the backslashes pair up
        b = k - 1
        while line[b] == 92:
            b -= 1
        if (k - 1 - b) % 2 == 0:
            break
        k = line.find(b'"', k + 1)
    if k < 0:
        return line
    return line[j + 1 : k]


def make_prefilter(matchers: Sequence[QueryMatcher]):
    """Raw-line prefilter for a set of matchers: ``f(line_bytes) -> bool``.

    A line passes when the ASCII-lower-cased raw ``body`` value (:func:`raw_body`, still
    JSON-escaped) contains one of the matchers' query needles (one literal word per query,
    see :func:`_needle`). JSON encoders do not escape ASCII letters and cleaning never joins
    two pieces of text into one word, so this does not reject a line whose cleaned body
    contains a query (exceptions in the module notes). Returns ``None`` (no prefilter)
    when some query has no ASCII needle.
    """
    needles: set[str] = set()
    for m in matchers:
        if m.needles is None:
            return None
        needles.update(m.needles)
    # drop needles that contain a shorter needle: the shorter one already lets the line through
    kept: list[str] = []
    for n in sorted(needles, key=len):
        if not any(k in n for k in kept):
            kept.append(n)
    search = re.compile(_trie_regex(kept).encode("ascii")).search

    def prefilter(line: bytes) -> bool:
        # fast path: the compact form of the dumps, one "body" key, no escaped quote at its end
        i = line.find(b'"body":"')
        if i >= 0:
            j = i + 8
            k = line.find(b'"', j)
            if k > 0 and line[k - 1] != 92 and line.count(_BODY_KEY) == 1:
                return search(line[j:k].lower()) is not None
        return search(raw_body(line).lower()) is not None

    prefilter.needles = tuple(kept)  # type: ignore[attr-defined]
    return prefilter


def output_paths(out: str | Path, names: Sequence[str]) -> dict[str, Path]:
    """Output CSV per bias type (see :func:`output_layout`)."""
    return output_layout(out, names).csvs


@dataclasses.dataclass(frozen=True)
class OutputLayout:
    """Where a retrieval run writes.

    Attributes:
        csvs: the merged candidates CSV of each bias type.
        parts_dir: the per-file parts (one sub-folder per dump file).
        summary: the JSON summary of the run.
        folder: whether ``--out`` named a folder.
    """

    csvs: dict[str, Path]
    parts_dir: Path
    summary: Path
    folder: bool


def output_layout(out: str | Path, names: Sequence[str]) -> OutputLayout:
    """Output files of a run for ``names`` (bias types) from ``--out``.

    * A folder (an existing one, or a path without a file suffix and without ``{bias}``):
      ``OUT/candidates_<name>.csv`` per type, ``OUT/summary.json`` and ``OUT/parts/``.
    * A file: one bias type: ``out`` itself; several: ``out`` formatted with ``{bias}``,
      else ``<stem>_<name><suffix>``. The parts and ``summary.json`` go to ``<out>.parts/``
      beside it (``{bias}`` there replaced by the names joined with ``+``).
    """
    out_s = str(out)
    names = list(names)
    p = Path(out_s)
    if "{bias}" not in out_s and (p.is_dir() or (not p.exists() and not p.suffix)):
        return OutputLayout({n: p / f"candidates_{n}.csv" for n in names}, p / "parts", p / "summary.json", True)
    if "{bias}" in out_s:
        csvs = {n: Path(out_s.format(bias=n)) for n in names}
        parts = Path(out_s.replace("{bias}", "+".join(names)) + ".parts")
    else:
        if len(names) == 1:
            csvs = {names[0]: p}
        else:
            suffix = p.suffix or ".csv"
            csvs = {n: p.with_name(f"{p.stem}_{n}{suffix}") for n in names}
        parts = Path(out_s + ".parts")
    return OutputLayout(csvs, parts, parts / "summary.json", False)


# ----------------------------------------------------------------------------------------------
# One dump file: the work unit of a run (runs in a worker process or on a Ray node)

#: Version of the retrieval logic and of the per-file part format. Parts written under another
#: version (or by other source code of this module and :mod:`rbjax.data.dumps`) are redone.
RETRIEVAL_VERSION = 1
#: Columns of a per-file part: the record's ordinal in the file, then :data:`CANDIDATE_COLUMNS`.
PART_COLUMNS: tuple[str, ...] = ("record", *CANDIDATE_COLUMNS)

_CODE_DIGEST: str | None = None


def code_digest() -> str:
    """sha256 of the source of this module and :mod:`rbjax.data.dumps`: part of every part's key,
    and checked against what each worker runs (a Ray node with other rbjax code is refused)."""
    global _CODE_DIGEST
    if _CODE_DIGEST is None:
        import hashlib


        h = hashlib.sha256()
        for f in (__file__, dumps.__file__):
            h.update(Path(f).read_bytes())
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
    """Everything besides the dump file that decides what a file gives (see :func:`retrieve`).

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


def _stat(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def scan_dump(task: FileTask, progress=None) -> FilePart:
    """Retrieve every window of one dump file, without de-duplication (paper §2.2).

    The work unit of :func:`retrieve`: a top-level function, run in worker processes or as a
    Ray task on the node that reads the file.

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
    if _stat(path) != (task.size, task.mtime_ns):
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
    if _stat(path) != (task.size, task.mtime_ns):
        raise ValueError(f"dump file {path} changed while it was read (size or modification time)")
    import socket

    return FilePart(path=path, size=task.size, mtime_ns=task.mtime_ns, windows=windows, stats=stats,
                    too_long=too_long, empty=empty, seconds=time.perf_counter() - t0,
                    cpu_seconds=time.process_time() - c0,
                    worker={"host": socket.gethostname(), "pid": os.getpid(), "peak_rss_mib": peak_rss_mib(),
                            "code_sha256": code_digest()})


# ----------------------------------------------------------------------------------------------
# Per-file parts on disk (the driver writes them as results come back) and the merge

PART_RECORD = "part.json"


def part_folder(parts_dir: Path, path: str) -> Path:
    """Sub-folder of ``parts_dir`` for the dump file ``path`` (its name plus a hash of its full path)."""
    import hashlib

    return parts_dir / f"{Path(path).name}-{hashlib.sha1(path.encode('utf-8', 'surrogatepass')).hexdigest()[:12]}"


def _write_part(folder: Path, part: FilePart, inputs: dict, names: Sequence[str]) -> dict:
    """Write a file's windows and record; the record goes last, so it exists only for a complete part."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / PART_RECORD).unlink(missing_ok=True)
    windows = {}
    for j, name in enumerate(names):
        fname = f"windows_{j}.csv"
        with atomic_csv_writer(folder / fname, PART_COLUMNS, errors="backslashreplace") as w:
            w.writerows(part.windows[name])
        windows[name] = {"file": fname, "rows": len(part.windows[name]), "sha256": sha256_file(folder / fname)}
    record = {"format": RETRIEVAL_VERSION, "inputs": inputs, "windows": windows, "stats": part.stats.to_dict(),
              "too_long": part.too_long, "empty": part.empty, "seconds": part.seconds,
              "cpu_seconds": part.cpu_seconds, "worker": part.worker,
              "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    atomic_write_json(folder / PART_RECORD, record)
    return record


def _changed(old: dict, new: dict) -> list[str]:
    what = []
    of, nf = old.get("file") or {}, new["file"]
    what += [k for k in ("path", "size", "mtime_ns") if of.get(k) != nf[k]]
    what += [k for k in new if k != "file" and old.get(k) != new[k]]
    return what


def _load_part(folder: Path, inputs: dict, names: Sequence[str]) -> tuple[dict | None, str]:
    """``(record, "reused")`` when ``folder`` holds a complete part made from ``inputs``, else
    ``(None, why it must be read)``."""
    f = folder / PART_RECORD
    if not f.is_file():
        return None, "new"
    try:
        rec = json.loads(f.read_text(encoding="utf-8"))
        old = rec["inputs"]
    except (OSError, ValueError, KeyError, TypeError):
        return None, "part record unreadable"
    changed = _changed(old, inputs)
    if changed:
        return None, "changed: " + ", ".join(changed)
    for name in names:
        w = (rec.get("windows") or {}).get(name)
        if not w or not (folder / w["file"]).is_file() or sha256_file(folder / w["file"]) != w["sha256"]:
            return None, "part files damaged"
    return rec, "reused"


def _file_entry(path: str, rec: dict, status: str, reason: str) -> dict:
    st = rec["stats"]
    return {"path": path, "size": rec["inputs"]["file"]["size"], "mtime_ns": rec["inputs"]["file"]["mtime_ns"],
            "status": status, "reason": reason, "lines": st["lines"], "prefiltered": st["prefiltered"],
            "parsed": st["parsed"], "corrupt": st["corrupt"], "no_body": st["no_body"], "deleted": st["deleted"],
            "out_of_range": st["out_of_range"], "other_subreddit": st["other_subreddit"], "kept": st["yielded"],
            "too_long": rec["too_long"], "empty": rec["empty"],
            "windows": {n: w["rows"] for n, w in rec["windows"].items()},
            "errors": st["errors"], "unreadable": st["unreadable"], "seconds": rec["seconds"],
            "cpu_seconds": rec["cpu_seconds"], "worker": rec["worker"], "part": None}


def _replay(rows: Iterable[list[str]], writer, state: dict, dedupe: bool, require_attribute_in_window: bool) -> None:
    """Apply de-duplication to one part's windows, exactly as one pass over the files in order
    would: a comment id seen before drops all the comment's windows (and does not mark its
    phrases); a window without an attribute is dropped before its phrase is marked."""
    seen_ids, seen_phrases = state["ids"], state["phrases"]
    group: list[list[str]] = []
    current = None

    def flush():
        if not group:
            return
        cid = group[0][1]
        if dedupe and cid:
            if cid in seen_ids:
                state["duplicates"] += len(group)
                return
            seen_ids.add(cid)
        wrote = False
        for row in group:
            if require_attribute_in_window and row[11] != "True":
                continue
            if dedupe:
                phrase = row[6]
                if phrase in seen_phrases:
                    state["duplicates"] += 1
                    continue
                seen_phrases.add(phrase)
            writer.writerow(row[1:])
            state["candidates"] += 1
            wrote = True
        if wrote:
            state["matched"] += 1

    for row in rows:
        if row[0] != current:
            flush()
            group = []
            current = row[0]
        group.append(row)
    flush()


def _read_part_rows(path: Path) -> Iterator[list[str]]:
    with open(path, newline="", encoding="utf-8") as f:
        r = csv.reader(f)
        header = next(r, None)
        if tuple(header or ()) != PART_COLUMNS:
            raise ValueError(f"{path}: not a retrieval part (header {header})")
        yield from r


# ----------------------------------------------------------------------------------------------
# The run


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
    *,
    start=None,
    end=None,
    subreddits: Iterable[str] | None = None,
    window: int = WINDOW,
    max_chars: int = MAX_CHARS,
    clean_mode: str = "paper",
    require_attribute_in_window: bool = False,
    dedupe: bool = True,
    prefilter: bool = True,
    progress: bool | None = None,
    jobs: int | None = 1,
    executor: str = "local",
    ray_address: str | None = None,
    resume: bool = True,
    on_file: Callable[[dict], None] | None = None,
    log: Callable[[str], None] | None = None,
    overwrite: bool = False,
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

    Args:
        specs: a :class:`~rbjax.specs.BiasSpec` or a list of them.
        dumps: dump file(s) or glob patterns (``"RC_2019-*.zst"``, each pattern sorted; see
            :func:`rbjax.data.dumps.expand_paths`): ``.zst`` (2 GiB windows accepted),
            ``.jsonl``, ``.json`` ... Files are merged in this order.
        out: output CSV, or a folder (see :func:`output_layout`).
        start, end: ``created_utc`` range, ``start`` inclusive, ``end`` exclusive (ISO date
            or epoch seconds); ``None`` = open.
        subreddits: keep only these subreddits; ``None`` = all.
        window: tokens each side of the target term (paper: 7).
        max_chars: keep cleaned comments shorter than this (paper: 150).
        clean_mode: ``"paper"`` or ``"reference"`` (see :func:`clean_comment`).
        require_attribute_in_window: drop windows without an A1 attribute (what upstream did
            for every type except religion1); default keeps them, flagged.
        dedupe: keep each phrase once per bias type, and each comment id once (over all files).
        prefilter: use the raw-bytes target-word prefilter (exact; see the module notes).
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
        log: where notes go (the jobs bound); default: stderr.
        overwrite: replace candidate CSVs / ``summary.json`` that are not this retrieval's own unchanged output of
            the same specification(s) and settings (a rerun over added or changed dumps updates them in place);
            without it they are refused before any file is read
            (:func:`rbjax.core.reuse.claim_outputs`).

    Returns:
        A :class:`RetrievalResult` (counts, timing, output paths, per-file entries).

    Raises:
        FileNotFoundError: a dump file is missing, or a pattern matches nothing.
        ValueError: bad date bound, cleaning mode, ``jobs``, executor, or a spec without
            queries/attributes; an output path that is a folder or lies under a file; a file
            that changes while it is read; or not one record could be read from any dump
            (:class:`~rbjax.data.dumps.UnreadableDumpsError`: every file failed to decompress
            or parse; then no CSV is written). A readable dump without matches is not an
            error: the CSV then has only its header.
        rbjax.core.reuse.OutputExists: see ``overwrite``.
        rbjax.core.parallel.TaskError: a file's scan failed or its worker died (parts of the files
            finished before are kept).
        RuntimeError: ``executor="ray"`` without Ray, or a Ray worker running other rbjax code.
    """

    log = log or (lambda msg: print(msg, file=sys.stderr))
    if not isinstance(specs, (list, tuple)):
        specs = [specs]
    if clean_mode not in ("paper", "reference"):
        raise ValueError(f"unknown cleaning mode {clean_mode!r}; expected 'paper' or 'reference'")
    if executor not in parallel.EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; expected one of {', '.join(parallel.EXECUTORS)}")
    if jobs is not None and jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"bias types given more than once: {names}")
    for s in specs:
        QueryMatcher(s, window=window)  # a spec without queries/attributes is named now
    filt = RecordFilter(start, end, subreddits)  # bad dates are named before anything is read
    dumps = [dumps] if isinstance(dumps, (str, os.PathLike)) else list(dumps)
    files = expand_paths(dumps)  # missing dump files are named before anything is created
    layout = output_layout(out, names)
    for p in layout.csvs.values():
        check_output_file(p, "output CSV")
    check_output_dir(layout.parts_dir, "parts folder")
    settings = ScanSettings(specs=tuple(specs), window=int(window), max_chars=int(max_chars), clean_mode=clean_mode,
                            start=filt.t0, end=filt.t1,
                            subreddits=None if filt.subs is None else tuple(sorted(filt.subs)), prefilter=bool(prefilter))
    t0 = time.perf_counter()
    tasks = []
    for p in files:
        size, mtime = _stat(str(p))
        tasks.append(FileTask(os.path.abspath(p), size, mtime, settings))
    # The folder is this query's resumable retrieval: a rerun with the same specification(s) and settings updates it
    # in place over added or changed dumps (each changed file is read again, below). Without --overwrite it refuses
    # anything else: other settings or specifications, or a file edited since rbjax wrote it.
    run_key = {"command": "retrieve", "dedupe": dedupe, "require_attribute_in_window": require_attribute_in_window,
               "settings": {k: v for k, v in settings.record().items() if k not in ("retrieval_version",
                                                                                    "code_sha256")}}
    targets = [*layout.csvs.values(), layout.summary]
    claim_outputs(targets, run_key, overwrite=overwrite)
    entries: list[dict | None] = [None] * len(tasks)
    records: list[dict | None] = [None] * len(tasks)
    todo: list[int] = []
    reasons: dict[int, str] = {}
    for i, task in enumerate(tasks):
        folder = part_folder(layout.parts_dir, task.path)
        rec, why = _load_part(folder, task.inputs(), names) if resume else (None, "resume off")
        if rec is not None:
            records[i] = rec
            entries[i] = dict(_file_entry(task.path, rec, "reused", why), part=str(folder))
        else:
            todo.append(i)
            reasons[i] = why
    # how many workers
    resources = None
    if executor == "local":
        need = max((decoder_memory(tasks[i].path) for i in todo), default=0) + WORKER_BASE_BYTES
        n_jobs, note = parallel.plan_jobs(len(todo), need, jobs)
        n_jobs = min(n_jobs, max(1, len(todo)))
        if note:
            log(f"rbjax retrieve: {note}")
    else:
        n_jobs = jobs

        def resources(task: FileTask) -> dict:
            return {"num_cpus": 1, "memory": decoder_memory(task.path) + WORKER_BASE_BYTES}

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
        folder = part_folder(layout.parts_dir, task.path)
        rec = _write_part(folder, part, task.inputs(), names)
        records[i] = rec
        entries[i] = dict(_file_entry(task.path, rec, "read", reasons[i]), part=str(folder))
        bar.file_done(task.size, part.stats.lines)
        if on_file is not None:
            on_file(entries[i])

    try:
        if todo:  # (all reused: no worker, no Ray cluster)
            parallel.run_tasks(fn, [tasks[i] for i in todo], executor=executor, jobs=n_jobs, resources=resources,
                               ray_address=ray_address, on_result=on_result)
    finally:
        bar.close()

    stats = DumpStats()
    too_long = empty = 0
    for rec in records:
        stats.add(DumpStats.from_dict(rec["stats"]))
        too_long += rec["too_long"]
        empty += rec["empty"]
    if len(stats.unreadable) == len(tasks):
        raise UnreadableDumpsError(stats, note="no candidates CSV was written")
    states = {n: {"ids": set(), "phrases": set(), "candidates": 0, "matched": 0, "duplicates": 0} for n in names}
    with contextlib.ExitStack() as stack:
        writers = {n: stack.enter_context(atomic_csv_writer(layout.csvs[n], CANDIDATE_COLUMNS,
                                                            errors="backslashreplace")) for n in names}
        for n in names:
            for task, rec in zip(tasks, records):
                folder = part_folder(layout.parts_dir, task.path)
                _replay(_read_part_rows(folder / rec["windows"][n]["file"]), writers[n], states[n], dedupe,
                        require_attribute_in_window)
    seconds = time.perf_counter() - t0
    lines_read = sum(e["lines"] for e in entries if e["status"] == "read")
    res = RetrievalResult(
        stats=stats, candidates={n: states[n]["candidates"] for n in names},
        comments_matched={n: states[n]["matched"] for n in names},
        duplicates={n: states[n]["duplicates"] for n in names}, too_long=too_long, empty=empty, seconds=seconds,
        outputs=dict(layout.csvs), files=entries, lines_read=lines_read, jobs=n_jobs, executor=executor,
        summary_path=layout.summary)
    totals = {k: v for k, v in stats.to_dict().items() if not isinstance(v, list)}
    totals.update(kept=stats.yielded, too_long=too_long, empty=empty)
    atomic_write_json(layout.summary, {
        "bias_types": names,
        "outputs": {n: str(p) for n, p in layout.csvs.items()},
        "candidates": res.candidates, "comments_matched": res.comments_matched, "duplicates": res.duplicates,
        "totals": totals, "corrupt_examples": stats.corrupt_examples, "stream_errors": stats.errors,
        "unreadable": stats.unreadable,
        "settings": {**settings.record(), "dedupe": dedupe, "require_attribute_in_window": require_attribute_in_window,
                     "dumps": [str(d) for d in dumps]},
        "run": {"executor": executor, "jobs": n_jobs, "seconds": seconds, "lines_read": lines_read,
                "comments_per_second": res.comments_per_second if lines_read else None,
                "files_read": sum(e["status"] == "read" for e in entries),
                "files_reused": sum(e["status"] == "reused" for e in entries)},
        "files": entries,
        "versions": _versions(),
    })
    record_outputs(targets, run_key)
    return res
