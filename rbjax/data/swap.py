"""Counterfactual target swapping (paper §3.1 and §4.4): T1 terms -> their paired T2 terms.

Two modes:

* ``mode="paper"`` (default): word-level swapping with the spec's word pairs (``BiasSpec.pairs``, paper App. A,
  singular and plural forms). A term matches only as a whole word: it may not be preceded or followed by an ASCII
  letter or digit, so "jew" does not match inside "jewish" and "black" not inside "blackmail"; a hyphen or an
  apostrophe is a boundary, so "jewish-americans" -> "christian-americans" and "jew's" -> "christian's". Longer
  terms win ("african-american" before "african"). Case is kept: ``Jews`` -> ``Christians``, ``JEWS`` ->
  ``CHRISTIANS``. All replacements happen in one pass over the original text, so a replacement is never
  replaced again. Directions: ``"t1_to_t2"``; ``"t2_to_t1"`` (a T2 word with several T1 partners maps to the
  first pair listed in the spec); ``"both"`` (T1 and T2 words exchanged in the same pass; a hyphenated compound
  is one mention: when it holds terms of both sides it is swapped T1 -> T2 only, so "muslim-american" (religion2)
  becomes "christian-american", not "christian-arab"). The last two need ``spec.two_way`` (the paper's pairs
  define an inverse), else :class:`ValueError`. Only words in the pairs are
  changed: pronouns other than she/he (her, his, him) and other inflections are left alone.

* ``mode="reference"``: the official substring rules (``spec.reference["swap_rules"]``, from
  rb:DataPreparation/reddit_data_replace_target_testset.py:23-101; docs/debiasing.md §2): each rule in
  order, plain ``str.replace`` on the text as given (the released phrases are lower-case; the rules are
  case-sensitive), no word boundaries; ``two_way`` rules exchange a and b through a placeholder, ``one_way`` rules
  map a -> b, ``one_way_if`` rules are one-way when any of their ``if_present`` strings occurs and two-way
  otherwise. It reproduces the released T2 phrases from the T1 phrases exactly (tests/test_swap.py).

:func:`compare_modes` reports where the two modes disagree on a list of phrases.
"""
from __future__ import annotations

import collections
import dataclasses
import re
from typing import Iterable, Sequence

from rbjax.specs import BiasSpec

__all__ = ["swap_targets", "term_regex", "compare_modes", "reference_direction", "SwapReport", "DIRECTIONS", "MODES"]

MODES = ("paper", "reference")
DIRECTIONS = ("t1_to_t2", "t2_to_t1", "both")
_WORD = "A-Za-z0-9"
_PLACEHOLDER = "\ue000"  # private-use character, never in the data


def term_regex(terms: Iterable[str]) -> re.Pattern:
    """Compile a case-insensitive whole-word regex for ``terms``.

    A term is a word, a hyphenated word or several words separated by spaces (matched by any whitespace run);
    ``*`` is a wildcard for any (possibly empty) run of ASCII letters/digits (the paper's retrieval wildcard, e.g.
    ``greed*`` matches "greed", "greedy"). Matches may not touch an ASCII letter or digit on either side. Longer
    terms are tried first, so the leftmost-longest term wins. Group ``lastindex`` is not used: look the match up by
    its lower-cased text.

    Raises:
        ValueError: if ``terms`` is empty or contains an empty term.
    """
    terms = [t.strip() for t in terms]
    if not terms or any(not t for t in terms):
        raise ValueError("term_regex needs non-empty terms")
    alts = []
    for t in sorted(set(terms), key=lambda x: (-len(x.replace("*", "")), x)):
        parts = [re.escape(w).replace(r"\*", f"[{_WORD}]*") for w in t.split()]
        alts.append(r"\s+".join(parts))
    return re.compile(rf"(?<![{_WORD}])(?:{'|'.join(alts)})(?![{_WORD}])", re.IGNORECASE)


def _match_case(src: str, repl: str) -> str:
    if len(src) > 1 and src.isupper():
        return repl.upper()
    if src[:1].isupper():
        return repl[:1].upper() + repl[1:]
    return repl


def _paper_map(spec: BiasSpec, direction: str) -> dict[str, str]:
    fwd: dict[str, str] = {}
    inv: dict[str, str] = {}
    for a, b in spec.pairs:
        fwd.setdefault(a, b)
        inv.setdefault(b, a)
    if direction == "t1_to_t2":
        return fwd
    if not spec.two_way:
        raise ValueError(
            f"bias type {spec.name!r} is one-directional (two_way is false: its T2 terms have no unique T1 "
            f"partner); direction={direction!r} is not available"
        )
    if direction == "t2_to_t1":
        return inv
    both = dict(inv)
    both.update(fwd)  # a word that is both a T1 and a T2 term (none in the packaged specs) keeps its T1 role
    return both


_REGEX_CACHE: dict[tuple, re.Pattern] = {}


_COMPOUND = re.compile(rf"[{_WORD}]+(?:-[{_WORD}]+)+")


def _swap_paper(text: str, spec: BiasSpec, direction: str) -> str:
    mapping = _paper_map(spec, direction)
    key = (spec.name, spec.pairs, direction)
    rx = _REGEX_CACHE.get(key)
    if rx is None:
        rx = _REGEX_CACHE[key] = term_regex(mapping)
    if direction != "both":
        return rx.sub(lambda m: _match_case(m.group(0), mapping[m.group(0).lower()]), text)
    # "both": a hyphenated compound is one mention. When it holds terms of both sides ("muslim-american"), it is
    # swapped in one direction, T1 -> T2 (the T1 role wins, as for a word that is a term of both sides):
    # "the muslim-american community" -> "the christian-american community", not "christian-arab".
    fwd = _paper_map(spec, "t1_to_t2")
    matches = list(rx.finditer(text))
    one_way: set[int] = set()  # indices of matches inside a mixed compound
    for c in _COMPOUND.finditer(text):
        inside = [k for k, m in enumerate(matches) if c.start() <= m.start() and m.end() <= c.end()]
        sides = {m.group(0).lower() in fwd for m in (matches[k] for k in inside)}
        if sides == {True, False}:
            one_way.update(inside)
    out, pos = [], 0
    for k, m in enumerate(matches):
        src = m.group(0)
        repl = fwd.get(src.lower()) if k in one_way else mapping[src.lower()]
        out += [text[pos:m.start()], src if repl is None else _match_case(src, repl)]  # None: a T2 term, kept
        pos = m.end()
    out.append(text[pos:])
    return "".join(out)


def _swap_reference(text: str, spec: BiasSpec) -> str:
    rules = spec.reference.get("swap_rules")
    if not rules:
        raise ValueError(f"bias type {spec.name!r} has no reference swap rules (spec.reference['swap_rules'])")
    s = text
    for r in rules:
        a, b, mode = r["a"], r["b"], r["mode"]
        if mode == "one_way" or (mode == "one_way_if" and any(c in s for c in r.get("if_present", ()))):
            s = s.replace(a, b)
        elif mode in ("two_way", "one_way_if"):
            s = s.replace(a, _PLACEHOLDER).replace(b, a).replace(_PLACEHOLDER, b)
        else:
            raise ValueError(f"unknown swap-rule mode {mode!r} in spec {spec.name!r}")
    return s


def swap_targets(text: str, spec: BiasSpec, mode: str = "paper", direction: str = "t1_to_t2") -> str:
    """Return ``text`` with its target terms swapped for their counterparts (paper §3.1, §4.4).

    Args:
        text: a phrase (any case in paper mode; lower-case for the reference rules to apply).
        spec: the bias specification (:func:`rbjax.specs.load_spec`).
        mode: ``"paper"`` (word-level pairs, boundaries, case kept) or ``"reference"`` (official substring rules).
        direction: ``"t1_to_t2"`` (default), ``"t2_to_t1"`` or ``"both"`` (paper mode only; the reference rules
            carry their own directions).

    Returns:
        the swapped text (unchanged when no term occurs).

    Raises:
        ValueError: unknown mode/direction; a direction other than ``"t1_to_t2"`` in reference mode or for a
            one-directional spec; a spec without reference rules in reference mode.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if mode == "reference":
        if direction != "t1_to_t2":
            raise ValueError("reference mode applies the official rules as they are; use direction='t1_to_t2'")
        return _swap_reference(text, spec)
    return _swap_paper(text, spec, direction)


@dataclasses.dataclass(frozen=True)
class SwapReport:
    """Where paper-mode and reference-mode swapping disagree on a list of phrases.

    Attributes:
        name: bias type.
        n: number of phrases.
        n_agree: phrases on which both modes give the same text.
        n_changed_paper, n_changed_reference: phrases each mode changes at all.
        disagreements: ``(index, original, paper, reference)`` for every phrase where the modes differ.
        word_diffs: counts of ``(paper word, reference word)`` at whitespace-token positions where the two
            outputs differ (only for outputs with the same number of tokens).
    """

    name: str
    n: int
    n_agree: int
    n_changed_paper: int
    n_changed_reference: int
    disagreements: tuple[tuple[int, str, str, str], ...]
    word_diffs: tuple[tuple[tuple[str, str], int], ...]

    @property
    def agreement(self) -> float:
        """Fraction of phrases on which the modes agree (1.0 for an empty list)."""
        return self.n_agree / self.n if self.n else 1.0

    def summary(self, top: int = 8) -> str:
        """A few lines of text for logs and docs."""
        lines = [
            f"{self.name}: {self.n_agree}/{self.n} agree ({100 * self.agreement:.1f}%); changed by paper "
            f"{self.n_changed_paper}, by reference {self.n_changed_reference}"
        ]
        for (p, r), c in self.word_diffs[:top]:
            lines.append(f"  {c:4d}  paper {p!r:24} reference {r!r}")
        return "\n".join(lines)


def reference_direction(spec: BiasSpec) -> str:
    """The paper-mode direction closest to the reference rules: ``"both"`` when any rule is two-way (religion1,
    religion2, race) and the spec allows it, else ``"t1_to_t2"`` (gender, queerness)."""
    rules = spec.reference.get("swap_rules") or []
    two = any(r["mode"] != "one_way" for r in rules)
    return "both" if two and spec.two_way else "t1_to_t2"


def compare_modes(phrases: Sequence[str], spec: BiasSpec, direction: str | None = None) -> SwapReport:
    """Swap every phrase in both modes and report the disagreements (see :class:`SwapReport`).

    ``direction`` applies to paper mode; ``None`` (default) picks :func:`reference_direction`, the one that matches
    what the reference rules do (they carry their own directions: two-way for religion and race).
    """
    if direction is None:
        direction = reference_direction(spec)
    dis = []
    n_agree = n_p = n_r = 0
    diffs: collections.Counter = collections.Counter()
    for i, s in enumerate(phrases):
        p = swap_targets(s, spec, "paper", direction)
        r = swap_targets(s, spec, "reference")
        n_p += p != s
        n_r += r != s
        if p == r:
            n_agree += 1
            continue
        dis.append((i, s, p, r))
        pt, rt = p.split(), r.split()
        if len(pt) == len(rt):
            diffs.update((a, b) for a, b in zip(pt, rt) if a != b)
    return SwapReport(
        name=spec.name,
        n=len(phrases),
        n_agree=n_agree,
        n_changed_paper=n_p,
        n_changed_reference=n_r,
        disagreements=tuple(dis),
        word_diffs=tuple(sorted(diffs.items(), key=lambda kv: (-kv[1], kv[0]))),
    )
