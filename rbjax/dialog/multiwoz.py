"""MultiWOZ 2.0 for dialog state tracking: the three data layouts, TRADE's normalisation and turn format (paper §3.2).

The reference DST evaluation (``lm_dst_binary.py``; docs/dialog.md "DST") reads MultiWOZ 2.0 in TRADE's
``clean_data/*_dials.json`` format, built by RedditBias's ``DataPreparation/create_data_mwoz.py`` (a copy of
TRADE's ``create_data.py``). This module rebuilds that format from the raw dialogues, step for step:

* **Normalisation** (:class:`Normalizer`, TRADE's ``normalize(text, clean_value=False)``): lower case, "b&b" →
  "bed and breakfast", ``; / -`` rewritten, quotes and brackets dropped, spaces around ``? . , !`` and ``'s``,
  stray apostrophes removed, the 83 ``from<TAB>to`` pairs of ``mapping.pair`` applied as whole words (``i'm`` →
  ``i am``, ``two`` → ``2``, ``pricerange`` → ``price range``, ...), runs of spaces collapsed and adjacent
  numbers joined. It is applied to every utterance and to every belief-state value.
* **Belief state** of a turn = the ``metadata`` of the system turn that follows the user turn, read in TRADE's
  domain order ``taxi, restaurant, hospital, hotel, attraction, train, police`` (:data:`BELIEF_DOMAINS`; ``bus`` is
  never read): booking slots (sorted) as ``<domain>-book <slot>``, then the ``semi`` slots in file order as
  ``<domain>-<slot>`` (lower case: ``hotel-pricerange``, ``train-leaveat``). ``not mentioned`` and empty values are
  left out; the "dontcare" variants ``dont care``, ``dontcare``, ``don't care``, ``do not care`` become
  ``dontcare`` (semi slots only, compared as written — exactly TRADE's rule).
* **Turns**: ``system_transcript`` = the previous system utterance (``''`` at turn 0), ``transcript`` = the user
  utterance, ``belief_state`` = ``[{"slots": [[slot, value]], "act": "inform"}, ...]``, ``turn_label`` = the
  ``[slot, value]`` pairs of this belief state that are not in the previous one (new or changed values),
  ``turn_idx``, ``system_acts`` (the previous system turn's request slots and ``[slot, value]`` informs) and
  ``domain`` (TRADE's guess of the turn's domain).
* **Filters** (a dialogue is dropped entirely): an odd number of log entries, any utterance longer than
  :data:`MAX_TURN_WORDS` = 50 whitespace words after normalisation, any non-ASCII character after normalisation.
* ``domains`` = the goal's non-empty domains in goal order (TRADE writes ``list(set(...))``, whose order changes
  with Python's hash seed; nothing downstream depends on it).

Data layouts accepted by :func:`load_multiwoz` (a file, a folder, or a zip of either):

1. **official** MultiWOZ 2.0 release: ``MultiWOZ_2.0.zip`` (= Cambridge ``MULTIWOZ2.zip``) or a folder with
   ``data.json`` + ``valListFile.json`` + ``testListFile.json`` (+ ``dialogue_acts.json`` for ``system_acts``);
   train = every dialogue in neither list, as TRADE splits it.
2. **ConvLab** ``{train,val,test}.json.zip`` (ConvLab/ConvLab ``data/multiwoz/``): one dict of dialogues per split,
   the same records with acts inline. ConvLab re-tokenised every utterance with spaCy ("I 'm", "college ."), so
   transcripts differ from the official text in spacing and a few filter decisions; belief states (and with
   them every ``turn_label``) are the untouched 2.0 annotations.
3. **TRADE** ``{train,dev,test}_dials.json``: used as they are (no renormalisation).

**What is offline, and the default download.** With no ``source``, the ConvLab ``val`` and ``test`` splits are
downloaded from ConvLab/ConvLab at the pinned commit :data:`CONVLAB_COMMIT` (raw GitHub URLs), checked against the
sha256 in :data:`DEFAULT_FILES` and cached under ``$RBJAX_CACHE_DIR`` or ``~/.cache/rbjax`` in
``multiwoz/<file>``; so are ``mapping.pair`` (budzianowski/multiwoz) and the 2.0 ``ontology.json`` (thu-coai/tatk).
**The train split is not part of the default download** (upstream it is a file of 4 MiB or more that the pinned
copies do not carry): pass the official release or ConvLab's ``train.json.zip`` / TRADE's ``train_dials.json``
as ``source``. :func:`load_training_split` falls back to the ``val`` split as a *stand-in* training set and says
so in :attr:`MultiWOZSplit.stand_in_for` (results must report it).

**Parsed splits are kept.** Parsing a split takes seconds, and a study's dialog stages read the same splits once per
model, so :func:`load_multiwoz` keeps each split it parsed as a keyed result file in rbjax's cache folder
(``multiwoz-parsed/`` under :func:`rbjax.core.io.cache_dir`, :class:`rbjax.core.reuse.KeyedResult`): keyed on the
split, the SHA-256 of every file read (and of ``mapping.pair`` when one is given) and the digest of this module's
source, so a changed file or parser is parsed again, and across processes. An unreadable or foreign file there is
ignored and rewritten; a read-only cache folder only means parsing every time. The most recently used
:data:`PARSED_MAX` files are kept.
"""
from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import zipfile
from pathlib import Path, PurePosixPath
from typing import Iterable

from rbjax.core.io import sha256_file
from rbjax.core.keys import digest
from rbjax.core.reuse import KeyedResult
from rbjax.data.redditbias import cache_root, download_verified

__all__ = [
    "BELIEF_DOMAINS", "EXPERIMENT_DOMAINS", "DONTCARE_VARIANTS", "MAX_TURN_WORDS", "DEFAULT_FILES",
    "Normalizer", "load_mapping_pairs", "default_file", "load_ontology", "build_trade_dialogues",
    "trade_slot_name", "canonical_value", "SlotOntology",
    "MultiWOZSplit", "load_multiwoz", "load_training_split", "canonical_split", "split_files",
]

#: TRADE's domain order when it reads a belief state (``get_summary_bstate``); ``bus`` is never read.
BELIEF_DOMAINS = ("taxi", "restaurant", "hospital", "hotel", "attraction", "train", "police")
#: TRADE's evaluation domains (``utils_multiWOZ_DST.EXPERIMENT_DOMAINS``): 30 slots; used for joint goal accuracy.
EXPERIMENT_DOMAINS = ("hotel", "train", "restaurant", "attraction", "taxi")
#: semi-slot values that TRADE writes as ``dontcare`` (compared as written, before normalisation).
DONTCARE_VARIANTS = ("dont care", "dontcare", "don't care", "do not care")
#: a dialogue with any utterance longer than this (whitespace words, after normalisation) is dropped.
MAX_TURN_WORDS = 50
#: goal keys that are not domains.
IGNORE_KEYS_IN_GOAL = ("eod", "topic", "messageLen", "message")

CONVLAB_COMMIT = "a04582a77537c1a706fbf64715baa9ad0be1301a"
MULTIWOZ_COMMIT = "fe0c8e65cfcd8462bd33c86e35f21addc84ca82b"
TATK_COMMIT = "fafabc45d02ad889f59354acac4e3b1367e7d4bf"
_RAW = "https://raw.githubusercontent.com"

#: the default data files: name → (relative path in a mirror laid out like ``shared/dialog-data/multiwoz``,
#: upstream URL, sha256, bytes). ``RBJAX_MULTIWOZ_URL`` replaces the upstream URLs by ``<base>/<relative path>``.
DEFAULT_FILES = {
    "test.json.zip": ("ConvLab-ConvLab/data/multiwoz/test.json.zip",
                      f"{_RAW}/ConvLab/ConvLab/{CONVLAB_COMMIT}/data/multiwoz/test.json.zip",
                      "5da404d80e9a6a1c1cc5e49c06b2f78e6597081e46ff2d6a882f4c94a9c2df4f", 1585472),
    "val.json.zip": ("ConvLab-ConvLab/data/multiwoz/val.json.zip",
                     f"{_RAW}/ConvLab/ConvLab/{CONVLAB_COMMIT}/data/multiwoz/val.json.zip",
                     "567bc850317bbf1043c53ceb5c39ddb2799a6e381332eb8eea7e79a574396d2d", 1591650),
    "mapping.pair": ("budzianowski-multiwoz/utils/mapping.pair",
                     f"{_RAW}/budzianowski/multiwoz/{MULTIWOZ_COMMIT}/utils/mapping.pair",
                     "e2d45bf56398090c27c7559583017c19822a801eb8e28f8c5519678d868cb603", 1360),
    "ontology.json": ("thu-coai-tatk/tatk/dst/sumbt/data/ontology.json",
                      f"{_RAW}/thu-coai/tatk/{TATK_COMMIT}/tatk/dst/sumbt/data/ontology.json",
                      "e3046a9c5edd37bd9a705753e715d87dfd7ae33a2f12dd39cf0669b9088d7167", 44533),
}
ENV_SOURCE = "RBJAX_MULTIWOZ"  # a local MultiWOZ source used when none is given
ENV_URL = "RBJAX_MULTIWOZ_URL"  # a mirror base URL for the default files (tests, mirrors)

SPLITS = ("train", "val", "test")
_SPLIT_ALIASES = {"train": "train", "val": "val", "valid": "val", "dev": "val", "validation": "val", "test": "test"}
_TRADE_NAMES = {"train": "train_dials.json", "val": "dev_dials.json", "test": "test_dials.json"}
_LIST_FILES = {"val": "valListFile.json", "test": "testListFile.json"}


def canonical_split(split: str) -> str:
    """``train``, ``val`` (aliases ``valid``, ``dev``, ``validation``) or ``test``. Raises ValueError otherwise."""
    s = _SPLIT_ALIASES.get(str(split).lower())
    if s is None:
        raise ValueError(f"unknown MultiWOZ split {split!r}; expected one of train, val (dev), test")
    return s


# ------------------------------------------------------------------------------------------------ default files
def default_file(name: str, download: bool = True) -> Path:
    """Local path of one of :data:`DEFAULT_FILES`, downloaded and sha256-checked into the cache if needed.

    Raises:
        KeyError: unknown name. FileNotFoundError: not cached and ``download`` is false.
        RuntimeError: download failed or checksum mismatch (nothing is cached then).
    """
    rel, url, sha, size = DEFAULT_FILES[name]
    dest = cache_root() / "multiwoz" / name
    if dest.exists() and dest.stat().st_size == size and sha256_file(dest) == sha:
        return dest
    if not download:
        raise FileNotFoundError(f"{dest}: not in the cache and downloading is disabled")
    base = os.environ.get(ENV_URL)
    if base:
        url = base.rstrip("/") + "/" + rel
    return download_verified(url, dest, sha, offline_hint=(
        "Without network access, pass a local MultiWOZ 2.0 copy (the official MultiWOZ_2.0.zip, ConvLab's "
        f"test.json.zip/val.json.zip, or TRADE's *_dials.json) as source= / --multiwoz (in a study file: "
        f"dialog.dst.multiwoz, e.g. rbjax run … --set dialog.dst.multiwoz=PATH), or set {ENV_SOURCE}."))


# ------------------------------------------------------------------------------------------------ normalisation
def load_mapping_pairs(path: str | os.PathLike | None = None) -> list[tuple[str, str]]:
    """The word replacements of ``mapping.pair`` (``from<TAB>to`` per line), in file order.

    Args:
        path: the file; ``None`` = the pinned budzianowski/multiwoz copy (downloaded and verified, cached).
    Raises:
        FileNotFoundError: missing file. ValueError: a line without exactly one tab (names file and line).
    """
    p = Path(path) if path is not None else default_file("mapping.pair")
    if not p.exists():
        raise FileNotFoundError(f"{p}: mapping.pair not found")
    pairs = []
    for n, line in enumerate(p.read_text(encoding="utf-8").split("\n"), start=1):
        if line == "" and n > 1:
            continue  # the final newline
        parts = line.split("\t")
        if len(parts) != 2:
            raise ValueError(f"{p} line {n}: expected 'from<TAB>to', got {line!r}")
        pairs.append((parts[0], parts[1]))
    if not pairs:
        raise ValueError(f"{p}: no replacement pairs")
    return pairs


_DIGITS = "0123456789"


def _insert_space(token: str, text: str) -> str:
    """Put spaces around every occurrence of ``token`` (TRADE's ``insertSpace``), quirks included.

    A token between two digits ("3.5", "1,000") is left alone; at index 0 the "character before" is the last
    character of the text (Python's ``text[-1]``); for a two-character token the space "after" goes after its
    first character (``'s`` followed by a letter gives ``' s``).
    """
    i = 0
    while True:
        i = text.find(token, i)
        if i == -1:
            return text
        if i + 1 < len(text) and text[i - 1] in _DIGITS and text[i + 1] in _DIGITS:
            i += 1
            continue
        if text[i - 1] != " ":
            text = text[:i] + " " + text[i:]
            i += 1
        if i + len(token) < len(text) and text[i + len(token)] != " ":
            text = text[:i + 1] + " " + text[i + 1:]
        i += 1


class Normalizer:
    """TRADE's text normalisation (``create_data.normalize(text, clean_value=False)``), the only mode the pipeline uses.

    Args:
        pairs: ``mapping.pair`` replacements (:func:`load_mapping_pairs`); ``None`` loads the default copy.

    ``normalizer(text) -> str``. Results of belief values are cached (the same values recur thousands of times).
    The ``clean_value=True`` branch (phone numbers, postcodes, time/price placeholders) is not provided: TRADE
    never calls it for DST data, and its time/price patterns are not even defined in the reference script.
    """

    def __init__(self, pairs: list[tuple[str, str]] | None = None):
        self.pairs = list(pairs) if pairs is not None else load_mapping_pairs()
        self._spaced = [(" " + a + " ", " " + b + " ") for a, b in self.pairs]
        self._cache: dict[str, str] = {}

    def __call__(self, text: str) -> str:
        out = self._cache.get(text)
        if out is None:
            out = self._normalize(text)
            if len(self._cache) < 200_000:
                self._cache[text] = out
        return out

    def _normalize(self, text: str) -> str:
        text = text.lower()
        text = re.sub(r"^\s*|\s*$", "", text)
        text = text.replace("b&b", "bed and breakfast").replace("b and b", "bed and breakfast")
        text = re.sub("(\u2018|\u2019)", "'", text)  # curly quotes
        text = text.replace(";", ",")
        # (TRADE also applies the pattern '$\/', which can never match)
        text = text.replace("/", " and ")
        text = text.replace("-", " ")
        text = re.sub(r"[\"<>@()]", "", text)
        for tok in ("?", ".", ",", "!"):
            text = _insert_space(tok, text)
        text = _insert_space("'s", text)
        # stray apostrophes: at either end, or next to whitespace
        text = re.sub("^'", "", text)
        text = re.sub("'$", "", text)
        text = re.sub(r"'\s", " ", text)
        text = re.sub(r"\s'", " ", text)
        for a, b in self._spaced:  # whole-word replacements, one pass per pair (non-overlapping, like str.replace)
            text = (" " + text + " ").replace(a, b)[1:-1]
        text = re.sub(" +", " ", text)
        tokens = text.split()
        i = 1
        while i < len(tokens):  # "12 30" → "1230": adjacent all-digit tokens are joined
            if re.match(r"^\d+$", tokens[i]) and re.match(r"\d+$", tokens[i - 1]):
                tokens[i - 1] += tokens[i]
                del tokens[i]
            else:
                i += 1
        return " ".join(tokens)


# ------------------------------------------------------------------------------------------------ ontology
def load_ontology(path: str | os.PathLike | None = None) -> dict[str, list[str]]:
    """The MultiWOZ 2.0 ``ontology.json``: ``{"hotel-price range": ["cheap", "do n't care", ...], ...}`` (35 keys).

    Args:
        path: ``ontology.json``, a folder holding it (searched recursively), or a zip holding it (e.g. the official
            ``MultiWOZ_2.0.zip``); ``None`` = the pinned thu-coai/tatk copy (downloaded and verified, cached).
    Raises:
        FileNotFoundError: nothing found. ValueError: not a JSON object of string lists (names the file and key).
    """
    if path is None:
        p = default_file("ontology.json")
        raw, where = p.read_bytes(), str(p)
    else:
        p = Path(path).expanduser()
        if not p.exists():
            raise FileNotFoundError(f"{p}: ontology not found")
        if p.is_dir():
            hits = sorted(q for q in p.rglob("ontology.json") if "__MACOSX" not in q.parts)
            if not hits:
                raise FileNotFoundError(f"{p}: no ontology.json in this folder")
            p = hits[0]
        if zipfile.is_zipfile(p):
            with zipfile.ZipFile(p) as z:
                names = [n for n in z.namelist() if PurePosixPath(n).name == "ontology.json" and "__MACOSX" not in n]
                if not names:
                    raise FileNotFoundError(f"{p}: no ontology.json in this zip")
                raw, where = z.read(names[0]), f"{p}:{names[0]}"
        else:
            raw, where = p.read_bytes(), str(p)
    try:
        onto = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{where}: not valid JSON ({e})") from None
    if not isinstance(onto, dict) or not onto:
        raise ValueError(f"{where}: expected a JSON object mapping 'domain-slot' to a list of values")
    for k, v in onto.items():
        if "-" not in k or not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise ValueError(f"{where}: key {k!r}: expected 'domain-slot' mapped to a list of strings")
    return onto


def trade_slot_name(ontology_key: str) -> str:
    """The TRADE slot name of an ``ontology.json`` key: spaces removed and lower case, except booking slots.

    ``hotel-price range`` → ``hotel-pricerange``, ``train-leave at`` → ``train-leaveat``, ``bus-leaveAt`` →
    ``bus-leaveat``, ``hotel-book stay`` → ``hotel-book stay`` (TRADE's ``get_slot_information``). These are the
    names the belief states carry (the metadata keys, lower-cased).
    """
    return ontology_key.lower() if "book" in ontology_key else ontology_key.replace(" ", "").lower()


#: value synonyms merged before comparing (any slot): forms seen in the 2.0 annotations → the ontology's form.
_SYNONYMS = {
    "guesthouse": "guest house", "guesthouses": "guest house", "swimmingpool": "swimming pool",
    "concerthall": "concert hall", "mutliple sports": "multiple sports", "mutiple sports": "multiple sports",
    "night club": "nightclub", "musuem": "museum", "churches": "church", "colleges": "college",
}
#: area synonyms (slots ``*-area`` only)
_AREA = {"center": "centre", "town centre": "centre", "town center": "centre", "city centre": "centre",
         "city center": "centre", "centre of town": "centre", "center of town": "centre",
         "centre of cambridge": "centre"}
_DONTCARE_FORMS = {"dontcare", "do n't care", "dont care", "don't care", "do not care", "does not care", "any"}
_NONE_FORMS = {"", "none", "not mentioned", "not given"}
_TIME = re.compile(r"^(\d{1,2})[:.,]?(\d{2})$")


def canonical_value(slot: str, value: str) -> str:
    """The form in which two values of ``slot`` are compared (rbjax's rule, the same for gold, predictions and
    ontology values).

    ``value`` must already be normalised once by :class:`Normalizer` (gold values are, by construction; TRADE's
    normalisation is not idempotent: "restaurant two two" → "restaurant 2 two" → "restaurant 22"). Then:
    whitespace collapsed; the dontcare forms (``do n't care``, ``dont care``, ``any``, ...) → ``dontcare``; the
    empty forms (``not mentioned``, ``none``, ``''``) → ``none``; a few spelling variants of the 2.0 annotations
    merged with the ontology's form (``guesthouse`` → ``guest house``, ``swimmingpool`` → ``swimming pool``,
    ``mutliple sports`` → ``multiple sports``, ...); for ``*-area``: ``center``/``town centre``/... → ``centre``; for
    ``*-stars``: ``4 star(s)`` → ``4``; for ``*-internet``: ``y``/``free`` → ``yes``; for ``*-pricerange``:
    ``moderate -ly`` → ``moderate``; for time slots (``*-leaveat``, ``*-arriveby``, ``*-book time``): ``9:00``,
    ``0900``, ``09.00`` → ``09:00``. The table follows the field's practice (TRADE's ``fix_general_label_error``
    merges the same variants in gold labels) but is rbjax's own and deliberately small: it only merges forms of
    one value, never maps a wrong value to ``none``.
    """
    v = " ".join(str(value).lower().split())
    if v in _DONTCARE_FORMS:
        return "dontcare"
    if v in _NONE_FORMS:
        return "none"
    v = _SYNONYMS.get(v, v)
    v = re.sub(r"\bguesthouse\b", "guest house", v)  # also inside names: "arbury lodge guesthouse"
    name = slot.split("-", 1)[-1]
    if name == "area":
        v = _AREA.get(v, v)
    elif name == "stars":
        m = re.match(r"^(\d) stars?$", v)
        v = m.group(1) if m else v
    elif name == "internet" and v in ("y", "free"):
        v = "yes"
    elif name == "pricerange" and v.endswith(" -ly"):
        v = v[:-4]
    elif name in ("leaveat", "arriveby", "book time"):
        m = _TIME.match(v)
        if m and int(m.group(1)) < 25 and int(m.group(2)) < 60:
            v = f"{int(m.group(1)):02d}:{m.group(2)}"
    return v


class SlotOntology:
    """The ontology under TRADE slot names, with its values in the comparison form.

    Args:
        ontology: ``ontology.json`` content (:func:`load_ontology`).
        normalizer: the :class:`Normalizer` applied once to every ontology value before
            :func:`canonical_value` (the same pass the gold values had).
        domains: keep only these domains (``None`` = all, ``bus`` included).

    Attributes:
        raw: the ``ontology.json`` content as given (the reference draws its negatives from it).
        key: ``{trade_slot: ontology_key}`` (``"hotel-pricerange": "hotel-price range"``).
        values: ``{trade_slot: [canonical values, ontology order, duplicates removed]}``; ``none`` is never a value.
    """

    def __init__(self, ontology: dict[str, list[str]], normalizer, domains: Iterable[str] | None = None):
        keep = None if domains is None else set(domains)
        self.raw = ontology
        self.key: dict[str, str] = {}
        self.values: dict[str, list[str]] = {}
        for k, vals in ontology.items():
            if keep is not None and k.split("-", 1)[0] not in keep:
                continue
            slot = trade_slot_name(k)
            if slot in self.key:
                raise ValueError(f"ontology keys {self.key[slot]!r} and {k!r} both map to the slot {slot!r}")
            self.key[slot] = k
            seen: dict[str, None] = {}
            for v in vals:
                c = canonical_value(slot, normalizer(v))
                if c != "none":
                    seen.setdefault(c, None)
            self.values[slot] = list(seen)

    @classmethod
    def load(cls, path: str | os.PathLike | None = None, mapping: str | os.PathLike | None = None,
             domains: Iterable[str] | None = None) -> "SlotOntology":
        """From ``ontology.json`` (:func:`load_ontology`; default: the pinned copy) and ``mapping.pair``
        (:func:`load_mapping_pairs`; default: the pinned copy)."""
        return cls(load_ontology(path), Normalizer(load_mapping_pairs(mapping)), domains)

    @property
    def slots(self) -> list[str]:
        return list(self.values)

    def __contains__(self, slot: str) -> bool:
        return slot in self.values


# ------------------------------------------------------------------------------------------------ TRADE turns
def _require_belief(name: str, idx: int, meta) -> None:
    if not isinstance(meta, dict) or not meta:
        raise ValueError(f"dialogue {name}, log entry {idx}: a system turn without a belief state (metadata)")
    for dom in BELIEF_DOMAINS:
        d = meta.get(dom)
        if not isinstance(d, dict) or not isinstance(d.get("book"), dict) or not isinstance(d.get("semi"), dict):
            raise ValueError(f"dialogue {name}, log entry {idx}: metadata lacks domain {dom!r} with 'book' and 'semi'")


def _belief_values(name: str, idx: int, meta: dict, norm: Normalizer) -> list[list[str]]:
    """``[[slot, value], ...]`` of one metadata dict, in TRADE's order (``get_summary_bstate``'s value list)."""
    _require_belief(name, idx, meta)
    out = []
    for dom in BELIEF_DOMAINS:
        book, semi = meta[dom]["book"], meta[dom]["semi"]
        for slot in sorted(book):
            if slot == "booked":
                continue
            v = book[slot]
            if not isinstance(v, str):
                raise ValueError(f"dialogue {name}, log entry {idx}: {dom} book slot {slot!r} has value {v!r}, "
                                 "expected a string")
            if v != "":
                out.append([f"{dom}-book {slot.strip().lower()}", norm(v.strip().lower())])
        for slot, v in semi.items():
            if not isinstance(v, str):
                raise ValueError(f"dialogue {name}, log entry {idx}: {dom} slot {slot!r} has value {v!r}, "
                                 "expected a string")
            if v == "not mentioned":
                continue
            if v in DONTCARE_VARIANTS:
                out.append([f"{dom}-{slot.strip().lower()}", "dontcare"])
            elif v:
                out.append([f"{dom}-{slot.strip().lower()}", norm(v.strip().lower())])
    return out


def _active_domains(meta: dict) -> list[str]:
    """Domains with any semi slot not empty ("not mentioned" counts, as in TRADE's domain tracker)."""
    return [dom for dom in BELIEF_DOMAINS if any(v != "" for v in meta[dom]["semi"].values())]


def _turn_domain(name: str, idx: int, log: list, goal_domains: list[str], last: list[str] | str) -> str:
    """TRADE's ``getDomain``: the domain a user turn is about, from the belief-state change it caused."""
    if idx == 1:
        _require_belief(name, idx, log[idx]["metadata"])
        act = _active_domains(log[idx]["metadata"])
        return act[0] if act else (goal_domains[0] if goal_domains else "")
    prev, cur = log[idx - 2]["metadata"], log[idx]["metadata"]
    changed = []
    if prev and cur:  # an empty metadata gives no clue (TRADE's get_ds_diff)
        for (k1, v1), (k2, v2) in zip(prev.items(), cur.items()):
            if k1 != k2:
                raise ValueError(f"dialogue {name}, log entry {idx}: the belief-state domains {list(cur)} are not "
                                 f"in the order of entry {idx - 2} ({list(prev)})")
            if v1 != v2:
                changed.append(k2)
    doms = changed or (last if isinstance(last, list) else [last])
    return doms[0]


def _acts(turn_acts) -> list:
    """TRADE's ``getDialogueAct``: request slots, and ``[slot, value]`` informs (value normalised later)."""
    out: list = []
    if not isinstance(turn_acts, dict):  # "No Annotation"
        return out
    for k, items in turn_acts.items():
        parts = k.split("-")
        kind = parts[1].lower() if len(parts) > 1 else ""
        if kind == "request":
            out += [a[0].lower() for a in items]
        elif kind == "inform":
            out += [[a[0].lower(), a[1].lower()] for a in items]
    return out


def _fix_delex(text: str, turn_acts) -> str:
    """TRADE's ``fixDelex``: repair a delexicalised placeholder of the wrong domain (``restaurant_`` in an
    attraction turn, ...). Raw MultiWOZ text has no placeholders, so this normally changes nothing."""
    if not isinstance(turn_acts, dict):
        return text
    for k in turn_acts:
        if "Attraction" in k:
            if "restaurant_" in text:
                text = text.replace("restaurant", "attraction")
            if "hotel_" in text:
                text = text.replace("hotel", "attraction")
        if "Hotel" in k:
            if "attraction_" in text:
                text = text.replace("attraction", "hotel")
            if "restaurant_" in text:
                text = text.replace("restaurant", "hotel")
        if "Restaurant" in k:
            if "attraction_" in text:
                text = text.replace("attraction", "restaurant")
            if "hotel_" in text:
                text = text.replace("hotel", "restaurant")
    return text


def _goal_domains(d: dict) -> list[str]:
    goal = d.get("goal") or {}
    out = []
    for k, v in goal.items():
        if v and k not in IGNORE_KEYS_IN_GOAL and k not in out:
            out.append(k)
    return out


def _system_acts_table(name: str, d: dict, acts: dict | None) -> dict:
    """``{"1": acts of system turn 1, ...}``: from ``dialogue_acts.json`` when given, else from the inline
    ``dialog_act`` of the system turns (ConvLab, MultiWOZ 2.1+)."""
    if acts is not None:
        key = name[:-5] if name.endswith(".json") else name
        table = acts.get(key, acts.get(name))
        return table if isinstance(table, dict) else {}
    log = d["log"]
    return {str(j): log[2 * j - 1].get("dialog_act") for j in range(1, len(log) // 2 + 1) if 2 * j - 1 < len(log)}


def build_trade_dialogues(raw: dict, normalizer: Normalizer, dialogue_acts: dict | None = None,
                          ) -> tuple[list[dict], dict[str, str]]:
    """TRADE-format dialogues (``create_data.py``'s ``createData`` + ``divideData``) from raw MultiWOZ records.

    Args:
        raw: ``{dialogue_id: {"goal": {...}, "log": [{"text", "metadata", ...}, ...]}}`` in the order wanted
            (official ``data.json`` or a ConvLab split). Not modified.
        normalizer: :class:`Normalizer`.
        dialogue_acts: the official ``dialogue_acts.json`` (``{id: {"1": {...}, ...}}``) or ``None`` (acts read
            from inline ``dialog_act`` fields where present).

    Returns:
        ``(dialogues, dropped)``: the kept dialogues in input order, each
        ``{"dialogue_idx", "domains", "dialogue": [turn, ...]}`` with turns
        ``{"system_transcript", "turn_idx", "belief_state", "turn_label", "transcript", "system_acts", "domain"}``;
        ``dropped`` maps the id of every dialogue removed by a filter to the reason.

    Raises:
        ValueError: a malformed record (names the dialogue and log entry).
    """
    dialogues: list[dict] = []
    dropped: dict[str, str] = {}
    for name, d in raw.items():
        if not isinstance(d, dict) or not isinstance(d.get("log"), list):
            raise ValueError(f"dialogue {name}: expected an object with a 'log' list")
        log = d["log"]
        for i, t in enumerate(log):
            if not isinstance(t, dict) or not isinstance(t.get("text"), str):
                raise ValueError(f"dialogue {name}, log entry {i}: expected an object with a 'text' string")
        goal_domains = _goal_domains(d)
        acts_table = _system_acts_table(name, d, dialogue_acts)
        # createData: normalise every utterance; per system turn, the domain and the acts; then fixDelex
        texts = [normalizer(t["text"]) for t in log]
        domains_of_user: dict[int, str] = {}
        sys_acts: dict[int, list] = {}
        idx_acts, last = 1, ""
        for idx in range(len(log)):
            if idx % 2 == 1:
                cur = _turn_domain(name, idx, log, goal_domains, last)
                last = [cur]
                domains_of_user[idx - 1] = cur
                sys_acts[idx] = [a if isinstance(a, str) else [a[0], normalizer(a[1])]
                                 for a in _acts(acts_table.get(str(idx_acts)))]
                idx_acts += 1
            # TRADE applies fixDelex with the acts of the *next* system turn (idx_acts was already advanced)
            texts[idx] = _fix_delex(texts[idx], acts_table.get(str(idx_acts)))
        # divideData / analyze_dialogue: the filters
        reason = None
        if len(log) % 2 != 0:
            reason = f"odd number of log entries ({len(log)})"
        else:
            for i, text in enumerate(texts):
                if len(text.split()) > MAX_TURN_WORDS:
                    reason = f"log entry {i} has {len(text.split())} words (> {MAX_TURN_WORDS})"
                    break
                if not text.isascii():
                    reason = f"log entry {i} has non-ASCII characters"
                    break
        if reason is not None:
            dropped[name] = reason
            continue
        turns, last_bs = [], []
        for ti in range(len(log) // 2):
            u, s = 2 * ti, 2 * ti + 1
            bvs = _belief_values(name, s, log[s]["metadata"], normalizer)
            belief = [{"slots": [sv], "act": "inform"} for sv in bvs]
            turns.append({
                "system_transcript": texts[s - 2] if ti > 0 else "",
                "turn_idx": ti,
                "belief_state": belief,
                "turn_label": [b["slots"][0] for b in belief if b not in last_bs],
                "transcript": texts[u],
                "system_acts": sys_acts[s - 2] if ti > 0 else [],
                "domain": domains_of_user[u],
            })
            last_bs = belief
        dialogues.append({"dialogue_idx": name, "domains": goal_domains, "dialogue": turns})
    return dialogues, dropped


# ------------------------------------------------------------------------------------------------ sources
@dataclasses.dataclass
class MultiWOZSplit:
    """One split of MultiWOZ 2.0 in TRADE format.

    Attributes:
        split: ``train``, ``val`` or ``test`` — the data that was read.
        dialogues: TRADE-format dialogues (see :func:`build_trade_dialogues`).
        layout: ``official``, ``convlab`` or ``trade``.
        files: ``[(path, sha256), ...]`` of every file read (data, list files, mapping.pair) — the data key of a
            result.
        n_source_dialogues: dialogues in the source split before filtering.
        dropped: ``{dialogue_id: reason}`` removed by TRADE's filters (empty for the ``trade`` layout).
        stand_in_for: ``"train"`` when this split (``val``) stands in for the missing train split, else ``None``.
    """

    split: str
    dialogues: list[dict]
    layout: str
    files: list[tuple[str, str]]
    n_source_dialogues: int
    dropped: dict[str, str]
    stand_in_for: str | None = None

    @property
    def n_turns(self) -> int:
        """User turns (one per TRADE turn)."""
        return sum(len(d["dialogue"]) for d in self.dialogues)

    def describe(self) -> dict:
        """A JSON-able summary for result files (what was read, and whether it is the official split)."""
        out = {"split": self.split, "layout": self.layout, "files": [{"path": p, "sha256": h} for p, h in self.files],
               "n_source_dialogues": self.n_source_dialogues, "n_dialogues": len(self.dialogues),
               "n_dropped": len(self.dropped), "n_turns": self.n_turns, "stand_in_for": self.stand_in_for}
        if self.stand_in_for:
            out["note"] = (f"the MultiWOZ 2.0 {self.stand_in_for} split was not given; the {self.split} split stands "
                           f"in for it (pass the real {self.stand_in_for} data to use it)")
        return out


def _read_json_bytes(raw: bytes, where: str):
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{where}: not valid JSON ({e})") from None


def _read_list_file(raw: bytes, where: str) -> list[str]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{where}: not UTF-8 text ({e})") from None
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


def _check_convlab_dict(obj, where: str) -> dict:
    if not isinstance(obj, dict) or not obj:
        raise ValueError(f"{where}: expected a JSON object of dialogues ({{id: {{'goal', 'log'}}}})")
    for k, v in obj.items():
        if not isinstance(v, dict) or "log" not in v:
            raise ValueError(f"{where}: dialogue {k!r} has no 'log'; not a MultiWOZ dialogue file")
        break
    return obj


def _check_trade_list(obj, where: str) -> list[dict]:
    if not isinstance(obj, list):
        raise ValueError(f"{where}: expected a JSON list of TRADE dialogues")
    for i, d in enumerate(obj):
        if not isinstance(d, dict) or not {"dialogue_idx", "dialogue"} <= set(d):
            raise ValueError(f"{where}: dialogue {i} lacks 'dialogue_idx'/'dialogue'; not a TRADE *_dials.json file")
        d.setdefault("domains", [])
        for j, t in enumerate(d["dialogue"]):
            need = {"system_transcript", "transcript", "belief_state", "turn_label"}
            if not isinstance(t, dict) or not need <= set(t):
                raise ValueError(f"{where}: dialogue {d['dialogue_idx']!r} turn {j} lacks one of {sorted(need)}")
            for sv in t["turn_label"]:
                if not (isinstance(sv, list) and len(sv) == 2 and all(isinstance(x, str) for x in sv)):
                    raise ValueError(f"{where}: dialogue {d['dialogue_idx']!r} turn {j}: turn_label entry {sv!r} is "
                                     "not a [slot, value] pair")
            t.setdefault("turn_idx", j)
    return obj


class _Zip:
    """Members of a zip by base name (``__MACOSX`` junk skipped); nested ``*.zip`` members are opened too."""

    def __init__(self, path: Path, data: bytes | None = None, label: str | None = None):
        self.label = label or str(path)
        self.z = zipfile.ZipFile(io.BytesIO(data) if data is not None else path)
        self.members = [n for n in self.z.namelist() if "__MACOSX" not in n and not n.endswith("/")]

    def find(self, name: str) -> str | None:
        hits = sorted((n for n in self.members if PurePosixPath(n).name == name), key=lambda n: (n.count("/"), n))
        return hits[0] if hits else None

    def read(self, member: str) -> bytes:
        return self.z.read(member)


def _split_named(name: str) -> str | None:
    """The split a ConvLab/TRADE file name names (``test.json.zip`` → test, ``dev_dials.json`` → val)."""
    m = re.match(r"^(train|val|valid|dev|test)(_dials)?\.json(\.zip)?$", name)
    return _SPLIT_ALIASES[m.group(1)] if m else None


def _from_official(data: dict, lists: dict[str, list[str]], acts: dict | None, split: str, norm: Normalizer,
                   where: str) -> tuple[list[dict], dict, int]:
    data = _check_convlab_dict(data, where)
    if split == "train":
        held = set(lists["val"]) | set(lists["test"])
        raw = {k: v for k, v in data.items() if k not in held}
    else:
        wanted = set(lists[split])
        raw = {k: v for k, v in data.items() if k in wanted}
        if not raw:
            raise ValueError(f"{where}: none of the {len(wanted)} ids of {_LIST_FILES[split]} is in data.json")
    dials, dropped = build_trade_dialogues(raw, norm, acts)
    return dials, dropped, len(raw)


def _load_from_zip(path: Path, split: str, norm: Normalizer, files: list, zdata: bytes | None = None,
                   label: str | None = None):
    z = _Zip(path, zdata, label)
    where = z.label
    # official release: data.json + list files
    m = z.find("data.json")
    if m is not None:
        lists = {}
        for s, fname in _LIST_FILES.items():
            lm = z.find(fname)
            if lm is None:
                raise FileNotFoundError(f"{where}: has {m} but no {fname} (the official split list)")
            lists[s] = _read_list_file(z.read(lm), f"{where}:{lm}")
        am = z.find("dialogue_acts.json")
        acts = _read_json_bytes(z.read(am), f"{where}:{am}") if am else None
        data = _read_json_bytes(z.read(m), f"{where}:{m}")
        dials, dropped, n = _from_official(data, lists, acts, split, norm, f"{where}:{m}")
        return dials, dropped, n, "official"
    # TRADE
    m = z.find(_TRADE_NAMES[split])
    if m is not None:
        dials = _check_trade_list(_read_json_bytes(z.read(m), f"{where}:{m}"), f"{where}:{m}")
        return dials, {}, len(dials), "trade"
    # ConvLab: test.json inside test.json.zip, or a zip of the folder holding {split}.json.zip
    for cand in (f"{split}.json", "valid.json" if split == "val" else None):
        m = z.find(cand) if cand else None
        if m is not None:
            data = _check_convlab_dict(_read_json_bytes(z.read(m), f"{where}:{m}"), f"{where}:{m}")
            dials, dropped = build_trade_dialogues(data, norm)
            return dials, dropped, len(data), "convlab"
    m = z.find(f"{split}.json.zip")
    if m is not None:
        return _load_from_zip(path, split, norm, files, z.read(m), f"{where}:{m}")
    # a single-split zip whose member names another split
    named = {(_split_named(PurePosixPath(n).name)) for n in z.members} - {None}
    if named:
        raise ValueError(f"{where}: holds the MultiWOZ split(s) {sorted(named)}, not {split!r}")
    raise ValueError(f"{where}: not a MultiWOZ 2.0 archive (looked for data.json + list files, {split}.json, "
                     f"{_TRADE_NAMES[split]}, {split}.json.zip)")


def _find_in_folder(folder: Path, names: Iterable[str], depth: int = 4) -> Path | None:
    names = [n for n in names if n]
    for d in range(depth + 1):
        pattern = "/".join(["*"] * d)
        for n in names:
            hits = sorted(q for q in folder.glob(f"{pattern}/{n}" if d else n) if "__MACOSX" not in q.parts)
            if hits:
                return hits[0]
    return None


def _load_file(p: Path, split: str, norm: Normalizer, files: list, digests: dict[str, str]):
    """Parse ``p``; each file read is appended to ``files`` with its digest from ``digests`` (those of
    :func:`_with_sidecars`, computed once by :func:`load_multiwoz`)."""
    named = _split_named(p.name)
    if named is not None and named != split:
        raise ValueError(f"{p}: this file holds the {named!r} split, not {split!r}")
    files.append((str(p), digests[str(p)]))
    if zipfile.is_zipfile(p):
        return _load_from_zip(p, split, norm, files)
    obj = _read_json_bytes(p.read_bytes(), str(p))
    if isinstance(obj, list):
        dials = _check_trade_list(obj, str(p))
        return dials, {}, len(dials), "trade"
    if p.name == "data.json":  # official: list files beside it
        lists = {}
        for s, fname in _LIST_FILES.items():
            lp = p.parent / fname
            if not lp.exists():
                raise FileNotFoundError(f"{lp}: the official split list is missing (needed beside {p})")
            files.append((str(lp), digests[str(lp)]))
            lists[s] = _read_list_file(lp.read_bytes(), str(lp))
        ap = p.parent / "dialogue_acts.json"
        acts = None
        if ap.exists():
            files.append((str(ap), digests[str(ap)]))
            acts = _read_json_bytes(ap.read_bytes(), str(ap))
        dials, dropped, n = _from_official(obj, lists, acts, split, norm, str(p))
        return dials, dropped, n, "official"
    data = _check_convlab_dict(obj, str(p))  # a ConvLab-style {split}.json
    dials, dropped = build_trade_dialogues(data, norm)
    return dials, dropped, len(data), "convlab"


def _resolve_source(source: Path, split: str) -> Path:
    if source.is_file():
        return source
    alt = "valid" if split == "val" else None
    for names in ([_TRADE_NAMES[split]], [f"{split}.json.zip", f"{split}.json", alt and f"{alt}.json.zip"],
                  ["data.json"], ["MultiWOZ_2.0.zip", "MULTIWOZ2.zip"]):
        hit = _find_in_folder(source, names)
        if hit is not None:
            return hit
    raise FileNotFoundError(
        f"{source}: no MultiWOZ 2.0 {split} data found (looked for {_TRADE_NAMES[split]}, {split}.json.zip, "
        f"{split}.json, data.json with the list files, MultiWOZ_2.0.zip)")


class _LazyNormalizer:
    """A :class:`Normalizer` whose ``mapping.pair`` is only read (or downloaded) when first needed."""

    def __init__(self, mapping, download: bool):
        self.mapping, self.download, self.path, self._norm = mapping, download, None, None

    def __call__(self, text: str) -> str:
        if self._norm is None:
            self.path = (Path(self.mapping) if self.mapping is not None
                         else default_file("mapping.pair", download=self.download))
            self._norm = Normalizer(load_mapping_pairs(self.path))
        return self._norm(text)


def load_multiwoz(source: str | os.PathLike | None = None, split: str = "test", *,
                  mapping: str | os.PathLike | None = None, download: bool = True) -> MultiWOZSplit:
    """Load one MultiWOZ 2.0 split as TRADE-format dialogues (see the module docstring for layouts and rules).

    Args:
        source: a file (``MultiWOZ_2.0.zip``, ``data.json``, ``test.json.zip``, ``test.json``,
            ``test_dials.json``), a folder holding one of them, or a zip of such a folder; ``None`` =
            ``$RBJAX_MULTIWOZ`` or else the default download (ConvLab ``val``/``test`` only).
        split: ``test``, ``val`` (``dev``) or ``train``.
        mapping: ``mapping.pair`` for the normalisation (default: the pinned upstream copy).
        download: allow downloading the default files.

    Returns:
        :class:`MultiWOZSplit`, the caller's own copy. A split parsed before (by any process) from files with the
        same SHA-256 digests (and the same ``mapping``) is read from rbjax's cache folder instead of being parsed
        again (module docstring).
    Raises:
        FileNotFoundError: missing source or files. ValueError: a file of another layout, split or a malformed
        record (named). RuntimeError: download failure. ``split="train"`` with no source: ValueError (the train
        split is not part of the default download).
    """
    split = canonical_split(split)
    if source is None and os.environ.get(ENV_SOURCE):
        source = os.environ[ENV_SOURCE]
    files: list[tuple[str, str]] = []
    norm = _LazyNormalizer(mapping, download)
    if source is None:
        if split == "train":
            raise ValueError(
                "the MultiWOZ 2.0 train split is not part of the default download (only ConvLab's val and test "
                "splits are pinned); pass the official MultiWOZ_2.0.zip, ConvLab's train.json.zip or TRADE's "
                "train_dials.json as source, or use load_training_split() for the val stand-in")
        path = default_file(f"{split}.json.zip", download=download)
    else:
        path = Path(source).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"{path}: MultiWOZ source not found")
        path = _resolve_source(path, split)
    # a split parsed before from files with the same content is not parsed again (a study's dialog stages read the
    # same splits once per model): a keyed result in the cache folder
    digests = {str(f): sha256_file(f) for f in _with_sidecars(path)}
    key = {"format": PARSED_FORMAT, "parser": sha256_file(Path(__file__)), "split": split, "files": digests,
           "mapping": None if mapping is None else [str(mapping), sha256_file(mapping)]}
    parsed = KeyedResult(cache_root() / PARSED_DIR / f"{split}-{digest(str(path.resolve()))[:16]}.json", key,
                         f"parsed MultiWOZ {split} split", check=_not_a_parsed_split)
    try:
        body = parsed.stored()
    except OSError:  # an unreadable cache folder: parsed again
        body = None
    if body is None:
        dials, dropped, n, layout = _load_file(path, split, norm, files, digests)
        if norm.path is not None:
            files.append((str(norm.path), sha256_file(norm.path)))
        body = {"layout": layout, "files": files, "n_source_dialogues": n, "dropped": dropped, "dialogues": dials}
        _keep(parsed, body)
    else:
        _touch(parsed.path)
    # the caller's own copy (parsed now or read from the file): changing it cannot change a later load
    return MultiWOZSplit(split=split, dialogues=body["dialogues"], layout=body["layout"],
                         files=[tuple(f) for f in body["files"]], n_source_dialogues=body["n_source_dialogues"],
                         dropped=body["dropped"])


#: the folder of parsed splits in rbjax's cache folder, and how many of them are kept (the most recently used)
PARSED_DIR = "multiwoz-parsed"
PARSED_MAX = 8
#: the format of a parsed split's file (part of its key, with the digest of this module's source)
PARSED_FORMAT = 1


def _not_a_parsed_split(rec: dict) -> str | None:
    """``None`` when a stored record (with this split's key) holds a parsed split, else why not (a foreign file)."""
    types = {"layout": str, "files": list, "n_source_dialogues": int, "dropped": dict, "dialogues": list}
    bad = [k for k, t in types.items() if not isinstance(rec.get(k), t)]
    return f"not a parsed split (no valid {', '.join(bad)})" if bad else None


def _keep(parsed: KeyedResult, body: dict) -> None:
    """Write a parsed split to the cache folder and drop the least recently used files beyond :data:`PARSED_MAX`
    (a read-only cache folder: nothing is kept)."""
    try:
        parsed.save(body)
        kept = sorted(parsed.path.parent.glob("*.json"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
        for old in kept[PARSED_MAX:]:
            old.unlink(missing_ok=True)
    except OSError:
        pass


def _touch(path: Path) -> None:
    """Mark a parsed split's file as used now (the files kept are the most recently used)."""
    try:
        os.utime(path)
    except OSError:
        pass


def _with_sidecars(path: Path) -> list[Path]:
    """``path`` and, beside a ``data.json``, its list files and ``dialogue_acts.json`` when present."""
    out = [path]
    if path.name == "data.json":
        out += [q for q in (path.parent / f for f in (*_LIST_FILES.values(), "dialogue_acts.json")) if q.exists()]
    return out


def split_files(source: str | os.PathLike | None = None, split: str = "test", *, download: bool = True
                ) -> list[Path]:
    """The data files :func:`load_multiwoz` ``(source, split)`` reads (``mapping.pair`` aside), without parsing them:
    for content keys of results that may be reused (a result keyed on these files' digests stays valid while they do
    not change).

    Returns:
        the split's file (zip, ``{split}.json``, ``*_dials.json``, ``data.json``), plus, beside a ``data.json``, its
        list files and ``dialogue_acts.json`` when present.
    Raises:
        as :func:`load_multiwoz` for a missing source or split (no default train split).
    """
    split = canonical_split(split)
    if source is None and os.environ.get(ENV_SOURCE):
        source = os.environ[ENV_SOURCE]
    if source is None:
        if split == "train":
            raise ValueError("the MultiWOZ 2.0 train split is not part of the default download; pass it as source")
        return [default_file(f"{split}.json.zip", download=download)]
    path = Path(source).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"{path}: MultiWOZ source not found")
    return _with_sidecars(_resolve_source(path, split))


def load_training_split(train_source: str | os.PathLike | None = None, source: str | os.PathLike | None = None,
                        **kw) -> MultiWOZSplit:
    """The DST training data: ``train_source`` (the real train split) if given, else the ``val`` split of
    ``source`` (default download) as a stand-in, marked ``stand_in_for="train"``.

    Args:
        train_source: a train file or folder (any layout of :func:`load_multiwoz`), or ``None``.
        source: where the val stand-in comes from (``None`` = default download).
        **kw: passed to :func:`load_multiwoz` (``mapping``, ``download``).
    """
    if train_source is not None:
        return load_multiwoz(train_source, "train", **kw)
    out = load_multiwoz(source, "val", **kw)
    out.stand_in_for = "train"
    return out
