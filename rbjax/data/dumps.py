"""Streaming reader for Reddit comment dumps (paper §2.2, retrieval).

The paper retrieved candidates through the Pushshift API, which is gone. The same
comments live on as monthly dumps: newline-delimited JSON, one comment object per line
(fields such as ``body``, ``id``, ``author``, ``subreddit``, ``created_utc``), compressed
with zstandard using a 2 GiB window (``zstd --long=31``).

This module reads such files line by line in bounded memory:

* ``.zst`` (any window up to 2 GiB, several frames), ``.gz``, ``.bz2``, ``.xz`` and plain
  ``.jsonl`` / ``.ndjson`` / ``.json`` (NDJSON; a ``.json`` file whose first byte is ``[``
  is read as one JSON array, which is *not* bounded in memory: arrays are for small files).
* Lines that are not valid JSON objects are counted as corrupt and reported (file, line
  number, reason); they never stop the read. A compressed stream that ends early or is
  damaged is read up to the damage (every line decoded before it is kept), reported in
  :attr:`DumpStats.errors` with how many lines were read, and the read goes on with the next
  file. When *no* file gives a single JSON record because every one of them failed to
  decompress or parse, :func:`iter_records` raises :class:`UnreadableDumpsError` at the end
  (a readable file without matching records is not an error).
* Optional filters: a ``created_utc`` range and a set of subreddits; ``[deleted]`` /
  ``[removed]`` bodies are dropped by default.
* Optional *prefilter*: a function on the raw (undecoded) line; lines for which it returns
  false are skipped without JSON parsing. Retrieval passes a check for its target words,
  which makes it many times faster. A skipped line is counted in
  :attr:`DumpStats.prefiltered`; it is not checked for corruption (it cannot match).
"""
from __future__ import annotations

import bz2
import contextlib
import dataclasses
import datetime as _dt
import glob
import gzip
import io
import json
import lzma
import os
from pathlib import Path
from typing import Callable, Iterable, Iterator

import zstandard

#: Largest zstd window accepted (``zstd --long=31``), the one monthly Reddit dumps use.
MAX_WINDOW_SIZE = 2**31
#: Bytes read from the (decompressed) stream at a time.
CHUNK_SIZE = 1 << 20
#: A "line" longer than this without a newline is dropped as corrupt (keeps memory bounded).
MAX_LINE_BYTES = 64 << 20
#: Bodies that mean the comment is gone.
DELETED_BODIES = frozenset({"[deleted]", "[removed]"})
#: How many corrupt-line examples :class:`DumpStats` keeps.
MAX_EXAMPLES = 10


@dataclasses.dataclass
class DumpStats:
    """Counters of one read over one or more dump files.

    Attributes:
        files: files opened.
        lines: non-empty lines seen.
        prefiltered: lines skipped unparsed by the prefilter.
        parsed: lines decoded as JSON objects.
        corrupt: lines that were parsed and are not a JSON object (bad JSON, bad UTF-8,
            a truncated line, a JSON value that is not an object, an over-long line).
        no_body: objects without a string ``body`` (e.g. submissions).
        deleted: ``[deleted]`` / ``[removed]`` bodies dropped.
        out_of_range: dropped by the date filter (including records without ``created_utc``
            while a date filter is set).
        other_subreddit: dropped by the subreddit filter.
        yielded: records handed to the caller.
        corrupt_examples: up to :data:`MAX_EXAMPLES` ``"file:line: reason"`` strings.
        errors: stream-level problems (damaged or truncated compressed data), one per file.
        unreadable: files from which not one JSON record could be decoded because of a
            stream error or corrupt lines (one ``"file: reason"`` each).
    """

    files: int = 0
    lines: int = 0
    prefiltered: int = 0
    parsed: int = 0
    corrupt: int = 0
    no_body: int = 0
    deleted: int = 0
    out_of_range: int = 0
    other_subreddit: int = 0
    yielded: int = 0
    corrupt_examples: list[str] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)
    unreadable: list[str] = dataclasses.field(default_factory=list)

    def add_corrupt(self, path: str | Path, line_no: int, reason: str) -> None:
        self.corrupt += 1
        if len(self.corrupt_examples) < MAX_EXAMPLES:
            self.corrupt_examples.append(f"{path}:{line_no}: {reason}")

    def add(self, other: "DumpStats") -> "DumpStats":
        """Add ``other``'s counters to these (``other`` read after this one: its examples come
        after, and the examples stay capped at :data:`MAX_EXAMPLES`). Returns ``self``."""
        for f in dataclasses.fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, list):
                mine.extend(theirs)
            else:
                setattr(self, f.name, mine + theirs)
        del self.corrupt_examples[MAX_EXAMPLES:]
        return self

    def to_dict(self) -> dict:
        """The counters as a JSON-able dict (:meth:`from_dict` reads it back)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DumpStats":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: (list(v) if isinstance(v, list) else v) for k, v in d.items() if k in names})

    def summary(self) -> str:
        """A short human-readable report (several lines)."""
        out = [
            f"files {self.files}, lines {self.lines:,}, skipped by prefilter {self.prefiltered:,}, "
            f"parsed {self.parsed:,}, kept {self.yielded:,}",
            f"dropped: deleted/removed {self.deleted:,}, no body {self.no_body:,}, "
            f"outside date range {self.out_of_range:,}, other subreddit {self.other_subreddit:,}",
            f"corrupt lines: {self.corrupt:,}" + (" (not fatal; first ones below)" if self.corrupt else ""),
        ]
        out += [f"  {e}" for e in self.corrupt_examples]
        out += [f"stream error: {e}" for e in self.errors]
        return "\n".join(out)


def parse_time(value: str | int | float | _dt.date | None) -> float | None:
    """Parse a date-range bound into a UTC epoch second.

    Args:
        value: ``None``; an epoch number (int/float or a string of digits); an ISO date
            ``YYYY-MM-DD`` (midnight UTC) or datetime ``YYYY-MM-DDTHH:MM[:SS]`` (UTC unless
            it carries an offset); or a ``datetime.date``/``datetime``.

    Returns:
        Seconds since the epoch, or ``None`` for ``None``.

    Raises:
        ValueError: the string is neither an epoch number nor an ISO date.
    """
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, _dt.datetime):
        d = value if value.tzinfo else value.replace(tzinfo=_dt.timezone.utc)
        return d.timestamp()
    if isinstance(value, _dt.date):
        return _dt.datetime(value.year, value.month, value.day, tzinfo=_dt.timezone.utc).timestamp()
    s = str(value).strip()
    try:
        return float(s)
    except ValueError:
        pass
    try:
        d = _dt.datetime.fromisoformat(s)
    except ValueError:
        raise ValueError(f"cannot read date {value!r}: use YYYY-MM-DD, an ISO datetime, or epoch seconds") from None
    if d.tzinfo is None:
        d = d.replace(tzinfo=_dt.timezone.utc)
    return d.timestamp()


#: The first four bytes of a zstd frame (``28 b5 2f fd``).
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: Compressed bytes handed to the zstd decompressor at a time. Small pieces keep what a
#: damaged block costs small: the text of blocks completed earlier in the same piece is
#: lost with the error, everything before the piece has already been handed out.
ZSTD_PIECE = 1 << 13


def _is_zstd_start(head: bytes) -> bool:
    """True when ``head`` starts like a zstd frame or a skippable frame (``5? 2a 4d 18``)."""
    return head[:4] == ZSTD_MAGIC or (len(head) >= 4 and head[0] & 0xF0 == 0x50 and head[1:4] == b"\x2a\x4d\x18")


class _ZstdReader(io.RawIOBase):
    """Decompress a zstd stream (several frames, windows up to 2 GiB) and notice truncation.

    ``stream_reader`` returns a silent EOF when the input stops in the middle of a frame;
    this reader raises :class:`zstandard.ZstdError` instead, so a cut download is reported.
    Errors are raised only after all text decoded before them has been read: a damaged or
    cut file is streamed up to the last complete zstd block before the damage (zstd decodes
    whole blocks of up to 128 KiB of text; a partial block cannot be decoded at all).
    """

    def __init__(self, fh, read_size: int = 1 << 17):
        self._fh = fh
        self._dctx = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW_SIZE)
        self._obj = self._dctx.decompressobj()
        self._in_frame = False
        self._buf = b""
        self._pos = 0
        self._read_size = read_size
        self._eof = False
        self._error: zstandard.ZstdError | None = None  # raised once the text before it is read
        self._started = False

    def readable(self) -> bool:
        return True

    def _fill(self) -> None:
        while self._pos >= len(self._buf):
            if self._error is not None:
                err, self._error = self._error, None
                raise err
            if self._eof:
                return
            data = self._fh.read(self._read_size)
            if not self._started:
                self._started = True
                if data and not _is_zstd_start(data):
                    self._eof = True
                    raise zstandard.ZstdError(
                        f"not zstd-compressed data (the file starts with bytes {data[:4].hex(' ')}, "
                        f"not the zstd magic number {ZSTD_MAGIC.hex(' ')})")
            if not data:
                self._eof = True
                if self._in_frame:
                    raise zstandard.ZstdError("input ends in the middle of a zstd frame (truncated file)")
                return
            out = []
            try:
                while data:
                    self._in_frame = True
                    piece, data = data[:ZSTD_PIECE], data[ZSTD_PIECE:]
                    out.append(self._obj.decompress(piece))
                    if self._obj.eof:  # frame complete; the rest belongs to the next frame
                        data = self._obj.unused_data + data
                        self._obj = self._dctx.decompressobj()
                        self._in_frame = False
            except zstandard.ZstdError as e:  # hand out the text decoded before the damage first
                self._error, self._eof = e, True
            self._buf, self._pos = b"".join(out), 0

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            chunks = []
            while True:
                self._fill()
                if self._pos >= len(self._buf):
                    return b"".join(chunks)
                chunks.append(self._buf[self._pos :])
                self._pos = len(self._buf)
        self._fill()
        out = self._buf[self._pos : self._pos + size]
        self._pos += len(out)
        return out

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


@contextlib.contextmanager
def open_dump(path: str | Path):
    """Open a dump file as a binary stream of *decompressed* bytes.

    Args:
        path: ``.zst`` (long windows up to 2 GiB accepted, multi-frame; a file that stops
            inside a frame raises :class:`zstandard.ZstdError` at the end), ``.gz``,
            ``.bz2``, ``.xz``/``.lzma``, or an uncompressed file.

    Yields:
        A readable binary file object.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"dump file not found: {p}")
    suffix = p.suffix.lower()
    with open(p, "rb") as fh:
        if suffix in (".zst", ".zstd"):
            yield _ZstdReader(fh)
        elif suffix == ".gz":
            with gzip.GzipFile(fileobj=fh) as r:
                yield r
        elif suffix == ".bz2":
            with bz2.BZ2File(fh) as r:
                yield r
        elif suffix in (".xz", ".lzma"):
            with lzma.LZMAFile(fh) as r:
                yield r
        else:
            yield fh


#: Leading bytes of each compressed format, to tell "not this format at all" from damage.
_MAGIC = {".gz": ("gzip", b"\x1f\x8b"), ".bz2": ("bzip2", b"BZh"), ".xz": ("xz", b"\xfd7zXZ\x00")}


def _not_format(path: Path) -> str | None:
    """``"not gzip-compressed data (...)"`` when a compressed file lacks its format's magic bytes."""
    suffix = path.suffix.lower()
    with open(path, "rb") as f:
        head = f.read(6)
    if suffix in (".zst", ".zstd"):
        ok, name, magic = _is_zstd_start(head), "zstd", ZSTD_MAGIC
    elif suffix in _MAGIC:
        name, magic = _MAGIC[suffix]
        ok = head.startswith(magic)
    else:
        return None
    if ok or not head:
        return None
    hint = ""
    if head.lstrip()[:1] in (b"{", b"["):
        hint = "; it looks like uncompressed JSON: name it .jsonl"
    return (f"not {name}-compressed data (the file starts with bytes {head[:len(magic)].hex(' ')}, "
            f"not the {name} magic number {magic.hex(' ')}{hint})")


def _stream_error(path: Path, error: BaseException, line_no: int) -> str:
    """The :attr:`DumpStats.errors` entry of a damaged, truncated or mislabelled compressed file."""
    msg = str(error) or type(error).__name__
    if "Frame requires too much memory" in msg:
        msg += " (window larger than 2 GiB)"
    if line_no == 0:
        wrong = _not_format(path)
        if wrong is not None:
            return f"{path}: cannot be read: {wrong}"
    out = f"{path}: compressed data damaged or truncated after line {line_no:,}: {msg}; "
    if line_no:
        out += f"the {line_no:,} lines before that point were read, the rest of the file is lost"
    else:
        out += "no complete line could be decoded before that point"
    if path.suffix.lower() in (".zst", ".zstd"):
        out += (" (zstd decodes whole blocks of up to 128 KiB of text: the text of the block in which the "
                "data breaks off cannot be recovered)")
    return out


def _is_json_object(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:  # includes UnicodeDecodeError
        return False


def iter_lines(
    path: str | Path,
    stats: DumpStats | None = None,
    progress=None,
    prefilter: Callable[[bytes], bool] | None = None,
) -> Iterator[tuple[int, bytes]]:
    """Yield ``(line_number, raw_line)`` for the non-empty lines of a dump, in order.

    Memory stays bounded by :data:`CHUNK_SIZE` plus the longest line; a line longer than
    :data:`MAX_LINE_BYTES` is dropped and counted as corrupt. A damaged or truncated
    compressed stream ends the file: every line decoded before the damage is yielded first,
    then the problem goes to ``stats.errors`` (with how many lines were read); the line cut
    off at that point is yielded when it is a complete JSON object, else counted as corrupt.

    With a ``prefilter``, lines it rejects are decoded as JSON until one of them turns out
    to be a JSON object (normally the first): until then a rejected line that is not one is
    yielded anyway, so that the parser reports it as corrupt. A file of garbage is thus
    seen as corrupt even when nothing in it passes the prefilter.

    Args:
        path: dump file (see :func:`open_dump`).
        stats: counters to update (``files``, ``lines``, ``prefiltered``, ``corrupt``,
            ``errors``).
        progress: optional object with ``update(n)`` (e.g. a tqdm bar), called once per
            chunk with the number of lines in it.
        prefilter: ``f(raw_line) -> bool``; lines for which it is false are not yielded
            (counted in ``stats.prefiltered``). Applied chunk by chunk, which is faster than
            filtering the yielded lines.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    path = Path(path)
    stats = stats if stats is not None else DumpStats()
    stats.files += 1
    line_no = 0
    carry = b""
    skipping = False  # inside an over-long line that is being dropped
    checking = prefilter is not None  # no prefilter-rejected line decoded as a JSON object yet
    error: BaseException | None = None
    with open_dump(path) as f:
        while True:
            try:
                chunk = f.read(CHUNK_SIZE)
            except (zstandard.ZstdError, OSError, EOFError, lzma.LZMAError) as e:
                error = e
                break
            if not chunk:
                break
            if b"\n" not in chunk:
                if not skipping:
                    carry += chunk
                    if len(carry) > MAX_LINE_BYTES:
                        stats.lines += 1
                        stats.add_corrupt(path, line_no + 1, f"line longer than {MAX_LINE_BYTES} bytes, dropped")
                        carry = b""
                        skipping = True
                continue
            parts = (carry + chunk).split(b"\n") if carry else chunk.split(b"\n")
            carry = parts.pop()
            if skipping:  # the first part ends the dropped line
                parts[0] = b""
                skipping = False
            base = line_no
            line_no += len(parts)
            n_lines = len(parts) - parts.count(b"")
            stats.lines += n_lines
            if progress is not None:
                progress.update(len(parts))
            if prefilter is None:
                for i, ln in enumerate(parts, base + 1):
                    if ln:
                        yield i, ln
                continue
            if checking:
                hits = []
                for i, ln in enumerate(parts):
                    if not ln:
                        continue
                    if prefilter(ln):
                        hits.append(i)
                    elif checking:
                        if _is_json_object(ln):
                            checking = False  # the file holds records: skip unchecked from now on
                        else:
                            hits.append(i)  # not a record: let the parser report it as corrupt
            else:
                hits = [i for i, ln in enumerate(parts) if ln and prefilter(ln)]
            stats.prefiltered += n_lines - len(hits)
            for i in hits:
                yield base + i + 1, parts[i]
    if error is not None:
        stats.errors.append(_stream_error(path, error, line_no))
    if carry and not skipping:
        line_no += 1
        stats.lines += 1
        if progress is not None:
            progress.update(1)
        if error is not None and not _is_json_object(carry):
            stats.add_corrupt(path, line_no, "incomplete line where the compressed data breaks off, dropped")
        elif prefilter is None or prefilter(carry) or (checking and not _is_json_object(carry)):
            yield line_no, carry
        else:
            stats.prefiltered += 1


def parse_line(line: bytes, path: str | Path, line_no: int, stats: DumpStats) -> dict | None:
    """Decode one NDJSON line into a dict; ``None`` (and counted as corrupt) if it is not one.

    Whitespace-only lines are skipped silently (``None``, not counted).
    """
    try:
        rec = json.loads(line)
    except UnicodeDecodeError as e:
        stats.add_corrupt(path, line_no, f"not UTF-8 ({e.reason} at byte {e.start})")
        return None
    except ValueError as e:
        if not line.strip():
            stats.lines -= 1
            return None
        stats.add_corrupt(path, line_no, f"invalid JSON ({e})")
        return None
    if not isinstance(rec, dict):
        stats.add_corrupt(path, line_no, f"JSON {type(rec).__name__}, not an object")
        return None
    stats.parsed += 1
    return rec


class UnreadableDumpsError(ValueError):
    """Every dump file failed to decompress or parse: not one JSON record could be read.

    Attributes:
        stats: the :class:`DumpStats` of the read (``unreadable`` names each file's problem).
    """

    def __init__(self, stats: DumpStats, note: str | None = None):
        self.stats = stats
        super().__init__(
            "no record could be read from the dump file(s): every file failed to decompress or parse"
            + (f"; {note}" if note else "") + "\n" + "\n".join(f"  {u}" for u in stats.unreadable)
        )


class RecordFilter:
    """The record-level filters of :func:`iter_records` (body present, not deleted, date, subreddit).

    Args:
        start, end: ``created_utc`` range, ``start`` inclusive, ``end`` exclusive (see
            :func:`parse_time`); ``None`` = open.
        subreddits: keep only these (case-insensitive, ``r/`` prefix ignored); ``None`` = all.
        drop_deleted: drop ``[deleted]`` / ``[removed]`` bodies.

    Raises:
        ValueError: a date bound cannot be parsed, or ``start >= end``.
    """

    def __init__(self, start=None, end=None, subreddits: Iterable[str] | None = None, drop_deleted: bool = True):
        self.t0, self.t1 = parse_time(start), parse_time(end)
        if self.t0 is not None and self.t1 is not None and self.t0 >= self.t1:
            raise ValueError(f"empty date range: start {start!r} is not before end {end!r}")
        self.subs = None
        if subreddits is not None:
            self.subs = {s.strip().lower().removeprefix("/").removeprefix("r/") for s in subreddits if s.strip()}
        self.drop_deleted = drop_deleted

    def accept(self, rec: dict, stats: DumpStats) -> bool:
        """True when ``rec`` passes; otherwise the matching ``stats`` counter is incremented."""
        body = rec.get("body")
        if not isinstance(body, str):
            stats.no_body += 1
            return False
        if self.drop_deleted and body.strip() in DELETED_BODIES:
            stats.deleted += 1
            return False
        if self.t0 is not None or self.t1 is not None:
            c = _created(rec)
            if c is None or (self.t0 is not None and c < self.t0) or (self.t1 is not None and c >= self.t1):
                stats.out_of_range += 1
                return False
        if self.subs is not None and str(rec.get("subreddit") or "").lower() not in self.subs:
            stats.other_subreddit += 1
            return False
        return True


def _created(rec: dict) -> float | None:
    v = rec.get("created_utc")
    if v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def check_paths(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    """Normalise one path or several to a list, checking that each file exists.

    Raises:
        FileNotFoundError: naming the first missing file.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out = [Path(p) for p in paths]
    if not out:
        raise ValueError("no dump file given")
    for p in out:
        if not p.is_file():
            raise FileNotFoundError(f"dump file not found: {p}")
    return out


def expand_paths(patterns: str | Path | Iterable[str | Path]) -> list[Path]:
    """Dump files named by paths and glob patterns, in the order given, each pattern sorted.

    ``"RC_2019-*.zst"`` gives the matching files sorted by name; a path without ``*``, ``?`` or
    ``[`` (or one that exists as written) is taken as it is. A file named twice (by two
    patterns, or a path and a pattern) is kept once, at its first place.

    Raises:
        FileNotFoundError: a path does not exist, or a pattern matches no file (named).
        ValueError: nothing given, or a path or pattern matches only folders.
    """
    if isinstance(patterns, (str, os.PathLike)):
        patterns = [patterns]
    out: list[Path] = []
    seen: set[Path] = set()
    given = 0
    for pat in patterns:
        given += 1
        s = str(pat)
        if Path(s).exists() or not any(c in s for c in "*?["):
            found = [Path(s)]
            if not found[0].exists():
                raise FileNotFoundError(f"dump file not found: {s}")
        else:
            found = [Path(p) for p in sorted(glob.glob(os.path.expanduser(s)))]
            if not found:
                raise FileNotFoundError(f"no dump file matches {s!r}")
        files = [p for p in found if p.is_file()]
        if not files:
            raise ValueError(f"{s} is a folder, not a dump file" if len(found) == 1 and found[0] == Path(s)
                             else f"{s!r} matches only folders, no dump file")
        for p in files:
            key = p.resolve()
            if key not in seen:
                seen.add(key)
                out.append(p)
    if not given:
        raise ValueError("no dump file given")
    return out


#: Memory a retrieval worker needs besides the decoder's window (interpreter, chunks, rows).
WORKER_BASE_BYTES = 256 << 20


def decoder_memory(path: str | Path) -> int:
    """Bytes of history the decoder of ``path`` may hold: the window of a ``.zst`` file's first
    frame (up to 2 GiB for the monthly dumps; capped by the frame's size when the header gives
    it), a few hundred KiB for the other formats.

    A ``.zst`` header that cannot be read counts as a 2 GiB window (the reader reports the problem).
    """
    p = Path(path)
    if p.suffix.lower() not in (".zst", ".zstd"):
        return 1 << 20
    try:
        with open(p, "rb") as f:
            head = f.read(18)
        params = zstandard.get_frame_parameters(head)
    except (OSError, zstandard.ZstdError):
        return MAX_WINDOW_SIZE
    window = int(params.window_size) or MAX_WINDOW_SIZE
    size = int(params.content_size)
    if 0 < size < window and size != zstandard.CONTENTSIZE_UNKNOWN:
        window = size
    return window


def _iter_file(path: Path, stats: DumpStats, progress=None, prefilter=None) -> Iterator[tuple[int, bytes | dict]]:
    if path.suffix.lower() == ".json" and _starts_with_array(path):
        return _iter_json_array(path, stats)
    return iter_lines(path, stats, progress, prefilter)


def iter_records(
    paths: str | Path | Iterable[str | Path],
    *,
    start: str | int | float | None = None,
    end: str | int | float | None = None,
    subreddits: Iterable[str] | None = None,
    drop_deleted: bool = True,
    prefilter: Callable[[bytes], bool] | None = None,
    stats: DumpStats | None = None,
    progress=None,
) -> Iterator[dict]:
    """Stream comment records (dicts) from one or more dump files, in file order.

    Args:
        paths: one path or several (read one after the other).
        start: keep ``created_utc >= start`` (see :func:`parse_time`), ``None`` = no bound.
        end: keep ``created_utc < end`` (exclusive), ``None`` = no bound.
        subreddits: keep only these subreddits (case-insensitive, an ``r/`` prefix is
            ignored); ``None`` = all.
        drop_deleted: drop records whose body is ``[deleted]`` or ``[removed]``.
        prefilter: ``f(raw_line_bytes) -> bool``; a false result skips the line unparsed.
        stats: :class:`DumpStats` to update (pass one in to read the counters afterwards).
        progress: optional object with ``update(n)`` (a tqdm bar), told the lines read.

    Yields:
        Each kept record, a dict with at least a string ``body``. Missing fields (``author``,
        ``subreddit`` ...) are simply absent; nothing here requires them.

    Raises:
        FileNotFoundError: a path does not exist (raised before reading anything).
        ValueError: a date bound cannot be parsed.
        UnreadableDumpsError: (a ``ValueError``, raised after the last file) not one JSON
            record could be decoded from any of the files, because each of them is damaged,
            truncated before its first complete block, not in the format its name says, or
            made only of corrupt lines. Files that are readable but hold no (matching) record
            are not an error.
    """
    paths = check_paths(paths)
    stats = stats if stats is not None else DumpStats()
    filt = RecordFilter(start, end, subreddits, drop_deleted)
    for path in paths:
        parsed, prefiltered, corrupt = stats.parsed, stats.prefiltered, stats.corrupt
        n_errors, n_examples, lines = len(stats.errors), len(stats.corrupt_examples), stats.lines
        for line_no, line in _iter_file(path, stats, progress, prefilter):
            if isinstance(line, dict):
                rec = line
                stats.parsed += 1
            else:
                rec = parse_line(line, path, line_no, stats)
                if rec is None:
                    continue
            if filt.accept(rec, stats):
                stats.yielded += 1
                yield rec
        # readable: a record was decoded, or a line skipped by the prefilter (iter_lines
        # only skips once a skipped line decoded as a JSON object)
        if stats.parsed == parsed and stats.prefiltered == prefiltered:
            if len(stats.errors) > n_errors:
                stats.unreadable.append(stats.errors[-1])
            elif stats.corrupt > corrupt:
                first = stats.corrupt_examples[n_examples] if len(stats.corrupt_examples) > n_examples else ""
                stats.unreadable.append(f"{path}: none of its {stats.lines - lines:,} lines is a JSON object"
                                        + (f" (first: {first})" if first else ""))
    if len(stats.unreadable) == len(paths):
        raise UnreadableDumpsError(stats)


def _starts_with_array(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(4096).lstrip()
    return head.startswith(b"[")


def _iter_json_array(path: Path, stats: DumpStats) -> Iterator[tuple[int, dict]]:
    """A ``.json`` file holding one JSON array of comment objects (read whole: small files only)."""
    stats.files += 1
    try:
        data = json.loads(Path(path).read_bytes())
    except ValueError as e:
        stats.lines += 1
        stats.add_corrupt(path, 1, f"invalid JSON array ({e})")
        return
    for i, rec in enumerate(data, 1):
        stats.lines += 1
        if not isinstance(rec, dict):
            stats.add_corrupt(path, i, f"array item {i} is a JSON {type(rec).__name__}, not an object")
            continue
        yield i, rec


def write_zst(records: Iterable[dict | str | bytes], path: str | Path, *, level: int = 3, window_log: int | None = None) -> int:
    """Write records as NDJSON compressed with zstandard (used by tests and benchmarks).

    Args:
        records: dicts (JSON-encoded), or ready-made lines as ``str``/``bytes`` (written as
            they are, so tests can write corrupt lines).
        path: output file.
        level: zstd compression level.
        window_log: e.g. 31 for a 2 GiB window like the monthly Reddit dumps; ``None`` =
            the level's default.

    Returns:
        Number of lines written.
    """
    if window_log is None:
        params = zstandard.ZstdCompressionParameters.from_level(level)
    else:
        params = zstandard.ZstdCompressionParameters.from_level(level, window_log=window_log)
    cctx = zstandard.ZstdCompressor(compression_params=params)
    n = 0
    with open(path, "wb") as fh, cctx.stream_writer(fh) as w:
        buf = io.BytesIO()
        for rec in records:
            if isinstance(rec, dict):
                line = json.dumps(rec, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
            elif isinstance(rec, str):
                line = rec.encode("utf-8")
            else:
                line = rec
            buf.write(line)
            buf.write(b"\n")
            n += 1
            if buf.tell() > CHUNK_SIZE:
                w.write(buf.getvalue())
                buf = io.BytesIO()
        w.write(buf.getvalue())
    return n
