"""Batched perplexity scorer: padding never leaks, batching/bucketing invariance, parity with PyTorch."""
import math

import numpy as np
import pytest

from rbjax.lmb.perplexity import PerplexityScorer, token_nll
from rbjax.model import hf

PHRASE_IDS = [[1169, 15849, 373, 1611], [42773, 0, 484, 389, 1611, 0], [31373, 995]]  # GPT-2 ids


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return hf.load_pretrained(tiny_model_dir)


def _pad(seqs, L, left: bool):
    ids = np.zeros((len(seqs), L), np.int32)
    mask = np.zeros((len(seqs), L), np.int32)
    for r, s in enumerate(seqs):
        if left:
            ids[r, L - len(s):], mask[r, L - len(s):] = s, 1
        else:
            ids[r, :len(s)], mask[r, :len(s)] = s, 1
    return ids, mask


@pytest.mark.parametrize("left", [False, True], ids=["right-padded", "left-padded"])
def test_padding_does_not_leak_into_scores(tiny, left):
    cfg, params = tiny
    ids, mask = _pad(PHRASE_IDS, 32, left)
    s, c = token_nll(params, ids, mask, cfg)
    assert list(np.asarray(c)) == [3, 5, 1]
    for r, seq in enumerate(PHRASE_IDS):
        s1, c1 = token_nll(params, np.array([seq], np.int32), np.ones((1, len(seq)), np.int32), cfg)
        assert int(c1[0]) == len(seq) - 1
        assert abs(float(s[r]) / int(c[r]) - float(s1[0]) / int(c1[0])) < 1e-5


def test_tokenizer_gives_the_documented_ids(tokenizer_dir):
    from rbjax.model.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    assert tok.encode_batch(["the nurse was kind", "wow! they are kind!", "hello world"]) == PHRASE_IDS


def test_batched_equals_one_at_a_time_and_packing_does_not_matter(tiny):
    cfg, params = tiny
    rng = np.random.default_rng(0)
    seqs = [list(rng.integers(0, cfg.vocab_size, size=n)) for n in rng.integers(2, 40, size=23)]
    # short rows (48 slots: the longest phrase, 39 tokens, rounded up to 16), one row per batch
    one = PerplexityScorer(params, cfg, batch_size=1, row_len=2).score_ids(seqs)
    batched = PerplexityScorer(params, cfg, batch_size=8).score_ids(seqs)
    other = PerplexityScorer(params, cfg, batch_size=5, row_len=128).score_ids(seqs)
    np.testing.assert_allclose(batched.mean_nll, one.mean_nll, rtol=0, atol=1e-5)
    np.testing.assert_allclose(other.mean_nll, one.mean_nll, rtol=0, atol=1e-5)
    assert list(batched.n_scored) == [len(s) - 1 for s in seqs]


def test_short_phrases_are_unscorable_not_zero(tiny):
    cfg, params = tiny
    sc = PerplexityScorer(params, cfg, batch_size=4)
    r = sc.score_ids([[31373], [], [31373, 995]])
    assert list(r.n_scored) == [0, 0, 1]
    assert np.isnan(r.perplexity[0]) and np.isnan(r.perplexity[1]) and r.perplexity[2] > 1
    assert list(r.scorable) == [False, False, True]
    # with a BOS every token is scored, so a one-token phrase has a perplexity
    rb = PerplexityScorer(params, cfg, batch_size=4, bos_id=50256).score_ids([[31373], [31373, 995]])
    assert list(rb.n_scored) == [1, 2] and list(rb.n_tokens) == [1, 2]


def test_bad_ids_are_refused(tiny):
    cfg, params = tiny
    sc = PerplexityScorer(params, cfg, batch_size=2)
    with pytest.raises(ValueError, match="outside the model vocabulary"):
        sc.score_ids([[1, 2], [3, cfg.vocab_size]])
    with pytest.raises(ValueError, match="phrase 0: .* at most"):
        sc.score_ids([list(range(cfg.n_positions + 1))])


def test_perplexity_matches_pytorch_reference_formula(torch_tiny_model_dir, redditbias_dir, tokenizer_dir):
    """exp(HF GPT-2 loss with labels=ids), one phrase at a time, as the official perplexity_score."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from rbjax.data.redditbias import load_pairs
    from rbjax.model.tokenizer import load_tokenizer

    cfg, params = hf.load_pretrained(torch_tiny_model_dir)
    tok = load_tokenizer(tokenizer_dir)
    pairs = load_pairs("religion1", "test", redditbias_dir)
    phrases = pairs.biased[:20] + pairs.counterfactual[:20]
    ours = PerplexityScorer(params, cfg, batch_size=16).score_texts(phrases, tok).perplexity
    model = transformers.GPT2LMHeadModel.from_pretrained(torch_tiny_model_dir).eval()
    ref_tok = transformers.GPT2TokenizerFast.from_pretrained(tokenizer_dir)
    for p, o in zip(phrases, ours):
        ids = ref_tok.convert_tokens_to_ids(ref_tok.tokenize(p))
        with torch.no_grad():
            loss = model(torch.tensor([ids]), labels=torch.tensor([ids])).loss.item()
        assert o == pytest.approx(math.exp(loss), rel=1e-4)
