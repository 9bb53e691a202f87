"""Prefix-shared pair scoring: equal to scoring every phrase alone with the full LM head, on every pair
of the real RedditBias test split; bf16 within the documented bound; several models at once."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rbjax.lmb.perplexity import PerplexityScorer, _choice_tree, _pair_tree, _single_tree, common_prefix_length
from rbjax.model.gpt2 import GPT2Config, GPT2LMHeadModel, init_params

TYPES = ("religion1", "religion2", "race", "gender", "queerness")
#: the split's distinct GPT-2 ids are renumbered densely (an injective map: every prefix, identical pair and
#: length is unchanged), so the small random model's vocabulary — and the full-logits reference — stays small
CFG = GPT2Config(vocab_size=6000, n_positions=128, n_embd=32, n_layer=2, n_head=2)
#: documented in docs/lmb.md: bf16 vs fp32, relative error of a phrase's mean NLL on this test's model
BF16_REL_BOUND = 2e-3


@pytest.fixture(scope="module")
def test_split(redditbias_dir, tokenizer_dir):
    from rbjax.data.redditbias import load_pairs
    from rbjax.model.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    a, c = [], []
    for b in TYPES:
        p = load_pairs(b, "test", redditbias_dir)
        a += tok.encode_batch(p.biased)
        c += tok.encode_batch(p.counterfactual)
    dense = {t: k for k, t in enumerate(sorted({t for s in a + c for t in s}))}
    assert len(dense) <= CFG.vocab_size
    return [[dense[t] for t in s] for s in a], [[dense[t] for t in s] for s in c]


@pytest.fixture(scope="module")
def params():
    return init_params(CFG, seed=1)


def _full_head_alone(params, seqs, L=48, B=64):
    """Independent reference: each phrase in its own right-padded row, the full (B, L, V) logits of the model's
    own LM head, log_softmax, summed over tokens 2..n (no packing, no prefix sharing, no head skipping)."""
    model = GPT2LMHeadModel(CFG)

    @jax.jit
    def f(p, ids, m):
        lp = jax.nn.log_softmax(model.apply({"params": p}, ids, attention_mask=m)[0][:, :-1], -1)
        tok = jnp.take_along_axis(lp, ids[:, 1:, None], -1)[..., 0]
        return -(tok * (m[:, 1:] * m[:, :-1]))

    assert max(map(len, seqs)) <= L
    out = np.zeros(len(seqs))
    for s in range(0, len(seqs), B):
        rows = seqs[s:s + B]
        ids = np.zeros((B, L), np.int32)
        m = np.zeros((B, L), np.int32)
        for r, q in enumerate(rows):
            ids[r, :len(q)], m[r, :len(q)] = q, 1
        with jax.default_matmul_precision("highest"):
            nll = np.asarray(f(params, ids, m), np.float64)
        out[s:s + len(rows)] = nll[:len(rows)].sum(1)
    return out


def test_prefix_shared_equals_alone_on_every_test_pair(params, test_split):
    a, c = test_split
    pref = [common_prefix_length(x, y) for x, y in zip(a, c)]
    assert len(a) == 1216
    assert sum(p == 0 for p in pref) > 100 and sum(x == y for x, y in zip(a, c)) >= 1  # no-prefix and identical
    # a few constructed edge cases on top: one phrase a prefix of the other, one-token sides, empty phrase
    a = a + [[11, 12, 13], [11, 12], [5], [7, 8, 9], []]
    c = c + [[11, 12], [11, 12, 13, 14], [5, 6, 7], [7], [3, 4]]
    sc = PerplexityScorer(params, CFG, batch_size=16)
    sb, scf = sc.score_pairs(a, c)
    stats = sc.last_stats
    ref_a, ref_c = _full_head_alone(params, a), _full_head_alone(params, c)
    for got, ref, seqs in ((sb, ref_a, a), (scf, ref_c, c)):
        assert list(got.n_scored) == [max(len(s) - 1, 0) for s in seqs]
        ok = got.n_scored > 0
        np.testing.assert_allclose(got.nll_sum[ok], ref[ok], rtol=1e-5, atol=0)
        assert np.isnan(got.mean_nll[~ok]).all()
    # identical pairs get identical scores; the prefix really is shared
    same = [i for i, (x, y) in enumerate(zip(a, c)) if x == y]
    assert all(sb.nll_sum[i] == scf.nll_sum[i] for i in same)
    pref = pref + [2, 2, 1, 1, 0]  # the constructed cases
    live = [max(len(x), len(y)) >= 2 for x, y in zip(a, c)]
    alone = sum(len(x) + len(y) for x, y, ok in zip(a, c, live) if ok)
    assert stats["phrase_tokens"] == alone
    # each shared prefix runs once, and a branch's last token (a target only) runs no slot
    ends = sum((len(x) > p) + (len(y) > p) for x, y, p, ok in zip(a, c, pref, live) if ok)
    assert stats["slots_run"] == alone - sum(p for p, ok in zip(pref, live) if ok) - ends
    assert 0.15 < 1 - (stats["slots_run"] + ends) / stats["phrase_tokens"] < 0.18  # 16.6 % of the tokens are shared
    # the LM head ran once per predicting position: the scored targets, less the prefix targets counted for both
    # phrases (p − 1 per pair) and the branch points that predict two targets from one state
    shared_targets = sum(max(p - 1, 0) for p in pref)
    branch_points = sum(1 for p, x, y in zip(pref, a, c) if p >= 1 and len(x) > p and len(y) > p)
    assert stats["predicting"] == int(sb.n_scored.sum() + scf.n_scored.sum()) - shared_targets - branch_points
    assert stats["head_rows"] < 1.1 * stats["predicting"]
    # compile count: one program per batch-row count used (16 and the tail's power-of-two fraction)
    assert sc.compile_count <= 1 + int(math.log2(16)), sc.programs
    # and the single-phrase path agrees too
    alone_b = sc.score_ids(a)
    np.testing.assert_allclose(alone_b.nll_sum, sb.nll_sum, rtol=1e-5, atol=1e-9)


def test_bf16_within_documented_bound_and_recorded(params, test_split):
    a, c = test_split
    a, c = a[::4], c[::4]
    f32 = PerplexityScorer(params, CFG, batch_size=16).score_pairs(a, c)
    b16 = PerplexityScorer(params, CFG, batch_size=16, precision="bf16").score_pairs(a, c)
    for x, y in zip(f32, b16):
        assert x.precision == "fp32" and y.precision == "bf16"
        rel = np.abs(y.mean_nll - x.mean_nll) / x.mean_nll
        assert 0 < rel.max() < BF16_REL_BOUND, rel.max()
    with pytest.raises(ValueError, match="precision"):
        PerplexityScorer(params, CFG, precision="fp16")


def test_many_models_vmapped_equal_each_alone(test_split):
    a, c = test_split
    a, c = a[:60], c[:60]
    plist = [init_params(CFG, seed=s) for s in (4, 5, 6)]
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *plist)
    sc = PerplexityScorer(stacked, CFG, batch_size=8, stacked=True)
    many_b, many_c = sc.score_pairs(a, c)
    assert len(many_b) == len(many_c) == 3
    for m, p in enumerate(plist):
        one_b, one_c = PerplexityScorer(p, CFG, batch_size=8).score_pairs(a, c)
        np.testing.assert_allclose(many_b[m].nll_sum, one_b.nll_sum, rtol=1e-5)
        np.testing.assert_allclose(many_c[m].nll_sum, one_c.nll_sum, rtol=1e-5)
    assert not np.allclose(many_b[0].nll_sum, many_b[1].nll_sum)  # the models differ
    single = sc.score_ids(a)
    np.testing.assert_allclose(single[2].nll_sum, many_b[2].nll_sum, rtol=1e-5)
    with pytest.raises(ValueError, match="leading model axis"):
        PerplexityScorer({"wte": {"embedding": np.zeros((2, 3, 4))}, "x": np.zeros((3,))}, CFG, stacked=True)


def test_pair_errors_name_the_side(params):
    sc = PerplexityScorer(params, CFG, batch_size=2)
    with pytest.raises(ValueError, match="counterfactual phrase 1: a token id outside"):
        sc.score_pairs([[1, 2], [3, 4]], [[1, 2], [3, CFG.vocab_size]])
    with pytest.raises(ValueError, match="2 biased phrases but 1"):
        sc.score_pairs([[1, 2], [3, 4]], [[1, 2]])


def test_trees_run_no_slot_that_nothing_reads():
    """A phrase's last token is a target only: its state predicts nothing and no later token of its branch attends
    to it, so no tree gives it a slot. Every slot of a tree predicts a token or is attended by a later slot (the
    prefix, branch 0, by every branch; a branch by its own later slots) — the body runs only states the scores
    read. Kept: a one-token phrase's slot (else an empty tree) and an identical pair's whole prefix."""
    def unread(t):
        pred = {s for s, _ in t.pred}
        return [s for s in range(t.size) if s not in pred
                and not any(t.br[j] == t.br[s] or t.br[s] == 0 for j in range(s + 1, t.size))]

    trees = {"single": _single_tree([1, 2, 3], 0), "single after a row context": _single_tree([9, 9, 1, 2], 0, 3, 2),
             "pair": _pair_tree([1, 2, 3, 4], [1, 2, 5], 0), "one side a prefix": _pair_tree([1, 2], [1, 2, 3], 0),
             "no common prefix": _pair_tree([1, 2], [3, 4, 5], 0),
             "choices": _choice_tree([1, 2], [[3, 4], [5]], [0, 1])}
    for name, t in trees.items():
        assert unread(t) == [], name
    # slots: the tokens less the last of each branch (the shared prefix once)
    assert [t.size for t in trees.values()] == [2, 1, 3, 2, 1 + 2, 1 + 2 + 1]
    assert _single_tree([7], 0).size == 1 and _pair_tree([1, 2], [1, 2], 0).size == 2  # kept
