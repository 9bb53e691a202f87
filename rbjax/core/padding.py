"""Token-id sequences of different lengths as one rectangular batch: ids padded with a pad id, and a 0/1 mask.

::

    ids, mask = pad_sequences([[5, 6, 7], [8]], pad_id=0)        # ids [[5, 6, 7], [8, 0, 0]], mask [[1, 1, 1], [1, 0, 0]]
    ids, mask = pad_sequences(seqs, pad_id, width=64, truncate="left")   # each row its last ≤ 64 tokens
    ids, mask = pad_sequences(seqs, pad_id, multiple=8, side="left")     # width: the longest, rounded up to 8
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["pad_sequences", "SIDES", "TRUNCATIONS"]

#: where the padding goes: after the tokens (``"right"``) or before them (``"left"``)
SIDES = ("right", "left")
#: which end of a sequence longer than the width is cut: ``"right"`` keeps the first tokens, ``"left"`` the last
TRUNCATIONS = ("right", "left")


def pad_sequences(seqs: Sequence[Sequence[int]], pad_id: int = 0, *, width: int | None = None, multiple: int = 1,
                  max_width: int | None = None, rows: int | None = None, side: str = "right",
                  truncate: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Pad token-id sequences into one ``(rows, width)`` batch.

    Args:
        seqs: N sequences of token ids (lists, tuples or 1-d arrays; empty ones give rows of padding).
        pad_id: the id of the padding positions.
        width: the batch's width. Default: the longest sequence rounded up to a multiple of ``multiple``, at most
            ``max_width`` (0 for no sequences or only empty ones).
        multiple, max_width: the default width's rounding and cap (ignored when ``width`` is given).
        rows: the batch's rows (default N); rows after the N sequences are all padding (mask 0).
        side: ``"right"`` (tokens first, padding after) or ``"left"`` (padding first).
        truncate: a sequence longer than the width is cut at the ``"right"`` (its first ``width`` tokens kept)
            or the ``"left"`` (its last ones kept); ``None``: it is an error.

    Returns:
        ``(ids, mask)``: int32 ``(rows, width)``; ``ids`` holds each sequence's tokens in order, ``pad_id``
        elsewhere; ``mask`` is 1 on the tokens, 0 on the padding.

    Raises:
        ValueError: a bad ``side``, ``truncate``, ``multiple`` or ``rows``; with ``truncate=None``, a sequence
            longer than the width (its index and length named).
    """
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    if truncate is not None and truncate not in TRUNCATIONS:
        raise ValueError(f"truncate must be one of {TRUNCATIONS} or None, got {truncate!r}")
    if multiple < 1:
        raise ValueError(f"multiple must be >= 1, got {multiple}")
    n = len(seqs)
    rows = n if rows is None else rows
    if rows < n:
        raise ValueError(f"rows={rows} is fewer than the {n} sequences")
    if width is None:
        width = -(-max((len(s) for s in seqs), default=0) // multiple) * multiple
        if max_width is not None:
            width = min(width, max_width)
    ids = np.full((rows, width), pad_id, np.int32)
    mask = np.zeros((rows, width), np.int32)
    for r, s in enumerate(seqs):
        if len(s) > width:
            if truncate is None:
                raise ValueError(f"sequence {r} has {len(s)} tokens, more than the width {width}")
            s = s[:width] if truncate == "right" else s[len(s) - width:]
        k = len(s)
        if side == "right":
            ids[r, :k] = s
            mask[r, :k] = 1
        elif k:
            ids[r, width - k:] = s
            mask[r, width - k:] = 1
    return ids, mask
