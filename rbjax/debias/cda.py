"""Counterfactual data augmentation, CDA (paper §4.4; docs/debiasing.md §6).

The augmented training set is every training phrase followed by its target-swapped copy (the paper: "every
training utterance that links a T1 term with an A1 attribute is duplicated"; every RedditBias training phrase is
such an utterance by construction, so *all* of them are duplicated, as in the reference). The model is then
fine-tuned with the plain LM loss on both copies.

Our own swapping (:func:`rbjax.data.swap.swap_targets`) builds the copies:

* ``mode="paper"`` (default): word-level pairs of the bias specification, whole words, case kept; direction
  ``"both"`` for the two-way specs (religion1, religion2, race: a phrase naming both groups gets them exchanged, as
  the reference's placeholder swap does) and ``"t1_to_t2"`` otherwise (gender, queerness), i.e.
  :func:`rbjax.data.swap.reference_direction`.
* ``mode="reference"``: the official substring rules; this reproduces the released
  ``<type>_bias_manual_swapped_targets_train.txt`` files line for line (:func:`cross_check`).

Input phrases are the debiasing training file (:meth:`RedditBiasData.train_file`: the lower-case file for
religion2), with the literal ``"<bos> "`` prefix that every queerness training line carries removed (the released
swapped-targets file has no such prefix either).
"""
from __future__ import annotations

import dataclasses
import os

from rbjax.data.redditbias import RedditBiasData
from rbjax.data.swap import reference_direction, swap_targets
from rbjax.specs import BiasSpec, canonical_bias_type, is_spec_path, load_spec

__all__ = ["BOS_PREFIX", "read_train_phrases", "augment", "augmented_training_set", "CrossCheck", "cross_check"]

#: literal prefix of every line of ``orientation_bias_manual_train.txt`` (rb:reddit_data_text_train_test.py:51-52)
BOS_PREFIX = "<bos> "


def read_train_phrases(bias_type: str, data: RedditBiasData | str | os.PathLike | None = None, *,
                       strip_bos: bool = True) -> list[str]:
    """The debiasing training phrases of a bias type (non-empty lines of its train file).

    Args:
        bias_type: one of the five bias types (``orientation`` = queerness) or a bias-spec file.
        data: a :class:`RedditBiasData`, a folder, or ``None`` (``$RBJAX_DATA_DIR`` / download cache).
        strip_bos: remove the literal ``"<bos> "`` line prefix of the queerness file.

    Raises:
        FileNotFoundError / RuntimeError: the file is missing or cannot be fetched.
        ValueError: the file has no non-empty line.
    """
    if not isinstance(data, RedditBiasData):
        data = RedditBiasData(data)
    path = data.path(RedditBiasData.train_file(bias_type))
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln and not ln.isspace()]
    if not lines:
        raise ValueError(f"{path}: no training phrase")
    if strip_bos:
        lines = [ln[len(BOS_PREFIX):] if ln.startswith(BOS_PREFIX) else ln for ln in lines]
    return lines


def augment(phrases: list[str], spec: BiasSpec, mode: str = "paper", direction: str | None = None) -> list[str]:
    """CDA training set: ``phrases`` followed by their swapped copies (the reference's file order).

    Args:
        phrases: training phrases.
        spec: bias specification.
        mode: ``"paper"`` or ``"reference"`` (see the module docstring).
        direction: paper-mode direction; ``None`` = :func:`rbjax.data.swap.reference_direction` (``"both"`` for
            two-way specs). Ignored in reference mode.

    Returns:
        ``2·len(phrases)`` strings; a phrase with no target term appears twice, unchanged (as in the reference).
    """
    if mode == "reference":
        copies = [swap_targets(p, spec, "reference") for p in phrases]
    else:
        d = reference_direction(spec) if direction is None else direction
        copies = [swap_targets(p, spec, "paper", d) for p in phrases]
    return list(phrases) + copies


def augmented_training_set(bias_type: str, data: RedditBiasData | str | os.PathLike | None = None,
                           mode: str = "paper", direction: str | None = None) -> list[str]:
    """The CDA training set of a bias type built by our swapping (paper §4.4).

    Raises:
        ValueError: unknown bias type or mode. FileNotFoundError / RuntimeError: data missing.
    """
    b = bias_type if is_spec_path(bias_type) else canonical_bias_type(bias_type)
    if mode not in ("paper", "reference"):
        raise ValueError(f"mode must be 'paper' or 'reference', got {mode!r}")
    spec = load_spec(b)
    if mode == "reference" and not spec.reference:
        raise ValueError(f"{b}: reference-mode swapping uses the official code's substring rules, which exist only "
                         "for the five packaged bias types; use paper mode for a bias type of your own")
    return augment(read_train_phrases(b, data), spec, mode, direction)


@dataclasses.dataclass(frozen=True)
class CrossCheck:
    """Our augmented set against the released ``*_swapped_targets_train.txt``.

    Attributes:
        bias_type, mode: what was compared.
        n_ours, n_released: line counts.
        n_identical: positions where both files have the same line.
        mismatches: up to 20 ``(line number (1-based), ours, released)``.
    """

    bias_type: str
    mode: str
    n_ours: int
    n_released: int
    n_identical: int
    mismatches: tuple[tuple[int, str, str], ...]

    @property
    def agreement(self) -> float:
        return self.n_identical / max(self.n_ours, self.n_released, 1)

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "agreement": self.agreement}


def cross_check(bias_type: str, data: RedditBiasData | str | os.PathLike | None = None,
                mode: str = "paper") -> CrossCheck:
    """Compare our augmented set with the released swapped-targets training file, line by line.

    In ``reference`` mode the two are expected to be identical; in ``paper`` mode the differences are the
    word-boundary and case decisions documented in :mod:`rbjax.data.swap`.
    """
    if not isinstance(data, RedditBiasData):
        data = RedditBiasData(data)
    ours = augmented_training_set(bias_type, data, mode)
    path = data.path(RedditBiasData.swapped_targets_train_file(bias_type))
    released = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln and not ln.isspace()]
    same = 0
    mism = []
    for i in range(max(len(ours), len(released))):
        a = ours[i] if i < len(ours) else ""
        b = released[i] if i < len(released) else ""
        if a == b:
            same += 1
        elif len(mism) < 20:
            mism.append((i + 1, a, b))
    return CrossCheck(canonical_bias_type(bias_type), mode, len(ours), len(released), same, tuple(mism))
