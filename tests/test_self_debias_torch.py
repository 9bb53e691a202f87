"""Self-Debias log-likelihoods against a PyTorch implementation of the formula, on tiny seeded ``transformers``
models: a GPT-2 (no BOS: the first token is context only) and a Llama whose tokenizer adds a BOS (the prefix goes
after it, every text token is scored).

Reference, per sequence: the full logits of ``seq`` and of ``lead + prefix_k + seq[lead:]`` (``lead`` the BOS when
there is one) from the ``transformers`` model, one sequence at a time; at each scored position the softmaxes,
``Δ = max(0, max_k p_k − p)``, ``q ∝ p·max(ε, exp(−λΔ))``, and log q of the next token, summed. Checked to 1e-4.

Skipped without PyTorch / ``transformers``.
"""
import numpy as np
import pytest

from rbjax.lmb.self_debias import SelfDebiasScorer
from rbjax.model import hf
from tests.conftest import make_torch_model
from rbjax.model.self_debias import SelfDebiasSettings

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

V = 96
CASES = {  # (config class, config, bos id or None)
    "gpt2": ("GPT2Config", dict(vocab_size=V, n_embd=32, n_layer=2, n_head=2, n_positions=64,
                                initializer_range=0.3, bos_token_id=1, eos_token_id=2), None),
    "llama": ("LlamaConfig", dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                  initializer_range=0.3, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                  tie_word_embeddings=False), 1),
}
PREFIXES = ([60, 61, 62, 63, 64], [70, 71, 72])


def _torch_self_debias(tm, seqs, firsts, prefixes, bos, lam, eps):
    out = []
    with torch.no_grad():
        for s, f in zip(seqs, firsts):
            lead = 1 if bos is not None and s[0] == bos else 0
            lp = torch.log_softmax(tm(input_ids=torch.tensor([s])).logits[0].double(), -1)
            pks = []
            for pre in prefixes:
                full = s[:lead] + list(pre) + s[lead:]
                pks.append(torch.softmax(tm(input_ids=torch.tensor([full])).logits[0].double(), -1)[len(pre):])
            pb = torch.stack(pks).max(0).values
            p = lp.exp()
            q = p * torch.clamp(torch.exp(-lam * torch.clamp(pb - p, min=0)), min=eps)
            q = q / q.sum(-1, keepdim=True)
            out.append(float(sum(torch.log(q[j - 1, s[j]]) for j in range(f, len(s)))))
    return np.array(out)


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    cls_name, kw, bos = CASES[request.param]
    tm = make_torch_model(cls_name, kw, folder)
    cfg, params = hf.load_pretrained(folder)
    return tm, cfg, params, bos


def _phrases(seed=0, n=11):
    rng = np.random.default_rng(seed)
    return [list(map(int, rng.integers(3, V, size=int(rng.integers(1, 12))))) for _ in range(n)]


@pytest.mark.parametrize("n_prefixes", [1, 2])
def test_self_debias_log_likelihoods_match_torch(case, n_prefixes):
    tm, cfg, params, bos = case
    prefixes = PREFIXES[:n_prefixes]
    settings = SelfDebiasSettings(tuple(f"p{i}" for i in range(n_prefixes)), 50.0, 0.01)
    sc = SelfDebiasScorer(params, cfg, prefixes, settings, batch_size=4, bos_id=bos)
    a, b = _phrases(0), _phrases(1)
    sa, sb = sc.score_pairs(a, b)
    lead = [] if bos is None else [bos]
    for phrases, got in ((a, sa), (b, sb)):
        seqs = [lead + p for p in phrases]
        firsts = [1] * len(seqs)
        ref = _torch_self_debias(tm, seqs, firsts, prefixes, bos, 50.0, 0.01)
        ok = got.n_scored > 0
        np.testing.assert_array_equal(got.n_scored, [len(s) - 1 for s in seqs])
        np.testing.assert_allclose(-got.nll_sum[ok], ref[ok], atol=1e-4)
    # the rescaling changed the scores (else the test would not see a wrong prefix)
    from rbjax.lmb.perplexity import PerplexityScorer
    plain = PerplexityScorer(params, cfg, batch_size=4, bos_id=bos).score_ids(a)
    ok = plain.n_scored > 0
    assert np.abs(plain.nll_sum[ok] - sa.nll_sum[ok]).max() > 1e-3
    # multiple choice (BBQ): context + each continuation, the continuation's tokens scored
    ctxs = [lead + p for p in a[:4] if p]
    conts = [[b[i] or [5], [7, 8]] for i in range(len(ctxs))]
    lls = sc.score_choices(ctxs, conts)
    for c, ts, ll in zip(ctxs, conts, lls):
        ref = _torch_self_debias(tm, [c + t for t in ts], [len(c)] * len(ts), prefixes, bos, 50.0, 0.01)
        np.testing.assert_allclose(ll, ref, atol=1e-4)


def test_self_debias_packed_layout_chat_context_mixed_starts_and_chunks(case):
    """The packed layout's other paths against PyTorch: a context shared by every sequence (the chat format: laid
    once a row, the prefix put after its BOS), pairs of which one side only starts with the BOS (scored as two
    phrases, rows of each kind packed apart), the LM head over chunks of one slot; the programs are those
    ``program_shapes`` plans."""
    tm, cfg, params, bos = case
    prefixes = PREFIXES
    settings = SelfDebiasSettings(("p0", "p1"), 50.0, 0.01)
    sc = SelfDebiasScorer(params, cfg, prefixes, settings, batch_size=4, bos_id=bos)
    a, b = _phrases(2, 6), _phrases(3, 6)
    # a chat template's context: 6 tokens (the BOS first where the model has one), none scored
    ctx = ([] if bos is None else [bos]) + [10, 11, 12, 13, 14, 15][: 6 - (bos is not None)]
    ca, cb = [ctx + p for p in a], [ctx + p for p in b]
    n = ([len(ctx)] * len(a), [len(ctx)] * len(b))
    sa, sb = sc.score_pairs(ca, cb, n_context=n)
    assert sc.last_stats["row_context"] > 0 and sc.last_stats["passes"] == 3
    for seqs, got in ((ca, sa), (cb, sb)):
        ref = _torch_self_debias(tm, seqs, [len(ctx)] * len(seqs), prefixes, bos, 50.0, 0.01)
        np.testing.assert_array_equal(got.n_scored, [len(s) - len(ctx) for s in seqs])
        ok = got.n_scored > 0
        np.testing.assert_allclose(-got.nll_sum[ok], ref[ok], atol=1e-4)
    assert sc.program_shapes(pairs=(ca, cb), n_context=n) == {p[1:4] for p in sc.programs} != set()
    # the LM head one predicting slot at a time: the same values
    chunked = SelfDebiasScorer(params, cfg, prefixes, settings, batch_size=4, bos_id=bos)
    chunked.max_logits = 1
    xa, xb = chunked.score_pairs(ca, cb, n_context=n)
    np.testing.assert_allclose(xa.nll_sum, sa.nll_sum, rtol=1e-6)
    np.testing.assert_allclose(xb.nll_sum, sb.nll_sum, rtol=1e-6)
    if bos is None:
        return
    # the BOS on one side only (the first pairs), on both (the others): each sequence's own prefixed form
    ma = [[bos] + p for p in a]
    mb = [p if i < 3 else [bos] + p for i, p in enumerate(b)]
    nm = ([1] * len(ma), [1 if s[0] == bos else 0 for s in mb])
    ga, gb = sc.score_pairs(ma, mb, n_context=nm)
    for seqs, got in ((ma, ga), (mb, gb)):
        ref = _torch_self_debias(tm, seqs, [1] * len(seqs), prefixes, bos, 50.0, 0.01)
        np.testing.assert_array_equal(got.n_scored, [len(s) - 1 for s in seqs])
        ok = got.n_scored > 0
        np.testing.assert_allclose(-got.nll_sum[ok], ref[ok], atol=1e-4)
