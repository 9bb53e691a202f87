"""Batched KV-cache generation: equal to a naive full-recompute loop, seeded, stops at EOS,
HF-style top-k/top-p filtering, the reference's length rule, the JSONL writer."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rbjax.model.generate import SamplingSettings, filter_logits, generate, sampling_settings
from rbjax.model.gpt2 import GPT2Config, GPT2LMHeadModel, init_params

EOS = 63
CFG = GPT2Config(vocab_size=64, n_positions=160, n_embd=32, n_layer=2, n_head=2, eos_token_id=EOS, bos_token_id=EOS)
PROMPTS = [[5, 9, 17, 3, 8, 1, 2, 3, 4, 5, 6], [11, 2], [40, 41, 42, 43], [7], [20, 21, 22, 23, 24, 25]]


@pytest.fixture(scope="module")
def params():
    return init_params(CFG, seed=7)


def _eos_prone(params, logit):
    """The same model with the final LayerNorm replaced by a constant state b and wte[EOS] set so that the EOS
    logit is ``logit`` above... : every position gets the same next-token distribution, EOS with high odds."""
    p = jax.tree.map(lambda x: x, params)
    rng = np.random.default_rng(0)
    b = rng.normal(size=CFG.n_embd).astype(np.float32)
    p["ln_f"] = {"scale": jnp.zeros(CFG.n_embd), "bias": jnp.asarray(b)}
    wte = np.asarray(p["wte"]["embedding"]).copy()
    wte[EOS] = logit * b / float(b @ b)
    p["wte"] = {"embedding": jnp.asarray(wte)}
    return p


def test_greedy_kv_cache_equals_naive_full_recompute(params):
    """The KV-cache sampler (greedy, left-padded batch) gives the tokens of a loop that re-runs the whole
    sequence through the model at every step, one prompt at a time."""
    model = GPT2LMHeadModel(CFG)
    full = jax.jit(lambda p, i, m: model.apply({"params": p}, i, attention_mask=m)[0])
    settings = SamplingSettings(max_new_tokens=12, greedy=True)
    got = generate(params, CFG, PROMPTS, settings=settings, batch_size=3)
    for i, prompt in enumerate(PROMPTS):
        seq = list(prompt)
        want = []
        W = 32
        with jax.default_matmul_precision("highest"):
            for _ in range(12):
                ids = np.zeros((1, W), np.int32)
                m = np.zeros((1, W), np.int32)
                ids[0, :len(seq)], m[0, :len(seq)] = seq, 1
                tok = int(np.argmax(np.asarray(full(params, ids, m))[0, len(seq) - 1]))
                want.append(tok)
                seq.append(tok)
                if tok == EOS:
                    break
        stopped = want[-1] == EOS
        assert got.tokens[i] == (want[:-1] if stopped else want), i
        assert bool(got.stopped_at_eos[i]) == stopped
    assert len({len(t) for t in got.tokens}) > 1 or all(len(t) == 12 for t in got.tokens)


def test_seeded_runs_repeat_and_do_not_depend_on_the_batch(params):
    s = sampling_settings("rbjax", max_new_tokens=10)
    a = generate(params, CFG, PROMPTS, settings=s, seed=3, batch_size=2)
    b = generate(params, CFG, PROMPTS, settings=s, seed=3, batch_size=2)
    c = generate(params, CFG, PROMPTS, settings=s, seed=4, batch_size=2)
    assert a.tokens == b.tokens and a.tokens != c.tokens
    # the same example in another batch, alone, or reversed: same tokens (per-example PRNG streams)
    d = generate(params, CFG, PROMPTS, settings=s, seed=3, batch_size=5)
    e = generate(params, CFG, [PROMPTS[2]], settings=s, seed=3, batch_size=1, example_ids=[2])
    f = generate(params, CFG, PROMPTS[::-1], settings=s, seed=3, batch_size=5, example_ids=[4, 3, 2, 1, 0])
    assert d.tokens == a.tokens and e.tokens[0] == a.tokens[2] and f.tokens[::-1] == a.tokens
    # sampling with top-k 1 is greedy
    g = generate(params, CFG, PROMPTS, settings=SamplingSettings(max_new_tokens=10, top_k=1), seed=9, batch_size=5)
    h = generate(params, CFG, PROMPTS, settings=SamplingSettings(max_new_tokens=10, greedy=True), batch_size=5)
    assert g.tokens == h.tokens


def test_eos_stops_a_row_and_the_rest_go_on(params):
    p = _eos_prone(params, logit=5.0)  # p(EOS) ≈ 0.7 at every step: rows stop at different steps
    s = SamplingSettings(max_new_tokens=8, top_k=None)
    g = generate(p, CFG, PROMPTS * 4, settings=s, seed=0, batch_size=20)
    lens = [len(t) for t in g.tokens]
    assert g.stopped_at_eos.any() and len(set(lens)) > 2
    for t, stopped in zip(g.tokens, g.stopped_at_eos):
        assert EOS not in t
        assert stopped or len(t) == 8
    # each row equals the row generated alone: a finished row's padding never reaches the others
    for i in (1, 7, 13):  # prompts of ≤ 8 tokens: one compiled program
        alone = generate(p, CFG, [(PROMPTS * 4)[i]], settings=s, seed=0, batch_size=1, example_ids=[i])
        assert alone.tokens[0] == g.tokens[i]
    # forced EOS: every row stops at once, with nothing generated
    forced = generate(_eos_prone(params, logit=1e4), CFG, PROMPTS, settings=s, seed=0)
    assert forced.tokens == [[]] * len(PROMPTS) and forced.stopped_at_eos.all()


def test_the_sampling_filter_compiles_to_a_top_k_not_a_sort_of_the_vocabulary():
    """The filter is O(V) per row: its compiled program holds a top-k of the row and no sort of all V logits (XLA's
    CPU compiler rewrote the top-k followed by slices into a full sort, ~100x slower per decode step)."""
    import re

    from rbjax.model.generate import _filter

    V = 5000
    f = jax.jit(lambda x: _filter(x, 50, jnp.float32(0.9), jnp.float32(1.0)))
    hlo = f.lower(jax.ShapeDtypeStruct((4, V), jnp.float32)).compile().as_text()
    sorts = [ln for ln in hlo.splitlines() if re.search(r"\bsort\(", ln) and f",{V}]" in ln]
    assert not sorts, sorts[0][:200]
    assert "TopK" in hlo or re.search(r"\btopk\(", hlo)


def test_top_k_top_p_filtering_on_hand_made_logits():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05], [0.05, 0.15, 0.3, 0.5]]))
    keep = lambda f: np.isfinite(np.asarray(f)).tolist()  # noqa: E731
    assert keep(filter_logits(logits, top_k=3)) == [[True, True, True, False], [False, True, True, True]]
    # Hugging Face: remove tokens whose ascending cumulative probability is <= 1 - top_p
    assert keep(filter_logits(logits, top_k=None, top_p=0.75)) == [[True, True, False, False],
                                                                    [False, False, True, True]]
    assert keep(filter_logits(logits, top_k=None, top_p=0.85)) == [[True, True, True, False],
                                                                    [False, True, True, True]]
    assert keep(filter_logits(logits, top_k=None, top_p=0.01)) == [[True, False, False, False],
                                                                    [False, False, False, True]]
    # top-p applies to the top-k distribution renormalised: top-2 → 0.625 / 0.375
    assert keep(filter_logits(logits, top_k=2, top_p=0.6)) == [[True, False, False, False],
                                                               [False, False, False, True]]
    assert keep(filter_logits(logits, top_k=2, top_p=0.7)) == [[True, True, False, False],
                                                               [False, False, True, True]]
    # temperature divides the kept logits
    np.testing.assert_allclose(np.asarray(filter_logits(logits, top_k=1, temperature=2.0))[0, 0],
                               float(logits[0, 0]) / 2, rtol=1e-6)


def test_reference_semantics_count_the_prompt(params):
    s = sampling_settings("reference")
    assert (s.top_k, s.top_p, s.max_length, s.max_new_tokens) == (50, 0.95, 128, 64)
    p = _eos_prone(params, logit=-1e4)  # EOS never: rows run to their budget
    long_prompt = list(np.arange(100) % 60)
    g = generate(p, CFG, [long_prompt, [1, 2, 3]], settings=s, seed=0)
    assert [len(t) for t in g.tokens] == [28, 64]  # 128 − 100, and the 64-token cap
    with pytest.raises(ValueError, match="semantics"):
        sampling_settings("hf")
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generate(params, CFG, [[1], []])
    with pytest.raises(ValueError, match="top_p"):
        SamplingSettings(top_p=1.5)


def test_jsonl_writer_and_prompts(tmp_path, tokenizer_dir):
    from rbjax.dialog.crg_generation import build_prompt, generate_responses
    from rbjax.model.tokenizer import load_tokenizer

    assert build_prompt([1, 2, 3], 50256) == [1, 2, 3, 50256]
    assert build_prompt(list(range(100)), 50256) == list(range(37, 100)) + [50256]
    assert build_prompt([1, 2, 3], 50256, semantics="reference") == [1, 2, 3, 50256, 50256]
    assert build_prompt(list(range(70)), 50256, semantics="reference") == list(range(64))  # no separator
    assert build_prompt(list(range(200)), 50256, semantics="reference") == list(range(74, 138))
    tok = load_tokenizer(tokenizer_dir)
    cfg = GPT2Config(vocab_size=50257, n_positions=128, n_embd=32, n_layer=2, n_head=2)
    params = init_params(cfg, seed=0)
    ex = [("k1", "how are you ?"), ("k2", "START what is the best pizza in town EOS"), ("k3", "hi")]
    out = tmp_path / "gen.jsonl"
    recs = generate_responses(params, cfg, tok, ex, out, settings=SamplingSettings(max_new_tokens=5), seed=1,
                              progress=False)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines == recs and [r["key"] for r in lines] == ["k1", "k2", "k3"]
    assert [r["context"] for r in lines] == [c for _, c in ex]
    assert all(isinstance(r["response"], str) and r["response"] for r in lines)


def test_ties_at_the_kth_logit_are_all_kept_as_hugging_face():
    """Field case: top_k=2 on [3, 2, 2, 2, 0, −1] kept 2 tokens; HF's TopKLogitsWarper keeps every token tied with
    the k-th (4 here), and top-p then works on that renormalised set."""
    torch = pytest.importorskip("torch")
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    def hf(x, k, p=None):
        s = TopKLogitsWarper(top_k=k)(None, torch.tensor(x, dtype=torch.float32))
        if p is not None:
            s = TopPLogitsWarper(top_p=p)(None, s)
        return np.isfinite(s.numpy())

    x = [[3.0, 2.0, 2.0, 2.0, 0.0, -1.0], [0.0, 1.0, 1.0, -2.0, 1.0, 1.0]]
    got = np.isfinite(np.asarray(filter_logits(x, top_k=2)))
    assert got.tolist() == hf(x, 2).tolist() == [[True, True, True, True, False, False],
                                                 [False, True, True, False, True, True]]
    # top-p over the 4 kept tokens: HF picks *which* tied tokens by torch.sort's order, so compare the counts and
    # that every kept tie-free token agrees
    rng = np.random.default_rng(0)
    for p in (0.3, 0.6, 0.95, 1.0):
        for k in (1, 2, 5):
            z = rng.integers(-2, 3, size=(3, 12)).astype(np.float32)  # many ties
            got = np.isfinite(np.asarray(filter_logits(z, top_k=k, top_p=p)))
            want = hf(z, k, p)
            assert got.sum(1).tolist() == want.sum(1).tolist(), (p, k, z)
            for r in range(3):  # the kept logits are the same multiset
                assert sorted(z[r][got[r]]) == sorted(z[r][want[r]]), (p, k, r)
    with pytest.raises(ValueError, match="temperature"):
        filter_logits(x, temperature=0)
    with pytest.raises(ValueError, match="top_k"):
        filter_logits(x, top_k=0)


def test_sampler_keeps_ties_at_the_kth_logit(params):
    """The sampler applies the same rule: two tokens with identical embeddings tie for the largest logit at every
    step, and top_k=1 draws both (the old sampler only ever drew the lower id)."""
    p = _eos_prone(params, logit=-1e4)  # constant next-token distribution, EOS never
    b = np.asarray(p["ln_f"]["bias"])
    wte = np.asarray(p["wte"]["embedding"]).copy()
    wte[10] = wte[20] = 50.0 * b / float(b @ b)  # logit 50 for both, far above the rest
    p["wte"] = {"embedding": jnp.asarray(wte)}
    g = generate(p, CFG, PROMPTS, settings=SamplingSettings(max_new_tokens=8, top_k=1), seed=0, batch_size=5)
    drawn = [t for row in g.tokens for t in row]
    assert set(drawn) == {10, 20}
