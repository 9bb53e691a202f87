"""Multiple-choice scoring (PerplexityScorer.score_choices): each context run once for all its continuations, equal to
scoring every context + continuation alone with the model's full logits (lm-evaluation-harness's loglikelihood)."""
import jax
import numpy as np
import pytest

from rbjax.lmb.perplexity import PerplexityScorer, PhraseError
from rbjax.model.gpt2 import GPT2Config, GPT2LMHeadModel, init_params

CFG = GPT2Config(vocab_size=300, n_positions=96, n_embd=32, n_layer=2, n_head=2)


def _reference(params, ctx, conts):
    """Independent: each context + continuation in its own (right-padded) row, full logits, log_softmax, the
    continuation's tokens summed."""
    model = GPT2LMHeadModel(CFG)
    L = CFG.n_positions
    ids = np.zeros((len(conts), L), np.int32)
    mask = np.zeros((len(conts), L), np.int32)
    for r, t in enumerate(conts):
        ids[r, :len(ctx) + len(t)], mask[r, :len(ctx) + len(t)] = ctx + t, 1
    lp = np.asarray(_log_softmax(model, params, ids, mask), np.float64)
    return np.array([sum(lp[r, len(ctx) - 1 + j, t[j]] for j in range(len(t))) for r, t in enumerate(conts)])


@jax.jit
def _lsm(params, ids, mask):
    return jax.nn.log_softmax(GPT2LMHeadModel(CFG).apply({"params": params}, ids, attention_mask=mask)[0], -1)


def _log_softmax(model, params, ids, mask):
    pad = 16 - len(ids)  # one compiled shape
    return _lsm(params, np.pad(ids, ((0, pad), (0, 0))), np.pad(mask, ((0, pad), (0, 0))))[:len(ids)]


def _rows(seed, shared=()):
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(9):
        ctx = list(shared) + rng.integers(0, CFG.vocab_size, rng.integers(1, 30)).tolist()
        k = int(rng.integers(1, 13))
        stem = rng.integers(0, CFG.vocab_size, 2).tolist()  # continuations that share leading tokens, as answers do
        conts = [(stem[:rng.integers(0, 3)] + rng.integers(0, CFG.vocab_size, rng.integers(1, 6)).tolist())
                 for _ in range(k)]
        rows.append((ctx, conts))
    return rows


@pytest.mark.parametrize("shared", [(), (5, 6, 7, 8, 9, 10)])
def test_score_choices_equals_each_continuation_alone(shared):
    params = init_params(CFG, seed=3)
    scorer = PerplexityScorer(params, CFG, batch_size=8)
    rows = _rows(0, shared)
    got = scorer.score_choices([c for c, _ in rows], [t for _, t in rows])
    if shared:
        assert scorer.last_stats["row_context"] == len(shared)  # the common leading context run once per row
    for (ctx, conts), g in zip(rows, got):
        np.testing.assert_allclose(g, _reference(params, ctx, conts), rtol=1e-5, atol=1e-5)
    # each context is run once: fewer slots than running context + continuation once per continuation
    assert scorer.last_stats["slots_run"] < scorer.last_stats["phrase_tokens"]


def test_score_choices_refuses_what_it_cannot_score():
    scorer = PerplexityScorer(init_params(CFG, seed=3), CFG, batch_size=8)
    with pytest.raises(PhraseError, match="phrase 1: an empty context"):
        scorer.score_choices([[1], []], [[[2]], [[3]]])
    with pytest.raises(PhraseError, match="phrase 0: no continuation, or one that encodes to no token"):
        scorer.score_choices([[1]], [[[2], []]])
    with pytest.raises(PhraseError, match="phrase 0: 97 tokens"):
        scorer.score_choices([[1] * 90], [[[2] * 7]])
