"""Every model family against PyTorch ``transformers``: tiny seeded random checkpoints built and
saved by ``transformers`` (offline, safetensors), with initializer_range 0.3 and every parameter (norm weights and
biases included) perturbed by N(0, 0.1²) so that no weight sits at its neutral init and the non-linearities matter;
loaded through rbjax's own loader.

Checked per family: logits of plain, left-padded and packed rows (two phrases with restarting positions and a block
mask vs each phrase alone) within rtol 1e-5 / atol 1e-5·max|logit| in float32 (measured: ≤ 2.1e-5 absolute at
max|logit| ≈ 11, i.e. ≤ 2e-6 of the logit scale); greedy generation with the KV cache token for token against
``generate(do_sample=False)`` on a left-padded batch; the LM loss and its gradient norm (rtol 1e-5 / 1e-4); the
export round trip (rbjax ``save_pretrained`` → ``transformers`` → the original logits, bit for bit). Variants:
Llama with grouped-query attention, ``llama3`` rope scaling, a free ``head_dim``, biases and an untied head; Mistral
with a sliding window of 4 and one key/value head; Qwen2 with q/k/v biases, a tied head and a sliding window on its
second layer; GPT-NeoX with ``rotary_pct`` 0.25 (parallel residual) and 0.5 (sequential); Gemma 2 with sliding
windows, attention and final-logit soft-capping active, ``query_pre_attn_scalar`` ≠ ``head_dim``. Inputs are 12
tokens long, so every window of 4 is exceeded. GPT-2's attention-scaling flags are checked the same way.

Skipped without PyTorch / ``transformers``.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rbjax.model import hf, registry
from rbjax.model.nll import mean_next_token_nll

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

V = 96
_COMMON = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               max_position_embeddings=64, initializer_range=0.3)
CASES = {
    "llama": ("LlamaConfig", dict(_COMMON, num_key_value_heads=2, head_dim=24, attention_bias=True, mlp_bias=True,
                                  tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                  rope_parameters={"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0,
                                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": 16})),
    "mistral": ("MistralConfig", dict(_COMMON, num_key_value_heads=1, head_dim=16, sliding_window=4,
                                      bos_token_id=1, eos_token_id=2, pad_token_id=0)),
    "qwen2": ("Qwen2Config", dict(_COMMON, num_key_value_heads=2, use_sliding_window=True, sliding_window=4,
                                  max_window_layers=1, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                                  pad_token_id=0)),
    "gpt_neox": ("GPTNeoXConfig", dict(_COMMON, intermediate_size=128, rotary_pct=0.25, rotary_emb_base=1000,
                                       bos_token_id=0, eos_token_id=0, pad_token_id=1)),
    "gpt_neox_sequential": ("GPTNeoXConfig", dict(_COMMON, intermediate_size=128, rotary_pct=0.5,
                                                  use_parallel_residual=False, bos_token_id=0, eos_token_id=0,
                                                  pad_token_id=1)),
    "gemma2": ("Gemma2Config", dict(_COMMON, num_hidden_layers=3, num_key_value_heads=2, head_dim=16,
                                    query_pre_attn_scalar=24, sliding_window=4, attn_logit_softcapping=3.0,
                                    final_logit_softcapping=8.0, bos_token_id=2, eos_token_id=1, pad_token_id=0)),
}
IDS = np.array([[5, 17, 33, 8, 61, 40, 12, 90, 7, 22, 3, 44], [9, 4, 44, 21, 30, 6, 50, 11, 19, 70, 64, 15]])


def _rtol_atol(ref):
    return dict(rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))


def _build(cls_name, kw, folder, seed=0):
    torch.manual_seed(seed)
    cfg = getattr(transformers, cls_name)(**kw)
    m = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    m.save_pretrained(folder, safe_serialization=True)
    return transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    cls_name, kw = CASES[request.param]
    tm = _build(cls_name, kw, folder)
    cfg, params = hf.load_pretrained(folder)
    return request.param, folder, tm, cfg, params


def _torch_logits(tm, ids):
    with torch.no_grad():
        return tm(torch.tensor(np.asarray(ids))).logits.numpy()


def test_logits_plain_padded_and_packed(case):
    name, _, tm, cfg, params = case
    fam = registry.family_of_config(cfg)
    m = fam.module(cfg)
    ref = _torch_logits(tm, IDS)
    ours, _ = m.apply({"params": params}, IDS)
    np.testing.assert_allclose(np.asarray(ours), ref, **_rtol_atol(ref))
    # left- and right-padded rows: the real tokens give each row's unpadded logits
    a, b = IDS[0, :9], IDS[1, 2:]
    rows = np.array([[0] * 3 + list(a), list(b) + [0] * 2])
    mask = np.array([[0] * 3 + [1] * 9, [1] * 10 + [0] * 2])
    got, _ = m.apply({"params": params}, rows, mask)
    ra, rb = _torch_logits(tm, a[None])[0], _torch_logits(tm, b[None])[0]
    np.testing.assert_allclose(np.asarray(got)[0, 3:], ra, **_rtol_atol(ra))
    np.testing.assert_allclose(np.asarray(got)[1, :10], rb, **_rtol_atol(rb))
    # packed: phrase a (9 tokens) and a 6-token phrase in one row, positions restarting at 0, a block mask
    c = IDS[1, 6:]
    row = np.concatenate([a, c])[None]
    pos = np.concatenate([np.arange(9), np.arange(6)])[None]
    seg = np.array([0] * 9 + [1] * 6)
    block = jnp.asarray((seg[:, None] == seg[None, :])[None])
    got, _ = m.apply({"params": params}, row, block, jnp.asarray(pos))
    rc = _torch_logits(tm, c[None])[0]
    np.testing.assert_allclose(np.asarray(got)[0, :9], ra, **_rtol_atol(ra))
    np.testing.assert_allclose(np.asarray(got)[0, 9:], rc, **_rtol_atol(rc))


def _rbjax_greedy(fam, cfg, params, ids, mask, n):
    m = fam.module(cfg)
    cache = fam.init_cache(cfg, ids.shape[0], ids.shape[1] + n)
    lg, _, cache = m.apply({"params": params}, ids, mask, cache=cache)
    out = []
    for _ in range(n):
        tok = jnp.argmax(lg[:, -1], -1)
        out.append(np.asarray(tok))
        lg, _, cache = m.apply({"params": params}, tok[:, None].astype(jnp.int32), cache=cache)
    return np.stack(out, 1)


def test_greedy_generation_with_the_kv_cache(case):
    name, _, tm, cfg, params = case
    fam = registry.family_of_config(cfg)
    pad = fam.special_tokens(cfg)["pad"]
    ids = np.array([[pad, pad, 5, 17, 33, 8], [9, 4, 44, 21, 30, 6]])
    mask = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    n = 8  # 6 + 8 tokens: beyond every sliding window of 4
    with torch.no_grad():
        ref = tm.generate(torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, pad_token_id=pad).numpy()[:, ids.shape[1]:]
    np.testing.assert_array_equal(_rbjax_greedy(fam, cfg, params, ids, mask, n), ref)


def test_lm_loss_and_gradient_norm(case):
    name, _, tm, cfg, params = case
    fam = registry.family_of_config(cfg)
    m = fam.module(cfg)
    ids = jnp.asarray(IDS)
    mask = jnp.ones_like(ids)

    def loss(p):
        _, h = m.apply({"params": p}, ids, return_logits=False)
        return mean_next_token_nll(h, fam.lm_head(p), ids, mask, chunk=40, softcap=fam.logit_softcap(cfg))

    val, g = jax.value_and_grad(loss)(jax.tree_util.tree_map(jnp.asarray, params))
    gnorm = float(jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree_util.tree_leaves(g))))
    tm.zero_grad()
    out = tm(torch.tensor(IDS), labels=torch.tensor(IDS))
    out.loss.backward()
    tnorm = float(torch.sqrt(sum((p.grad ** 2).sum() for p in tm.parameters() if p.grad is not None)))
    np.testing.assert_allclose(float(val), out.loss.detach().item(), rtol=1e-5)
    np.testing.assert_allclose(gnorm, tnorm, rtol=1e-4)


def test_export_round_trip(case, tmp_path):
    name, _, tm, cfg, params = case
    out = hf.save_pretrained(params, cfg, tmp_path / "export")
    back = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    np.testing.assert_array_equal(_torch_logits(back, IDS), _torch_logits(tm, IDS))
    cfg2, params2 = hf.load_pretrained(out)
    assert cfg2 == cfg
    jax.tree_util.tree_map(np.testing.assert_array_equal, params2, params)


def test_bf16_sharded_checkpoint_saved_by_transformers(tmp_path):
    cls_name, kw = CASES["llama"]
    tm = _build(cls_name, kw, tmp_path / "fp32")
    tm = tm.to(torch.bfloat16)
    tm.save_pretrained(tmp_path / "bf16", safe_serialization=True, max_shard_size="40KB")
    assert (tmp_path / "bf16" / "model.safetensors.index.json").exists()
    cfg, params = hf.load_pretrained(tmp_path / "bf16")
    fam = registry.family_of_config(cfg)
    want = {k: v.float().numpy() for k, v in tm.state_dict().items()}
    got = fam.params_to_hf(params, cfg)
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.parametrize("flags", [dict(scale_attn_by_inverse_layer_idx=True), dict(scale_attn_weights=False),
                                   dict(reorder_and_upcast_attn=True)])
def test_gpt2_attention_scaling_flags(flags, tmp_path):
    # Stanford CRFM's GPT-2s scale by the inverse layer index; these flags were once silently dropped
    # (logits off by 0.04 / 0.48 on real checkpoints). reorder_and_upcast_attn is a no-op in float32.
    tm = _build("GPT2Config", dict(vocab_size=V, n_positions=32, n_embd=32, n_layer=3, n_head=2,
                                   initializer_range=0.3, bos_token_id=0, eos_token_id=0, **flags), tmp_path)
    cfg, params = hf.load_pretrained(tmp_path)
    for k, v in flags.items():
        assert getattr(cfg, k) == v
    ref = _torch_logits(tm, IDS)
    ours, _ = registry.family_of_config(cfg).module(cfg).apply({"params": params}, IDS)
    np.testing.assert_allclose(np.asarray(ours), ref, **_rtol_atol(ref))
    if "reorder_and_upcast_attn" not in flags:  # the flag matters: without it the logits are far off
        plain = cfg.__class__(**{**cfg.__dict__, **{k: not v for k, v in flags.items()}})
        off, _ = registry.family_of_config(cfg).module(plain).apply({"params": params}, IDS)
        assert np.abs(np.asarray(off) - ref).max() > 1e-2
