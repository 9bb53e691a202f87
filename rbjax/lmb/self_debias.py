"""Scoring with Self-Debias (:mod:`rbjax.model.self_debias`; docs/debiasing.md, "Self-Debias"): every scored token's
log-probability is taken from the rescaled next-token distribution instead of the model's own.

:class:`SelfDebiasScorer` has the interface of :class:`rbjax.lmb.perplexity.PerplexityScorer` (``score_ids``,
``score_pairs``, ``score_choices``, ``score_texts``, ``with_bos`` …), so that RedditBias LMB, the pair benchmarks
(CrowS-Pairs, any pair file) and BBQ score a Self-Debias model as they score any other
(:class:`rbjax.lmb.measure.LoadedModel` builds it for a Self-Debias run folder). The same tokens are scored as by the
plain scorer: the BOS policy, the context tokens of the chat format and of a multiple-choice context are the same.

How a batch is computed (sequences sorted by length, right-padded, ``batch_size`` rows a batch):

* the regular pass: the rows as they are, the full next-token distribution at every position;
* for each prefix: its tokens (after the BOS, when the sequences start with one) are run **once for the batch**
  into a KV cache of one row, which is broadcast to the batch's rows; each row then runs its text on that cache,
  starting with the prefix's last token (so that the prefixed distribution of the text's first token is the row's
  own), with position ids continuing from the prefix;
* the distributions are combined and the log-probability of each target is read
  (:func:`rbjax.model.self_debias.target_log_probs`: the formula of
  :func:`~rbjax.model.self_debias.rescaled_log_probs` with no (…, V) distribution kept but the logits).

So a batch costs one regular forward and one forward per prefix (each one token wider), plus one prefix row per
prefix: (1 + number of prefixes) × the padded regular pass. Pairs share no prefix here (unlike the packed scorer)
and the LM head runs at every position of the padded rows.
"""
from __future__ import annotations

from functools import partial
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rbjax.core.interrupt import poll
from rbjax.core.precision import get_policy
from rbjax.lmb.perplexity import PerplexityScorer, PhraseError
from rbjax.model.layers import soft_cap
from rbjax.model.registry import family_of_config
from rbjax.model.self_debias import SelfDebiasSettings, target_log_probs

__all__ = ["SelfDebiasScorer", "self_debias_token_log_probs", "MAX_LOGIT_ELEMENTS"]

#: a batch's rows are cut so that one (rows × width × vocabulary) float32 array stays within this many elements
#: (the regular, the running prefixed maximum and the rescaled distributions are held at once)
MAX_LOGIT_ELEMENTS = 1 << 26


def _head(hidden, emb, dt, softcap):
    z = jnp.einsum("bld,vd->blv", hidden.astype(dt), emb.astype(dt), preferred_element_type=jnp.float32)
    return soft_cap(z, softcap)


@partial(jax.jit, static_argnames=("config", "precision", "decay_constant", "epsilon"))
def self_debias_token_log_probs(params, head_emb, ids, mask, pidx, targets, prefixes, blocks, block_mask, gather, *,
                                config, precision: str, decay_constant: float, epsilon: float):
    """log q(target) at the predicting positions of a right-padded batch, q the self-debiased distribution.

    Args:
        params, head_emb: the model's parameters and (V, d) LM head. ids, mask: int32 (B, W) the regular rows and
            their real tokens. pidx: int32 (B, P) the positions read (the LM head runs there only). targets: int32
            (B, P) the token each read position predicts (position j: token j+1).
        prefixes: a tuple of K int32 (1, P_k) arrays: each prefix's tokens but its last (may be empty, P_k = 0).
        blocks: a tuple of K int32 (B, W_k) arrays: each row's text after the prefix, starting with the prefix's
            last token; block_mask: a tuple of their (B, W_k) real-token masks. gather: a tuple of K int32 (B, P):
            the block position whose state predicts the same token as the regular position ``pidx``.
    Returns:
        float32 (B, P) log q(targets); junk at filler entries (the caller masks).
    """
    policy = get_policy(precision)
    dt = policy.compute_dtype
    fam = family_of_config(config)
    cap = fam.logit_softcap(config)
    cap = None if cap is None else float(cap)
    B = ids.shape[0]
    with policy.matmul_context():
        model = fam.module(config, dtype=dt)
        _, hidden = model.apply({"params": params}, ids, attention_mask=mask, return_logits=False)
        zr = _head(jnp.take_along_axis(hidden, pidx[..., None], axis=1), head_emb, dt, cap)  # (B, P, V)
        zb = []
        for pre, blk, bm, g in zip(prefixes, blocks, block_mask, gather):
            P = pre.shape[1]
            cache = fam.init_cache(config, 1, P + blk.shape[1], dt)
            if P:  # the prefix's states, once for the batch
                _, _, cache = model.apply({"params": params}, pre, jnp.ones_like(pre), cache=cache,
                                          return_logits=False)
            cache = jax.tree.map(lambda x: jnp.broadcast_to(x, (B,) + x.shape[1:]) if x.ndim else x, cache)
            _, h, _ = model.apply({"params": params}, blk, bm, cache=cache, return_logits=False)
            h = jnp.take_along_axis(h, g[..., None], axis=1)  # (B, P, d): aligned with the regular positions
            zb.append(_head(h, head_emb, dt, cap))
    return target_log_probs(zr, zb, targets, decay_constant, epsilon)


class SelfDebiasScorer(PerplexityScorer):
    """A :class:`~rbjax.lmb.perplexity.PerplexityScorer` whose token log-probabilities are the self-debiased ones.

    Args:
        params, config, batch_size, bos_id, precision, param_dtype: as the plain scorer's (``batch_size``: rows,
            i.e. sequences, per batch, cut further to keep (rows × width × vocabulary) within
            :data:`MAX_LOGIT_ELEMENTS`).
        prefix_ids: the token ids of each prefix, tokenised on its own without special tokens (≥ 1 id each).
        settings: :class:`rbjax.model.self_debias.SelfDebiasSettings` (λ and ε; its prefix texts are recorded).

    A sequence that starts with ``bos_id`` keeps it first: a prefix goes after it.

    Raises:
        ValueError: no prefix, an empty one, or a prefix + sequence longer than the model's context (at scoring:
            :class:`~rbjax.lmb.perplexity.PhraseError`).
    """

    def __init__(self, params, config, prefix_ids: Sequence[Sequence[int]], settings: SelfDebiasSettings,
                 batch_size: int = 64, bos_id: int | None = None, precision: str = "fp32", *,
                 param_dtype: str = "fp32"):
        super().__init__(params, config, batch_size=batch_size, bos_id=bos_id, precision=precision,
                         devices=jax.local_devices()[:1], param_dtype=param_dtype)
        if not prefix_ids or any(len(p) == 0 for p in prefix_ids):
            raise ValueError("Self-Debias needs at least one prefix, each with at least one token")
        vmax = config.vocab_size
        if any(not 0 <= int(t) < vmax for p in prefix_ids for t in p):
            raise ValueError(f"a prefix token id outside the model vocabulary [0, {vmax})")
        self.prefix_ids = tuple(tuple(int(t) for t in p) for p in prefix_ids)
        self.settings = settings

    # -- the plain scorer's entry points ---------------------------------------------------------------------
    def score_ids(self, token_ids, progress: Callable[[int], None] | None = None, *, n_context=None):
        seqs, firsts = self._prepare(token_ids, None, n_context)
        sums, counts = self._score(seqs, firsts, progress)
        return self._results(sums[None], counts, seqs, n_context)

    def score_pairs(self, biased_ids, counter_ids, progress=None, *, n_context=None):
        if len(biased_ids) != len(counter_ids):
            raise ValueError(f"{len(biased_ids)} biased phrases but {len(counter_ids)} counterfactuals")
        na, nc = (None, None) if n_context is None else n_context
        a, fa = self._prepare(biased_ids, "biased", na)
        c, fc = self._prepare(counter_ids, "counterfactual", nc)
        n = len(a)
        self._check_lengths(a, "biased")
        self._check_lengths(c, "counterfactual")
        sums, counts = self._score(a + c, fa + fc, progress)
        return (self._results(sums[None, :n], counts[:n], a, na),
                self._results(sums[None, n:], counts[n:], c, nc))

    def score_choices(self, context_ids, continuation_ids, progress=None) -> list[np.ndarray]:
        if len(context_ids) != len(continuation_ids):
            raise ValueError(f"{len(context_ids)} contexts but {len(continuation_ids)} continuation lists")
        seqs, firsts, owner = [], [], []
        for i, (c, ts) in enumerate(zip(context_ids, continuation_ids)):
            c = [int(x) for x in c]
            if not c:
                raise PhraseError(i, "an empty context (it needs at least a start token)")
            if not ts or any(not t for t in ts):
                raise PhraseError(i, "no continuation, or one that encodes to no token")
            for t in ts:
                seqs.append(c + [int(x) for x in t])
                firsts.append(len(c))
                owner.append(i)
        vmax = self.config.vocab_size
        for j, s in enumerate(seqs):
            if min(s) < 0 or max(s) >= vmax:
                raise PhraseError(owner[j], f"a token id outside the model vocabulary [0, {vmax})")
        self._check_lengths(seqs, None, owner)
        sums, counts = self._score(seqs, firsts, progress)
        want = np.array([len(s) - f for s, f in zip(seqs, firsts)])
        if not np.array_equal(counts, want):
            raise AssertionError("score_choices: a continuation token was not scored")
        ll, out, k = -sums, [], 0
        for ts in continuation_ids:
            out.append(ll[k:k + len(ts)])
            k += len(ts)
        return out

    def program_shapes(self, token_ids=None, *, pairs=None, n_context=None) -> set:
        """No packed programs (the row length of a pair benchmark is then chosen per call: it has no effect here)."""
        return set()

    def compile_programs(self, shapes) -> int:
        return 0

    # -- internals -------------------------------------------------------------------------------------------
    def _lead(self, s) -> int:
        return 1 if self.bos_id is not None and s and s[0] == self.bos_id else 0

    def _check_lengths(self, seqs, side, owner=None) -> None:
        limit = self.config.max_positions
        longest = max(len(p) for p in self.prefix_ids)
        for i, s in enumerate(seqs):
            if len(s) + longest > limit:
                raise PhraseError(i if owner is None else owner[i],
                                  f"{len(s)} tokens, which with the Self-Debias prefix ({longest} tokens) exceed the "
                                  f"model's {limit} positions", side)

    def _score(self, seqs, firsts, progress):
        """Per sequence, the summed −log q over its scored targets (index ≥ its first) and their count."""
        self._check_lengths(seqs, None)
        n = len(seqs)
        sums = np.zeros(n, np.float64)
        counts = np.zeros(n, np.int64)
        live = [i for i in range(n) if len(seqs[i]) > firsts[i]]
        V = self.config.vocab_size
        # batches of one lead (with / without a BOS first) and similar lengths
        order = sorted(live, key=lambda i: (self._lead(seqs[i]), len(seqs[i])))
        stats = dict(phrases=n, batches=0, rows=0, slots_total=0, prefix_slots=0)
        start = 0
        while start < len(order):
            lead = self._lead(seqs[order[start]])
            W = -(-(len(seqs[order[min(start + self.batch_size, len(order)) - 1]]) + 1) // 8) * 8
            rows = max(1, min(self.batch_size, MAX_LOGIT_ELEMENTS // max(1, W * V)))
            chunk = [i for i in order[start:start + rows] if self._lead(seqs[i]) == lead]
            W = -(-(max(len(seqs[i]) for i in chunk) + 1) // 8) * 8
            self._batch([seqs[i] for i in chunk], [firsts[i] for i in chunk], lead, W, chunk, sums, counts)
            stats["batches"] += 1
            stats["rows"] += len(chunk)
            stats["slots_total"] += len(chunk) * W * (1 + len(self.prefix_ids))
            stats["prefix_slots"] += sum(len(p) + lead - 1 for p in self.prefix_ids)
            start += len(chunk)
            if progress is not None:
                progress(len(chunk))
            poll()
        if progress is not None and n > len(live):
            progress(n - len(live))
        self.last_stats = stats
        return sums, counts

    def _batch(self, seqs, firsts, lead, W, owners, sums, counts) -> None:
        B = len(seqs)
        R = -(-B // 8) * 8 if B > 1 else 1  # few shapes: rows in steps of 8
        P = -(-max(len(s) - f for s, f in zip(seqs, firsts)) // 8) * 8  # predicting positions a row, at most
        ids = np.zeros((R, W), np.int32)
        mask = np.zeros((R, W), np.int32)
        mask[:, 0] = 1  # filler rows: one real token (no row without a key)
        pidx = np.zeros((R, P), np.int32)
        tgt = np.zeros((R, P), np.int32)
        scored = np.zeros((R, P), bool)
        for r, (s, f) in enumerate(zip(seqs, firsts)):
            ids[r, :len(s)] = s
            mask[r, :len(s)] = 1
            n = len(s) - f
            pidx[r, :n] = np.arange(f - 1, len(s) - 1)
            tgt[r, :n] = s[f:]
            scored[r, :n] = True
        bos = [self.bos_id] if lead else []
        pres, blocks, bmasks, gathers = [], [], [], []
        for p in self.prefix_ids:
            full = bos + list(p)
            pres.append(jnp.asarray(np.asarray(full[:-1], np.int32).reshape(1, -1)))
            blk = np.zeros((R, W), np.int32)
            bm = np.zeros((R, W), np.int32)
            bm[:, 0] = 1
            for r, s in enumerate(seqs):
                row = [full[-1]] + list(s[lead:])
                blk[r, :len(row)] = row
                bm[r, :len(row)] = 1
            blocks.append(jnp.asarray(blk))
            bmasks.append(jnp.asarray(bm))
            # regular position j (predicting token j+1) ↔ block position j + 1 − lead
            gathers.append(jnp.asarray(np.clip(pidx + 1 - lead, 0, W - 1).astype(np.int32)))
        self.programs.add(("self-debias", R, W, P, tuple(len(p) + lead - 1 for p in self.prefix_ids), self.precision))
        out = self_debias_token_log_probs(
            self._compute_params, self._head_emb, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(pidx),
            jnp.asarray(tgt), tuple(pres),
            tuple(blocks), tuple(bmasks), tuple(gathers), config=self.config, precision=self.precision,
            decay_constant=float(self.settings.decay_constant), epsilon=float(self.settings.epsilon))
        out = np.asarray(out, np.float64)
        for r, i in enumerate(owners):
            sums[i] = -out[r][scored[r]].sum()
            counts[i] = int(scored[r].sum())
