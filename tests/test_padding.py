"""rbjax/core/padding.py: the one pad-and-mask of token-id sequences (right or left padded, cut or refused when too
long, width rounded and capped, filler rows)."""
from __future__ import annotations

import numpy as np
import pytest

from rbjax.core.padding import pad_sequences


def test_right_padding_by_hand():
    ids, mask = pad_sequences([[5, 6, 7], [8], []], pad_id=9)
    assert ids.dtype == np.int32 and mask.dtype == np.int32
    assert ids.tolist() == [[5, 6, 7], [8, 9, 9], [9, 9, 9]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0], [0, 0, 0]]


def test_left_padding_width_rounding_cap_and_filler_rows_by_hand():
    ids, mask = pad_sequences([[5, 6, 7], [8]], pad_id=0, multiple=4, side="left", rows=3)
    assert ids.tolist() == [[0, 5, 6, 7], [0, 0, 0, 8], [0, 0, 0, 0]]
    assert mask.tolist() == [[0, 1, 1, 1], [0, 0, 0, 1], [0, 0, 0, 0]]
    assert pad_sequences([[1] * 9], multiple=8)[0].shape == (1, 16)
    assert pad_sequences([[1] * 9], multiple=8, max_width=10)[0].shape == (1, 10)  # the cap wins over the rounding
    assert pad_sequences([], width=4)[0].shape == (0, 4) and pad_sequences([])[0].shape == (0, 0)


def test_truncation_keeps_the_first_or_the_last_tokens():
    seqs = [np.arange(1, 7), [7, 8]]
    right, mr = pad_sequences(seqs, 0, width=4, truncate="right")
    left, ml = pad_sequences(seqs, 0, width=4, truncate="left")
    assert right.tolist() == [[1, 2, 3, 4], [7, 8, 0, 0]] and left.tolist() == [[3, 4, 5, 6], [7, 8, 0, 0]]
    assert mr.tolist() == ml.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]


def test_bad_arguments_and_a_too_long_sequence_are_named():
    with pytest.raises(ValueError, match="sequence 1 has 5 tokens, more than the width 4"):
        pad_sequences([[1], [1] * 5], width=4)
    with pytest.raises(ValueError, match="side must be one of"):
        pad_sequences([[1]], side="middle")
    with pytest.raises(ValueError, match="truncate must be one of"):
        pad_sequences([[1]], truncate="reference")
    with pytest.raises(ValueError, match="rows=1 is fewer than the 2 sequences"):
        pad_sequences([[1], [2]], rows=1)
    with pytest.raises(ValueError, match="multiple must be >= 1"):
        pad_sequences([[1]], multiple=0)


def test_equals_the_loop_it_replaced_on_random_sequences():
    """The loops the callers had (right padding into np.full / np.zeros, then [:len(s)]), on random lengths."""
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 50000, rng.integers(0, 20)).tolist() for _ in range(30)]
    for width, truncate in ((None, None), (12, "right"), (12, "left"), (25, None)):
        W = max(len(s) for s in seqs) if width is None else width
        want_ids, want_mask = np.full((len(seqs), W), 3, np.int32), np.zeros((len(seqs), W), np.int32)
        for r, s in enumerate(seqs):
            if len(s) > W:
                s = s[-W:] if truncate == "left" else s[:W]
            want_ids[r, :len(s)] = s
            want_mask[r, :len(s)] = 1
        ids, mask = pad_sequences(seqs, 3, width=width, truncate=truncate)
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_array_equal(mask, want_mask)
