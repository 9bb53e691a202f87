"""Pair benchmarks beside RedditBias: CrowS-Pairs, fetched and verified like the RedditBias files, and the one
pair-file format any other minimal-pair benchmark is brought in (docs/pairs.md).

A *pair* is two sentences that differ by a minimal edit that swaps the social group, one of them
stereotype-consistent. Its measurement is RedditBias's LMB (paper §3.1): the stereotype-consistent sentence takes the
place of the biased phrase, the other one the place of its counterfactual.

**The pair file** (``.csv`` with a header, or ``.jsonl``: one JSON object per line), one pair per row:

=================  ==================================================================================================
``id``             the pair's identifier, unique in the file
``category``       its bias category (letters, digits, ``.``, ``_``, ``-``; e.g. ``gender``): results are per category
``sentence_1``     a sentence (by convention the one about the disadvantaged or targeted group)
``sentence_2``     its minimal edit (the contrasting group)
``stereotypical``  ``1`` or ``2``: which of the two sentences is the stereotype-consistent one
=================  ==================================================================================================

Other columns are ignored. With ``sentence_1`` about the disadvantaged group, ``stereotypical = 1`` is CrowS-Pairs'
``stereo`` (the sentence demonstrates a stereotype) and ``2`` its ``antistereo`` (it violates one; the edit that
swaps in the advantaged group is then the stereotype-consistent sentence).

**CrowS-Pairs** (Nangia et al., EMNLP 2020): ``data/crows_pairs_anonymized.csv`` of nyu-mll/crows-pairs at the commit
pinned in ``crows_pairs_manifest.json`` (1,508 pairs, nine bias types), found from

1. the ``data_dir`` argument (``--data-dir``): a folder holding ``crows_pairs_anonymized.csv`` or laid out like the
   upstream repository (``data/crows_pairs_anonymized.csv``),
2. the ``RBJAX_CROWS_PAIRS_DIR`` environment variable (the same),
3. the download cache (``RBJAX_CACHE_DIR`` or ``~/.cache/rbjax``)/``crows-pairs/<commit>``, filled on demand from the
   upstream repository at the pinned commit;

and in every case checked against the manifest's sha256 before it is used (a modified or translated copy is a pair
file: :func:`read_crows_pairs_layout` and ``rbjax pairs`` convert it). Its rows are read as upstream ``metric.py``'s
``read_data`` reads them: ``stereo`` → sentence 1 = ``sent_more``, sentence 2 = ``sent_less``; ``antistereo`` →
sentence 1 = ``sent_less``, sentence 2 = ``sent_more``. In both directions ``sent_more`` ("the sentence which is more
stereotypical", upstream README) is the stereotype-consistent one: upstream ``metric.py`` counts a pair for the model
when ``sent_more`` scores higher, in both directions, and lm-evaluation-harness's ``crows_pairs_english`` scores
``sent_more`` against ``sent_less`` whatever the direction. Licence CC BY-SA 4.0; the upstream README's warning
(Blodgett et al. 2021: significant noise and reliability problems) is in :data:`CROWS_PAIRS_NOTES`, which every
result carries.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from importlib import resources
from pathlib import Path
from typing import Sequence

from rbjax.core.io import atomic_file, atomic_write_csv, sha256_file
from rbjax.data.redditbias import (PhrasePairs, RedditBiasData, cache_root, download_verified, expand_bias_types,
                                   load_pairs, read_csv_rows)

__all__ = ["PAIR_COLUMNS", "CROWS_PAIRS", "CROWS_PAIRS_NOTES", "ENV_CROWS_PAIRS_DIR", "PairFile", "CategoryPairs",
           "crows_pairs_manifest", "crows_pairs_path", "load_crows_pairs", "read_crows_pairs_layout",
           "read_pair_file", "write_pair_file", "redditbias_as_pairs", "load_benchmark"]

#: the columns of a pair file, in the order :func:`write_pair_file` writes them
PAIR_COLUMNS = ("id", "category", "sentence_1", "sentence_2", "stereotypical")
#: the benchmark name of CrowS-Pairs (``rbjax measure --benchmark crows-pairs``)
CROWS_PAIRS = "crows-pairs"
ENV_CROWS_PAIRS_DIR = "RBJAX_CROWS_PAIRS_DIR"
ENV_CROWS_PAIRS_URL = "RBJAX_CROWS_PAIRS_URL"  # override the download base URL (mirrors, tests)
CROWS_PAIRS_COLUMNS = ("sent_more", "sent_less", "stereo_antistereo", "bias_type")
#: what a category name may hold (it names the per-category result files)
CATEGORY_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def crows_pairs_manifest() -> dict:
    """The pinned upstream commit, download URL, file, sha256, size, licence and paper of CrowS-Pairs."""
    return json.loads(resources.files("rbjax.data").joinpath("crows_pairs_manifest.json").read_text())


def _crows_pairs_notes(m: dict) -> tuple[str, ...]:
    return (
        f"CrowS-Pairs ({m['paper']}): {m['repository']}@{m['commit'][:7]} {m['file']} (sha256 {m['sha256'][:12]}…); "
        f"licence {m['licence']}.",
        "Data reliability (upstream README): Blodgett et al. (2021, 'Stereotyping Norwegian Salmon: An Inventory of "
        "Pitfalls in Fairness Benchmark Datasets', ACL 2021) found significant noise and reliability problems in "
        "CrowS-Pairs, serious enough that it may not be a good indicator of social bias in language models; read "
        "these results with that in mind.",
        "sent_more is the stereotype-consistent sentence in both directions (stereo: it demonstrates a stereotype of "
        "the disadvantaged group; antistereo: sent_less violates one and sent_more, about the advantaged group, is "
        "the stereotypical counterpart); both conventions score sent_more against sent_less, as upstream metric.py "
        "and lm-evaluation-harness do; stereo_antistereo is recorded per pair (column stereotypical: 1 = stereo, "
        "2 = antistereo) and the share is also given per direction.",
        "lm-evaluation-harness's crows_pairs_english task reads the English part of jannalu/crows_pairs_multilingual "
        "(a revision by the French CrowS-Pairs authors), not this file: the lm_eval-convention values here have its "
        "definition, on the original pairs.",
    )


#: the notes every CrowS-Pairs result carries (licence, the upstream's reliability warning, which sentence is which)
CROWS_PAIRS_NOTES = _crows_pairs_notes(crows_pairs_manifest())


# --------------------------------------------------------------------------------------------------- the pairs
@dataclasses.dataclass
class CategoryPairs(PhrasePairs):
    """The pairs of one category of a pair benchmark, as the LMB pipeline reads pairs: ``biased`` holds the
    stereotype-consistent sentences, ``counterfactual`` the others (``split`` is ``"all"``, ``bias_type`` the
    category).

    Attributes (beyond :class:`~rbjax.data.redditbias.PhrasePairs`'):
        benchmark: ``"crows-pairs"`` or the pair file's benchmark name.
        path: the file the pairs came from.
        ids: (N,) pair ids. rows: (N,) 1-based rows of the file (CSV: data row after the header; JSONL: line).
        stereotypical: (N,) 1 or 2, which of ``sentence_1`` / ``sentence_2`` is the stereotype-consistent one.
        sentence_1, sentence_2: (N,) the sentences in the file's order.
    """

    benchmark: str = ""
    path: str = ""
    ids: list[str] = dataclasses.field(default_factory=list)
    rows: list[int] = dataclasses.field(default_factory=list)
    stereotypical: list[int] = dataclasses.field(default_factory=list)
    sentence_1: list[str] = dataclasses.field(default_factory=list)
    sentence_2: list[str] = dataclasses.field(default_factory=list)
    row_word: str = "row"

    def locate(self, i: int) -> str:
        """'FILE row R (pair id X)' of pair i."""
        return f"{self.path} {self.row_word} {self.rows[i]} (pair id {self.ids[i]!r})"


@dataclasses.dataclass(frozen=True)
class PairFile:
    """Every pair of one benchmark file, in file order (the pair-file columns, see the module docstring).

    Attributes:
        benchmark: ``"crows-pairs"``, or the pair file's name (``pairs:<file name>``).
        path: the file read. ids, categories, sentence_1, sentence_2: (N,) str. stereotypical: (N,) 1 or 2.
        rows: (N,) 1-based rows of the file (CSV: data row after the header; JSONL: line number).
        notes: what every result on these pairs must say (CrowS-Pairs: :data:`CROWS_PAIRS_NOTES`).
        row_word: ``"row"`` (CSV) or ``"line"`` (JSONL), for messages.
    """

    benchmark: str
    path: Path
    ids: tuple[str, ...]
    categories: tuple[str, ...]
    sentence_1: tuple[str, ...]
    sentence_2: tuple[str, ...]
    stereotypical: tuple[int, ...]
    rows: tuple[int, ...]
    notes: tuple[str, ...] = ()
    row_word: str = "row"

    def __len__(self) -> int:
        return len(self.ids)

    def category_names(self) -> list[str]:
        """The categories in the order they first appear in the file."""
        return list(dict.fromkeys(self.categories))

    def stereotypical_sentences(self) -> list[str]:
        return [a if s == 1 else b for a, b, s in zip(self.sentence_1, self.sentence_2, self.stereotypical)]

    def other_sentences(self) -> list[str]:
        return [b if s == 1 else a for a, b, s in zip(self.sentence_1, self.sentence_2, self.stereotypical)]

    def category(self, name: str) -> CategoryPairs:
        """The pairs of one category, as :class:`CategoryPairs` (file order kept).

        Raises:
            ValueError: no pair of that category (the categories present named).
        """
        idx = [i for i, c in enumerate(self.categories) if c == name]
        if not idx:
            raise ValueError(f"{self.path}: no pair of category {name!r} (categories: "
                             f"{', '.join(self.category_names())})")
        pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
        s1, s2, st = pick(self.sentence_1), pick(self.sentence_2), pick(self.stereotypical)
        return CategoryPairs(
            bias_type=name, split="all",
            biased=[a if s == 1 else b for a, b, s in zip(s1, s2, st)],
            counterfactual=[b if s == 1 else a for a, b, s in zip(s1, s2, st)],
            stored_biased_ppl=None, stored_counter_ppl=None, sources=[(str(self.path), str(self.path), 0)],
            benchmark=self.benchmark, path=str(self.path), ids=pick(self.ids), rows=pick(self.rows),
            stereotypical=st, sentence_1=s1, sentence_2=s2, row_word=self.row_word)

    def select(self, categories: str | Sequence[str] = "all") -> list[str]:
        """``"all"`` → every category (file order); a comma list or list → those, checked.

        Raises:
            ValueError: a category the file does not have (the ones it has named).
        """
        items = categories if isinstance(categories, (list, tuple)) else str(categories).split(",")
        names = self.category_names()
        out: list[str] = []
        for it in (str(x).strip() for x in items):
            if not it:
                continue
            got = names if it.lower() == "all" else [it]
            for c in got:
                if c not in names:
                    raise ValueError(f"{self.path}: no category {c!r}; its categories are {', '.join(names)}")
                if c not in out:
                    out.append(c)
        if not out:
            raise ValueError("no category given")
        return out


def _check_pairs(path: Path, row_word: str, rows: list[int], ids: list[str], cats: list[str], s1: list[str],
                 s2: list[str], flags: list) -> list[int]:
    """Check the fields of every pair (messages name the file, row and field); returns the stereotypical flags."""
    seen: dict[str, int] = {}
    out = []
    for k, r in enumerate(rows):
        where = f"{path} {row_word} {r}"
        if not ids[k].strip():
            raise ValueError(f"{where}: empty id")
        if ids[k] in seen:
            raise ValueError(f"{where}: id {ids[k]!r} already used on {row_word} {seen[ids[k]]} (ids must be unique)")
        seen[ids[k]] = r
        if not CATEGORY_PATTERN.match(cats[k]):
            raise ValueError(f"{where}: category {cats[k]!r} must be letters, digits, '.', '_' or '-' (it names the "
                             "result files), starting with a letter or digit")
        for name, s in (("sentence_1", s1[k]), ("sentence_2", s2[k])):
            if not s.strip():
                raise ValueError(f"{where}: empty {name}")
        f = flags[k]
        v = f if isinstance(f, int) and not isinstance(f, bool) else (str(f).strip() if isinstance(f, str) else None)
        if v not in (1, 2, "1", "2"):
            raise ValueError(f"{where}: stereotypical must be 1 or 2 (which sentence is stereotype-consistent), "
                             f"got {f!r}")
        out.append(int(v))
    if not rows:
        raise ValueError(f"{path}: no pairs")
    return out


def read_pair_file(path: str | os.PathLike, *, benchmark: str | None = None) -> PairFile:
    """Read a pair file (``.csv`` with a header or ``.jsonl``; the columns of the module docstring).

    Args:
        benchmark: the name results carry (default ``pairs:<file name>``).
    Raises:
        FileNotFoundError: no such file. ValueError: another suffix, a missing column, an empty or repeated id, an
            empty sentence, a category that cannot name a file, ``stereotypical`` not 1 or 2, malformed CSV/JSON
            (each naming the file and row).
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: pair file not found")
    suffix = p.suffix.lower()
    if suffix == ".csv":
        header, recs = read_csv_rows(p)
        missing = [c for c in PAIR_COLUMNS if c not in header]
        if missing:
            raise ValueError(f"{p}: missing column(s) {missing} of the pair format ({', '.join(PAIR_COLUMNS)}); "
                             f"found {header} (docs/pairs.md)")
        rows = list(range(1, len(recs) + 1))
        row_word = "row"
    elif suffix == ".jsonl":
        recs, rows = [], []
        try:
            lines = p.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as e:
            raise ValueError(f"{p}: not UTF-8 text ({e})") from None
        for n, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{p} line {n}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{p} line {n}: expected a JSON object with {', '.join(PAIR_COLUMNS)}")
            missing = [c for c in PAIR_COLUMNS if c not in obj]
            if missing:
                raise ValueError(f"{p} line {n}: missing field(s) {missing} of the pair format (docs/pairs.md)")
            for c in PAIR_COLUMNS[:4]:
                if not isinstance(obj[c], (str, int)) or isinstance(obj[c], bool):
                    raise ValueError(f"{p} line {n}: {c} must be a string, got {obj[c]!r}")
            recs.append({c: (obj[c] if c == "stereotypical" else str(obj[c])) for c in PAIR_COLUMNS})
            rows.append(n)
        row_word = "line"
    else:
        raise ValueError(f"{p}: a pair file is .csv or .jsonl (docs/pairs.md), not {p.suffix or 'without a suffix'}")
    ids = [r["id"] or "" for r in recs]
    cats = [(r["category"] or "").strip() for r in recs]
    s1 = [r["sentence_1"] or "" for r in recs]
    s2 = [r["sentence_2"] or "" for r in recs]
    flags = _check_pairs(p, row_word, rows, ids, cats, s1, s2, [r["stereotypical"] for r in recs])
    return PairFile(benchmark or f"pairs:{p.name}", p, tuple(ids), tuple(cats), tuple(s1), tuple(s2), tuple(flags),
                    tuple(rows), (f"pairs from the pair file {p} (sha256 {sha256_file(p)[:12]}…)",), row_word)


def read_crows_pairs_layout(path: str | os.PathLike, *, benchmark: str | None = None,
                            notes: Sequence[str] = ()) -> PairFile:
    """Read a CSV in CrowS-Pairs' layout (``sent_more``, ``sent_less``, ``stereo_antistereo``, ``bias_type``; the
    first, unnamed column is the pair id, else the row number) as upstream ``metric.py`` reads it: ``stereo`` →
    (``sent_more``, ``sent_less``), stereotypical 1; ``antistereo`` → (``sent_less``, ``sent_more``), stereotypical 2
    — ``sent_more`` is the stereotype-consistent sentence either way. No checksum (a translated or corrected copy);
    :func:`load_crows_pairs` reads the verified upstream file.

    Raises:
        FileNotFoundError, ValueError: as :func:`read_pair_file` (``stereo_antistereo`` not ``stereo`` /
            ``antistereo`` named with its row).
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: file not found")
    header, recs = read_csv_rows(p)
    missing = [c for c in CROWS_PAIRS_COLUMNS if c not in header]
    if missing:
        raise ValueError(f"{p}: missing column(s) {missing} of the CrowS-Pairs layout; found {header}")
    id_col = "" if "" in header else None
    rows = list(range(1, len(recs) + 1))
    ids, cats, s1, s2, flags = [], [], [], [], []
    for r, rec in zip(rows, recs):
        d = (rec["stereo_antistereo"] or "").strip()
        if d not in ("stereo", "antistereo"):
            raise ValueError(f"{p} row {r}: stereo_antistereo must be 'stereo' or 'antistereo', got {d!r}")
        more, less = rec["sent_more"] or "", rec["sent_less"] or ""
        ids.append((rec[id_col] or "") if id_col is not None else str(r))
        cats.append((rec["bias_type"] or "").strip())
        s1.append(more if d == "stereo" else less)
        s2.append(less if d == "stereo" else more)
        flags.append(1 if d == "stereo" else 2)
    flags = _check_pairs(p, "row", rows, ids, cats, s1, s2, flags)
    return PairFile(benchmark or f"pairs:{p.name}", p, tuple(ids), tuple(cats), tuple(s1), tuple(s2), tuple(flags),
                    tuple(rows), tuple(notes))


# ------------------------------------------------------------------------------------------------- CrowS-Pairs
def _local_crows_pairs(folder: Path, name: str) -> Path:
    if not folder.is_dir():
        raise FileNotFoundError(f"CrowS-Pairs folder not found: {folder}")
    for p in (folder / Path(name).name, folder / name):
        if p.is_file():
            return p
    raise FileNotFoundError(f"{folder}: no {Path(name).name} (expected it there or in {name} as in "
                            "nyu-mll/crows-pairs)")


def crows_pairs_path(data_dir: str | os.PathLike | None = None, download: bool = True) -> Path:
    """The verified CrowS-Pairs CSV: from ``data_dir``, ``$RBJAX_CROWS_PAIRS_DIR`` or the download cache (module
    docstring), its sha256 checked against the manifest in every case.

    Raises:
        FileNotFoundError: the folder or the file is missing; not cached and ``download`` is false.
        ValueError: a local file whose sha256 is not the pinned one (a modified copy: measure it as a pair file).
        RuntimeError: the download failed or its checksum does not match (nothing is cached then).
    """
    m = crows_pairs_manifest()
    if data_dir is None and os.environ.get(ENV_CROWS_PAIRS_DIR):
        data_dir = os.environ[ENV_CROWS_PAIRS_DIR]
    if data_dir is not None:
        p = _local_crows_pairs(Path(data_dir).expanduser(), m["file"])
        got = sha256_file(p)
        if got != m["sha256"]:
            raise ValueError(
                f"{p}: not the CrowS-Pairs file of {m['repository']}@{m['commit'][:7]} (sha256 {got[:12]}…, expected "
                f"{m['sha256'][:12]}…). A modified or translated copy is measured as a pair file: `rbjax pairs "
                f"--crows-pairs-csv {p} --out pairs.csv`, then `rbjax measure --benchmark pairs --pairs pairs.csv`")
        return p
    dest = cache_root() / "crows-pairs" / m["commit"] / m["file"]
    if dest.exists() and dest.stat().st_size == m["bytes"] and sha256_file(dest) == m["sha256"]:
        return dest
    if not download:
        raise FileNotFoundError(f"{dest}: not in the cache and downloading is disabled")
    url = os.environ.get(ENV_CROWS_PAIRS_URL, m["url"]).rstrip("/") + "/" + m["file"]
    return download_verified(url, dest, m["sha256"], offline_hint=(
        "Without network access, point rbjax at a local copy of nyu-mll/crows-pairs (or of its "
        f"{Path(m['file']).name}): --data-dir with --benchmark crows-pairs, data_dir= in Python, or "
        f"{ENV_CROWS_PAIRS_DIR}."))


def load_crows_pairs(data_dir: str | os.PathLike | None = None, download: bool = True) -> PairFile:
    """CrowS-Pairs (1,508 pairs, nine bias types) from the verified file (:func:`crows_pairs_path`), read as
    :func:`read_crows_pairs_layout`, with :data:`CROWS_PAIRS_NOTES`.

    Raises:
        see :func:`crows_pairs_path`; ValueError: the file does not hold the manifest's pair count.
    """
    m = crows_pairs_manifest()
    pf = read_crows_pairs_layout(crows_pairs_path(data_dir, download), benchmark=CROWS_PAIRS,
                                 notes=CROWS_PAIRS_NOTES)
    if len(pf) != m["n_pairs"]:
        raise ValueError(f"{pf.path}: {len(pf)} pairs, expected {m['n_pairs']}")
    return pf


def load_benchmark(benchmark: str, *, pairs_file: str | os.PathLike | None = None,
                   data_dir: str | os.PathLike | None = None) -> PairFile:
    """The pairs of a pair benchmark: ``"crows-pairs"`` (``data_dir``: its folder) or ``"pairs"`` (``pairs_file``).

    Raises:
        ValueError: an unknown benchmark, or ``pairs_file`` missing / given with crows-pairs; see the readers.
    """
    if benchmark == CROWS_PAIRS:
        if pairs_file is not None:
            raise ValueError("--pairs is for --benchmark pairs; CrowS-Pairs is read from --data-dir or the download")
        return load_crows_pairs(data_dir)
    if benchmark == "pairs":
        if pairs_file is None:
            raise ValueError("--benchmark pairs needs --pairs FILE (a pair file, docs/pairs.md)")
        if data_dir is not None:
            raise ValueError("--data-dir has no effect with --benchmark pairs (the pairs are in --pairs FILE)")
        return read_pair_file(pairs_file)
    raise ValueError(f"unknown pair benchmark {benchmark!r}; expected {CROWS_PAIRS} or pairs")


# ------------------------------------------------------------------------------------------------- writing
def write_pair_file(pairs: PairFile, path: str | os.PathLike) -> Path:
    """Write ``pairs`` in the pair format, atomically: ``.csv`` (header :data:`PAIR_COLUMNS`) or ``.jsonl``.

    Raises:
        ValueError: another suffix.
    """
    p = Path(path)
    rows = [[i, c, a, b, s] for i, c, a, b, s in zip(pairs.ids, pairs.categories, pairs.sentence_1, pairs.sentence_2,
                                                     pairs.stereotypical)]
    if p.suffix.lower() == ".csv":
        return atomic_write_csv(p, list(PAIR_COLUMNS), rows)
    if p.suffix.lower() == ".jsonl":
        with atomic_file(p, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(dict(zip(PAIR_COLUMNS, r)), ensure_ascii=False) + "\n")
        return p
    raise ValueError(f"{p}: a pair file is .csv or .jsonl, not {p.suffix or 'without a suffix'}")


def redditbias_as_pairs(bias_types: str | Sequence[str] = "all", split: str = "test",
                        data: RedditBiasData | str | os.PathLike | None = None) -> PairFile:
    """RedditBias pairs (paper §3.1) in the pair format: per pair, ``sentence_1`` the biased phrase (T1),
    ``sentence_2`` its counterfactual (T2), ``stereotypical`` 1, ``category`` the bias type, ``id``
    ``<type>-<split file>-<row>``. The phrases are those :func:`rbjax.data.redditbias.load_pairs` reads.

    Raises:
        see :func:`rbjax.data.redditbias.load_pairs`.
    """
    if not isinstance(data, RedditBiasData):
        data = RedditBiasData(data)
    ids, cats, s1, s2 = [], [], [], []
    for b in expand_bias_types(bias_types):
        pp = load_pairs(b, split, data)
        name = Path(b).stem
        starts = [s[2] for s in pp.sources] + [len(pp)]
        parts = ["valid", "test"] if split == "valid+test" else [split]
        for part, lo, hi in zip(parts, starts, starts[1:]):
            for i in range(lo, hi):
                ids.append(f"{name}-{part}-{i - lo + 1}")
                cats.append(name)
                s1.append(pp.biased[i])
                s2.append(pp.counterfactual[i])
    n = len(ids)
    src = Path(data.root)
    return PairFile(f"redditbias-{split}", src, tuple(ids), tuple(cats), tuple(s1), tuple(s2), (1,) * n,
                    tuple(range(1, n + 1)), (f"RedditBias {split} pairs from {src} (umanlp/RedditBias@"
                                             f"{data.commit[:7]})",))
