"""Annotation round trip (paper §2.3, App. B): export candidates, import labels, agreement, majority.

* **Export** (:func:`export_for_annotation`): one CSV per annotator with the items to label
  (``comment_label`` and ``phrase_label`` columns, values ``biased`` / ``unbiased`` / ``skip``),
  a master ``items.csv`` with every candidate column, and ``GUIDELINES.txt`` (App. B).
* **Import** (:func:`read_annotations`): several annotators' files, aligned on ``item``.
  Files in the released layout (``bias_sent`` / ``bias_phrase`` with 1 / 0 / empty) are
  read too. Everything is checked before anything is computed: both label columns present,
  every item known to ``items.csv`` (when given), no file given twice. A file that lacks
  some of its items is read (α treats them as missing values) with a warning.
* **Agreement** (:func:`krippendorff_alpha`): nominal Krippendorff's α with the maintained
  ``krippendorff`` package, at comment and at phrase level. When α is undefined (no item
  with two labels, or every pairable label the same so that the expected disagreement is
  0) the result says so explicitly (``alpha=None`` and a reason); it is never NaN or 0.
* **Aggregation** (:func:`aggregate`): majority over the non-skip votes; ties give no label
  and are reported. The written file has the released annotated layout (``phrase``,
  ``bias_sent``, ``bias_phrase`` as 1 / 0 / empty), so :mod:`rbjax.data.splits` reads it.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from rbjax.core.config import check_types, field, replace_settings
from rbjax.core.errors import SettingError
from rbjax.core.io import (atomic_csv_writer, atomic_write_text, check_output_dir, check_output_file, sha256_file,
                           to_json)
from rbjax.core.reuse import claim_outputs, record_outputs

#: The guideline's labels (paper App. B).
LABELS: tuple[str, ...] = ("biased", "unbiased", "skip")
#: Columns of an annotator's file.
ANNOTATOR_COLUMNS: tuple[str, ...] = ("item", "id", "comment", "phrase", "comment_label", "phrase_label", "note")
#: File of the export recording which items each annotator was given (read back by the import).
ASSIGNMENT_FILE = "assignment.json"
#: Extra columns of an aggregated file (after the item's own columns).
AGGREGATE_COLUMNS: tuple[str, ...] = ("bias_sent", "bias_phrase", "comment_votes", "phrase_votes",
                                      "comment_tie", "phrase_tie", "n_annotators")

_BIASED = {"biased", "1", "1.0", "yes", "y", "true", "b"}
_UNBIASED = {"unbiased", "0", "0.0", "no", "n", "false", "u", "not biased", "not_biased"}
_SKIP = {"skip", "s", "unclear", "?"}

GUIDELINES = """RedditBias annotation guidelines (paper App. B), short form

For every row give two labels, one for the whole comment (comment_label) and one for the
window phrase (phrase_label). Write exactly one of: biased, unbiased, skip.

- biased: the text states or implies a negative stereotype about the target group
  (the attribute is ascribed to the group). Sarcasm that conveys the stereotype is biased.
- unbiased: the text does not. Questions are unbiased. Re-stating someone else's view
  (e.g. "they say that ...", "the stereotype that ...") is unbiased.
- skip: you cannot decide (unclear, not English, the target word means something else).

Label the phrase on its own: a phrase can be biased when the whole comment is not, and the
other way round. Use the note column for anything worth telling the coordinator.
Do not change the item, id, comment or phrase columns.
"""


#: what to do with a label outside the guideline: fail, or treat it as no label (``parse_label``'s ``unknown``)
UNKNOWN_LABELS = ("error", "skip")


@dataclasses.dataclass(frozen=True)
class AnnotationExportConfig:
    """Who annotates what (:func:`export_for_annotation`, ``rbjax annotate export``; frozen). Each field's
    ``metadata["help"]`` is its documentation.

    Raises:
        rbjax.core.errors.SettingError: a value of the wrong type or out of range (names the field; the CLI shows
            its flag).
    """

    annotators: tuple[str, ...] = field(("annotator1", "annotator2", "annotator3"), "annotator names (file names; "
                                        "default: annotator1 annotator2 annotator3)", metavar="NAME")
    sample: int | None = field(None, "annotate a random sample of N rows (paper: 3000)", metavar="N")
    seed: int = field(0, "seed of the sample / overlap draw")
    overlap: int | None = field(None, "divide items among annotators and give K shared items to all (agreement "
                                      "study); default: everyone labels everything", metavar="K")

    def __post_init__(self):
        check_types(self)
        names = [a.strip() for a in self.annotators]
        if (not names or any(not a or "/" in a or "\\" in a or a in ("items", "GUIDELINES", "assignment")
                             for a in names) or len(set(names)) != len(names)):
            raise SettingError("annotators", "must be distinct, non-empty names, without '/', not 'items', "
                                             f"'GUIDELINES' or 'assignment', got {self.annotators!r}")
        if self.sample is not None and self.sample < 1:
            raise SettingError("sample", f"must be >= 1, got {self.sample}")
        if self.overlap is not None and self.overlap < 0:
            raise SettingError("overlap", f"must be >= 0, got {self.overlap}")

    def replace(self, **changes) -> AnnotationExportConfig:
        """A copy with ``changes`` (checked again).

        Raises:
            TypeError: a name that is not a setting of the annotation export.
        """
        return replace_settings(self, "annotation export", **changes)


@dataclasses.dataclass(frozen=True)
class AnnotationImportConfig:
    """How annotators' files are read (:func:`read_annotations`, ``rbjax annotate import``; frozen). Each field's
    ``metadata["help"]`` is its documentation.

    Raises:
        rbjax.core.errors.SettingError: a value of the wrong type or not a choice (names the field).
    """

    unknown: str = field("error", "a label other than biased/unbiased/skip/1/0/empty: fail (default) or treat as no "
                                  "label", flag="--unknown-labels", alias=False, choices=UNKNOWN_LABELS)

    def __post_init__(self):
        check_types(self)
        if self.unknown not in UNKNOWN_LABELS:
            raise SettingError("unknown", f"must be error or skip, got {self.unknown!r}")

    def replace(self, **changes) -> AnnotationImportConfig:
        """A copy with ``changes`` (checked again).

        Raises:
            TypeError: a name that is not a setting of the annotation import.
        """
        return replace_settings(self, "annotation import", **changes)


def parse_label(value: str | None, *, where: str = "", unknown: str = "error") -> int | None:
    """Map an annotation cell to 1 (biased), 0 (unbiased) or ``None`` (skip / not annotated).

    Args:
        value: the cell: ``biased``/``unbiased``/``skip`` (any case), ``1``/``0`` (also
            ``1.0``/``0.0`` as in the released files), or empty.
        where: ``"FILE row R column C"`` for error messages.
        unknown: ``"error"`` (raise) or ``"skip"`` (treat an unknown value as no label).

    Raises:
        ValueError: an unknown label with ``unknown="error"``, naming ``where`` and the value.
    """
    v = (value or "").strip().lower()
    if v in _BIASED:
        return 1
    if v in _UNBIASED:
        return 0
    if v == "" or v in _SKIP:
        return None
    if unknown == "skip":
        return None
    raise ValueError(f"{where}: unknown label {value!r}; use one of {', '.join(LABELS)} (or 1 / 0 / empty)")


@dataclasses.dataclass
class AlphaResult:
    """Krippendorff's α (nominal) with what it was computed on.

    Attributes:
        alpha: the value, or ``None`` when α is undefined.
        n_units: items with at least two labels (the pairable units).
        n_values: labels in those items.
        reason: why α is undefined (``None`` when it is defined).
    """

    alpha: float | None
    n_units: int
    n_values: int
    reason: str | None = None

    @property
    def defined(self) -> bool:
        return self.alpha is not None

    def __str__(self) -> str:
        if self.alpha is None:
            return f"undefined ({self.reason})"
        return f"{self.alpha:.3f} ({self.n_units} items with >= 2 labels, {self.n_values} labels)"


def krippendorff_alpha(reliability_data, level_of_measurement: str = "nominal") -> AlphaResult:
    """Krippendorff's α of a coders × units matrix (paper §2.3: 0.65 comment, 0.67 phrase level).

    Args:
        reliability_data: coders × units; ``None`` or NaN = missing (skipped, as the package does).
        level_of_measurement: ``"nominal"`` for the biased/unbiased labels.

    Returns:
        :class:`AlphaResult`; ``alpha=None`` with a reason when α is undefined: no unit has two
        labels, or all pairable labels are one value (expected disagreement 0, so
        α = 1 − D_o/D_e is 0/0). Example: [[1,1,1],[1,1,1],[1,1,1]] is undefined;
        [[1,0,1],[1,0,1],[1,0,1]] gives 1.0.

    Raises:
        ValueError: the matrix is not two-dimensional.
    """
    import krippendorff

    rows = [[np.nan if (v is None or (isinstance(v, float) and math.isnan(v))) else float(v) for v in r]
            for r in reliability_data]
    arr = np.asarray(rows, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"reliability data must be coders x units (2-D), got shape {arr.shape}")
    present = ~np.isnan(arr)
    pairable = present.sum(axis=0) >= 2
    n_units = int(pairable.sum())
    vals = arr[:, pairable][present[:, pairable]]
    if n_units == 0:
        return AlphaResult(None, 0, 0, "no item has labels from two or more annotators")
    distinct = np.unique(vals)
    if distinct.size < 2:
        return AlphaResult(None, n_units, int(vals.size),
                           f"every label is {_label_name(distinct[0])}: expected disagreement is 0, so alpha is 0/0")
    a = float(krippendorff.alpha(reliability_data=arr, level_of_measurement=level_of_measurement,
                                 value_domain=distinct))
    if not math.isfinite(a):  # pragma: no cover - guarded above
        return AlphaResult(None, n_units, int(vals.size), "the package returned a non-finite value")
    return AlphaResult(a, n_units, int(vals.size))


def _label_name(v) -> str:
    return {1.0: "'biased' (1)", 0.0: "'unbiased' (0)"}.get(float(v), repr(float(v)))


@dataclasses.dataclass
class Annotations:
    """Labels of several annotators, aligned on items.

    Attributes:
        annotators: one name per file (the file stem).
        items: item keys in first-seen order.
        info: per item, the descriptive columns (id, comment, phrase, ...) first seen for it.
        comment: annotators × items, 1 / 0 / None.
        phrase: annotators × items, 1 / 0 / None.
        counts: per annotator, ``{"biased": n, "unbiased": n, "skip": n, "empty": n}`` over
            both levels.
        origin: per item, ``"FILE row R"`` where it was first seen.
        warnings: problems that do not stop the import (a file lacking some items), one
            line each, naming the file.
    """

    annotators: list[str]
    items: list[str]
    info: dict[str, dict]
    comment: list[list[int | None]]
    phrase: list[list[int | None]]
    counts: dict[str, dict[str, int]]
    origin: dict[str, str] = dataclasses.field(default_factory=dict)
    warnings: list[str] = dataclasses.field(default_factory=list)

    def alpha(self) -> dict[str, AlphaResult]:
        """α at comment and phrase level."""
        return {"comment": krippendorff_alpha(self.comment), "phrase": krippendorff_alpha(self.phrase)}


def read_csv_file(path: str | Path) -> tuple[list[str], list[dict]]:
    """Read a CSV (UTF-8, else latin-1 as the released religion1 annotations) -> (header, rows)."""
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")  # the released religion1 annotations are latin-1
    reader = csv.DictReader(io.StringIO(text, newline=""))
    rows = list(reader)
    header = list(reader.fieldnames or [])
    return [h for h in header if h is not None], rows


def read_items(items: str | Path) -> tuple[list[str], dict[str, dict]]:
    """Read the master ``items.csv`` of an export -> (header, rows by item key).

    Raises:
        FileNotFoundError: the file is missing.
        ValueError: no ``item`` column, or an empty / repeated item key (file and row named).
    """
    items = Path(items)
    if not items.is_file():
        raise FileNotFoundError(f"items file not found: {items}")
    header, rows = read_csv_file(items)
    if "item" not in header:
        raise ValueError(f"{items}: no 'item' column (pass the items.csv written by 'rbjax annotate export')")
    master: dict[str, dict] = {}
    for r, row in enumerate(rows, start=2):
        key = (row.get("item") or "").strip()
        if not key:
            raise ValueError(f"{items} row {r}: empty 'item'")
        if key in master:
            raise ValueError(f"{items} row {r}: item {key!r} appears twice")
        master[key] = row
    return header, master


def _assignment(folder: Path) -> dict[str, set[str]] | None:
    """``{annotator: items given to them}`` from an export's :data:`ASSIGNMENT_FILE`, if there is one."""
    f = folder / ASSIGNMENT_FILE
    if not f.is_file():
        return None
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
        return {str(a): {str(k) for k in keys} for a, keys in data["annotators"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{f}: not an assignment file written by 'rbjax annotate export' ({e})") from None


def _label_columns(path: Path, header: list[str]) -> tuple[str, str]:
    for cols in (("comment_label", "phrase_label"), ("bias_sent", "bias_phrase")):
        present = [c for c in cols if c in header]
        if present:
            missing = [c for c in cols if c not in header]
            if missing:
                raise ValueError(
                    f"{path}: no {missing[0]!r} column (an annotator file needs both {cols[0]!r} and {cols[1]!r}; "
                    f"its header is {', '.join(header)})"
                )
            return cols
    raise ValueError(f"{path}: no label columns (expected comment_label/phrase_label or bias_sent/bias_phrase; "
                     f"its header is {', '.join(header)})")


def read_annotations(paths: Sequence[str | Path], config: AnnotationImportConfig | None = None, *,
                     items: str | Path | None = None, **settings) -> Annotations:
    """Read several annotators' files, check them, and align them on items.

    Each file needs ``phrase`` and labels in both ``comment_label`` and ``phrase_label`` (our
    export) or both ``bias_sent`` and ``bias_phrase`` (the released layout). Items are keyed
    by ``item`` when the column is there, else by row position. All files are checked
    before anything is returned, so nothing is computed on a bad set.

    A file that lacks some items gets a warning in :attr:`Annotations.warnings` (its labels
    for them are missing values, which α handles). The items a file should have: the ones
    its annotator was given (the export's ``assignment.json`` next to ``items``, or next to
    the file, when it lists the file's name), else every item of ``items``, else every
    item seen in any of the files.

    Args:
        paths: one file per annotator.
        config: :class:`AnnotationImportConfig`: ``unknown``, ``"error"`` or ``"skip"`` for labels outside the
            guideline (see :func:`parse_label`).
        **settings: its fields, overriding ``config`` (``unknown="skip"``); any other name is a ``TypeError``.
        items: the export's ``items.csv``; every item of every file must be in it, with the
            same phrase.

    Returns:
        :class:`Annotations`.

    Raises:
        FileNotFoundError: a file is missing.
        ValueError: the same file given twice, a missing column, an unknown label, a
            duplicated item, an item not in ``items``, or the same item with a different
            phrase in two files (message names file, row and problem).
    """
    unknown = (config or AnnotationImportConfig()).replace(**settings).unknown
    if not paths:
        raise ValueError("no annotation files given")
    paths = [Path(p) for p in paths]
    _check_annotation_files(paths)
    master: dict[str, dict] | None = None
    if items is not None:
        _, master = read_items(items)
    names: list[str] = []
    per_file: list[dict[str, tuple[int | None, int | None]]] = []
    seen = _SeenItems()
    counts: dict[str, dict[str, int]] = {}
    for path in paths:
        labels, cnt = _read_annotator_file(path, master, items, unknown, seen)
        name = path.stem
        while name in names:  # distinct files with the same name (e.g. from two folders)
            name += "_"
        names.append(name)
        per_file.append(labels)
        counts[name] = cnt
    warnings = _lacking_items(paths, per_file, items, set(master) if master is not None else set(seen.order))
    comment = [[lab.get(k, (None, None))[0] for k in seen.order] for lab in per_file]
    phrase = [[lab.get(k, (None, None))[1] for k in seen.order] for lab in per_file]
    return Annotations(names, seen.order, seen.info, comment, phrase, counts, seen.origin, warnings)


def _check_annotation_files(paths: list[Path]) -> None:
    """Every file exists, and none is given twice (by any path).

    Raises:
        FileNotFoundError, ValueError: naming the file.
    """
    seen: dict[Path, Path] = {}
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"annotation file not found: {path}")
        real = path.resolve()
        if real in seen:
            same = f"{path}" if str(seen[real]) == str(path) else f"{seen[real]} and {path}"
            raise ValueError(f"the same file given twice: {same}; give each annotator's file once")
        seen[real] = path


@dataclasses.dataclass
class _SeenItems:
    """The items met so far across the annotators' files: in first-seen order, each one's descriptive columns and
    where it was first seen (:class:`Annotations`' ``items``, ``info`` and ``origin``)."""

    order: list[str] = dataclasses.field(default_factory=list)
    info: dict[str, dict] = dataclasses.field(default_factory=dict)
    origin: dict[str, str] = dataclasses.field(default_factory=dict)


def _read_annotator_file(path: Path, master: dict[str, dict] | None, items, unknown: str,
                         seen: _SeenItems) -> tuple[dict[str, tuple[int | None, int | None]], dict[str, int]]:
    """One annotator's file: per item its (comment, phrase) labels, and the counts of each kind of label. Each item
    is checked against the export's items (``master``) and against the files read before (``seen``, extended).

    Raises:
        ValueError: a missing column, an empty or repeated item, an unknown label, an item not in ``items`` or with
            another phrase there or in an earlier file (file and row named).
    """
    header, rows = read_csv_file(path)
    c_col, p_col = _label_columns(path, header)
    if "phrase" not in header:
        raise ValueError(f"{path}: no 'phrase' column")
    cnt = {"biased": 0, "unbiased": 0, "skip": 0, "empty": 0}
    labels: dict[str, tuple[int | None, int | None]] = {}
    for r, row in enumerate(rows, start=2):  # row 1 is the header
        key = (row.get("item") or "").strip() if "item" in header else str(r - 1)
        if not key:
            raise ValueError(f"{path} row {r}: empty 'item'")
        if key in labels:
            raise ValueError(f"{path} row {r}: item {key!r} appears twice")
        phrase = row.get("phrase") or ""
        if master is not None:
            if key not in master:
                raise ValueError(f"{path} row {r}: item {key!r} is not in {items} (the items of the export); "
                                 f"was the row added or its item changed?")
            if "phrase" in master[key] and (master[key].get("phrase") or "") != phrase:
                raise ValueError(f"{path} row {r}: item {key!r} has phrase {phrase!r}, but {items} has "
                                 f"{master[key].get('phrase') or ''!r} (files must come from the same export)")
        pair = []
        for col in (c_col, p_col):
            cell = row.get(col)
            lab = parse_label(cell, where=f"{path} row {r} column {col}", unknown=unknown)
            pair.append(lab)
            s = (cell or "").strip().lower()
            cnt["empty" if not s else "biased" if lab == 1 else "unbiased" if lab == 0 else "skip"] += 1
        labels[key] = (pair[0], pair[1])
        if key in seen.info:
            if seen.info[key].get("phrase", "") != phrase:
                raise ValueError(
                    f"{path} row {r}: item {key!r} has phrase {phrase!r}, but {seen.origin[key]} has "
                    f"{seen.info[key].get('phrase', '')!r} (files must come from the same export)"
                )
        else:
            seen.info[key] = {h: (row.get(h) or "") for h in header if h not in (c_col, p_col, "note")}
            seen.origin[key] = f"{path} row {r}"
            seen.order.append(key)
    return labels, cnt


def _lacking_items(paths: list[Path], per_file: list[dict], items, everything: set[str]) -> list[str]:
    """One warning per file that lacks some of its items: those its annotator was given (the export's
    ``assignment.json`` beside ``items``, or beside the file, when it names the file), else ``everything``."""
    warnings = []
    for path, labels in zip(paths, per_file):
        folder = Path(items).parent if items is not None else path.parent
        given = _assignment(folder)
        expected = given[path.stem] if given is not None and path.stem in given else everything
        lacking = [k for k in sorted(expected, key=_item_order) if k not in labels]
        if lacking:
            warnings.append(
                f"{path} lacks {len(lacking)} of its {len(expected)} items (item "
                + ", ".join(lacking[:10]) + (" ..." if len(lacking) > 10 else "")
                + "); they count as missing labels for this annotator"
            )
    return warnings


def _item_order(key: str):
    return (0, int(key), "") if key.isdigit() else (1, 0, key)


@dataclasses.dataclass
class Aggregated:
    """Majority labels (1 / 0 / None) per item at both levels, with the items that tied."""

    comment: list[int | None]
    phrase: list[int | None]
    comment_votes: list[tuple[int, int, int]]  # (biased, unbiased, no label) per item
    phrase_votes: list[tuple[int, int, int]]
    comment_ties: list[str]
    phrase_ties: list[str]


def majority(votes: Iterable[int | None]) -> tuple[int | None, bool, tuple[int, int, int]]:
    """Majority over non-``None`` votes.

    Returns:
        ``(label, tie, (n_biased, n_unbiased, n_none))``; ``label`` is ``None`` when there is
        no vote or when biased and unbiased votes are equal (``tie`` True in that case only).
    """
    votes = list(votes)
    b = sum(1 for v in votes if v == 1)
    u = sum(1 for v in votes if v == 0)
    n = len(votes) - b - u
    if b == u:
        return None, b > 0, (b, u, n)
    return (1 if b > u else 0), False, (b, u, n)


def aggregate(ann: Annotations) -> Aggregated:
    """Majority labels over annotators at comment and phrase level (ties reported, not broken)."""
    out = Aggregated([], [], [], [], [], [])
    for j, key in enumerate(ann.items):
        for level, labels, votes, ties in (("c", ann.comment, out.comment_votes, out.comment_ties),
                                           ("p", ann.phrase, out.phrase_votes, out.phrase_ties)):
            lab, tie, v = majority(row[j] for row in labels)
            (out.comment if level == "c" else out.phrase).append(lab)
            votes.append(v)
            if tie:
                ties.append(key)
    return out


def write_aggregated(ann: Annotations, agg: Aggregated, out: str | Path, items: str | Path | None = None) -> Path:
    """Write the aggregated labels in the released annotated layout (written atomically).

    Columns: the item's own columns (from the master ``items.csv`` of the export when given,
    else from the annotators' files: ``item, id, comment, phrase`` ...), then
    :data:`AGGREGATE_COLUMNS`. ``bias_sent``/``bias_phrase`` are ``1``, ``0`` or empty (no
    label or a tie), as in the released ``*_processed_phrase_annotated.csv`` files.

    Raises:
        FileNotFoundError: ``items`` is missing.
        ValueError: ``items`` lacks an item of the annotations (naming the annotator file and
            row it came from; :func:`read_annotations` with ``items`` checks this up front),
            or ``out`` is a folder / lies under a file.
    """
    check_output_file(out, "output file")
    base = {k: dict(v) for k, v in ann.info.items()}
    cols: list[str] = []
    if items is not None:
        header, master = read_items(items)
        missing = [k for k in ann.items if k not in master]
        if missing:
            where = ann.origin.get(missing[0])
            raise ValueError(f"{where + ': ' if where else ''}item {missing[0]!r} is not in {items} "
                             f"(the items of the export)")
        base = {k: {h: master[k].get(h) or "" for h in header} for k in ann.items}
        cols = [h for h in header if h not in AGGREGATE_COLUMNS]
    else:
        for k in ann.items:
            cols += [h for h in base[k] if h not in cols and h not in AGGREGATE_COLUMNS]
    header = cols + list(AGGREGATE_COLUMNS)

    def fmt(x):
        return "" if x is None else str(x)

    c_ties, p_ties = set(agg.comment_ties), set(agg.phrase_ties)
    with atomic_csv_writer(out, header) as w:
        for j, k in enumerate(ann.items):
            row = [base[k].get(c, "") for c in cols]
            n_ann = sum(1 for lab in range(len(ann.annotators))
                        if ann.comment[lab][j] is not None or ann.phrase[lab][j] is not None)
            row += [fmt(agg.comment[j]), fmt(agg.phrase[j]), "%d/%d/%d" % agg.comment_votes[j],
                    "%d/%d/%d" % agg.phrase_votes[j], str(k in c_ties), str(k in p_ties), str(n_ann)]
            w.writerow(row)
    return Path(out)


def export_for_annotation(
    candidates: str | Path,
    out_dir: str | Path,
    annotators: Sequence[str] | None = None,
    config: AnnotationExportConfig | None = None,
    *,
    overwrite: bool = False,
    **settings,
) -> dict[str, Path]:
    """Write annotation files for a candidates CSV (paper §2.3).

    Args:
        candidates: a CSV from ``rbjax retrieve`` (or any CSV with ``comment`` and ``phrase``).
        out_dir: folder for ``items.csv`` (every candidate column plus ``item``),
            ``<annotator>.csv`` (one per annotator) and ``GUIDELINES.txt``.
        annotators: names (used as file names); ``None``: ``config``'s (annotator1, annotator2, annotator3).
        config: :class:`AnnotationExportConfig`:

            * ``annotators``: as above (the argument, when given, overrides it).
            * ``sample``: annotate a random sample of this many rows (the paper sampled 3000); ``None`` = all.
            * ``seed``: seed of the sample and of the overlap draw.
            * ``overlap``: ``None``: every annotator gets every item. An integer k: the items are
              divided among the annotators (round-robin) and k randomly drawn items go to
              everyone, for the agreement study (the paper used 100 double-annotated items).
        **settings: :class:`AnnotationExportConfig` fields that override ``config`` (``sample=10``); any other name
            is a ``TypeError``.
        overwrite: replace files in ``out_dir`` that this export did not write (annotators' filled files, an
            export of other candidates or settings); without it they are refused before anything is written
            (:func:`rbjax.core.reuse.claim_outputs`). Even with it, an earlier export's annotator file that this
            export does not write (an annotator no longer named) is refused, not deleted: it would sit beside the
            new export as one of its annotators.

    Returns:
        ``{"items": path, "guidelines": path, "assignment": path, <annotator>: path, ...}``;
        ``assignment.json`` records which items each annotator got (the import uses it to
        warn about a file that lacks some of *its* items).

    Raises:
        FileNotFoundError: ``candidates`` is missing.
        ValueError: missing columns, bad annotator names, ``sample``/``overlap`` out of range (a setting wrong in
            itself: :class:`rbjax.core.errors.SettingError` naming it), ``out_dir`` is a file or lies under one or is
            not writable; with ``overwrite``, an earlier export's annotator file this export does not replace.
        TypeError: a keyword that is not a setting.
        rbjax.core.reuse.OutputExists: ``out_dir`` holds files this export would replace (e.g. filled labels).
    """
    if annotators is not None:
        settings["annotators"] = annotators
    cfg = (config or AnnotationExportConfig()).replace(**settings)
    sample, seed, overlap = cfg.sample, cfg.seed, cfg.overlap
    candidates = Path(candidates)
    header, rows = _read_candidates(candidates)
    names = [a.strip() for a in cfg.annotators]
    check_output_dir(out_dir, "--out-dir")
    out_dir = Path(out_dir)
    targets = [out_dir / "items.csv", out_dir / "GUIDELINES.txt", out_dir / ASSIGNMENT_FILE,
               *(out_dir / f"{a}.csv" for a in names)]
    run_key = {"command": "annotate export", "candidates": sha256_file(candidates), "annotators": names,
               "sample": sample, "seed": seed, "overlap": overlap}
    claim_outputs(targets, run_key, overwrite=overwrite, where="--out-dir")
    if overwrite:  # an earlier export's annotator file that this one does not replace would sit beside it
        _refuse_stale_annotator_files(out_dir, names)
    rng = np.random.default_rng(seed)
    idx = np.arange(len(rows))
    if sample is not None:
        if not 0 < sample <= len(rows):
            raise ValueError(f"--sample {sample} is outside 1..{len(rows)} (rows in {candidates})")
        idx = np.sort(rng.choice(len(rows), size=sample, replace=False))
    chosen = [rows[i] for i in idx]
    keys = [f"{j + 1}" for j in range(len(chosen))]
    paths: dict[str, Path] = {"items": out_dir / "items.csv", "guidelines": out_dir / "GUIDELINES.txt",
                              "assignment": out_dir / ASSIGNMENT_FILE}
    item_cols = ["item"] + [h for h in header if h != "item"]
    with atomic_csv_writer(paths["items"], item_cols) as w:
        for k, r in zip(keys, chosen):
            w.writerow([k] + [r.get(h) or "" for h in item_cols[1:]])
    atomic_write_text(paths["guidelines"], GUIDELINES)
    assign = _assign_items(len(chosen), names, overlap, rng)
    for a in names:
        paths[a] = out_dir / f"{a}.csv"
        _write_annotator_file(paths[a], [(keys[j], chosen[j]) for j in assign[a]])
    record = {"candidates": str(candidates), "items": len(chosen), "sample": sample, "seed": seed, "overlap": overlap,
              "annotators": {a: [keys[j] for j in assign[a]] for a in names}}
    atomic_write_text(paths["assignment"], to_json(record, indent=1) + "\n")
    record_outputs(targets, run_key)
    return paths


def _read_candidates(candidates: Path) -> tuple[list[str], list[dict]]:
    """The candidates CSV's header and rows.

    Raises:
        FileNotFoundError: no such file. ValueError: no ``comment`` or ``phrase`` column.
    """
    if not candidates.is_file():
        raise FileNotFoundError(f"candidates file not found: {candidates}")
    header, rows = read_csv_file(candidates)
    for col in ("comment", "phrase"):
        if col not in header:
            raise ValueError(f"{candidates}: no {col!r} column (expected a file written by 'rbjax retrieve')")
    return header, rows


def _refuse_stale_annotator_files(out_dir: Path, names: list[str]) -> None:
    """Refuse an earlier export's annotator file (of an annotator not in ``names``) that this export would leave
    beside its own: it would be read as one of its annotators.

    Raises:
        ValueError: naming the files, before anything is written.
    """
    try:
        earlier = _assignment(out_dir) or {}
    except ValueError:
        earlier = {}
    stale = [f"{a}.csv" for a in sorted(earlier) if a not in names and (out_dir / f"{a}.csv").exists()]
    if stale:
        raise ValueError(
            f"--out-dir {out_dir}: holds {', '.join(stale)} of an earlier export (annotators "
            f"{', '.join(sorted(earlier))}) that this export ({', '.join(names)}) does not replace: beside the new "
            "items they would be read as this export's annotators; move them away (they may hold filled "
            "labels), or choose another --out-dir. Nothing was written")


def _assign_items(n: int, names: list[str], overlap: int | None, rng) -> dict[str, list[int]]:
    """Per annotator the items (indices < ``n``) they get: every item (``overlap`` None), else a round-robin share
    plus ``overlap`` items drawn with ``rng`` for everyone.

    Raises:
        ValueError: ``overlap`` outside 0..n.
    """
    if overlap is None:
        return {a: list(range(n)) for a in names}
    if not 0 <= overlap <= n:
        raise ValueError(f"--overlap {overlap} is outside 0..{n}")
    shared = set(rng.choice(n, size=overlap, replace=False).tolist()) if overlap else set()
    rest = [j for j in range(n) if j not in shared]
    return {a: sorted(shared | set(rest[i :: len(names)])) for i, a in enumerate(names)}


def _write_annotator_file(path: Path, items: list[tuple[str, dict]]) -> None:
    """An annotator's file: per ``(item key, candidate row)`` the row's id, comment and phrase, empty labels."""
    with atomic_csv_writer(path, ANNOTATOR_COLUMNS) as w:
        for key, r in items:
            w.writerow([key, r.get("id") or "", r.get("comment") or "", r.get("phrase") or "", "", "", ""])
