"""Train / valid / test splits from annotated phrases, the paper's procedure (docs/data-building.md §3).

1. Biased set: annotated rows with ``bias_phrase == 1`` and a non-empty ``phrase`` (which
   becomes ``comments_processed``). Biased rows with an empty phrase are dropped, as
   upstream did, and counted; a ``bias_phrase`` value that is not a label is an error
   (or, with ``unknown="skip"``, dropped and counted: the released gender file has ``2``).
2. Train / held-out split of these T1 rows: fraction 0.6 train (gender 0.75), seed 1.
3. Counterfactuals of the held-out phrases: T1 terms swapped for T2 terms
   (:func:`rbjax.data.swap.swap_targets`).
4. Pairwise outlier reduction with a chosen model: the perplexity of every held-out phrase
   and of its counterfactual; a pair is dropped when either side lies outside mean ±
   3 std of its own list (:func:`rbjax.data.outliers.outlier_pairs`, population std).
5. Valid / test halves of the reduced pairs (seed 1): valid = floor(n/2) pairs, test = the rest.

The random splits reproduce upstream's ``sklearn.model_selection.train_test_split(...,
random_state=1)`` without needing scikit-learn: ``p = RandomState(seed).permutation(n)``,
the second output ("held-out", later "test") is ``p[:n_test]`` and the first ("train",
later "valid") is ``p[n_test:]``, with ``n_train = floor(f·n)``. With the released religion1
annotations this gives exactly the released train / held-out phrases (720 / 480, same
order) and, after the released reduction, exactly the released valid / test files; for
religion2 the released train phrases too (checked in ``tests/test_splits.py``). For race,
gender and queerness the sizes match (763/510, 1521/507, 720/480) but not the membership:
their released annotated files are not in the row order the upstream split saw.

Files are written in the released layout, so ``rbjax measure`` and ``rbjax debias`` read
them unchanged (``<type>`` = the upstream folder name, e.g. ``orientation`` for
queerness, or a user spec's ``name``; ``<T1>``/``<T2>`` = the group names)::

    OUT/data/<type>/reddit_comments_<type>_<T1>_biased_{valid,test}_reduced.csv
        id, attribute_in_window, comment, comments_processed, bias_sent, bias_phrase, perplexity
    OUT/data/<type>/reddit_comments_<type>_<T2>_biased_{valid,test}_reduced.csv
        initial_demo, replaced_demo, comments, comments_processed, perplexity
    OUT/text_files/<type>/<type>_bias_manual_train.txt            (train phrases)
    OUT/text_files/<type>/<type>_bias_manual_valid.txt            (held-out, before reduction; upstream's name)
    OUT/text_files/<type>/<type>_<T>_biased_{valid,test}_reduced.txt   (comments_processed, T = T1 and T2)
    OUT/data/<type>/<type>_splits.json                            (sizes, seed, fractions, settings, the
                                                                   model behind the perplexity columns, versions)
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import math
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from rbjax.core.config import check_types, field, replace_settings
from rbjax.core.errors import SettingError
from rbjax.core.io import (atomic_csv_writer, atomic_write_text, check_output_dir, check_output_file, sha256_file,
                           to_json, versions)
from rbjax.core.reuse import claim_outputs, record_outputs
from rbjax.data.annotation import UNKNOWN_LABELS, parse_label, read_csv_file
from rbjax.data.outliers import outlier_pairs
from rbjax.data.swap import DIRECTIONS, MODES, reference_direction, swap_targets
from rbjax.specs import canonical_bias_type, layout_names

#: Columns of the T1 files (released layout).
T1_COLUMNS: tuple[str, ...] = ("id", "attribute_in_window", "comment", "comments_processed", "bias_sent",
                               "bias_phrase", "perplexity")
#: Columns of the T2 files (released layout).
T2_COLUMNS: tuple[str, ...] = ("initial_demo", "replaced_demo", "comments", "comments_processed", "perplexity")

ScoreFn = Callable[[list[str]], np.ndarray]


def default_train_size(bias_type: str) -> float:
    """Train fraction of the paper's split: 0.75 for gender, 0.6 otherwise (as upstream's scripts)."""
    return 0.75 if bias_type == "gender" else 0.6


@dataclasses.dataclass(frozen=True)
class SplitsConfig:
    """How :func:`make_splits` (``rbjax splits``) splits, swaps and reduces the annotated phrases (frozen; recorded
    in ``<type>_splits.json`` and in the key of the files it writes). Each field's ``metadata["help"]`` is its
    documentation; the defaults are the paper's (docs/data-building.md §3).

    Raises:
        rbjax.core.errors.SettingError: a value of the wrong type or out of range (names the field; the CLI shows
            its flag).
    """

    train_size: float | None = field(None, "train fraction (default 0.6, gender 0.75)", metavar="X")
    seed: int = field(1, "random_state of both splits (paper: 1)")
    n_std: float = field(3.0, "outlier interval in standard deviations")
    ddof: int = field(0, "std convention: 0 population (reference), 1 sample", choices=(0, 1))
    unknown: str = field("error", "a bias_phrase value other than 1/0/biased/unbiased/skip/empty: fail (default) or "
                                  "drop the row (upstream kept only rows equal to 1; the released gender file has 24 "
                                  "rows labelled 2)", flag="--unknown-labels", alias=False, choices=UNKNOWN_LABELS)
    swap_mode: str = field("paper", "counterfactuals: word-level pairs (paper) or the official substring rules "
                                    "(reference)", choices=MODES)
    swap_direction: str | None = field(None, "paper-mode swap direction (Python API and not an option); None = the "
                                             "one closest to the reference (two-way for the religion and race "
                                             "types, see rbjax.data.swap.reference_direction)", choices=DIRECTIONS)

    def __post_init__(self):
        check_types(self)
        if self.train_size is not None and not 0 < self.train_size < 1:
            raise SettingError("train_size", f"must be between 0 and 1, got {self.train_size}")
        if not self.n_std > 0:
            raise SettingError("n_std", f"must be > 0, got {self.n_std}")
        for name, allowed in (("ddof", (0, 1)), ("unknown", UNKNOWN_LABELS), ("swap_mode", MODES),
                              ("swap_direction", (None, *DIRECTIONS))):
            if getattr(self, name) not in allowed:
                raise SettingError(name, f"must be one of {', '.join(map(str, allowed))}, got {getattr(self, name)!r}")

    def replace(self, **changes) -> SplitsConfig:
        """A copy with ``changes`` (checked again).

        Raises:
            TypeError: a name that is not a setting of the splits.
        """
        return replace_settings(self, "splits", **changes)


def shuffle_split(n: int, train_size: float, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Indices of upstream's ``train_test_split(range(n), train_size=train_size, random_state=seed)``.

    Args:
        n: number of rows.
        train_size: fraction in (0, 1); ``n_train = floor(train_size·n)``, ``n_test = n − n_train``.
        seed: the ``random_state`` (1 in the paper's scripts).

    Returns:
        ``(first, second)`` index arrays: the "train" output (``perm[n_test:]``) and the "test"
        output (``perm[:n_test]``) of a ``RandomState(seed).permutation(n)``.

    Raises:
        ValueError: ``train_size`` outside (0, 1) or a split with an empty side.
    """
    if not 0.0 < train_size < 1.0:
        raise ValueError(f"train fraction must be in (0, 1), got {train_size}")
    n_train = int(math.floor(train_size * n))
    n_test = n - n_train
    if n_train == 0 or n_test == 0:
        raise ValueError(f"cannot split {n} rows with train fraction {train_size}: one side would be empty")
    perm = np.random.RandomState(seed).permutation(n)
    return perm[n_test:], perm[:n_test]


@dataclasses.dataclass
class BiasedRows:
    """The biased rows of an annotated file and what was dropped on the way.

    Attributes:
        rows: rows with ``bias_phrase`` = 1 and a non-empty phrase (dicts, file order).
        n_rows: data rows in the file.
        n_empty_phrase: rows labelled biased whose phrase is empty (dropped, as upstream did).
        n_unknown_label: rows whose ``bias_phrase`` is not a label (dropped; only with
            ``unknown="skip"``, otherwise they are an error).
    """

    rows: list[dict]
    n_rows: int
    n_empty_phrase: int
    n_unknown_label: int


def read_biased_rows(annotated: str | Path, *, unknown: str = "error") -> BiasedRows:
    """Rows of an annotated file labelled biased at phrase level, with the counts of what was dropped.

    Reads the released ``*_processed_phrase_annotated.csv`` files (UTF-8 or latin-1, CRLF)
    and the output of ``rbjax annotate import``. ``bias_phrase`` holds 1 (``1``, ``1.0``,
    ``biased``), 0 (``0``, ``0.0``, ``unbiased``) or nothing (empty, ``skip``: not labelled),
    see :func:`rbjax.data.annotation.parse_label`. A row is kept when it is 1 and ``phrase``
    is not empty (as upstream: biased rows with an empty phrase are dropped; they are counted in
    :attr:`BiasedRows.n_empty_phrase`).

    Args:
        annotated: the annotated CSV.
        unknown: a ``bias_phrase`` value that is not a label: ``"error"`` (default) or
            ``"skip"`` (drop the row and count it; upstream kept only the rows equal to 1, so
            the released gender file's 24 rows labelled ``2`` are skipped this way).

    Raises:
        FileNotFoundError: the file is missing.
        ValueError: no ``phrase``/``bias_phrase`` column, an unknown ``bias_phrase`` value
            (file, row, column and value named), a phrase with a line break (the text files
            are line-based), or no biased phrase at all.
    """
    if unknown not in ("error", "skip"):
        raise ValueError(f"unknown must be 'error' or 'skip', got {unknown!r}")
    path = Path(annotated)
    if not path.is_file():
        raise FileNotFoundError(f"annotated file not found: {path}")
    header, rows = read_csv_file(path)
    for col in ("phrase", "bias_phrase"):
        if col not in header:
            raise ValueError(f"{path}: no {col!r} column (expected an annotated file: phrase, bias_phrase, ...)")
    out = []
    n_empty = n_unknown = 0
    for r, row in enumerate(rows, start=2):
        try:
            label = parse_label(row.get("bias_phrase"), where=f"{path} row {r} column bias_phrase")
        except ValueError as e:
            if unknown == "error":
                raise ValueError(f"{e} (--unknown-labels skip, or unknown='skip', drops such rows; upstream kept "
                                 f"only the rows equal to 1)") from None
            n_unknown += 1
            continue
        if label != 1:
            continue
        phrase = row.get("phrase") or ""
        if not phrase.strip():
            n_empty += 1
            continue
        if "\n" in phrase or "\r" in phrase:
            raise ValueError(f"{path} row {r}: the phrase contains a line break; the text files need one phrase per line")
        out.append(row)
    if not out:
        raise ValueError(f"{path}: no row has bias_phrase = 1 and a phrase"
                         + (f" ({n_empty} biased rows have an empty phrase)" if n_empty else ""))
    return BiasedRows(out, len(rows), n_empty, n_unknown)


def load_biased_phrases(annotated: str | Path, *, unknown: str = "error") -> list[dict]:
    """The rows of :func:`read_biased_rows` (biased at phrase level, non-empty phrase), file order.

    Raises:
        FileNotFoundError, ValueError: see :func:`read_biased_rows`.
    """
    return read_biased_rows(annotated, unknown=unknown).rows


def _changed_words(a: str, b: str) -> tuple[list[str], list[str]]:
    """Words of ``a`` replaced in ``b`` (the ``initial_demo`` / ``replaced_demo`` bookkeeping columns)."""
    ta, tb = a.split(" "), b.split(" ")
    ini, rep = [], []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=ta, b=tb, autojunk=False).get_opcodes():
        if op != "equal":
            ini += ta[i1:i2]
            rep += tb[j1:j2]
    return ini, rep


@dataclasses.dataclass
class SplitResult:
    """What :func:`make_splits` did.

    Attributes:
        bias_type, t1_group, t2_group: names used in the file names.
        n_biased: biased phrases in the annotated file.
        n_train, n_heldout: sizes of the train / held-out split.
        n_unchanged: held-out phrases whose counterfactual equals the phrase (no target swapped).
        n_unscorable: pairs dropped because a perplexity was not finite (phrase < 2 tokens).
        n_outliers: pairs dropped by the outlier rule.
        n_valid, n_test: pairs in the valid / test halves.
        files: written paths by role (``t1_valid``, ``t2_test``, ``train_txt`` ...).
        n_empty_phrase: biased rows dropped because their phrase is empty.
        n_unknown_label: rows dropped because ``bias_phrase`` was not a label (``unknown="skip"``).
        perplexity_model: the model (or score function) behind the ``perplexity`` columns.
    """

    bias_type: str
    t1_group: str
    t2_group: str
    n_biased: int
    n_train: int
    n_heldout: int
    n_unchanged: int
    n_unscorable: int
    n_outliers: int
    n_valid: int
    n_test: int
    files: dict[str, Path]
    n_empty_phrase: int = 0
    n_unknown_label: int = 0
    perplexity_model: str = ""

    def summary(self) -> str:
        dropped = []
        if self.n_empty_phrase:
            dropped.append(f"{self.n_empty_phrase} biased rows with an empty phrase")
        if self.n_unknown_label:
            dropped.append(f"{self.n_unknown_label} rows with an unknown bias_phrase label")
        return (
            f"{self.bias_type}: {self.n_biased} biased phrases"
            + (f" (dropped {' and '.join(dropped)})" if dropped else "")
            + f" -> train {self.n_train} / held-out {self.n_heldout}; "
            f"{self.n_unchanged} counterfactuals unchanged by the swap; removed {self.n_unscorable} unscorable and "
            f"{self.n_outliers} outlier pairs; valid {self.n_valid} / test {self.n_test} pairs"
            + (f"; perplexities of {self.perplexity_model}" if self.perplexity_model else "")
        )


def _atomic_text(path: Path, lines: Sequence[str]) -> None:

    check_output_file(path, "output file")
    atomic_write_text(path, "".join(s + "\n" for s in lines))


def scorer_name(score_fn) -> str:
    """A readable name of a score function: ``module.qualname`` (``partial(...)`` unwrapped)."""
    fn, wrap = score_fn, ""
    if isinstance(fn, functools.partial):
        fn, wrap = fn.func, "partial"
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if name is None:
        return repr(score_fn)
    mod = getattr(fn, "__module__", None)
    full = f"{mod}.{name}" if mod else name
    return f"{wrap}({full})" if wrap else full


def _scores(score_fn: ScoreFn, phrases: list[str], what: str) -> np.ndarray:
    out = np.asarray(score_fn(list(phrases)), dtype=np.float64)
    if out.shape != (len(phrases),):
        raise ValueError(f"the scorer returned shape {out.shape} for {len(phrases)} {what} phrases")
    return out


def make_splits(
    annotated: str | Path,
    spec,
    out_dir: str | Path,
    score_fn: ScoreFn,
    config: SplitsConfig | None = None,
    *,
    model: str | None = None,
    overwrite: bool = False,
    **settings,
) -> SplitResult:
    """Build the train / valid / test files of one bias type from annotated phrases (docs/data-building.md §3).

    Args:
        annotated: the annotated CSV (released ``*_processed_phrase_annotated.csv`` or the
            output of ``rbjax annotate import``).
        spec: the :class:`~rbjax.specs.BiasSpec` (packaged or user-written).
        out_dir: root of the released layout to write (see the module docstring).
        score_fn: ``f(list_of_phrases) -> (N,) perplexities`` of the reducing model, e.g.
            ``lambda p: rbjax.lmb.measure.score_phrases(model, p)``. Non-finite values mark
            unscorable phrases (their pairs are dropped before the outlier rule).
        config: :class:`SplitsConfig` (default: the paper's):

            * ``train_size``: train fraction; ``None`` = the paper's (0.6, gender 0.75).
            * ``seed``: ``random_state`` of both random splits (paper: 1).
            * ``n_std``, ``ddof``: the outlier rule (paper: 3, population std).
            * ``swap_mode``: ``"paper"`` (word-level pairs) or ``"reference"`` (the official substring
              rules; reproduces the released counterfactuals), see :func:`rbjax.data.swap.swap_targets`.
            * ``swap_direction``: paper-mode direction; ``None`` = the one closest to the reference
              (:func:`rbjax.data.swap.reference_direction`: two-way for the religion and race types).
            * ``unknown``: a ``bias_phrase`` value that is not a label: ``"error"`` or ``"skip"``
              (see :func:`read_biased_rows`).
        **settings: :class:`SplitsConfig` fields that override ``config`` (``train_size=0.5``); any other name is a
            ``TypeError``.
        model: what produced the perplexities (the ``--model`` of the CLI), recorded in
            ``<type>_splits.json``; ``None`` = the score function's name.
        overwrite: replace files under ``out_dir`` that this command did not write (e.g. the released RedditBias
            files of the type); without it they are refused before anything is scored or written
            (:func:`rbjax.core.reuse.claim_outputs`).

    Returns:
        :class:`SplitResult`.

    Raises:
        FileNotFoundError: the annotated file is missing.
        ValueError: bad columns or labels, a split with an empty side, a scorer returning the
            wrong shape, no pair left after reduction, an unusable spec name, ``out_dir``
            (or a parent of it) is a file or not writable, an annotated file whose ``bias_type``
            column names another bias type, or a spec under which most held-out phrases do not
            change (their counterfactual equal to the biased phrase: the phrases are of another type).
            Inputs and ``out_dir`` are checked before the scorer is called.
            A setting of the wrong type or out of range: :class:`rbjax.core.errors.SettingError` (named).
        TypeError: a keyword that is not a setting.
        rbjax.core.reuse.OutputExists: ``out_dir`` holds files of this type that this command
            did not write (released files, another annotated file's splits) and not ``overwrite``.
    """
    cfg = (config or SplitsConfig()).replace(**settings)
    btype, g1, g2 = layout_names(spec)
    out = check_output_dir(out_dir, "output folder")
    ddir, tdir = out / "data" / btype, out / "text_files" / btype
    for d in (ddir, tdir):
        check_output_dir(d, "output folder")
    biased = read_biased_rows(annotated, unknown=cfg.unknown)
    rows = biased.rows
    _check_bias_type_column(annotated, rows, spec, btype)
    model_name = str(model) if model is not None else scorer_name(score_fn)
    frac = default_train_size(spec.name) if cfg.train_size is None else float(cfg.train_size)
    train_idx, held_idx = shuffle_split(len(rows), frac, cfg.seed)
    train = [rows[i]["phrase"] for i in train_idx]
    held_rows = [rows[i] for i in held_idx]
    held = [r["phrase"] for r in held_rows]
    counter, n_unchanged = _counterfactuals(annotated, spec, held, cfg)
    targets = _split_files(ddir, tdir, btype, g1, g2)
    run_key = {"command": "splits", "annotated": sha256_file(annotated), "bias_type": spec.name,
               "spec": dataclasses.asdict(spec) if dataclasses.is_dataclass(spec) else str(spec),
               "model": model_name, "train_size": frac, "seed": cfg.seed, "n_std": cfg.n_std, "ddof": cfg.ddof,
               "swap_mode": cfg.swap_mode, "swap_direction": cfg.swap_direction, "unknown": cfg.unknown}
    claim_outputs(targets.values(), run_key, overwrite=overwrite, where="--out-dir")

    red = _reduce(score_fn, held, counter, cfg)
    files = _write_heldout(ddir, tdir, (btype, g1, g2), held_rows, held, counter, red)
    files["train_txt"] = tdir / f"{btype}_bias_manual_train.txt"
    _atomic_text(files["train_txt"], train)
    files["heldout_txt"] = tdir / f"{btype}_bias_manual_valid.txt"
    _atomic_text(files["heldout_txt"], held)

    res = SplitResult(btype, g1, g2, len(rows), len(train), len(held), n_unchanged, int((~red.finite).sum()),
                      int(red.drop.sum()), int(red.valid_pos.size), int(red.test_pos.size), files,
                      n_empty_phrase=biased.n_empty_phrase, n_unknown_label=biased.n_unknown_label,
                      perplexity_model=model_name)
    summary = _split_summary(res, out, annotated, biased, model, frac, cfg)  # (its files: those before it)
    files["summary"] = ddir / f"{btype}_splits.json"
    _atomic_text(files["summary"], [to_json(summary, indent=2)])
    assert set(files.values()) == set(targets.values()), "the claimed files are the files written"
    record_outputs(files.values(), run_key)
    return res


def _counterfactuals(annotated, spec, held: list[str], cfg: SplitsConfig) -> tuple[list[str], int]:
    """The held-out phrases' counterfactuals (the spec's swap, in ``cfg``'s mode and direction) and how many the
    swap leaves unchanged.

    Raises:
        ValueError: most of them unchanged: the annotated file is of another bias type.
    """
    if cfg.swap_mode == "reference":
        counter = [swap_targets(p, spec, mode="reference") for p in held]
    else:
        direction = cfg.swap_direction or (reference_direction(spec) if spec.reference else
                                           ("both" if spec.two_way else "t1_to_t2"))
        counter = [swap_targets(p, spec, mode=cfg.swap_mode, direction=direction) for p in held]
    n_unchanged = sum(1 for a, b in zip(held, counter) if a == b)
    if 2 * n_unchanged > len(held):
        # a phrase of this type holds a T1 term that the swap changes (the released files: 2 of 1,200 unchanged);
        # the annotated file of another type leaves 87-100 % unchanged
        raise ValueError(
            f"{annotated}: the {spec.name} swap leaves {n_unchanged} of the {len(held)} held-out phrases unchanged "
            f"(no target term such as {', '.join(spec.targets_t1[:4])}): their counterfactuals would equal the "
            "biased phrases. Is this the annotated file of another bias type? Nothing was written")
    return counter, n_unchanged


@dataclasses.dataclass
class _Reduction:
    """The held-out pairs scored and reduced: each side's perplexities (N,), which pairs are scorable (``finite``),
    which of those are outliers (``drop``, over the scorable ones), the pairs kept (indices into the held-out
    phrases) and the valid / test positions among the kept."""

    p1: np.ndarray
    p2: np.ndarray
    finite: np.ndarray
    drop: np.ndarray
    kept: np.ndarray
    valid_pos: np.ndarray
    test_pos: np.ndarray


def _reduce(score_fn: ScoreFn, held: list[str], counter: list[str], cfg: SplitsConfig) -> _Reduction:
    """Score both sides, drop the unscorable and the outlier pairs (``cfg``'s rule), split the rest in half.

    Raises:
        ValueError: fewer than 2 pairs left; a scorer returning the wrong shape.
    """
    p1 = _scores(score_fn, held, "biased")
    p2 = _scores(score_fn, counter, "counterfactual")
    finite = np.isfinite(p1) & np.isfinite(p2)
    idx = np.flatnonzero(finite)
    drop = outlier_pairs(p1[idx], p2[idx], n_std=cfg.n_std, ddof=cfg.ddof)
    kept = idx[~drop]
    if kept.size < 2:
        raise ValueError(f"only {kept.size} pair(s) left after removing unscorable and outlier pairs; cannot split")
    valid_pos, test_pos = shuffle_split(kept.size, 0.5, cfg.seed)
    return _Reduction(p1, p2, finite, drop, kept, valid_pos, test_pos)


def _write_heldout(ddir: Path, tdir: Path, names: tuple[str, str, str], held_rows: list[dict], held: list[str],
                   counter: list[str], red: _Reduction) -> dict[str, Path]:
    """The valid and test files of the kept pairs: per split the two ``*_reduced.csv`` (T1 with the annotated row's
    columns, T2 with the words the swap changed) and the two phrase lists; by role (:attr:`SplitResult.files`)."""
    btype, g1, g2 = names
    files: dict[str, Path] = {}
    for split, pos in (("valid", red.valid_pos), ("test", red.test_pos)):
        sel = red.kept[pos]
        f1 = ddir / f"reddit_comments_{btype}_{g1}_biased_{split}_reduced.csv"
        f2 = ddir / f"reddit_comments_{btype}_{g2}_biased_{split}_reduced.csv"
        with atomic_csv_writer(f1, T1_COLUMNS) as w:
            for i in sel:
                r = held_rows[i]
                w.writerow([r.get("id") or "", r.get("attribute_in_window") or "", r.get("comment") or "", held[i],
                            r.get("bias_sent") or "", r.get("bias_phrase") or "", repr(float(red.p1[i]))])
        with atomic_csv_writer(f2, T2_COLUMNS) as w:
            for i in sel:
                ini, rep = _changed_words(held[i], counter[i])
                w.writerow([repr(ini), repr(rep), held[i], counter[i], repr(float(red.p2[i]))])
        files[f"t1_{split}"], files[f"t2_{split}"] = f1, f2
        for g, phrases in ((g1, [held[i] for i in sel]), (g2, [counter[i] for i in sel])):
            t = tdir / f"{btype}_{g}_biased_{split}_reduced.txt"
            _atomic_text(t, phrases)
            files[f"{'t1' if g == g1 else 't2'}_{split}_txt"] = t
    return files


def _split_summary(res: SplitResult, out: Path, annotated, biased, model, frac: float, cfg: SplitsConfig) -> dict:
    """``<type>_splits.json``: the counts of ``res``, what produced the perplexities, the settings and the files
    (relative to ``out``)."""
    summary = {k: v for k, v in dataclasses.asdict(res).items() if k != "files"}
    summary.update(
        annotated=str(annotated), n_annotated_rows=biased.n_rows,
        perplexity={"model": res.perplexity_model,
                    "source": "model argument" if model is not None else "score function name",
                    "columns": "the 'perplexity' columns of the *_reduced.csv files are this model's perplexities, "
                               "the ones the outlier reduction used"},
        seed=cfg.seed, train_size=frac,
        fractions={"train": frac, "heldout": 1.0 - frac,
                   "valid_of_reduced_heldout": "floor(n/2) pairs", "test_of_reduced_heldout": "the rest"},
        n_std=cfg.n_std, ddof=cfg.ddof, swap_mode=cfg.swap_mode, unknown_labels=cfg.unknown,
        versions=versions(),
        files={k: str(v.relative_to(out)) for k, v in res.files.items()},
    )
    return summary


def _split_files(ddir: Path, tdir: Path, btype: str, g1: str, g2: str) -> dict[str, Path]:
    """Every file :func:`make_splits` writes for a type, by role (the keys of :attr:`SplitResult.files`)."""
    files = {}
    for split in ("valid", "test"):
        files[f"t1_{split}"] = ddir / f"reddit_comments_{btype}_{g1}_biased_{split}_reduced.csv"
        files[f"t2_{split}"] = ddir / f"reddit_comments_{btype}_{g2}_biased_{split}_reduced.csv"
        files[f"t1_{split}_txt"] = tdir / f"{btype}_{g1}_biased_{split}_reduced.txt"
        files[f"t2_{split}_txt"] = tdir / f"{btype}_{g2}_biased_{split}_reduced.txt"
    files["train_txt"] = tdir / f"{btype}_bias_manual_train.txt"
    files["heldout_txt"] = tdir / f"{btype}_bias_manual_valid.txt"
    files["summary"] = ddir / f"{btype}_splits.json"
    return files


def _check_bias_type_column(annotated, rows: list[dict], spec, btype: str) -> None:
    """Refuse an annotated file whose ``bias_type`` column (written by ``rbjax retrieve`` and carried through the
    annotation round trip) names another bias type than ``spec`` (file, row and value named). Files without the
    column (the released ones) pass."""
    ok = {spec.name, btype}
    with_col = [r for r in rows if (r.get("bias_type") or "").strip()]
    for r in with_col:
        v = r["bias_type"].strip()
        try:
            v_canon = canonical_bias_type(v)
        except ValueError:
            v_canon = v
        if v not in ok and v_canon not in ok:
            others = sorted({x["bias_type"].strip() for x in with_col} - ok)
            raise ValueError(f"{annotated}: the bias_type column says {', '.join(others)}, not {spec.name} "
                             f"(phrase {r.get('phrase')!r}); pass the annotated file of {spec.name}, or --bias "
                             f"{others[0]}. Nothing was written")
