"""Scoring with Self-Debias (:mod:`rbjax.model.self_debias`; docs/debiasing.md, "Self-Debias"): every scored token's
log-probability is taken from the rescaled next-token distribution instead of the model's own.

:class:`SelfDebiasScorer` is a :class:`rbjax.lmb.perplexity.PerplexityScorer` (``score_ids``, ``score_pairs``,
``score_choices``, ``score_texts``, ``with_bos``, ``program_shapes``/``compile_programs``, a mesh …), so that
RedditBias LMB, the pair benchmarks (CrowS-Pairs, any pair file) and BBQ score a Self-Debias model as they score any
other (:class:`rbjax.lmb.measure.LoadedModel` builds it for a Self-Debias run folder). The same tokens are scored as
by the plain scorer: the BOS policy, the context tokens of the chat format and of a multiple-choice context are the
same.

How a batch is computed: the plain scorer's packed layout — pair trees (a pair's common prefix run once, a tree
attention mask), multiple-choice trees, rows of a few fixed lengths, the LM head only at the predicting slots —
laid **once**, and run in 1 + K passes (K prefixes) that share every slot, segment, branch and target and differ
only in each row's *context region* and the position ids:

* every row starts with a context region of ``C = K_ctx + max_k len(prefix_k)`` slots (``K_ctx`` the row context
  the plain scorer would share, e.g. the chat template's; every tree attends to the region), each pass's context
  right-aligned in it (empty slots in front), position ids counting from 0 and continuing in the trees;
* the regular pass: the shared context as the plain scorer has it (often none);
* prefixed pass k: the context that makes each sequence read ``seq[:lead] + prefix_k + seq[lead:]`` (``lead`` = 1
  when the sequence starts with the BOS, which the prefix goes after): with a shared context ``S``,
  ``S[:lead] + prefix_k + S[lead:]``; without one and without a BOS, ``prefix_k`` (its last token predicts the
  sequence's first token, never scored); without one and with a BOS, ``[BOS] + prefix_k[:-1]``, and the trees'
  first token (the BOS) is ``prefix_k[-1]`` in that pass; the trees' positions are shifted by ``len(prefix_k)``;
* the 1 + K passes run as one batch of (1 + K) × rows; the hidden states of the same predicting slots are gathered
  from each pass, the LM head applied, and log q of each target (two at a pair's branch point) read with
  :func:`rbjax.model.self_debias.target_log_probs`, in chunks of predicting slots so that the logits of a chunk
  (rows × passes × slots × vocabulary, float32) stay within :data:`MAX_LOGIT_ELEMENTS`.

So a batch costs (1 + K) × the plain scorer's packed batch, each row a context region of the longest prefix wider
(rows are packed into ``row_len - C`` slots, so a call runs somewhat more rows than the plain scorer), and the
softmaxes of the rescaling beside the head's matmul. A call compiles one program per (rows, row length, head slots),
as the plain scorer. Rows whose sequences start with a BOS and rows whose sequences do not are packed apart (their
prefixed contexts differ); a pair whose two sequences differ in that (no shared token at all) is scored as two
phrases.
"""
from __future__ import annotations

from functools import partial
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rbjax.core.compilation import abstract
from rbjax.core.precision import get_policy
from rbjax.lmb.perplexity import (ROW_CONTEXT, BatchTargets, PerplexityScorer, PhraseError, _pack, _plan_rows,
                                  _single_tree, tree_attention_mask)
from rbjax.model.layers import soft_cap
from rbjax.model.registry import family_of_config
from rbjax.model.self_debias import SelfDebiasSettings, target_log_probs

__all__ = ["SelfDebiasScorer", "self_debias_packed_log_probs", "MAX_LOGIT_ELEMENTS"]

#: the LM head runs over chunks of predicting slots so that one chunk's (rows × passes × slots × vocabulary) float32
#: logits stay within this many elements (the regular, the prefixed and the rescaled distributions are held at once)
MAX_LOGIT_ELEMENTS = 1 << 24


def _head(hidden, emb, dt, softcap):
    z = jnp.einsum("...d,vd->...v", hidden.astype(dt), emb.astype(dt), preferred_element_type=jnp.float32)
    return soft_cap(z, softcap)


@partial(jax.jit, static_argnames=("config", "precision", "decay_constant", "epsilon", "max_logits"))
def self_debias_packed_log_probs(params, head_emb, ids, pos, seg, br, pidx, tgt, *, config, precision: str,
                                 decay_constant: float, epsilon: float, max_logits: int = MAX_LOGIT_ELEMENTS):
    """log q(target) at the predicting slots of a packed batch run in 1 + K passes, q the self-debiased distribution.

    Args:
        params, head_emb: the model's parameters and (V, d) LM head (as :func:`rbjax.lmb.perplexity._packed_nll`).
        ids, pos, seg: int32 (R, 1 + K, L): each pass's tokens, position ids and segment ids (pass 0 the regular
            one, pass k the one with prefix k; −1 empty, ``ROW_CONTEXT`` the row's context region).
        br: int32 (R, L) the branch of each slot (the same in every pass).
        pidx: int32 (R, P) the predicting slots. tgt: int32 (R, P, 2) the token(s) each predicts (two at a pair's
            branch point).
        max_logits: the LM head runs over chunks of predicting slots whose (R × (1 + K) × slots × V) logits hold
            at most this many elements (at least one slot a chunk).
    Returns:
        float32 (R, P, 2) log q(tgt); junk at filler entries (the caller reads the real ones).
    """
    policy = get_policy(precision)
    dt = policy.compute_dtype
    fam = family_of_config(config)
    cap = fam.logit_softcap(config)
    cap = None if cap is None else float(cap)
    R, Q, L = ids.shape
    P = pidx.shape[1]
    V = head_emb.shape[0]
    allowed = tree_attention_mask(seg.reshape(R * Q, L), jnp.broadcast_to(br[:, None], (R, Q, L)).reshape(R * Q, L))
    with policy.matmul_context():
        model = fam.module(config, dtype=dt)
        _, hidden = model.apply({"params": params}, ids.reshape(R * Q, L), attention_mask=allowed,
                                position_ids=pos.reshape(R * Q, L), return_logits=False)
        hidden = hidden.reshape(R, Q, L, hidden.shape[-1])

        def chunk(xs):  # (R, c) slots, (R, c, 2) targets -> (R, c, 2)
            idx, t = xs
            h = jnp.take_along_axis(hidden, idx[:, None, :, None], axis=2)  # (R, Q, c, d)
            z = _head(h, head_emb, dt, cap)  # (R, Q, c, V)
            return target_log_probs(z[:, 0], [z[:, k] for k in range(1, Q)], t, decay_constant, epsilon)

        n = -(-P // max(1, min(P, max_logits // max(1, R * Q * V))))  # chunks, as even as possible
        c = -(-P // n)
        if n == 1:
            return chunk((pidx, tgt))
        pi = jnp.pad(pidx, ((0, 0), (0, n * c - P))).reshape(R, n, c).transpose(1, 0, 2)
        tg = jnp.pad(tgt, ((0, 0), (0, n * c - P), (0, 0))).reshape(R, n, c, 2).transpose(1, 0, 2, 3)
        out = jax.lax.map(chunk, (pi, tg))  # (n, R, c, 2)
        return out.transpose(1, 0, 2, 3).reshape(R, n * c, 2)[:, :P]


class SelfDebiasScorer(PerplexityScorer):
    """A :class:`~rbjax.lmb.perplexity.PerplexityScorer` whose token log-probabilities are the self-debiased ones.

    Args:
        params, config, batch_size, bos_id, precision, row_len, devices, mesh, param_dtype: as the plain scorer's
            (one model: not stacked). ``batch_size`` and ``row_len`` size the packed rows of one pass; a batch runs
            them in 1 + K passes.
        prefix_ids: the token ids of each prefix, tokenised on its own without special tokens (≥ 1 id each).
        settings: :class:`rbjax.model.self_debias.SelfDebiasSettings` (λ and ε; its prefix texts are recorded).

    A sequence that starts with ``bos_id`` keeps it first: a prefix goes after it.

    Attributes:
        max_logits: the bound on one chunk of the LM head's logits (elements; :data:`MAX_LOGIT_ELEMENTS`).
        last_stats: the plain scorer's (of one pass), and ``passes`` (1 + K), ``slots_all_passes`` (the slots of the
            compiled batches over all passes), ``context_width`` (the context region's slots a row).

    Raises:
        ValueError: no prefix, an empty one, or a prefix + sequence longer than the model's context (at scoring:
            :class:`~rbjax.lmb.perplexity.PhraseError`).
    """

    def __init__(self, params, config, prefix_ids: Sequence[Sequence[int]], settings: SelfDebiasSettings,
                 batch_size: int = 64, bos_id: int | None = None, precision: str = "fp32", *,
                 row_len: int | None = None, devices: Sequence | None = None, mesh=None, param_dtype: str = "fp32"):
        if not prefix_ids or any(len(p) == 0 for p in prefix_ids):
            raise ValueError("Self-Debias needs at least one prefix, each with at least one token")
        vmax = config.vocab_size
        if any(not 0 <= int(t) < vmax for p in prefix_ids for t in p):
            raise ValueError(f"a prefix token id outside the model vocabulary [0, {vmax})")
        super().__init__(params, config, batch_size=batch_size, bos_id=bos_id, precision=precision, row_len=row_len,
                         devices=devices, mesh=mesh, param_dtype=param_dtype)
        self.prefix_ids = tuple(tuple(int(t) for t in p) for p in prefix_ids)
        self.settings = settings
        self.max_logits = MAX_LOGIT_ELEMENTS

    # -- the plain scorer's entry points (packing, trees, results inherited) ----------------------------------
    def score_choices(self, context_ids, continuation_ids, progress=None) -> list[np.ndarray]:
        limit, longest = self.config.max_positions, max(len(p) for p in self.prefix_ids)
        if len(context_ids) == len(continuation_ids):  # (the plain scorer names every other problem)
            for i, (c, ts) in enumerate(zip(context_ids, continuation_ids)):
                if len(c) and ts and all(len(t) for t in ts):
                    n = len(c) + max(len(t) for t in ts)
                    if n <= limit < n + longest:
                        raise PhraseError(i, f"{n} tokens (context and its longest continuation), which with the "
                                             f"Self-Debias prefix ({longest} tokens) exceed the model's {limit} "
                                             "positions")
        return super().score_choices(context_ids, continuation_ids, progress)

    def compile_programs(self, shapes) -> int:
        """The plain scorer's :meth:`~rbjax.lmb.perplexity.PerplexityScorer.compile_programs` for this scorer's
        program (1 + K passes) at each ``(rows, row_len, head_slots)`` of :meth:`program_shapes`."""
        rows = self._rows_sharding if self.mesh is not None else None
        params, head = abstract(self._compute_params), abstract(self._head_emb)
        Q = 1 + len(self.prefix_ids)
        n = 0
        for R, L, P in sorted(set(shapes)):
            def arr(*shape):
                return jax.ShapeDtypeStruct(shape, jnp.int32, sharding=rows)
            self_debias_packed_log_probs.lower(params, head, arr(R, Q, L), arr(R, Q, L), arr(R, Q, L), arr(R, L),
                                               arr(R, P), arr(R, P, 2), **self._static()).compile()
            n += 1
        return n

    # -- internals -------------------------------------------------------------------------------------------
    def _static(self) -> dict:
        return dict(config=self.config, precision=self.precision,
                    decay_constant=float(self.settings.decay_constant), epsilon=float(self.settings.epsilon),
                    max_logits=int(self.max_logits))

    def _prepare(self, token_ids, side, n_context=None):
        seqs, firsts = super()._prepare(token_ids, side, n_context)
        limit, longest = self.config.max_positions, max(len(p) for p in self.prefix_ids)
        for i, s in enumerate(seqs):
            if len(s) + longest > limit:
                raise PhraseError(i, f"{len(s)} tokens, which with the Self-Debias prefix ({longest} tokens) exceed "
                                     f"the model's {limit} positions", side)
        return seqs, firsts

    def _tree_lead(self, tree) -> int | None:
        """1 when the tree's sequences start with the BOS, 0 when none does, None when the tree starts after a row
        context, −1 when its two sequences differ in that."""
        first = {x == self.bos_id for x, q in zip(tree.ids, tree.pos) if q == 0}
        if not first:
            return None
        return int(first.pop()) if len(first) == 1 else -1

    def _pair_trees(self, biased_ids, counter_ids, n_context):
        (a, c), trees, shared = super()._pair_trees(biased_ids, counter_ids, n_context)
        if self.bos_id is not None and not shared:  # a pair of which one side only starts with the BOS: two trees
            na, nc = (None, None) if n_context is None else n_context
            fa = [1] * len(a) if na is None else [max(1, int(k)) for k in na]
            fc = [1] * len(c) if nc is None else [max(1, int(k)) for k in nc]
            for i, t in enumerate(list(trees)):
                if t is not None and self._tree_lead(t) == -1:
                    trees[i] = _single_tree(a[i], i, fa[i])
                    tc = _single_tree(c[i], i, fc[i])
                    tc.pred = [(slot, [(tok, -1, own) for tok, own, _ in tg]) for slot, tg in tc.pred]
                    trees.append(tc)
        return (a, c), trees, shared

    def _width(self, K: int) -> int:
        """The context region of a row after a shared context of ``K`` tokens."""
        return K + max(len(p) for p in self.prefix_ids)

    def _batches(self, live, K: int):
        C = self._width(K)
        leads = [self._tree_lead(t) for t in live]
        if -1 in leads:
            raise AssertionError("a tree mixes sequences with and without a BOS first")
        kinds = sorted(set(leads), key=str)
        if len(kinds) <= 1:
            return super()._batches(live, C)
        # rows of one lead each (their prefixed contexts differ), at the row length planned for all
        sizes = np.array([t.size for t in live])
        preds = np.array([len(t.pred) for t in live])
        L, P, _ = _plan_rows(sizes, preds, self.config, self.row_len, C)
        rows = []
        for kind in kinds:
            idx = np.array([i for i, x in enumerate(leads) if x == kind])
            rows += [[int(idx[j]) for j in row] for row in _pack(sizes[idx], preds[idx], L - C, P)]
        return L, P, self._cut_batches(rows, L)

    def _run(self, trees, n, progress, n_skipped_phrases=1, shared=()):
        sums, counts = super()._run(trees, n, progress, n_skipped_phrases, shared)
        st = self.last_stats
        st["passes"] = 1 + len(self.prefix_ids)
        st["slots_all_passes"] = st["slots_total"] * st["passes"]
        st["context_width"] = self._width(len(shared))
        return sums, counts

    def _batch(self, chunk, live, R, L, P, sums, counts, shared=()):
        pre, bos = self.prefix_ids, self.bos_id
        Q, K = 1 + len(pre), len(shared)
        C = self._width(K)
        shifts = np.array([0] + [len(p) for p in pre])[:, None]
        ids = np.zeros((R, Q, L), np.int32)
        pos = np.zeros((R, Q, L), np.int32)
        seg = np.full((R, Q, L), -1, np.int32)
        br = np.zeros((R, L), np.int32)
        targets = BatchTargets(R, P)
        for r, row in enumerate(chunk):
            if K:
                lead = int(bos is not None and shared[0] == bos)
            else:
                lead = self._tree_lead(live[row[0]]) if bos is not None else 0
            ctxs = [list(shared)]
            for p in pre:  # pass k: seq[:lead] + prefix + seq[lead:]
                if K or not lead:
                    ctxs.append(list(shared[:lead]) + list(p) + list(shared[lead:]))
                else:  # the BOS, the prefix but its last token (that one takes the BOS's slot in the trees)
                    ctxs.append([bos] + list(p[:-1]))
            for q, cx in enumerate(ctxs):  # right-aligned in the context region
                w = len(cx)
                ids[r, q, C - w:C], pos[r, q, C - w:C], seg[r, q, C - w:C] = cx, np.arange(w), ROW_CONTEXT
            off, j = C, 0
            for s, t in enumerate(row):
                tr = live[t]
                n = tr.size
                tpos = np.asarray(tr.pos)
                ids[r, :, off:off + n] = tr.ids
                pos[r, :, off:off + n] = tpos[None] + shifts
                seg[r, :, off:off + n] = s
                br[r, off:off + n] = tr.br
                if lead and not K:
                    first = off + np.flatnonzero(tpos == 0)
                    for q, p in enumerate(pre, start=1):
                        ids[r, q, first] = p[-1]
                j = targets.read(tr, r, j, off)
                off += n
        arrays = (ids, pos, seg, br, targets.pidx, targets.tgt)
        if self.mesh is not None:
            arrays = tuple(jax.device_put(x, self._rows_sharding) for x in arrays)
        self.programs.add(("self-debias", R, L, P, Q, self.precision))
        out = self_debias_packed_log_probs(self._compute_params, self._head_emb, *arrays, **self._static())
        targets.add_to(-np.asarray(out, np.float64)[None], sums, counts)  # log q → NLL, one model
