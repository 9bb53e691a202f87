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
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import html
import re
import sys
import time
from pathlib import Path
from typing import Iterable, Sequence

from rbjax.data.dumps import DumpStats, UnreadableDumpsError, check_paths, iter_records
from rbjax.report.io import atomic_file

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


@dataclasses.dataclass
class RetrievalResult:
    """Summary of one retrieval run.

    Attributes:
        stats: the dump reader's counters (:class:`rbjax.data.dumps.DumpStats`).
        candidates: rows written, per bias type.
        comments_matched: comments with at least one window, per bias type.
        duplicates: windows dropped as repeated phrases (or repeated comment ids), per type.
        too_long: records whose cleaned body had ``max_chars`` characters or more.
        empty: records whose cleaned body was empty.
        seconds: wall time of the read.
        outputs: output path per bias type.
    """

    stats: DumpStats
    candidates: dict[str, int]
    comments_matched: dict[str, int]
    duplicates: dict[str, int]
    too_long: int
    empty: int
    seconds: float
    outputs: dict[str, Path]

    @property
    def comments_per_second(self) -> float:
        """Lines (comments) read per second, including those skipped by the prefilter."""
        return self.stats.lines / self.seconds if self.seconds > 0 else float("nan")

    def summary(self) -> str:
        lines = [
            f"read {self.stats.lines:,} comments in {self.seconds:.1f} s ({self.comments_per_second:,.0f} comments/s)",
            self.stats.summary(),
            f"cleaned body too long (>= limit): {self.too_long:,}; empty after cleaning: {self.empty:,}",
        ]
        for name, n in self.candidates.items():
            lines.append(
                f"{name}: {n:,} candidates from {self.comments_matched[name]:,} comments "
                f"({self.duplicates[name]:,} duplicates dropped) -> {self.outputs[name]}"
            )
        return "\n".join(lines)


class _Progress:
    """Adapter: the dump reader calls ``update(n)`` once per chunk of lines."""

    def __init__(self, enabled: bool | None):
        self.bar = None
        if enabled is False:
            return
        try:
            from tqdm import tqdm
        except ImportError:  # pragma: no cover
            return
        self.bar = tqdm(unit=" comments", unit_scale=True, disable=None if enabled is None else not enabled,
                        file=sys.stderr, desc="retrieve", smoothing=0.1)

    def update(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _file_in_the_way(folder: Path) -> Path | None:
    """The first of ``folder`` and its parents that exists, when it is not a folder."""
    for p in (folder, *folder.parents):
        if p.exists() or p.is_symlink():
            return None if p.is_dir() else p
    return None


def check_output_dir(folder: str | Path, what: str = "output folder") -> Path:
    """Check that ``folder`` is, or can be created as, a folder (nothing is created).

    Raises:
        ValueError: ``folder`` or one of its parents exists and is not a folder (named).
    """
    folder = Path(folder)
    p = _file_in_the_way(folder)
    if p == folder:
        raise ValueError(f"{what} {folder} exists and is not a folder")
    if p is not None:
        raise ValueError(f"cannot create {what} {folder}: {p} exists and is not a folder")
    return folder


def check_output_file(path: str | Path, what: str = "output file") -> Path:
    """Check that ``path`` can be written as a file: it is not a folder, and its folder
    exists or can be created. Nothing is created.

    Raises:
        ValueError: ``path`` is a folder, or a parent of it exists and is not a folder (named).
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{what} {path} is a folder; give a file name")
    p = _file_in_the_way(path.parent)
    if p is not None:
        raise ValueError(f"cannot write {what} {path}: {p} exists and is not a folder")
    return path


def _make_parent(path: Path) -> None:
    check_output_file(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create the folder {path.parent} for {path}: {e.strerror or e}") from None



@contextlib.contextmanager
def atomic_csv_writer(path: str | Path, header: Sequence[str]):
    """A ``csv.writer`` on a temporary file next to ``path``, moved into place on success.

    On an exception the temporary file is removed and ``path`` is left untouched.

    Raises:
        ValueError: ``path`` is a folder, a parent of it is a file, or its folder cannot be
            created (the message names the path).
    """
    path = Path(path)
    _make_parent(path)
    with contextlib.ExitStack() as stack:
        try:
            fh = stack.enter_context(atomic_file(path, "w", encoding="utf-8", newline=""))
        except OSError as e:
            raise ValueError(f"cannot write {path}: {e.strerror or e}") from None
        w = csv.writer(fh)
        w.writerow(header)
        yield w


def output_paths(out: str | Path, names: Sequence[str]) -> dict[str, Path]:
    """Output file per bias type.

    One bias type: ``out`` itself. Several: ``out`` may contain ``{bias}`` (formatted with
    each name); otherwise ``<out stem>_<name><suffix>`` (or ``<out>/<name>.csv`` when
    ``out`` is an existing directory).
    """
    out = str(out)
    if "{bias}" in out:
        return {n: Path(out.format(bias=n)) for n in names}
    p = Path(out)
    if p.is_dir():
        return {n: p / f"candidates_{n}.csv" for n in names}
    if len(names) == 1:
        return {names[0]: p}
    suffix = p.suffix or ".csv"
    return {n: p.with_name(f"{p.stem}_{n}{suffix}") for n in names}


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
) -> RetrievalResult:
    """Retrieve candidate comments and windows for one or more bias types (paper §2.2).

    Streams the dumps once (bounded memory: a chunk of the decompressed stream plus the set
    of phrases already written, for de-duplication) and writes one CSV per bias type.

    Args:
        specs: a :class:`~rbjax.specs.BiasSpec` or a list of them.
        dumps: dump file(s): ``.zst`` (2 GiB windows accepted), ``.jsonl``, ``.json`` ...
        out: output CSV (see :func:`output_paths` for several bias types).
        start, end: ``created_utc`` range, ``start`` inclusive, ``end`` exclusive (ISO date
            or epoch seconds); ``None`` = open.
        subreddits: keep only these subreddits; ``None`` = all.
        window: tokens each side of the target term (paper: 7).
        max_chars: keep cleaned comments shorter than this (paper: 150).
        clean_mode: ``"paper"`` or ``"reference"`` (see :func:`clean_comment`).
        require_attribute_in_window: drop windows without an A1 attribute (what upstream did
            for every type except religion1); default keeps them, flagged.
        dedupe: keep each phrase once per bias type, and each comment id once.
        prefilter: use the raw-bytes target-word prefilter (exact; see the module notes).
        progress: tqdm bar on stderr; ``None`` = only when stderr is a terminal.

    Returns:
        A :class:`RetrievalResult` (counts, timing, output paths).

    Raises:
        FileNotFoundError: a dump file is missing.
        ValueError: bad date bound, cleaning mode, or a spec without queries/attributes; an
            output path that is a folder or lies under a file; or not one record could be
            read from any dump (:class:`~rbjax.data.dumps.UnreadableDumpsError`: every file
            failed to decompress or parse; then no CSV is written). A readable dump without
            matches is not an error: the CSV then has only its header.
    """
    if not isinstance(specs, (list, tuple)):
        specs = [specs]
    if clean_mode not in ("paper", "reference"):
        raise ValueError(f"unknown cleaning mode {clean_mode!r}; expected 'paper' or 'reference'")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"bias types given more than once: {names}")
    matchers = [QueryMatcher(s, window=window) for s in specs]
    pf = make_prefilter(matchers) if prefilter else None
    dumps = check_paths(dumps)  # missing dump files are named before anything is created
    paths = output_paths(out, names)
    for p in paths.values():
        check_output_file(p, "output CSV")
    stats = DumpStats()
    counts = {n: 0 for n in names}
    matched = {n: 0 for n in names}
    dups = {n: 0 for n in names}
    seen_phrases: dict[str, set[str]] = {n: set() for n in names}
    seen_ids: dict[str, set[str]] = {n: set() for n in names}
    too_long = empty = 0
    bar = _Progress(progress)
    t0 = time.perf_counter()
    try:
        with contextlib.ExitStack() as stack:
            writers = {n: stack.enter_context(atomic_csv_writer(paths[n], CANDIDATE_COLUMNS)) for n in names}
            records = iter_records(dumps, start=start, end=end, subreddits=subreddits, prefilter=pf,
                                   stats=stats, progress=bar)
            for rec in records:
                text = clean_comment(rec["body"], clean_mode)
                if not text:
                    empty += 1
                    continue
                if len(text) >= max_chars:
                    too_long += 1
                    continue
                cid = str(rec.get("id", ""))
                for m in matchers:
                    wins = m.match(text)
                    if not wins:
                        continue
                    name = m.name
                    if dedupe and cid:
                        if cid in seen_ids[name]:
                            dups[name] += len(wins)
                            continue
                        seen_ids[name].add(cid)
                    comment_attrs = "|".join(m.attributes_in(text))
                    wrote = False
                    for phrase, target, query, attrs, a_in, q_in in wins:
                        if require_attribute_in_window and not a_in:
                            continue
                        if dedupe:
                            if phrase in seen_phrases[name]:
                                dups[name] += 1
                                continue
                            seen_phrases[name].add(phrase)
                        writers[name].writerow(Candidate(
                            id=cid, bias_type=name, subreddit=str(rec.get("subreddit") or ""),
                            created_utc=str(rec.get("created_utc") if rec.get("created_utc") is not None else ""),
                            comment=text, phrase=phrase, target=target, query=query, attribute="|".join(attrs),
                            comment_attributes=comment_attrs, attribute_in_window=a_in, query_in_window=q_in,
                        ).row())
                        counts[name] += 1
                        wrote = True
                    if wrote:
                        matched[name] += 1
    except UnreadableDumpsError as err:  # nothing was moved into place
        raise UnreadableDumpsError(err.stats, note="no candidates CSV was written") from None
    finally:
        bar.close()
    return RetrievalResult(stats=stats, candidates=counts, comments_matched=matched, duplicates=dups,
                           too_long=too_long, empty=empty, seconds=time.perf_counter() - t0, outputs=paths)
