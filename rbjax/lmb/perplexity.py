"""Per-phrase perplexity under a causal LM of any supported family (GPT-2 as in paper §3.1), jit-compiled, packed and batched.

Perplexity of a phrase with tokens x_1..x_n is ``exp(mean_{j=2..n} -log p(x_j | x_<j))``:
the mean next-token negative log-likelihood (natural log) over tokens 2..n, exactly as
the reference's ``perplexity_score`` computes it (HF GPT-2 loss with ``labels=ids``, no
BOS/EOS added). With a ``bos_id`` (the model's tokenizer adds a BOS — Llama, Mistral,
Gemma — or ``--bos``; GPT-2's is ``<|endoftext|>``) the BOS is prepended as context and
all n tokens are scored (docs/lmb.md). A phrase with fewer than 2 scorable tokens has no perplexity: it is
reported as unscorable (NaN, ``n_scored == 0``), never as 0 (the reference's fallback).

**Context tokens** (the chat format, docs/chat.md): ``n_context`` gives, per phrase, how many leading tokens are
context only — a chat template's BOS, role headers, system prompt and earlier turns. They are run (the phrase is
conditioned on them) but never scored; every token after them is, the first one predicted by the last context token.
No BOS is added to such a phrase: the context holds whatever the template put first.

How the work is cut down, each step exact in float32:

* **Pairs share their prefix.** A biased phrase and its counterfactual usually agree up to the target term.
  :meth:`PerplexityScorer.score_pairs` lays a pair out as one *tree* ``[common prefix | rest of the biased
  phrase | rest of the counterfactual]``: the prefix is run once, and each branch attends to the prefix's keys
  and values and to its own earlier tokens, never to the other branch (a tree attention mask, with position ids
  continuing from the prefix in both branches). This is the prefix-KV-cache computation in one pass: the
  prefix's keys/values are computed once and both suffixes continue from them. The last prefix position
  predicts the first token of both branches from one log-sum-exp.
* **Packing, little padding.** Trees (or single phrases) are packed into rows of ``row_len`` slots (best-fit
  decreasing; 98 % of the slots are used on the RedditBias test split); a block mask keeps them apart and
  position ids restart in each. The row length is the cheapest of a few candidates (32 … 256 slots) by a
  FLOP model; a run compiles one program per (row length, rows per batch): the full batch and, for the last
  batch, the smallest multiple of a quarter batch that holds the rest — not one per phrase length.
* **A context shared by every phrase is run once per row.** In the chat format every phrase starts with the same
  template prefix (10–40 tokens). When all the sequences of a call share a leading context of K+1 tokens or more,
  its first K tokens are laid once at the start of every packed row and every tree in the row attends to them
  (position ids continue from K in each tree), instead of being repeated in each tree. The last shared token stays
  in each tree, so that what it predicts — the phrase's first token — belongs to the tree.
* **LM head only where a token is predicted.** The last token of each phrase and the empty slots predict
  nothing; the predicting slots of each row are gathered into a packed ``(rows, head_slots)`` array before the
  chunked log-sum-exp (:mod:`rbjax.model.nll`).
* **No slot for a phrase's last token.** It is only a target: its state predicts nothing and no later token of
  its branch attends to it, so a tree's branch ends at the token before it (the states of every other slot are
  those of the whole phrase: attention is causal). The exceptions keep one slot where there would be none: a
  phrase of a single token (with nothing scored) and a continuation without tokens.

Precision is a setting: ``"fp32"`` (default, parity with PyTorch: matmuls at ``"highest"`` so GPU/TPU do not
use TF32/bf16 passes) or ``"bf16"`` (bf16 matmul inputs, float32 accumulation, float32 residual stream,
LayerNorm, softmax and log-sum-exp; float32 parameters, cast once per scorer). Results record the precision.

Several models at once: ``stacked=True`` takes parameters with a leading model axis M (``jax.tree.map(lambda
*x: jnp.stack(x), *params_list)``) and ``jax.vmap``\\ s the program over them, one pass over the token batches.
With several devices the batch rows are sharded over all of them (a 1-D ``Mesh`` named ``data``).
"""
from __future__ import annotations

import copy
import dataclasses
import math
from functools import partial
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rbjax.core.compilation import abstract
from rbjax.core.interrupt import poll
from rbjax.core.mesh import batch_axes, mesh_sizes, tree_shardings
from rbjax.core.precision import PRECISIONS, get_policy  # noqa: F401 (PRECISIONS: the accepted names)
from rbjax.model.gpt2 import position_ids_from_mask
from rbjax.model.layers import gather_positions
from rbjax.model.nll import HEAD_CHUNK, chunked_logsumexp, next_token_nll, nll_from_hidden
from rbjax.model.registry import family_of_config
from rbjax.model.partition import logical_axes_for

__all__ = ["PerplexityScorer", "PhraseScores", "PhraseError", "token_nll", "chunked_logsumexp", "PRECISIONS",
           "HEAD_CHUNK", "SLOTS_PER_PHRASE", "common_prefix_length"]


#: a batch holds ``batch_size × SLOTS_PER_PHRASE`` token slots (``batch_size`` is a nominal phrase count: RedditBias
#: phrases have 13 tokens on average, a pair tree ≈ 22 slots)
SLOTS_PER_PHRASE = 16
#: candidate row lengths (slots); a run takes the cheapest of the (up to three) shortest that hold its longest
#: phrase or pair tree, by a FLOP model of body, attention and LM head; longer trees: multiples of 64
ROW_LENGTHS = (32, 48, 64, 96, 128, 192, 256)
#: the segment id of a row's shared context slots
ROW_CONTEXT = -2
#: a shared context shorter than this is left in the trees (not worth a row's slots)
MIN_ROW_CONTEXT = 4


@partial(jax.jit, static_argnames=("config", "precision"))
def token_nll(params, input_ids, attention_mask, config, precision: str = "fp32"):
    """Summed next-token NLL and scored-token count per row of a padded batch.

    Works for right- or left-padded rows (positions are counted from the first real
    token). Target j is scored when tokens j-1 and j are both real. The NLL is
    :func:`rbjax.model.nll.next_token_nll` (chunked log-sum-exp, float32).

    Args:
        params: the model's params pytree (any family of :mod:`rbjax.model.registry`).
        input_ids: int32 (B, L).
        attention_mask: int32 (B, L), 1 for real tokens.
        config: the static model config (its family gives the module, LM head and logit soft-cap). precision: ``"fp32"`` or ``"bf16"`` compute.
    Returns:
        ``(nll_sum, n_scored)``: float32 (B,) in nats, int32 (B,).
    """
    policy = get_policy(precision)
    dt = policy.compute_dtype
    fam = family_of_config(config)
    with policy.matmul_context():
        model = fam.module(config, dtype=dt)
        pos = position_ids_from_mask(attention_mask)
        _, hidden = model.apply({"params": params}, input_ids, attention_mask=attention_mask, position_ids=pos,
                                return_logits=False)
        nll, m = next_token_nll(hidden, fam.lm_head(params), input_ids, attention_mask, compute_dtype=dt,
                                softcap=fam.logit_softcap(config))
    return nll.sum(-1), m.sum(-1).astype(jnp.int32)


def tree_attention_mask(seg, br):
    """The packed rows' attention mask, the causal (slot order) mask left to the model: a tree sees its prefix and
    its own branch, and the row's shared context (``seg == ROW_CONTEXT``).

    Args:
        seg, br: int32 (R, L) tree id and branch of each slot (:func:`_packed_nll`).
    Returns:
        bool (R, L, L): query slot × key slot.
    """
    same = seg[:, :, None] == seg[:, None, :]
    bq, bk = br[:, :, None], br[:, None, :]
    return (same & ((bk == 0) | (bk == bq))) | (seg[:, None, :] == ROW_CONTEXT)


def _packed_nll(params, head_emb, ids, pos, seg, br, pidx, tgt, *, config, precision: str):
    """NLL of the predicting slots of a packed batch.

    Args:
        params: the model's params (kernels may already be in the compute dtype). head_emb: (V, d) LM-head
            embedding (``Family.lm_head(params)``).
        ids, pos: int32 (R, L) tokens and position ids. seg: int32 (R, L) tree id of each slot within its row
            (−1 for empty slots, ``ROW_CONTEXT`` (−2) for the row's shared context, which every slot may attend to). br: int32 (R, L) branch (0 = shared prefix / whole phrase, 1 and 2 = the two
            continuations of a pair).
        pidx: int32 (R, P) slot index of each predicting slot (packed; extra entries are ignored by the caller).
        tgt: int32 (R, P, 2) the token(s) each predicting slot predicts (two at a pair's branch point).
    Returns:
        float32 (R, P, 2) NLL in nats.
    """
    policy = get_policy(precision)
    dt = policy.compute_dtype
    allowed = tree_attention_mask(seg, br)
    fam = family_of_config(config)
    with policy.matmul_context():
        model = fam.module(config, dtype=dt)
        _, hidden = model.apply({"params": params}, ids, attention_mask=allowed, position_ids=pos,
                                return_logits=False)
        h = gather_positions(hidden, pidx)  # (R, P, d): only positions that predict a token
        return nll_from_hidden(h, head_emb, tgt, compute_dtype=dt, softcap=fam.logit_softcap(config))


_packed_nll_jit = jax.jit(_packed_nll, static_argnames=("config", "precision"))
@partial(jax.jit, static_argnames=("config", "precision"))
def _packed_nll_models(params, head_emb, ids, pos, seg, br, pidx, tgt, *, config, precision: str):
    """:func:`_packed_nll` for M models at once: params/head_emb with a leading model axis -> (M, R, P, 2)."""
    fn = partial(_packed_nll, config=config, precision=precision)
    return jax.vmap(fn, in_axes=(0, 0, None, None, None, None, None, None))(params, head_emb, ids, pos, seg, br,
                                                                            pidx, tgt)


class PhraseError(ValueError):
    """A phrase that cannot be scored; ``index`` is its position in the input list, ``side`` ``"biased"`` or
    ``"counterfactual"`` for :meth:`PerplexityScorer.score_pairs` (else ``None``)."""

    def __init__(self, index: int, message: str, side: str | None = None):
        super().__init__(f"{side + ' ' if side else ''}phrase {index}: {message}")
        self.index = index
        self.problem = message
        self.side = side


@dataclasses.dataclass(frozen=True)
class PhraseScores:
    """Scores of a list of phrases, in input order.

    Attributes:
        mean_nll: float64 (N,), mean next-token NLL in nats (NaN when unscorable).
        n_scored: int (N,), number of scored tokens (0 = unscorable).
        n_tokens: int (N,), phrase length in tokens (without an added BOS or the context tokens).
        nll_sum: float64 (N,), summed next-token NLL in nats (0 when unscorable); corpus-level
            estimators (e.g. LMP) pool these.
        precision: the compute precision that produced them (``"fp32"`` or ``"bf16"``).
    """

    mean_nll: np.ndarray
    n_scored: np.ndarray
    n_tokens: np.ndarray
    nll_sum: np.ndarray
    precision: str = "fp32"

    @property
    def perplexity(self) -> np.ndarray:
        """exp(mean NLL); NaN for unscorable phrases."""
        return np.exp(self.mean_nll)

    @property
    def scorable(self) -> np.ndarray:
        return self.n_scored > 0


class BatchTargets:
    """The predicting slots of a packed batch and, for each target read there, the phrase its NLL goes to: filled
    tree by tree (:meth:`read`), then the batch's NLLs summed per phrase (:meth:`add_to`). Both scorers' batches
    (:class:`PerplexityScorer`, :class:`rbjax.lmb.self_debias.SelfDebiasScorer`) read their targets so.

    Attributes:
        pidx: int32 (R, P) the slot of each predicting position of a row. tgt: int32 (R, P, 2) the token(s) it
            predicts (two at a pair's branch point).
    """

    def __init__(self, R: int, P: int):
        self.pidx = np.zeros((R, P), np.int32)
        self.tgt = np.zeros((R, P, 2), np.int32)
        self._where = []  # (row, position, target k, biased owner, counterfactual owner); owner −1: nobody

    def read(self, tree: "_Tree", r: int, j: int, off: int) -> int:
        """Record the targets of ``tree``, laid at slot ``off`` of row ``r``, from predicting position ``j`` on;
        returns the next free position."""
        for slot, targets in tree.pred:
            self.pidx[r, j] = off + slot
            for k, (tok, oa, oc) in enumerate(targets):
                self.tgt[r, j, k] = tok
                self._where.append((r, j, k, oa, oc))
            j += 1
        return j

    def add_to(self, nll, sums: np.ndarray, counts: np.ndarray) -> None:
        """Add the batch's NLLs, float (M, R, P, 2) for M models, to each owner's ``sums`` (2, M, n) (side 0:
        biased, 1: counterfactual) and count them in ``counts`` (2, n)."""
        w = np.asarray(self._where, np.int64).reshape(-1, 5)
        vals = nll[:, w[:, 0], w[:, 1], w[:, 2]]  # (M, items)
        for side in (0, 1):
            owners = w[:, 3 + side]
            ok = owners >= 0
            for m in range(vals.shape[0]):
                np.add.at(sums[side, m], owners[ok], vals[m, ok])
            np.add.at(counts[side], owners[ok], 1)


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclasses.dataclass
class _Tree:
    """One packed unit: a prefix and up to two branches, with what each predicting slot predicts."""

    ids: list       # slot tokens: prefix, branch 1, branch 2
    pos: list       # position ids
    br: list        # branch of each slot
    pred: list      # [(slot, [(target, owner_a, owner_c), ...])] — owners are phrase indices or -1
    n_phrases: int  # phrases this tree scores (for progress)
    n_alone: int    # tokens its phrases have when each is run on its own

    @property
    def size(self) -> int:
        return len(self.ids)


def _single_tree(seq: list, i: int, first: int = 1, skip: int = 0) -> _Tree:
    """One phrase: slot j predicts token j+1 when j+1 >= ``first`` (the first scored token); the tree starts at
    token ``skip`` of the sequence (the tokens before it are the row's shared context) and ends before its last
    token (a target only; kept when it would leave the tree empty)."""
    end = len(seq) - 1 if len(seq) - skip >= 2 else len(seq)
    ids = list(seq[skip:end])
    return _Tree(ids=ids, pos=list(range(skip, end)), br=[0] * len(ids),
                 pred=[(j - skip, [(seq[j + 1], i, -1)]) for j in range(max(first - 1, skip), len(seq) - 1)],
                 n_phrases=1, n_alone=len(seq))


def _pair_tree(a: list, c: list, i: int, fa: int = 1, fc: int = 1, skip: int = 0) -> _Tree:
    """A biased phrase and its counterfactual sharing their common prefix; ``fa``/``fc``: the first scored token
    of each (targets before it are context, owned by nobody); ``skip`` as :func:`_single_tree`. Each branch ends
    before its phrase's last token (a target only); the prefix is kept whole."""
    p = common_prefix_length(a, c)
    ea, ec = (len(a) - 1 if len(a) > p else p), (len(c) - 1 if len(c) > p else p)  # branch ends (exclusive)
    ids = a[skip:p] + a[p:ea] + c[p:ec]
    pos = list(range(skip, p)) + list(range(p, ea)) + list(range(p, ec))
    br = [0] * (p - skip) + [1] * (ea - p) + [2] * (ec - p)
    pred = []
    for j in range(skip, p - 1):  # inside the prefix: one target, both phrases (each from its first scored token)
        oa, oc = (i if j + 1 >= fa else -1), (i if j + 1 >= fc else -1)
        if oa >= 0 or oc >= 0:
            pred.append((j - skip, [(a[j + 1], oa, oc)]))
    if p >= 1:  # the branch point: one state, up to two targets
        t = ([(a[p], i, -1)] if len(a) > p and p >= fa else []) + ([(c[p], -1, i)] if len(c) > p and p >= fc else [])
        if t:
            pred.append((p - 1 - skip, t))
    off = p - skip
    for seq, e, f, own in ((a, ea, fa, (i, -1)), (c, ec, fc, (-1, i))):
        n = len(seq) - p
        pred += [(off + k, [(seq[p + k + 1], *own)]) for k in range(n - 1) if p + k + 1 >= f]
        off += e - p
    return _Tree(ids=ids, pos=pos, br=br, pred=pred, n_phrases=2, n_alone=len(a) + len(c))


def _choice_tree(ctx: list, conts: Sequence[list], owners: Sequence[int], skip: int = 0) -> _Tree:
    """A context and its k continuations (multiple choice): the context but its last token is run once (branch 0);
    continuation b is branch b, laid out as ``[last context token] + continuation`` with position ids continuing
    from the context, so that each branch predicts its own first token from its own copy of the last context
    token (attending to the shared part and to itself only: the same keys and values as the context followed by
    that continuation alone), ending before the continuation's last token (a target only). ``owners``: the flat
    index each continuation's sums go to; ``skip`` as :func:`_single_tree`."""
    n = len(ctx)
    ids, pos, br, pred = list(ctx[skip:n - 1]), list(range(skip, n - 1)), [0] * (n - 1 - skip), []
    off = n - 1 - skip
    for b, (t, own) in enumerate(zip(conts, owners), start=1):
        seq = [ctx[-1], *t]
        run = seq[:-1] if t else seq  # the last token is a target only
        ids += run
        pos += list(range(n - 1, n - 1 + len(run)))
        br += [b] * len(run)
        pred += [(off + k, [(seq[k + 1], own, -1)]) for k in range(len(t))]
        off += len(run)
    return _Tree(ids=ids, pos=pos, br=br, pred=pred, n_phrases=len(conts), n_alone=sum(n + len(t) for t in conts))


def _row_context(seqs: Sequence[list], firsts: Sequence[int]) -> int:
    """K: the leading tokens every sequence shares and none scores, less the last of them (it stays in each tree to
    predict the first scored token); 0 when shorter than :data:`MIN_ROW_CONTEXT`."""
    if not seqs:
        return 0
    k = min(firsts) - 1
    ref = seqs[0]
    for s in seqs[1:]:
        k = min(k, common_prefix_length(ref, s))
        if k < MIN_ROW_CONTEXT:
            return 0
    k = min(k, len(ref))
    return k if k >= MIN_ROW_CONTEXT else 0


def _pack(sizes: np.ndarray, preds: np.ndarray, row_len: int, head_slots: int) -> list[list[int]]:
    """Best-fit decreasing bin packing of trees into rows (≤ ``row_len`` slots, ≤ ``head_slots`` predicting).

    Returns:
        rows, each a list of tree indices.
    """
    order = np.argsort(-sizes, kind="stable")
    rows: list[list[int]] = []
    free_s: list[int] = []
    free_p: list[int] = []
    by_free: list[list[int]] = [[] for _ in range(row_len + 1)]  # free slots -> rows (lazy: checked on use)
    for t in order:
        s, q = int(sizes[t]), int(preds[t])
        chosen = -1
        for f in range(s, row_len + 1):
            bucket = by_free[f]
            for k in range(len(bucket) - 1, -1, -1):
                r = bucket[k]
                if free_s[r] != f:  # stale entry
                    bucket.pop(k)
                    continue
                if free_p[r] >= q:
                    chosen = r
                    bucket.pop(k)
                    break
            if chosen >= 0:
                break
        if chosen < 0:
            chosen = len(rows)
            rows.append([])
            free_s.append(row_len)
            free_p.append(head_slots)
        rows[chosen].append(int(t))
        free_s[chosen] -= s
        free_p[chosen] -= q
        by_free[free_s[chosen]].append(chosen)
    return rows


def _head_slots(L: int, frac: float = 1.0) -> int:
    """LM-head slots per row of ``L`` slots when a fraction ``frac`` of the trees' slots predict a token: that
    share of the row and a margin of ``max(2, L // 32)`` for rows whose trees predict more than the average, at
    most ``L`` (the packer respects the limit). Trees run no slot for a phrase's last token, so without context
    tokens every slot predicts (``frac`` 1: the head takes the whole row)."""
    return min(L, math.ceil(frac * L) + max(2, L // 32))


def _plan_rows(sizes: np.ndarray, preds: np.ndarray, config, row_len: int | None, shared: int = 0):
    """Choose the row length, pack, return ``(L, P, rows)``; each row starts with ``shared`` context slots."""
    longest = int(sizes.max()) + shared
    if row_len is not None:
        cands = [max(int(row_len), -(-longest // 16) * 16)]
    else:  # the shortest three that fit; with a row context all that fit (a longer row spreads the context over
        # more trees, at little attention cost)
        cands = [c for c in ROW_LENGTHS if c >= longest][:None if shared else 3] or [-(-longest // 64) * 64]
    d, V, nl = config.hidden_size, config.vocab_size, config.num_layers
    frac = float(preds.sum()) / max(1, int(sizes.sum()))
    best = None
    for L in cands:
        P = max(_head_slots(L - shared, frac), int(preds.max()))
        rows = _pack(sizes, preds, L - shared, P)
        cost = len(rows) * (L * nl * (24 * d * d + 4 * L * d) + P * 2 * d * V)
        if best is None or cost < best[0]:
            best = (cost, L, P, rows)
    return best[1:]


def _placed_like(where):
    """``x -> ShapeDtypeStruct`` of ``x`` placed on ``where`` (a device or a sharding): the abstract value of an
    array that :func:`jax.device_put` puts there."""
    sharding = jax.sharding.SingleDeviceSharding(where) if isinstance(where, jax.Device) else where
    return lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


def _cast_for_compute(params, dt):
    """Matmul kernels in the compute dtype (cast once); LayerNorm, biases and embeddings stay float32."""
    if dt == jnp.float32:
        return params

    def cast(path, x):
        return x.astype(dt) if getattr(path[-1], "key", None) == "kernel" else x

    return jax.tree_util.tree_map_with_path(cast, params)


class PerplexityScorer:
    """Scores token-id sequences (or biased/counterfactual pairs) with a causal LM, packed and jit-compiled.

    Args:
        params: the model's params (any family of :mod:`rbjax.model.registry`; numpy or jax arrays; moved to the device(s) once). With ``stacked=True`` every leaf
            has a leading model axis M and results are per model.
        config: the model's config (its family gives the module, the LM head ``Family.lm_head`` — untied where
            the checkpoint has one — and the final-logit soft-cap).
        batch_size: nominal phrases per compiled batch: a batch holds about ``batch_size × 16`` token slots
            (:data:`SLOTS_PER_PHRASE`), i.e. ``max(1, batch_size·16 // row_len)`` packed rows, rounded up to a
            multiple of the device count when batches are sharded. 64 (1,024 slots) suits a CPU; accelerators
            want more.
        row_len: token slots per packed row. Default: chosen per call among :data:`ROW_LENGTHS` (32 … 256) by the
            FLOP model: the cheapest of the shortest three that hold the longest phrase or pair tree (with a row
            context: of all that hold it and the context); an int fixes it (raised, in steps of 16, to fit the
            longest).
        bos_id: when given, prepend this id (e.g. 50256) and score every phrase token.
        precision: ``"fp32"`` (default; matmuls at ``"highest"``) or ``"bf16"`` (bf16 matmul inputs, float32
            accumulation / softmax / log-sum-exp; see the module docstring).
        stacked: params carry a leading model axis; ``score_*`` then return one result per model.
        devices: devices to shard the batch rows over (default: this process's devices of the default backend;
            one device means no sharding).
        mesh: a named mesh (:func:`rbjax.core.mesh.make_mesh`; replaces ``devices``): the parameters are placed by
            the family's logical axes (``fsdp`` / ``tensor`` split them, :mod:`rbjax.model.partition`), the rows
            split over ``data`` × ``fsdp``; results equal the unsharded ones to float32 rounding.
        param_dtype: ``"fp32"`` (default) or ``"bf16"``: the parameters are *stored* in bf16 (half the memory) and
            promoted to the compute dtype inside every matmul; accumulation, residual stream, LayerNorm, softmax
            and log-sum-exp stay float32 as with ``precision``. The effect is that of rounding every weight to
            bf16 (measured in docs/scale.md).

    Attributes:
        programs: the distinct compiled program signatures this scorer has used (``len(programs)`` is its
            compile count).
        last_stats: token accounting of the last call, for benchmarks: ``phrase_tokens`` (tokens of the scored
            phrases, each counted on its own), ``slots_run`` (tokens the body actually runs: shared prefixes once),
            ``slots_total`` (slots of the compiled batches, padding included), ``predicting`` (positions that
            predict a token), ``head_rows`` (positions the LM head processes), ``batches``, ``rows``, ``row_context``
            (the context slots every row starts with).
    """

    def __init__(self, params, config, batch_size: int = 64, bos_id: int | None = None,
                 precision: str = "fp32", *, row_len: int | None = None, stacked: bool = False,
                 devices: Sequence | None = None, mesh=None, param_dtype: str = "fp32"):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if row_len is not None and row_len < 2:
            raise ValueError(f"row_len must be >= 2, got {row_len}")
        self.config = config
        self.policy = get_policy(precision, param_dtype)  # compute dtype and parameter storage (unknown names refused)
        self.precision = precision
        self.dtype = self.policy.compute_dtype
        self.bos_id = bos_id
        self.row_len = None if row_len is None else int(row_len)
        self.stacked = bool(stacked)
        self.param_dtype = param_dtype
        # parameters given as jax.ShapeDtypeStruct: an abstract scorer, for compile_programs (nothing on a device)
        self.abstract = any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(params))
        if self.abstract:
            params = jax.eval_shape(self.policy.cast_for_storage, params)
        else:
            params = self.policy.cast_for_storage(params)  # (on the host, or where a mesh's slices lie)
        # this process's devices: in a multi-host job every host scores on its own devices (a mesh over other
        # hosts' devices would give arrays this process cannot read)
        devs = list(devices) if devices is not None else jax.local_devices()
        self.n_devices = len(devs)
        self.mesh = None
        self._layout = None
        if mesh is not None:
            from jax.sharding import NamedSharding, PartitionSpec

            self.mesh = mesh
            rows = batch_axes(mesh, math.prod(mesh_sizes(mesh)[a] for a in ("data", "fsdp")))
            self.n_devices = math.prod(mesh_sizes(mesh)[a] for a in rows)  # row shards (R is a multiple)
            self._rows_sharding = NamedSharding(mesh, PartitionSpec(rows if rows else None))
            self._layout = tree_shardings(params, mesh, logical_axes_for(config), stacked=stacked)
            replicated = None
        elif self.n_devices > 1:
            from jax.sharding import Mesh, NamedSharding, PartitionSpec

            self.mesh = Mesh(np.array(devs), ("data",))
            self._rows_sharding = NamedSharding(self.mesh, PartitionSpec("data"))
            replicated = NamedSharding(self.mesh, PartitionSpec())
        else:
            replicated = devs[0]
        self.batch_size = int(batch_size)
        if self.stacked:
            leaves = jax.tree.leaves(params)
            self.n_models = int(leaves[0].shape[0]) if leaves else 0
            if any(x.shape[:1] != (self.n_models,) for x in leaves):
                raise ValueError("stacked params must all have the same leading model axis")
        else:
            self.n_models = None
        head = family_of_config(config).lm_head

        def head_emb(p):  # (V, d), stacked: (M, V, d)
            emb = jax.vmap(head)(p) if self.stacked else head(p)
            return emb.astype(self.dtype) if self.dtype != jnp.float32 else emb

        if self.abstract:  # shapes, dtypes and placements only
            if self._layout is not None:
                raise ValueError("an abstract scorer (shapes only) is not available on an fsdp/tensor mesh")
            at = _placed_like(replicated)
            self.params = jax.tree.map(at, params)
            self._compute_params = jax.tree.map(at, jax.eval_shape(partial(_cast_for_compute, dt=self.dtype),
                                                                   params))
            self._head_emb = at(jax.eval_shape(head_emb, params))
        else:
            params = jax.device_put(params, self._layout if self._layout is not None else replicated)
            self.params = params
            self._compute_params = _cast_for_compute(params, self.dtype)
            emb = head_emb(params)
            # placed where the parameters are (so that compile_programs knows every argument's placement)
            self._head_emb = emb if self._layout is not None else jax.device_put(emb, replicated)
        self.programs: set = set()
        self.last_stats: dict = {}

    # ------------------------------------------------------------------------------------------- public API
    def score_ids(self, token_ids: Sequence[Sequence[int]], progress: Callable[[int], None] | None = None, *,
                  n_context: Sequence[int] | None = None):
        """Score token-id lists.

        Args:
            token_ids: N phrases, each a list of token ids (no BOS; :attr:`bos_id` adds it).
            progress: called with a number of phrases as batches finish (N in all).
            n_context: per phrase, the number of its leading ids that are context only (module docstring): they
                are run, never scored, and no BOS is added. ``None``: the phrase alone (after :attr:`bos_id`).
        Returns:
            :class:`PhraseScores` (a list of M of them when ``stacked``).
        Raises:
            PhraseError: a phrase longer than ``config.max_positions`` or with an id outside the vocabulary.
            ValueError: ``n_context`` of another length, or a count outside ``[0, len(phrase)]``.
        """
        seqs, trees, shared = self._id_trees(token_ids, n_context)
        sums, counts = self._run(trees, len(seqs), progress, shared=shared)
        return self._results(sums[0], counts[0], seqs, n_context)

    def score_pairs(self, biased_ids: Sequence[Sequence[int]], counter_ids: Sequence[Sequence[int]],
                    progress: Callable[[int], None] | None = None, *,
                    n_context: tuple[Sequence[int], Sequence[int]] | None = None):
        """Score biased phrases and their counterfactuals together, sharing each pair's common token prefix.

        Equal to ``score_ids(biased_ids), score_ids(counter_ids)`` up to float rounding (tests: 1e-5 relative in
        fp32 on every pair of the RedditBias test split), with the shared prefix run once.

        Args:
            biased_ids, counter_ids: N token-id lists each; pair i is ``(biased_ids[i], counter_ids[i])``.
            progress: called with a number of phrases as batches finish (2N in all).
            n_context: ``(biased, counterfactual)`` context counts per phrase (:meth:`score_ids`), e.g. the chat
                template's prefix; a context common to the pair is part of its shared prefix, run once.
        Returns:
            ``(biased, counterfactual)`` :class:`PhraseScores` (with ``stacked``: two lists of M).
        Raises:
            ValueError: the lists differ in length. PhraseError (with ``side``): a phrase that cannot be scored.
        """
        (a, c), trees, shared = self._pair_trees(biased_ids, counter_ids, n_context)
        sums, counts = self._run(trees, len(a), progress, n_skipped_phrases=2, shared=shared)
        na, nc = (None, None) if n_context is None else n_context
        return self._results(sums[0], counts[0], a, na), self._results(sums[1], counts[1], c, nc)

    def score_choices(self, context_ids: Sequence[Sequence[int]], continuation_ids: Sequence[Sequence[Sequence[int]]],
                      progress: Callable[[int], None] | None = None) -> list[np.ndarray]:
        """Multiple choice: the total log-likelihood of each continuation of each context, every context run once
        for all its continuations (:func:`_choice_tree`; the pair scorer's shared prefix with k branches).

        Equal, up to float rounding, to scoring ``context + continuation`` for each continuation on its own and
        summing the log-probabilities of the continuation's tokens (lm-evaluation-harness's ``loglikelihood``).
        :attr:`bos_id` is not used: a context holds whatever start token its caller put first.

        Args:
            context_ids: N contexts, each a non-empty list of token ids.
            continuation_ids: per context, its k_i continuations (each a non-empty list of token ids).
            progress: called with a number of continuations as batches finish (Σ k_i in all).
        Returns:
            N float64 arrays, (k_i,) each: Σ log p(continuation token | context, earlier continuation tokens), nats.
        Raises:
            ValueError: the lists differ in length; the scorer is stacked. PhraseError (``index`` the context): an
                empty context or continuation, context + a continuation longer than ``config.max_positions``, an
                id outside the vocabulary.
        """
        if self.stacked:
            raise ValueError("score_choices scores one model (not a stacked scorer)")
        if len(context_ids) != len(continuation_ids):
            raise ValueError(f"{len(context_ids)} contexts but {len(continuation_ids)} continuation lists")
        max_pos, vmax = self.config.max_positions, self.config.vocab_size
        ctxs = [[int(x) for x in c] for c in context_ids]
        conts = [[[int(x) for x in t] for t in ts] for ts in continuation_ids]
        for i, (c, ts) in enumerate(zip(ctxs, conts)):
            if not c:
                raise PhraseError(i, "an empty context (it needs at least a start token)")
            if not ts or any(not t for t in ts):
                raise PhraseError(i, "no continuation, or one that encodes to no token")
            longest = len(c) + max(len(t) for t in ts)
            if longest > max_pos:
                raise PhraseError(i, f"{longest} tokens (context and its longest continuation), but the model takes "
                                     f"at most {max_pos}")
            if min(min(c), *(min(t) for t in ts)) < 0 or max(max(c), *(max(t) for t in ts)) >= vmax:
                raise PhraseError(i, f"a token id outside the model vocabulary [0, {vmax})")
        offs = np.cumsum([0] + [len(ts) for ts in conts])
        k = _row_context(ctxs, [len(c) for c in ctxs])
        trees = [_choice_tree(c, ts, range(offs[i], offs[i + 1]), k) for i, (c, ts) in enumerate(zip(ctxs, conts))]
        sums, counts = self._run(trees, int(offs[-1]), progress, shared=(ctxs[0][:k] if k else ()))
        want = np.array([len(t) for ts in conts for t in ts])
        if not np.array_equal(counts[0], want):  # every continuation token scored exactly once
            raise AssertionError("score_choices: a continuation token was not scored")
        ll = -sums[0, 0]
        return [ll[offs[i]:offs[i + 1]] for i in range(len(ctxs))]

    def score_texts(self, texts: Sequence[str], tokenizer, progress=None):
        """Tokenise (no special tokens, as the reference) and score ``texts``."""
        return self.score_ids(tokenizer.encode_batch(list(texts)), progress=progress)

    def score_text_pairs(self, biased: Sequence[str], counterfactual: Sequence[str], tokenizer, progress=None):
        """Tokenise and :meth:`score_pairs`."""
        return self.score_pairs(tokenizer.encode_batch(list(biased)), tokenizer.encode_batch(list(counterfactual)),
                                progress=progress)

    def with_bos(self, bos_id: int | None) -> "PerplexityScorer":
        """This scorer with another ``bos_id``: the same parameters on the same devices (nothing is copied), the
        compiled programs shared. A pair benchmark scores each sentence with lm-evaluation-harness's start token
        and, where that differs, as the model's tokenizer encodes it (:mod:`rbjax.lmb.pair_benchmark`)."""
        other = copy.copy(self)
        other.bos_id = bos_id
        other.last_stats = {}
        return other

    def with_row_len(self, row_len: int | None) -> "PerplexityScorer":
        """This scorer with another ``row_len`` (the class docstring; ``None``: chosen per call), the parameters and
        compiled programs shared as by :meth:`with_bos`. A pair benchmark scores its categories one by one with
        the row length chosen for all of them, so that a category's scores do not depend on which other
        categories are scored in the same run (an interrupted run resumed scores the same values)."""
        if row_len is not None and row_len < 2:
            raise ValueError(f"row_len must be >= 2, got {row_len}")
        other = copy.copy(self)
        other.row_len = None if row_len is None else int(row_len)
        other.last_stats = {}
        return other

    @property
    def compile_count(self) -> int:
        return len(self.programs)

    def program_shapes(self, token_ids: Sequence[Sequence[int]] | None = None, *,
                       pairs: tuple[Sequence[Sequence[int]], Sequence[Sequence[int]]] | None = None,
                       n_context=None) -> set[tuple[int, int, int]]:
        """The ``(rows, row_len, head_slots)`` of every batch that :meth:`score_ids` (``token_ids``) or
        :meth:`score_pairs` (``pairs=(biased_ids, counter_ids)``) would run on these phrases, without running them:
        the programs a later call needs (:meth:`compile_programs`).

        Raises:
            the errors of :meth:`score_ids` / :meth:`score_pairs` for phrases that cannot be scored.
        """
        if (token_ids is None) == (pairs is None):
            raise ValueError("give token_ids or pairs")
        if pairs is not None:
            _, trees, shared = self._pair_trees(pairs[0], pairs[1], n_context)
        else:
            _, trees, shared = self._id_trees(token_ids, n_context)
        live = [t for t in trees if t is not None]
        if not live:
            return set()
        L, P, batches = self._batches(live, len(shared))
        return {(r, L, P) for _, r in batches}

    def compile_programs(self, shapes) -> int:
        """Compile (ahead of time, ``jax.jit(...).lower(...).compile()``) the scoring program of each
        ``(rows, row_len, head_slots)`` in ``shapes`` (:meth:`program_shapes`) for this scorer's parameters,
        placement and precision, so that a later :meth:`score_ids` / :meth:`score_pairs` with the same shapes — by
        this scorer or by any scorer of parameters of the same shapes, dtypes and placement, e.g. one built from
        the trained parameters after a training run — compiles nothing. Works on an abstract scorer (parameters
        given as ``jax.ShapeDtypeStruct``). Returns the number of programs."""
        fn = _packed_nll_models if self.stacked else _packed_nll_jit
        rows = self._rows_sharding if self.mesh is not None else None
        params, head = abstract(self._compute_params), abstract(self._head_emb)
        n = 0
        for R, L, P in sorted(set(shapes)):
            def arr(*shape):
                return jax.ShapeDtypeStruct(shape, jnp.int32, sharding=rows)
            fn.lower(params, head, arr(R, L), arr(R, L), arr(R, L), arr(R, L), arr(R, P), arr(R, P, 2),
                     config=self.config, precision=self.precision).compile()
            n += 1
        return n

    # ------------------------------------------------------------------------------------------- internals
    def _prepare(self, token_ids, side, n_context=None):
        """``(sequences, first scored index of each)``: the BOS added (no context given), ids checked."""
        if n_context is None:
            seqs = [([self.bos_id] if self.bos_id is not None else []) + [int(x) for x in t] for t in token_ids]
            firsts = [1] * len(seqs)
        else:
            if len(n_context) != len(token_ids):
                raise ValueError(f"{len(n_context)} context counts for {len(token_ids)} phrases")
            seqs = [[int(x) for x in t] for t in token_ids]
            firsts = []
            for i, (s, k) in enumerate(zip(seqs, n_context)):
                if not 0 <= int(k) <= len(s):
                    raise ValueError(f"{side + ' ' if side else ''}phrase {i}: {k} context tokens of {len(s)}")
                firsts.append(max(1, int(k)))
        max_pos, vmax = self.config.max_positions, self.config.vocab_size
        for i, s in enumerate(seqs):
            if len(s) > max_pos:
                raise PhraseError(i, f"{len(s)} tokens, but the model takes at most {max_pos}", side)
            if s and (min(s) < 0 or max(s) >= vmax):
                raise PhraseError(i, f"a token id outside the model vocabulary [0, {vmax})", side)
        return seqs, firsts

    def _results(self, nll_sum, n_scored, seqs, n_context=None):
        """Per-phrase results; ``n_tokens`` counts a phrase's own tokens (no BOS added, no context)."""
        if n_context is None:
            n_tok = np.array([len(s) for s in seqs], np.int64) - (1 if self.bos_id is not None else 0)
        else:
            n_tok = np.array([len(s) - int(k) for s, k in zip(seqs, n_context)], np.int64)

        def one(s, c):
            with np.errstate(invalid="ignore", divide="ignore"):
                mean = np.where(c > 0, s / np.maximum(c, 1), np.nan)
            return PhraseScores(mean_nll=mean, n_scored=c.copy(), n_tokens=n_tok, nll_sum=s,
                                precision=self.precision)

        if self.stacked:
            return [one(nll_sum[m], n_scored) for m in range(nll_sum.shape[0])]
        return one(nll_sum[0], n_scored)

    def _id_trees(self, token_ids, n_context):
        """``(sequences, trees, shared context)`` of :meth:`score_ids`' phrases."""
        seqs, firsts = self._prepare(token_ids, None, n_context)
        live = [s for s, f in zip(seqs, firsts) if len(s) > f]
        k = _row_context(live, [f for s, f in zip(seqs, firsts) if len(s) > f])
        trees = [(_single_tree(s, i, f, k) if len(s) > f else None) for i, (s, f) in enumerate(zip(seqs, firsts))]
        return seqs, trees, (live[0][:k] if k else ())

    def _pair_trees(self, biased_ids, counter_ids, n_context):
        """``((biased, counterfactual sequences), trees, shared context)`` of :meth:`score_pairs`' pairs."""
        if len(biased_ids) != len(counter_ids):
            raise ValueError(f"{len(biased_ids)} biased phrases but {len(counter_ids)} counterfactuals")
        na, nc = (None, None) if n_context is None else n_context
        a, fa = self._prepare(biased_ids, "biased", na)
        c, fc = self._prepare(counter_ids, "counterfactual", nc)
        scorable = [len(x) > f or len(y) > g for x, y, f, g in zip(a, c, fa, fc)]
        live = [x for x, y, ok in zip(a, c, scorable) if ok] + [y for x, y, ok in zip(a, c, scorable) if ok]
        k = _row_context(live, [f for f, ok in zip(fa, scorable) if ok] + [g for g, ok in zip(fc, scorable) if ok])
        trees = [(_pair_tree(x, y, i, f, g, k) if ok else None)
                 for i, (x, y, f, g, ok) in enumerate(zip(a, c, fa, fc, scorable))]
        return (a, c), trees, (live[0][:k] if k else ())

    def _batches(self, live, K: int):
        """Pack the scorable trees ``live`` after a row context of ``K`` slots: ``(L, P, [(rows, R)])``, the row
        length, the head slots per row and each batch's packed rows (tree indices) with its compiled row count."""
        sizes = np.array([t.size for t in live])
        preds = np.array([len(t.pred) for t in live])
        L, P, rows = _plan_rows(sizes, preds, self.config, self.row_len, K)
        return L, P, self._cut_batches(rows, L)

    def _cut_batches(self, rows, L: int):
        """The packed ``rows`` (of ``L`` slots) cut into batches: ``[(rows, R)]``, each batch's rows with its
        compiled row count."""
        # rows per batch: a multiple of the device count, and of 4 devices' worth when that large, so that the
        # last batch can take the smallest multiple of a quarter batch that holds it (≤ 4 programs per L)
        step = self.n_devices
        R = -(-max(1, self.batch_size * SLOTS_PER_PHRASE // L) // step) * step
        if R >= 4 * step:
            step = -(-R // (4 * step)) * step
            R = 4 * step
        batches = []
        for start in range(0, len(rows), R):
            chunk = rows[start:start + R]
            batches.append((chunk, -(-len(chunk) // step) * step))
        return batches

    def _run(self, trees, n, progress, n_skipped_phrases=1, shared=()):
        """Pack ``trees`` (None = nothing to predict) after the row context ``shared`` (token ids at the start of
        every row), run every batch, return per-owner sums and counts: ``sums`` (2, M, n) float64 (owner a /
        owner c), ``counts`` (2, n) int64."""
        M = self.n_models if self.stacked else 1
        sums = np.zeros((2, M, n), np.float64)
        counts = np.zeros((2, n), np.int64)
        live = [t for t in trees if t is not None]
        n_skipped = sum(t is None for t in trees) * n_skipped_phrases
        stats = dict(phrases=0, phrase_tokens=0, slots_run=0, slots_total=0, predicting=0, head_rows=0,
                     batches=0, rows=0)
        if live:
            if self.abstract:
                raise ValueError("this scorer is abstract (parameter shapes only): it compiles, it cannot score")
            K = len(shared)
            L, P, batches = self._batches(live, K)
            n_rows = sum(len(c) for c, _ in batches)
            stats.update(slots_run=int(sum(t.size for t in live)) + K * n_rows,
                         predicting=int(sum(len(t.pred) for t in live)), rows=n_rows, row_len=L, head_slots=P,
                         row_context=K)
            for chunk, r in batches:
                self._batch(chunk, live, r, L, P, sums, counts, shared)
                stats["batches"] += 1
                stats["slots_total"] += r * L
                stats["head_rows"] += r * P
                if progress is not None:
                    progress(sum(live[t].n_phrases for row in chunk for t in row))
                poll()  # an interrupt inside a long phase (rbjax.core.interrupt.interruptible) stops here
        if progress is not None and n_skipped:
            progress(n_skipped)
        stats["phrases"] = sum(t.n_phrases for t in live)
        stats["phrase_tokens"] = sum(t.n_alone for t in live)
        self.last_stats = stats
        return sums, counts

    def _batch(self, chunk, live, R, L, P, sums, counts, shared=()):
        ids = np.zeros((R, L), np.int32)
        pos = np.zeros((R, L), np.int32)
        seg = np.full((R, L), -1, np.int32)
        br = np.zeros((R, L), np.int32)
        targets = BatchTargets(R, P)
        K = len(shared)
        if K:  # the row context, once per row (filler rows too: harmless)
            ids[:, :K], pos[:, :K], seg[:, :K] = shared, np.arange(K), ROW_CONTEXT
        for r, row in enumerate(chunk):
            off = K
            j = 0
            for s, t in enumerate(row):
                tr = live[t]
                n = tr.size
                ids[r, off:off + n] = tr.ids
                pos[r, off:off + n] = tr.pos
                seg[r, off:off + n] = s
                br[r, off:off + n] = tr.br
                j = targets.read(tr, r, j, off)
                off += n
        arrays = (ids, pos, seg, br, targets.pidx, targets.tgt)
        if self.mesh is not None:
            arrays = tuple(jax.device_put(x, self._rows_sharding) for x in arrays)
        fn = _packed_nll_models if self.stacked else _packed_nll_jit
        self.programs.add((R, L, P, self.n_models, self.precision))
        out = fn(self._compute_params, self._head_emb, *arrays, config=self.config, precision=self.precision)
        out = np.asarray(out, np.float64)
        targets.add_to(out if self.stacked else out[None], sums, counts)
