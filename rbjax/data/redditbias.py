"""The released RedditBias data: where it is, fetching it, and loading phrase pairs (paper §2, §3.1).

A data folder is laid out like the upstream repository (umanlp/RedditBias):
``data/<type>/reddit_comments_<type>_<group>_biased_{valid,test}_reduced.csv`` and
``text_files/<type>/...``, where ``<type>`` is the upstream name (``orientation`` for
queerness). It is found, in order, from

1. the ``data_dir`` argument (``--data-dir``),
2. the ``RBJAX_DATA_DIR`` environment variable,
3. the download cache (``RBJAX_CACHE_DIR`` or ``~/.cache/rbjax``)/``redditbias/<commit>``,
   filled on demand from the upstream repository at the pinned commit; every file is
   checked against the sha256 in ``redditbias_manifest.json`` before it is used.

Row i of the T2 file is the counterfactual of row i of the T1 file; the loader checks
this against the T2 file's ``comments`` column (the original T1 phrase) and fails with
the file and row when the alignment breaks.
"""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import math
import os
import urllib.request
from importlib import resources
from pathlib import Path

from rbjax.core.io import atomic_file, cache_dir, sha256_file
from rbjax.specs import BIAS_TYPES, UPSTREAM_NAME, BiasSpec, canonical_bias_type, is_spec_path, layout_names, load_spec

SPLITS = ("test", "valid", "valid+test")
ENV_DATA_DIR = "RBJAX_DATA_DIR"
ENV_URL = "RBJAX_REDDITBIAS_URL"  # override the download base URL (mirrors, tests)


def manifest() -> dict:
    """The pinned upstream commit, download URL and per-file sha256/size."""
    return json.loads(resources.files("rbjax.data").joinpath("redditbias_manifest.json").read_text())


def cache_root() -> Path:
    """rbjax's cache folder (:func:`rbjax.core.io.cache_dir`)."""
    return cache_dir()



def download_verified(url: str, dest: str | os.PathLike, sha256: str, *, offline_hint: str = "") -> Path:
    """Download ``url`` to ``dest``, hashing while writing; ``dest`` only appears when the sha256 matches.

    Raises:
        RuntimeError: the download failed (the message ends with ``offline_hint``) or the checksum differs
            (nothing is written then).
    """
    dest = Path(dest)
    with atomic_file(dest, "wb") as f:  # nothing reaches the cache unless the checksum matches
        h = hashlib.sha256()
        try:
            with urllib.request.urlopen(url, timeout=60) as r:
                while chunk := r.read(1 << 20):
                    f.write(chunk)
                    h.update(chunk)
        except OSError as e:
            raise RuntimeError(f"cannot download {url} ({e}). {offline_hint}".rstrip()) from None
        if h.hexdigest() != sha256:
            raise RuntimeError(f"{url}: checksum mismatch (sha256 {h.hexdigest()}, expected {sha256}); not cached")
    return dest


class RedditBiasData:
    """A RedditBias data folder, local or the verified download cache.

    Args:
        root: a local folder laid out like the upstream repository, or ``None`` for
            ``$RBJAX_DATA_DIR`` or else the download cache.
        download: allow fetching missing files into the cache (ignored for local folders).
    """

    def __init__(self, root: str | os.PathLike | None = None, download: bool = True):
        m = manifest()
        self.commit = m["commit"]
        self._files = m["files"]
        self._url = os.environ.get(ENV_URL, m["url"])
        if root is None and os.environ.get(ENV_DATA_DIR):
            root = os.environ[ENV_DATA_DIR]
        if root is not None:
            self.root = Path(root).expanduser()
            if not self.root.is_dir():
                raise FileNotFoundError(f"RedditBias data folder not found: {self.root}")
            if not (self.root / "data").is_dir():
                raise FileNotFoundError(
                    f"{self.root}: not a RedditBias data folder (expected a 'data/' subfolder laid out like umanlp/RedditBias)"
                )
            self.is_cache = False
        else:
            self.root = cache_root() / "redditbias" / self.commit
            self.is_cache = True
        self.download = download

    def __repr__(self) -> str:
        return f"RedditBiasData(root={str(self.root)!r}, commit={self.commit[:7]}{', cache' if self.is_cache else ''})"

    def path(self, rel: str) -> Path:
        """Local path of upstream file ``rel`` (e.g. ``data/race/race_black.txt``), fetching it if needed.

        Raises:
            FileNotFoundError: the file is missing from a local folder, or unknown upstream.
            RuntimeError: download failed or the checksum does not match.
        """
        p = self.root / rel
        if not self.is_cache:
            if not p.exists():
                raise FileNotFoundError(f"{p}: file missing from the RedditBias data folder {self.root}")
            return p
        meta = self._files.get(rel)
        if meta is None:
            raise FileNotFoundError(f"{rel}: not a file of umanlp/RedditBias@{self.commit[:7]}")
        if p.exists() and p.stat().st_size == meta["bytes"] and sha256_file(p) == meta["sha256"]:
            return p
        if not self.download:
            raise FileNotFoundError(f"{p}: not in the cache and downloading is disabled")
        self._fetch(rel, p, meta)
        return p

    def _fetch(self, rel: str, dest: Path, meta: dict) -> None:
        download_verified(self._url.rstrip("/") + "/" + rel, dest, meta["sha256"],
                          offline_hint="Without network access, point rbjax at a local copy of umanlp/RedditBias: "
                                       f"--data-dir on the command line, data_dir= in Python, or {ENV_DATA_DIR}.")

    # -- file names -------------------------------------------------------------------
    @staticmethod
    def pair_files(bias_type: str, split: str) -> tuple[str, str]:
        """Relative paths of the (T1, T2) CSVs of one bias type and split (``test``/``valid``).

        ``bias_type`` is a packaged name or a user spec file (names from the spec, see
        :func:`rbjax.specs.layout_names`).
        """
        up, g1, g2 = layout_names(resolve_spec(bias_type))
        return (f"data/{up}/reddit_comments_{up}_{g1}_biased_{split}_reduced.csv",
                f"data/{up}/reddit_comments_{up}_{g2}_biased_{split}_reduced.csv")

    @staticmethod
    def train_file(bias_type: str) -> str:
        """Relative path of the debiasing training phrases (religion2: the lower-cased file); for a bias-spec file,
        ``text_files/<name>/<name>_bias_manual_train.txt`` (what ``rbjax splits`` writes)."""
        up = _type_folder(bias_type)
        if up == "religion2" and not is_spec_path(bias_type):
            return f"text_files/{up}/{up}_bias_manual_lowercase_train.txt"
        return f"text_files/{up}/{up}_bias_manual_train.txt"

    @staticmethod
    def swapped_targets_train_file(bias_type: str) -> str:
        """The reference's CDA training set (phrases followed by their target-swapped copies)."""
        up = _type_folder(bias_type)
        return f"text_files/{up}/{up}_bias_manual_swapped_targets_train.txt"

    def reddit_reference_file(self) -> Path:
        """The 6K Reddit reference utterances (DialoGPT's human.ref.6k) used for LMP (paper §3.2)."""
        return self.path("text_files/humanref6k.txt")


def _type_folder(bias_type: str) -> str:
    """The file-name stem of a bias type: the upstream name of a packaged type, a spec file's own ``name``."""
    if is_spec_path(bias_type):
        return layout_names(load_spec(bias_type))[0]
    return UPSTREAM_NAME[canonical_bias_type(bias_type)]


@dataclasses.dataclass
class PhrasePairs:
    """Biased phrases and their counterfactuals of one bias type and split (pair-aligned).

    Attributes:
        bias_type: canonical bias type.
        split: ``test``, ``valid`` or ``valid+test``.
        biased: (N,) T1 phrases (column ``comments_processed`` of the T1 file).
        counterfactual: (N,) T2 phrases (column ``comments_processed`` of the T2 file).
        stored_biased_ppl, stored_counter_ppl: the released ``perplexity`` columns
            (DialoGPT-small, per the upstream README) when loaded with ``need_stored_ppl``, else ``None``.
        sources: ``[(t1_file, t2_file, first_index), ...]`` for error messages.
    """

    bias_type: str
    split: str
    biased: list[str]
    counterfactual: list[str]
    stored_biased_ppl: list[float] | None
    stored_counter_ppl: list[float] | None
    sources: list[tuple[str, str, int]]

    def __len__(self) -> int:
        return len(self.biased)

    def locate(self, i: int) -> str:
        """'FILE row R' of pair i (R = 1-based data row, i.e. the line after the header)."""
        for t1, t2, start in reversed(self.sources):
            if i >= start:
                return f"{t1} row {i - start + 1} (and {Path(t2).name} row {i - start + 1})"
        return f"pair {i}"


#: a counterfactual swaps target terms only: biased and counterfactual phrase (of 3 words or more) keep at least
#: this share of their words in order (difflib ratio on whitespace tokens). Released pairs: ≥ 0.6; shuffled
#: released pairs: ≤ 0.56.
MIN_WORD_OVERLAP = 0.5


def _word_overlap(a: str, b: str) -> float:
    import difflib

    return difflib.SequenceMatcher(None, a.split(), b.split(), autojunk=False).ratio()


def read_csv_rows(path: Path) -> tuple[list[str], list[dict]]:
    """Read a CSV with a header; every value a string. Raises ValueError naming the file on bad input."""
    rows: list[dict] = []
    record_start = 1  # the line the record being read starts on
    try:
        with open(path, newline="", encoding="utf-8") as f:
            # strict: an unclosed quote is an error, not the following rows silently swallowed into one field
            reader = csv.DictReader(f, strict=True)
            for row in reader:
                rows.append(row)
                record_start = reader.line_num + 1
            header = list(reader.fieldnames or [])
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e})") from None
    except csv.Error as e:
        raise ValueError(f"{path}: malformed CSV in the record starting on line {record_start} ({e}; an unclosed "
                         "or stray quote?)") from None
    if not header:
        raise ValueError(f"{path}: empty file (no CSV header)")
    return header, rows


def _require(path: Path, header: list[str], cols: list[str]) -> None:
    missing = [c for c in cols if c not in header]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}; found {header}")


def _ppl_column(path: Path, rows: list[dict]) -> list[float]:
    out = []
    for r, row in enumerate(rows, start=1):
        raw = (row.get("perplexity") or "").strip()
        try:
            v = float(raw)
        except ValueError:
            raise ValueError(f"{path} row {r}: perplexity {raw!r} is not a number") from None
        if not math.isfinite(v) or v <= 0:
            raise ValueError(f"{path} row {r}: perplexity {raw!r} is not a finite positive number")
        out.append(v)
    return out


def load_pair_files(t1_path: Path, t2_path: Path, *, bias_type: str, split: str,
                    need_stored_ppl: bool = False) -> PhrasePairs:
    """Load and check one (T1, T2) pair of released-layout CSVs.

    Raises:
        FileNotFoundError: a file is missing.
        ValueError: missing columns, different row counts, an empty phrase, a T2 row whose
            ``comments`` is not the T1 row's phrase (misaligned pairs), or (with
            ``need_stored_ppl``) a missing/non-numeric/non-finite perplexity.
    """
    for p in (t1_path, t2_path):
        if not Path(p).exists():
            raise FileNotFoundError(f"{p}: file not found")
    h1, r1 = read_csv_rows(t1_path)
    h2, r2 = read_csv_rows(t2_path)
    _require(t1_path, h1, ["comments_processed"])
    _require(t2_path, h2, ["comments_processed"])
    if len(r1) != len(r2):
        raise ValueError(f"{t1_path} has {len(r1)} rows but {t2_path} has {len(r2)}: the files are not pair-aligned")
    biased = [row["comments_processed"] or "" for row in r1]
    counter = [row["comments_processed"] or "" for row in r2]
    for path, phrases in ((t1_path, biased), (t2_path, counter)):
        for r, s in enumerate(phrases, start=1):
            if not s.strip():
                raise ValueError(f"{path} row {r}: empty phrase in column comments_processed")
    if "comments" in h2:
        for r, (a, row) in enumerate(zip(biased, r2), start=1):
            if (row["comments"] or "") != a:
                raise ValueError(
                    f"{t2_path} row {r}: misaligned pair — its 'comments' column is {row['comments']!r} but row {r} of "
                    f"{Path(t1_path).name} is {a!r} (row i of the T2 file must be the counterfactual of row i of the T1 file)"
                )
    for r, (a, c) in enumerate(zip(biased, counter), start=1):
        if min(len(a.split()), len(c.split())) >= 3 and _word_overlap(a, c) < MIN_WORD_OVERLAP:
            raise ValueError(
                f"{t2_path} row {r}: misaligned pair — {c!r} shares too few words with row {r} of "
                f"{Path(t1_path).name} ({a!r}); a counterfactual only swaps target terms, so the rows are probably "
                "out of order"
            )
    s1 = s2 = None
    if need_stored_ppl:  # only read (and checked) when used
        for path, h in ((t1_path, h1), (t2_path, h2)):
            if "perplexity" not in h:
                raise ValueError(f"{path}: no 'perplexity' column; --stored-perplexities needs the released columns")
        s1, s2 = _ppl_column(t1_path, r1), _ppl_column(t2_path, r2)
    return PhrasePairs(bias_type, split, biased, counter, s1, s2, [(str(t1_path), str(t2_path), 0)])


def load_pairs(bias_type: str, split: str = "test", data: RedditBiasData | str | os.PathLike | None = None,
               need_stored_ppl: bool = False) -> PhrasePairs:
    """Load the RedditBias phrase pairs of one bias type (paper §3.1).

    Args:
        bias_type: ``religion1``, ``religion2``, ``race``, ``gender``, ``queerness`` (or ``orientation``).
        split: ``test`` (the paper's LMB split), ``valid`` or ``valid+test`` (their union, the
            whole reduced held-out set that the debias repo's README measures).
        data: a :class:`RedditBiasData`, a folder, or ``None`` (env var / download cache).
        need_stored_ppl: require the released ``perplexity`` columns.
    Returns:
        :class:`PhrasePairs`.
    Raises:
        ValueError, FileNotFoundError, RuntimeError: see :func:`load_pair_files` and
        :meth:`RedditBiasData.path`.
    """
    spec = resolve_spec(bias_type)
    b = spec.name
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    if not isinstance(data, RedditBiasData):
        data = RedditBiasData(data)
    parts = ["valid", "test"] if split == "valid+test" else [split]
    loaded = []
    for s in parts:
        f1, f2 = RedditBiasData.pair_files(bias_type, s)
        loaded.append(load_pair_files(data.path(f1), data.path(f2), bias_type=b, split=s, need_stored_ppl=need_stored_ppl))
    if len(loaded) == 1:
        return loaded[0]
    out = PhrasePairs(b, split, [], [], [], [], [])
    for part in loaded:
        out.sources.append((part.sources[0][0], part.sources[0][1], len(out.biased)))
        out.biased += part.biased
        out.counterfactual += part.counterfactual
        if part.stored_biased_ppl is None:
            out.stored_biased_ppl = out.stored_counter_ppl = None
        elif out.stored_biased_ppl is not None:
            out.stored_biased_ppl += part.stored_biased_ppl
            out.stored_counter_ppl += part.stored_counter_ppl
    return out


def resolve_spec(bias_type):
    """A :class:`~rbjax.specs.BiasSpec` from a packaged name or a user spec file path."""

    if isinstance(bias_type, BiasSpec):
        return bias_type
    return load_spec(bias_type if is_spec_path(bias_type) else canonical_bias_type(bias_type))


def expand_bias_types(spec: str | list[str]) -> list[str]:
    """``"all"`` → the five types; a comma list or list → canonical names or spec-file paths
    (order kept, duplicates dropped).

    Raises:
        ValueError: unknown bias type; FileNotFoundError: a spec path that does not exist.
    """
    items = spec if isinstance(spec, (list, tuple)) else str(spec).split(",")
    out: list[str] = []
    for it in items:
        it = str(it).strip()
        if it.lower() == "all":
            names = list(BIAS_TYPES)
        elif is_spec_path(it):
            load_spec(it)  # fail early on a bad spec file
            names = [it]
        else:
            names = [canonical_bias_type(it)]
        out += [n for n in names if n not in out]
    if not out:
        raise ValueError("no bias type given")
    return out
