"""Host-side batches of a training run, for any objective: token rows → the micro-batches and updates of a batch
plan, padded or packed.

Everything here is numpy on the host and is computed **once** per run: a data object (:class:`ArrayData`, or a
task's own class with the same attributes, e.g. :class:`rbjax.debias.data.TrainingData`) holds the token rows and
gives each micro-batch its per-example arrays (``triggers``); :class:`BatchPlan` orders them into updates. Every grid
point that shares a batch plan shares the same stream.

Order and randomness (paper §5.1 and the reference Trainer; docs/debiasing.md §5 "Setup")
    * Data order: a seeded permutation per epoch, ``numpy.random.default_rng([seed, epoch])``; micro-batch ``b`` of
      epoch ``e`` holds rows ``perm[b·B:(b+1)·B]``. The last, smaller micro-batch is filled with empty rows (zero
      mask), which contribute nothing, so the result equals the reference's smaller last batch.
    * Dropout key of a micro-batch: ``fold_in(fold_in(key(seed, impl="rbg"), epoch), b)``. Both are functions of the
      position in the run only, so a resumed run sees exactly the same batches and dropout masks.
    * Updates (:func:`update_plan`): ``grad_accum`` consecutive micro-batches per update; ``t_total =
      ⌊#batches/accum⌋·epochs`` (or ``max_steps``); leftovers at an epoch's end are dropped (paper) or carried into
      the next epoch's first update (reference).
"""
from __future__ import annotations

import hashlib
import heapq
from typing import Any

import numpy as np

from rbjax.core.padding import pad_sequences

__all__ = ["LAYOUTS", "tokenize_lines", "epoch_permutation", "update_plan", "dropout_key", "ArrayData", "BatchPlan",
           "pack_micro_batch", "packed_need", "deal_update", "pack_index", "choose_packed_shapes", "choose_rows",
           "update_need", "row_cost",
           "PACKED_SHAPES", "COMPILE_SLOTS_768", "compile_slots", "ATTENTION_SLOTS_768", "attention_slots",
           "sha256_arrays"]

#: token layouts of a micro-batch (:class:`BatchPlan`): ``packed`` (the examples' tokens side by side in a few rows,
#: no update computes on padding) or ``padded`` (one row of ``block_size`` per example)
LAYOUTS = ("packed", "padded")

def tokenize_lines(texts: list[str], tokenizer, block_size: int, pad_id: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """Tokenise each line on its own (no special tokens), cut to ``block_size``, right-pad.

    Args:
        texts: (N,) phrases. tokenizer: ``encode_batch``. block_size: tokens kept per phrase. pad_id: filler id
            (never scored or attended; the reference's ``<pad>`` row is not added to the vocabulary).

    Returns:
        ``(ids, mask, stats)``: int32 ``(N', block_size)`` ids and 0/1 mask, where lines with no token are dropped
        (N' ≤ N), and ``{"n_dropped_empty", "n_truncated", "n_tokens"}``.

    Raises:
        ValueError: no line has a token.
    """
    toks = tokenizer.encode_batch(list(texts))
    keep = [t for t in toks if len(t) > 0]
    if not keep:
        raise ValueError("no training line has a token")
    n_trunc = sum(len(t) > block_size for t in keep)
    ids, mask = pad_sequences(keep, pad_id, width=block_size, truncate="right")
    return ids, mask, {"n_dropped_empty": len(toks) - len(keep), "n_truncated": int(n_trunc),
                       "n_tokens": int(mask.sum())}


# ------------------------------------------------------------------------------------------------ order, plan
def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The example order of an epoch: ``numpy.random.default_rng([seed, epoch]).permutation(n)``."""
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch)]).permutation(n)


def update_plan(n_batches: int, grad_accum: int, epochs: int, leftover: str = "drop",
                max_steps: int | None = None) -> tuple[list[list[tuple[int, int]]], int]:
    """Which micro-batches make up each update, and the schedule length.

    Args:
        n_batches: micro-batches per epoch (``ceil(N / batch_size)``).
        grad_accum: micro-batches per update.
        epochs: passes over the data.
        leftover: ``drop`` (leftover micro-batches of each epoch are skipped) or ``carry`` (reference Trainer: they
            join the first update of the next epoch; the last epoch's are discarded).
        max_steps: cap on updates; when given, ``t_total = max_steps`` and more epochs are planned if needed
            (as HF's ``max_steps``).

    Returns:
        ``(plan, t_total)``: ``plan[u]`` = list of ``(epoch, batch_index)`` of update ``u`` (0-based);
        ``t_total = ⌊n_batches/grad_accum⌋·epochs`` (or ``max_steps``).

    Raises:
        ValueError: fewer micro-batches per epoch than ``grad_accum`` (no update would happen).
    """
    per_epoch = n_batches // grad_accum
    if per_epoch == 0:
        raise ValueError(f"{n_batches} micro-batch(es) per epoch is fewer than grad_accum={grad_accum}: no update "
                         "would happen; lower --batch-size or --grad-accum")
    t_total = per_epoch * epochs if max_steps is None else int(max_steps)
    n_epochs = epochs if max_steps is None else max(epochs, -(-int(max_steps) // per_epoch))
    plan: list[list[tuple[int, int]]] = []
    carry: list[tuple[int, int]] = []
    for e in range(n_epochs):
        cur = list(carry) if leftover == "carry" else []
        k = 0
        for b in range(n_batches):
            cur.append((e, b))
            k += 1
            if k == grad_accum:
                plan.append(cur)
                cur, k = [], 0
        carry = cur
    return plan[:t_total], t_total


def dropout_key(seed: int, epoch: int, batch_index: int):
    """Dropout key of one micro-batch: ``fold_in(fold_in(key(seed), epoch), batch_index)`` (raw key data, uint32).

    The key uses JAX's ``rbg`` implementation (four 32-bit words): deterministic on a given backend, and on CPU it
    compiles the dropout of a GPT-2 step about twice as fast as the default threefry keys; the masks themselves are
    drawn from each site's words by :func:`rbjax.model.layers.keep_mask`. Returned as raw key data so that batches
    stack with numpy; :func:`rbjax.train.step.train_step` wraps it back.
    """
    import jax

    k = jax.random.key(int(seed) & 0xFFFFFFFF, impl="rbg")
    return np.asarray(jax.random.key_data(jax.random.fold_in(jax.random.fold_in(k, int(epoch)), int(batch_index))))


# ------------------------------------------------------------------------------------------------------ packing
#: default number of packed shapes per batch plan, at most (one compiled training program each)
PACKED_SHAPES = 4
#: the compile time of one training program of the DialoGPT-small shape (width 768, LM loss) in token slots of its
#: updates: 15.0 s of compiling against 0.0104 s per slot, measured on the project's 2-core CPU by
#: benchmarks/bench_compile_slots.py (benchmarks/RESULTS.md, "Compile time and packed shapes"); a warm compilation
#: cache makes compiling free, so this only matters for a run's first compile
COMPILE_SLOTS_768 = 1450.0
#: the attention's share of a training update at width 768 as a row length: a packed row of ``Lp`` slots costs
#: ``Lp · (1 + Lp / ATTENTION_SLOTS_768)`` slots' worth of computation (the block-diagonal attention of a row —
#: scores, mask, softmax, the dropout mask of its probabilities and their gradients — is computed densely, so it grows
#: with ``Lp²``). Measured on the project's 2-core CPU by benchmarks/bench_row_length.py (benchmarks/RESULTS.md,
#: "Packed rows of a DST update"): the same DST micro-batch in 1 to 8 rows.
ATTENTION_SLOTS_768 = 714.0


def compile_slots(hidden_size: int) -> float:
    """The compile time of one training program in token slots of computation, for a model of width
    ``hidden_size``: :data:`COMPILE_SLOTS_768` scaled by (768 / width)² (compile time grows with the layers, as the
    computation per slot does, and the computation per slot also with the width squared). Used to choose the packed
    shapes of a plan (:func:`choose_packed_shapes`)."""
    return COMPILE_SLOTS_768 * (768.0 / max(int(hidden_size), 1)) ** 2


def attention_slots(hidden_size: int) -> float:
    """The row length at which a packed row's attention costs as much as the rest of its update, for a model of
    width ``hidden_size``: :data:`ATTENTION_SLOTS_768`, scaled by width / 768 for wider models (per token and
    layer, the attention grows with ``Lp · width`` and the projections and MLP with ``width²``). Narrower models
    keep the width-768 figure: their updates are bound by per-operation costs, not arithmetic (the same benchmark
    at width 64 measures about 430). Used to choose the rows of a plan (:func:`choose_rows`)."""
    return ATTENTION_SLOTS_768 * max(int(hidden_size), 768) / 768.0


def row_cost(shape: tuple[int, int], attention: float = float("inf")) -> float:
    """The computation of a packed ``(R, Lp)`` micro-batch in token slots: ``R · Lp · (1 + Lp / attention)``
    (:func:`attention_slots`; ``inf``: slots only)."""
    r, s = shape
    return float(r) * s * (1.0 + s / attention)


def pack_micro_batch(lengths: np.ndarray, n_rows: int) -> list[list[int]]:
    """Examples of a micro-batch spread over at most ``n_rows`` packed rows, as evenly as it goes: longest first,
    each into the row with the fewest tokens so far (the lowest on ties; Graham's LPT rule, whose fullest row is
    within 4/3 of the best possible). Examples keep their batch order within a row; empty rows are left out.

    Args:
        lengths: ``(B,)`` real tokens of each example (0 for filler rows, which get no slot). n_rows: ≥ 1.

    Returns:
        rows, each the list of example indices it holds (empty examples are left out).
    """
    real = [b for b in range(len(lengths)) if lengths[b] > 0]
    n = max(1, min(int(n_rows), len(real)))
    if n == 1:
        return [real] if real else [[]]
    rows: list[list[int]] = [[] for _ in range(n)]
    load = [0] * n
    for b in sorted(real, key=lambda b: (-int(lengths[b]), b)):
        r = min(range(n), key=load.__getitem__)
        rows[r].append(b)
        load[r] += int(lengths[b])
    return [sorted(r) for r in rows if r]


def packed_need(lengths: np.ndarray, n_rows: int) -> tuple[int, int]:
    """``(n_rows, slots of the fullest row)`` a micro-batch needs packed into ``n_rows`` rows
    (:func:`pack_micro_batch`). For a fixed ``n_rows`` these are ordered by their slots, and a micro-batch fits every
    shape ``(n_rows, s)`` with ``s`` at or above its need."""
    rows = pack_micro_batch(lengths, n_rows)
    return int(n_rows), max(1, max(int(lengths[r].sum()) for r in rows) if rows and rows[0] else 1)


def deal_update(lengths: np.ndarray, n_micro: int, n_rows: int) -> tuple[list[list[list[int]]], tuple[int, int]]:
    """An update's examples dealt into its ``n_micro`` micro-batches and their packed rows at once, as evenly as it
    goes: longest first, each into the least-filled row (the lowest micro-batch and row on ties) of a micro-batch
    that has room left (Graham's LPT rule over all ``n_micro · n_rows`` rows of the update, every micro-batch keeping
    ``len(lengths) / n_micro`` examples). Each row is filled from ``n_micro`` times as many examples as
    :func:`pack_micro_batch` chooses from, so the update's fullest row, which sets its packed shape, is shorter.
    Within one micro-batch the rule is :func:`pack_micro_batch`'s (its examples come longest first, each into its
    emptiest row, the lowest on ties), so packing a dealt micro-batch's examples gives back these rows.

    Only for an objective whose loss does not depend on the grouping (:class:`BatchPlan`, ``exchangeable``).

    Args:
        lengths: ``(A·B,)`` real tokens of the update's examples, micro-batch after micro-batch (all > 0).
        n_micro: A ≥ 1, dividing ``len(lengths)``. n_rows: ≥ 1.

    Returns:
        ``(rows, need)``: ``rows[m]`` the packed rows of micro-batch ``m``, each the ascending list of the example
        indices (into ``lengths``) it holds (empty rows left out), and ``need``, ``(n_rows, slots of the fullest
        row)``, a shape that every micro-batch fits.

    Raises:
        ValueError: ``n_micro`` does not divide the examples, or an example has no token.
    """
    lengths = np.asarray(lengths, np.int64)
    n, A, R = len(lengths), int(n_micro), int(n_rows)
    if A < 1 or R < 1 or n % A:
        raise ValueError(f"{n} examples cannot be dealt into {n_micro} equal micro-batches of {n_rows} rows")
    if n and lengths.min() <= 0:
        raise ValueError("deal_update: every example needs a token")
    per = n // A
    heap = [(0, m, r) for m in range(A) for r in range(R)]  # (tokens so far, micro-batch, row): already a heap
    count = [0] * A
    rows: list[list[list[int]]] = [[[] for _ in range(R)] for _ in range(A)]
    for i in sorted(range(n), key=lambda i: (-int(lengths[i]), i)):
        load, m, r = heapq.heappop(heap)
        while count[m] == per:  # a full micro-batch's rows take nothing more: dropped as they come up
            load, m, r = heapq.heappop(heap)
        rows[m][r].append(i)
        count[m] += 1
        heapq.heappush(heap, (load + int(lengths[i]), m, r))
    # ≥ 1: every example has a token (1 for an update without examples)
    need = max((int(lengths[row].sum()) for mb in rows for row in mb if row), default=1)
    return [[sorted(row) for row in mb if row] for mb in rows], (R, need)


def pack_index(attention_mask: np.ndarray, rows: list[list[int]], shape: tuple[int, int]
               ) -> tuple[np.ndarray, np.ndarray]:
    """The packed layout of a padded micro-batch as two gather indices.

    Args:
        attention_mask: ``(B, L)`` 0/1 of the padded micro-batch (real tokens need not be contiguous from 0).
        rows: :func:`pack_micro_batch`. shape: ``(R, Lp)`` packed rows × slots (≥ the need).

    Returns:
        ``(pack, unpack)``: int32 ``(R, Lp)``, slot → flat index ``b·L + i`` of the padded token it holds (−1 for
        an empty slot); int32 ``(B, L)``, padded token → flat index ``r·Lp + j`` of its slot (−1 for padding).

    Raises:
        ValueError: the micro-batch does not fit ``shape``.
    """
    B, L = attention_mask.shape
    R, Lp = shape
    if len(rows) > R:
        raise ValueError(f"micro-batch needs {len(rows)} packed rows, the shape has {R}")
    pack = np.full((R, Lp), -1, np.int32)
    unpack = np.full((B, L), -1, np.int32)
    for r, members in enumerate(rows):
        j = 0
        for b in members:
            pos = np.flatnonzero(attention_mask[b])
            if j + len(pos) > Lp:
                raise ValueError(f"packed row {r} needs more than {Lp} slots")
            pack[r, j:j + len(pos)] = b * L + pos
            unpack[b, pos] = r * Lp + j + np.arange(len(pos))
            j += len(pos)
    return pack, unpack


def choose_packed_shapes(needs: list[tuple[int, int]], weights: list[int], max_shapes: int,
                         compile_slots: float = 0.0, attention: float = float("inf")) -> list[tuple[int, int]]:
    """At most ``max_shapes`` packed shapes that every need fits, chosen to minimise the computation plus the
    compilation of one program per shape.

    Optimal 1-D bucketing (dynamic programme over the sorted distinct needs): each update takes the smallest chosen
    shape at or above its need, and costs ``weight × row_cost(shape)`` (``weight``: its micro-batches;
    :func:`row_cost`: slots, with the attention's quadratic part); each shape costs ``compile_slots`` more (its
    program's compile time, in the time of computing that many token slots), so a short run takes fewer shapes than
    a long one.

    Args:
        needs: ``(rows, slots)`` of each update (:func:`packed_need`, the maximum over its micro-batches).
        weights: micro-batches of each update. max_shapes: ≥ 1. compile_slots: ≥ 0 (0: as many shapes as help).
        attention: :func:`attention_slots` (``inf``: the cost is the slots alone).

    Returns:
        the chosen shapes, ascending (the largest is the largest need).
    """
    return _bucket(needs, weights, max_shapes, compile_slots, attention)[0]


def _bucket(needs, weights, max_shapes, compile_slots, attention) -> tuple[list[tuple[int, int]], float]:
    """:func:`choose_packed_shapes` and its cost (computation + compilation, in slots)."""
    vals = sorted(set(needs))
    w = {v: 0 for v in vals}
    for n, k in zip(needs, weights):
        w[n] += k
    n = len(vals)
    K = max(1, min(int(max_shapes), n))
    size = np.array([row_cost(v, attention) for v in vals])
    cum = np.cumsum([0] + [w[v] for v in vals]).astype(np.float64)  # weight of vals[:i]
    # best[k, i]: cost of covering vals[:i] with k shapes, the last one being vals[i-1]
    best = np.full((K + 1, n + 1), np.inf)
    arg = np.full((K + 1, n + 1), -1, np.int64)
    best[0, 0] = 0.0
    for k in range(1, K + 1):
        for i in range(1, n + 1):  # vals[j:i] take shape vals[i-1], j < i
            c = best[k - 1, :i] + (cum[i] - cum[:i]) * size[i - 1]
            j = int(np.argmin(c))
            best[k, i], arg[k, i] = c[j], j
    total = best[1:, n] + np.arange(1, K + 1) * float(compile_slots)
    k = int(np.argmin(total)) + 1
    out, i = [], n
    while i > 0:
        out.append(vals[i - 1])
        i, k = int(arg[k, i]), k - 1
    return sorted(out), float(total.min())


def choose_rows(lengths: list[np.ndarray], updates: list[list[int]], max_shapes: int, compile_slots: float = 0.0,
                attention: float = float("inf"), max_rows: int = 16, deal: list[bool] | None = None
                ) -> tuple[int, list[tuple[int, int]]]:
    """The packed rows of a plan's micro-batches and the plan's shapes: the row count whose shapes
    (:func:`choose_packed_shapes`) cost least over the whole plan.

    Fewer rows waste fewer slots (a row is as long as its fullest member allows); more, shorter rows spend less on
    the attention, which grows with the square of a row's length (:func:`row_cost`). RedditBias phrases (≈ 120
    tokens a micro-batch) take one row or two, DST's micro-batches of 12 turns (≈ 550 tokens) several.

    Args:
        lengths: real tokens of each micro-batch's examples (``(B,)`` each).
        updates: the micro-batch indices (into ``lengths``) of each update.
        max_shapes, compile_slots, attention: as :func:`choose_packed_shapes`. max_rows: rows tried, at most.
        deal: for each update, whether its examples may be dealt anew into its micro-batches (:func:`update_need`);
            default: none.

    Returns:
        ``(rows, shapes)``; ties go to fewer rows.
    """
    most = max(1, max(int((np.asarray(x) > 0).sum()) for x in lengths))
    deal = deal or [False] * len(updates)
    best = None
    for r in range(1, min(most, int(max_rows)) + 1):
        need = [update_need(lengths, u, r, d)[0] for u, d in zip(updates, deal)]
        shapes, cost = _bucket(need, [len(u) for u in updates], max_shapes, compile_slots, attention)
        if best is None or cost < best[0]:
            best = (cost, r, shapes)
    return best[1], best[2]


def update_need(lengths: list[np.ndarray], update: list[int], n_rows: int, deal: bool = False
                ) -> tuple[tuple[int, int], list[list[list[int]]] | None]:
    """The packed need ``(n_rows, slots)`` of an update: the largest of its micro-batches' (:func:`packed_need`),
    or, when ``deal`` and that is smaller, that of its examples dealt anew (:func:`deal_update`).

    Args:
        lengths: real tokens of each micro-batch's examples. update: its micro-batches (indices into ``lengths``).
        n_rows: packed rows of a micro-batch. deal: the examples may be dealt anew (the caller has checked that
            every micro-batch of the update is full: :class:`BatchPlan`).

    Returns:
        ``(need, dealt)``: ``dealt`` is :func:`deal_update`'s rows (indices into the update's examples, micro-batch
        after micro-batch), or ``None`` when the update keeps its micro-batches.
    """
    need = max(packed_need(lengths[i], n_rows) for i in update)
    if not deal or len(update) < 2:
        return need, None
    rows, dealt_need = deal_update(np.concatenate([lengths[i] for i in update]), len(update), n_rows)
    return (dealt_need, rows) if dealt_need < need else (need, None)


# ------------------------------------------------------------------------------------------------ data, plans
def sha256_arrays(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.shape}{a.dtype}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


class ArrayData:
    """A training set given as fixed-shape arrays (the dialog fine-tuning tasks: DST, CRG), in the interface of
    the debiasing runs' :class:`rbjax.debias.data.TrainingData`, so that :class:`BatchPlan` and the trainer serve
    both alike.

    Args:
        arrays: ``input_ids`` and ``attention_mask`` int32 ``(N, L)``, plus any per-example arrays the task's loss
            reads (DST: ``labels`` ``(N,)``; CRG: ``loss_mask`` ``(N, L)``), all with N rows.
        pad_id: filler id of empty rows. info: where the data came from (recorded with the run).

    Raises:
        ValueError: missing ``input_ids``/``attention_mask``, or arrays of different lengths.
    """

    def __init__(self, arrays: dict[str, np.ndarray], pad_id: int, info: dict | None = None):
        if "input_ids" not in arrays or "attention_mask" not in arrays:
            raise ValueError("arrays need input_ids and attention_mask")
        n = len(arrays["input_ids"])
        bad = [k for k, v in arrays.items() if len(v) != n]
        if bad:
            raise ValueError(f"arrays {bad} do not have {n} rows like input_ids")
        if n == 0:
            raise ValueError("no training example")
        self.ids = np.asarray(arrays["input_ids"], np.int32)
        self.mask = np.asarray(arrays["attention_mask"], np.int32)
        self.extra = {k: np.asarray(v) for k, v in arrays.items() if k not in ("input_ids", "attention_mask")}
        self.pad_id = int(pad_id)
        self.n_examples = n
        self.info = dict(info or {})
        self.info["sha256_arrays"] = sha256_arrays(self.ids, self.mask, *[self.extra[k] for k in sorted(self.extra)])
        self.key = self.info["sha256_arrays"]
        self.shared: dict[str, np.ndarray] = {}
        self.trigger_stats: dict[str, Any] = {}
        self.n_occ = 0

    def triggers(self, ids: np.ndarray, mask: np.ndarray, rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """The per-example arrays of a micro-batch's rows (filler rows get zeros)."""
        out = {}
        for k, v in self.extra.items():
            a = np.zeros((ids.shape[0],) + v.shape[1:], v.dtype)
            a[:len(rows)] = v[rows]
            out[k] = a
        return out


class BatchPlan:
    """The micro-batches and updates of one batch plan (batch size, accumulation, epochs, seed): shared by every
    grid point with these settings (the paper's 6 λ combinations at each of the 9 (batch, accumulation) pairs).

    Layouts. Every micro-batch is built in the **padded** layout, ``(batch_size, block_size)`` token rows plus the
    method's per-example trigger arrays (``(B, L, P)``, ``(B, N, L)``, …), whose meaning never changes. In the
    **packed** layout (the default of the trainer) it also carries two gather indices (:func:`pack_index`):
    ``pack`` ``(R, Lp)`` puts the real tokens of its examples side by side into ``R`` rows of ``Lp`` slots (the
    step runs GPT-2 on those rows with a block-diagonal causal mask and positions restarting per example), and
    ``unpack`` ``(B, L)`` brings the final hidden states back to the padded layout for the losses
    (:mod:`rbjax.train.lm`). Batch size stays "examples per micro-batch". The packed shapes are static: before
    training, the need ``(rows, slots)`` of every update of the whole plan (all epochs) is computed and at most
    ``max_shapes`` shapes are chosen for it (:func:`choose_packed_shapes`), so a plan compiles at most that many
    programs and nothing recompiles per batch.

    Args:
        data: the run's examples: :class:`ArrayData` or an object with its attributes (``ids``, ``mask``,
            ``n_examples``, ``pad_id``, ``triggers(ids, mask, rows)``), e.g. :class:`rbjax.debias.data.TrainingData`.
        batch_size, grad_accum, epochs, seed, leftover, max_steps: see :class:`rbjax.train.config.TrainerConfig`.
        layout: ``packed`` or ``padded`` (default; the trainer passes ``TrainerConfig.layout``).
        rows: packed rows of every micro-batch (default: chosen for the plan by :func:`choose_rows`).
            max_shapes: packed shapes per plan, at most.
        compile_slots: the compile time of one program, in token slots of computation (:func:`compile_slots`; 0:
            the plan takes every shape up to ``max_shapes`` that saves slots).
        attention_slots: the attention's cost as a row length (:func:`attention_slots`; ``inf``, the default:
            slots alone count, so every micro-batch takes one row).
        exchangeable: the objective's loss of a micro-batch is the mean of one loss per example (DST's BCE:
            ``Objective.exchangeable``), so an update's gradient, the mean of its micro-batches' losses, is the
            mean over its examples however they are grouped, as long as every micro-batch stays full. The packed
            layout then deals the examples of each update whose micro-batches are all full anew into its
            micro-batches and rows at once (:func:`deal_update`), where that needs a shorter packed shape than
            packing each micro-batch alone; :meth:`batch_rows` gives the examples a micro-batch then holds. The
            update's examples, its gradient without dropout and its loss are unchanged; dropout masks fall on
            other slots.

    Attributes:
        n_batches: micro-batches per epoch. plan: ``plan[u]`` = ``[(epoch, batch_index), ...]`` of update u.
        t_total: schedule length in updates. shapes: the packed ``(R, Lp)`` shapes (``[]`` when padded).

    Raises:
        ValueError: unknown layout; fewer micro-batches than ``grad_accum``.
    """

    @classmethod
    def of_run(cls, data, cfg, **kw) -> "BatchPlan":
        """The plan of a run's settings ``cfg`` (:class:`rbjax.train.config.TrainerConfig`: batch size,
        accumulation, epochs, seed, leftover rule, ``max_steps``, layout); ``kw``: ``rows``, ``max_shapes``,
        ``compile_slots``, ``attention_slots``, ``exchangeable``."""
        return cls(data, cfg.batch_size, cfg.grad_accum, cfg.epochs, cfg.seed, cfg.resolved_leftover, cfg.max_steps,
                   layout=cfg.layout, **kw)

    def __init__(self, data, batch_size: int, grad_accum: int, epochs: int, seed: int,
                 leftover: str = "drop", max_steps: int | None = None, *, layout: str = "padded",
                 rows: int | None = None, max_shapes: int = PACKED_SHAPES, compile_slots: float = 0.0,
                 attention_slots: float = float("inf"), exchangeable: bool = False):
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        self.data = data
        self.layout = layout
        self.batch_size, self.grad_accum, self.seed = int(batch_size), int(grad_accum), int(seed)
        self.n_batches = -(-data.n_examples // self.batch_size)
        self.plan, self.t_total = update_plan(self.n_batches, self.grad_accum, epochs, leftover, max_steps)
        self._perms: dict[int, np.ndarray] = {}
        self._cache: dict[tuple[int, int], dict[str, np.ndarray]] = {}
        self._lengths = np.asarray(data.mask, np.int64).sum(axis=1)
        self._dealt: dict[tuple[int, int], np.ndarray] = {}  # (epoch, index) → its examples, dealt anew
        self.rows = 1
        self.shapes: list[tuple[int, int]] = []
        self._update_shape: list[tuple[int, int]] = []
        if layout == "packed":
            index: dict[tuple[int, int], int] = {}
            for mbs in self.plan:
                for m in mbs:
                    index.setdefault(m, len(index))
            lengths = [self._lengths[self.batch_rows(e, b)] for e, b in index]
            updates = [[index[m] for m in mbs] for mbs in self.plan]
            # an update may be dealt anew when its loss allows it and each of its micro-batches is full
            deal = [bool(exchangeable) and all(len(x) == self.batch_size and x.min() > 0
                                                for x in (lengths[i] for i in u)) for u in updates]
            if rows is None:
                self.rows, self.shapes = choose_rows(lengths, updates, max_shapes, compile_slots, attention_slots,
                                                     deal=deal)
            else:
                if int(rows) < 1:
                    raise ValueError(f"rows must be >= 1, got {rows}")
                self.rows = int(rows)
                self.shapes = choose_packed_shapes([update_need(lengths, u, self.rows, d)[0]
                                                    for u, d in zip(updates, deal)],
                                                   [len(u) for u in updates], max_shapes, compile_slots,
                                                   attention_slots)
            needs = []
            for mbs, u, d in zip(self.plan, updates, deal):
                need, dealt = update_need(lengths, u, self.rows, d)
                needs.append(need)
                if dealt is not None:
                    examples = np.concatenate([self.batch_rows(e, b) for e, b in mbs])
                    for (e, b), mb_rows in zip(mbs, dealt):  # (packed again into these rows: deal_update)
                        self._dealt[(e, b)] = examples[sorted(i for row in mb_rows for i in row)]
            self._update_shape = [next(s for s in self.shapes if s >= n) for n in needs]

    def epoch_rows(self, epoch: int) -> np.ndarray:
        p = self._perms.get(epoch)
        if p is None:
            p = self._perms[epoch] = epoch_permutation(self.data.n_examples, self.seed, epoch)
        return p

    def batch_rows(self, epoch: int, index: int) -> np.ndarray:
        """Example indices of micro-batch ``index`` of ``epoch`` (those dealt to it, when its update's examples
        were dealt anew)."""
        dealt = self._dealt.get((epoch, index))
        if dealt is not None:
            return dealt
        B = self.batch_size
        return self.epoch_rows(epoch)[index * B:(index + 1) * B]

    def dealt(self) -> int:
        """How many micro-batches hold examples dealt anew within their update (``exchangeable``)."""
        return len(self._dealt)

    def make_batch(self, rows: np.ndarray, shape: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
        """Host batch of examples ``rows``: ``(batch_size, block_size)`` ids/mask (empty filler rows) + triggers;
        packed layout: also ``pack``/``unpack`` for ``shape`` (default: the micro-batch's own need)."""
        d = self.data
        B, Lb = self.batch_size, d.ids.shape[1]
        ids = np.full((B, Lb), d.pad_id, np.int32)
        mask = np.zeros((B, Lb), np.int32)
        ids[:len(rows)] = d.ids[rows]
        mask[:len(rows)] = d.mask[rows]
        out = {"input_ids": ids, "attention_mask": mask, **d.triggers(ids, mask, rows)}
        if self.layout == "packed":
            lengths = mask.sum(axis=1)
            members = pack_micro_batch(lengths, self.rows)
            shape = shape or packed_need(lengths, self.rows)
            out["pack"], out["unpack"] = pack_index(mask, members, shape)
        return out

    def micro_batch(self, epoch: int, index: int, shape: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
        """Micro-batch ``index`` of ``epoch`` with its dropout key (``rng``), built once and cached (a grid chunk
        smaller than the plan's λ combinations goes over the same stream again); packed in ``shape``."""
        k = (epoch, index, shape)
        b = self._cache.get(k)
        if b is None:
            b = self.make_batch(self.batch_rows(epoch, index), shape)
            b["rng"] = dropout_key(self.seed, epoch, index)
            self._cache[k] = b
        return b

    def update_shape(self, u: int) -> tuple[int, int] | None:
        """The packed ``(R, Lp)`` shape of update ``u`` (``None`` when padded)."""
        return self._update_shape[u] if self._update_shape else None

    def update_batch(self, u: int) -> dict[str, np.ndarray]:
        """The micro-batches of update ``u`` stacked on a leading axis: arrays ``(A_u, B, ...)``, A_u = their
        number (``grad_accum``, more for a reference-semantics update that carries an epoch's leftovers); packed:
        ``pack`` ``(A_u, R, Lp)`` in the update's shape."""
        shape = self.update_shape(u)
        mbs = [self.micro_batch(e, b, shape) for e, b in self.plan[u]]
        return {k: np.stack([m[k] for m in mbs]) for k in mbs[0]}

    def tokens(self, u: int) -> int:
        """Real tokens in update ``u``."""
        return int(sum(self._lengths[self.batch_rows(e, b)].sum() for e, b in self.plan[u]))

    def slots(self, u: int) -> int:
        """Token slots the step computes for update ``u`` (real + padding)."""
        s = self.update_shape(u)
        per = self.batch_size * int(self.data.ids.shape[1]) if s is None else s[0] * s[1]
        return per * len(self.plan[u])

    def real_fraction(self) -> float:
        """Real tokens / computed slots over the whole plan."""
        return sum(self.tokens(u) for u in range(len(self.plan))) / max(1, sum(self.slots(u)
                                                                              for u in range(len(self.plan))))
