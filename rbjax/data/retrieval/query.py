"""The retrieval query (paper §2.2): cleaning a comment, the T1-query × A1-attribute matcher with its ±7-token
windows, and the raw-bytes prefilter (see the package notes, :mod:`rbjax.data.retrieval`)."""
from __future__ import annotations

import dataclasses
import html
import re
from collections.abc import Iterable, Sequence

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
    contains a query (exceptions in the package notes). Returns ``None`` (no prefilter)
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
