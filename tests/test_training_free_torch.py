"""SentenceDebias and INLP against a PyTorch reference computed from ``transformers`` hidden states by bias-bench's
procedure, on tiny seeded models of GPT-2, Llama (untied head), GPT-NeoX (``embed_out``) and Gemma 2 (tied head,
final-logit soft-capping).

Reference: each sentence run alone through the ``transformers`` model's body, ``last_hidden_state`` (after the final
norm) averaged over its tokens; SentenceDebias: L2-normalised, each pair centred on its mean, scikit-learn's
``PCA(n_components=1)``; the debiased model: a forward hook on the body that replaces ``last_hidden_state`` by
``h − (h·v) v`` (bias-bench's hook), the full model's logits then (Gemma 2 soft-caps them after the head). INLP: the
same loop written with scikit-learn's ``LogisticRegression`` (no intercept, C = 1) and ``scipy.linalg.orth``.

Checked: the representations (1e-5), the subspace up to sign (1e-5), the debiased per-phrase log-likelihoods
(1e-4), the INLP projection against the reference loop, and the exported folded model loaded in ``transformers``
against rbjax's debiased model (1e-4).

Skipped without PyTorch / ``transformers``.
"""
import numpy as np
import pytest
import scipy.linalg

from rbjax.debias import projection as pr
from rbjax.debias.representations import sentence_representations
from rbjax.lmb.perplexity import token_nll
from rbjax.model import hf
from tests.conftest import make_torch_model
from rbjax.model.registry import family_of_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
sklearn_decomposition = pytest.importorskip("sklearn.decomposition")
sklearn_linear = pytest.importorskip("sklearn.linear_model")

V = 96
_C = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
          max_position_embeddings=64, initializer_range=0.3, bos_token_id=1, eos_token_id=2, pad_token_id=0)
CASES = {
    "gpt2": ("GPT2Config", dict(vocab_size=V, n_embd=32, n_layer=2, n_head=2, n_positions=64, initializer_range=0.3,
                                bos_token_id=1, eos_token_id=2)),
    "llama": ("LlamaConfig", dict(_C, num_key_value_heads=2, tie_word_embeddings=False)),
    "gpt_neox": ("GPTNeoXConfig", dict(_C, rotary_pct=0.25, bos_token_id=0, eos_token_id=0, pad_token_id=1)),
    "gemma2": ("Gemma2Config", dict(_C, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8, sliding_window=4,
                                    attn_logit_softcapping=3.0, final_logit_softcapping=2.0)),
}


def _sentences(seed=0, n=16):
    """``n`` counterfactual pairs of token-id sentences: the same random sentence with one "target" token swapped
    (token 10 + k in one group, 40 + k in the other), of 3 to 9 tokens."""
    rng = np.random.default_rng(seed)
    a, b = [], []
    for i in range(n):
        s = list(rng.integers(50, V, size=int(rng.integers(3, 10))))
        at = int(rng.integers(0, len(s)))
        k = i % 4
        a.append(s[:at] + [10 + k] + s[at:])
        b.append(s[:at] + [40 + k] + s[at:])
    return a, b


def _body(tm):
    return next(getattr(tm, n) for n in ("transformer", "gpt_neox", "model") if hasattr(tm, n))


def _torch_reps(tm, sents):
    with torch.no_grad():
        return np.stack([_body(tm)(input_ids=torch.tensor([s])).last_hidden_state[0].mean(0).double().numpy()
                         for s in sents])


def _torch_loglik(tm, sents, project):
    """Per-sentence log-likelihood (sum over tokens 2..L) with ``project`` applied to ``last_hidden_state``."""
    def hook(module, inputs, output):
        output.last_hidden_state = project(output.last_hidden_state)
        return output

    h = _body(tm).register_forward_hook(hook)
    try:
        out = []
        with torch.no_grad():
            for s in sents:
                logp = torch.log_softmax(tm(input_ids=torch.tensor([s])).logits[0].double(), -1)
                out.append(float(sum(logp[i, s[i + 1]] for i in range(len(s) - 1))))
        return np.array(out)
    finally:
        h.remove()


def _rbjax_loglik(params, cfg, sents):
    L = max(map(len, sents))
    ids = np.zeros((len(sents), L), np.int32)
    mask = np.zeros_like(ids)
    for r, s in enumerate(sents):
        ids[r, :len(s)], mask[r, :len(s)] = s, 1
    nll, _ = token_nll(params, ids, mask, cfg)
    return -np.asarray(nll, dtype=np.float64)


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    tm = make_torch_model(*CASES[request.param], folder)
    cfg, params = hf.load_pretrained(folder)
    return request.param, tm, cfg, params, tmp_path_factory.mktemp(request.param + "_export")


def test_sentence_debias_matches_the_torch_reference(case):
    name, tm, cfg, params, export_dir = case
    a, b = _sentences()
    ta, tb = _torch_reps(tm, a), _torch_reps(tm, b)
    ra, rb = (sentence_representations(params, cfg, s, batch_size=8) for s in (a, b))
    np.testing.assert_allclose(ra, ta, atol=1e-5)
    np.testing.assert_allclose(rb, tb, atol=1e-5)

    # bias-bench: normalise, centre each pair, PCA(1) of the stacked centred vectors
    na, nb = (t / np.linalg.norm(t, axis=1, keepdims=True) for t in (ta, tb))
    mean = (na + nb) / 2
    ref_v = sklearn_decomposition.PCA(n_components=1).fit(np.concatenate([na - mean, nb - mean])).components_[0]
    groups = np.stack([sentence_representations(params, cfg, s, normalize=True) for s in (a, b)])
    v = pr.sentence_debias_subspace(groups, k=1)[0]
    assert min(np.abs(v - ref_v).max(), np.abs(v + ref_v).max()) < 1e-5

    # the debiased model: rbjax's folded head vs bias-bench's hook on the torch model
    p = pr.subspace_projection(v[None])
    dparams, dcfg = pr.projected_model(params, cfg, p)
    vt = torch.tensor(ref_v, dtype=torch.float32)
    ref_ll = _torch_loglik(tm, a + b, lambda h: h - (h @ vt)[..., None] * vt)
    got = _rbjax_loglik(dparams, dcfg, a + b)
    np.testing.assert_allclose(got, ref_ll, atol=1e-4)
    base = _rbjax_loglik(params, cfg, a + b)
    assert np.abs(base - got).max() > 1e-3  # the projection changed something

    # export: the folded model, saved and loaded in transformers, gives rbjax's debiased logits
    hf.save_pretrained(dparams, dcfg, export_dir)
    em = transformers.AutoModelForCausalLM.from_pretrained(export_dir, attn_implementation="eager").eval()
    assert not em.config.tie_word_embeddings
    sents = a[:4]
    with torch.no_grad():
        ref = [em(input_ids=torch.tensor([s])).logits[0].numpy() for s in sents]
    mod = family_of_config(dcfg).module(dcfg)
    for s, r in zip(sents, ref):
        logits, _ = mod.apply({"params": dparams}, np.array([s], np.int32))
        np.testing.assert_allclose(np.asarray(logits[0]), r, atol=1e-4)
    # and the input embedding is the base's (the head was untied, not the embedding changed)
    emb = em.get_input_embeddings().weight.detach().numpy()
    np.testing.assert_array_equal(emb, tm.get_input_embeddings().weight.detach().numpy())


def _reference_inlp(xt, yt, xd, yd, iterations, epsilon):
    """INLP as bias-bench's loop runs it, with scikit-learn's logistic regression as the classifier."""
    d = xt.shape[1]
    chance = np.bincount(yd).max() / len(yd)
    p, rows = np.eye(d), []
    for _ in range(iterations):
        clf = sklearn_linear.LogisticRegression(C=1.0, fit_intercept=False, tol=1e-10, max_iter=10_000)
        clf.fit(xt @ p, yt)
        if clf.score(xd @ p, yd) <= chance + epsilon:
            break
        basis = scipy.linalg.orth(clf.coef_.T)
        rows.append(basis @ basis.T)
        basis = scipy.linalg.orth(np.sum(rows, axis=0))
        p = np.eye(d) - basis @ basis.T
    return p, len(rows)


def test_inlp_matches_the_torch_reference(case):
    name, tm, cfg, params, _ = case
    a, b = _sentences(seed=1, n=24)
    train, dev = pr.split_groups(len(a), 0.3, seed=0)

    def rows(reps_a, reps_b, idx):
        return np.concatenate([reps_a[idx], reps_b[idx]]), np.repeat([0, 1], len(idx))

    ta, tb = _torch_reps(tm, a), _torch_reps(tm, b)
    ra, rb = (sentence_representations(params, cfg, s) for s in (a, b))
    (xt, yt), (xd, yd) = rows(ra, rb, train), rows(ra, rb, dev)
    res = pr.inlp_projection(xt, yt, xd, yd, iterations=4, epsilon=0.0)
    ref_p, ref_kept = _reference_inlp(*rows(ta, tb, train), *rows(ta, tb, dev), 4, 0.0)
    assert len(res.classifiers) == ref_kept >= 1
    np.testing.assert_allclose(res.projection, ref_p, atol=1e-4)
    p = res.projection
    assert np.abs(p - p.T).max() < 1e-12 and np.abs(p @ p - p).max() < 1e-10
    assert np.linalg.matrix_rank(p, tol=1e-8) == cfg.hidden_size - ref_kept
