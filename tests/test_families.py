"""Model families without PyTorch: tiny models built by rbjax itself go through save_pretrained →
load_pretrained unchanged; the KV cache, padded rows and packed rows agree with the plain forward pass in every
family (grouped-query attention and sliding windows included); config fields are handled or refused by name; the
chunked NLL takes the untied head and the final-logit soft-cap with its exact gradient.

Parity with PyTorch ``transformers`` on checkpoints it builds is in ``test_families_torch.py``.
"""
import functools
import inspect
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rbjax.model import gemma2, gpt2, gpt_neox, hf, llama, registry
from rbjax.model import hf_config as hc
from rbjax.model.nll import mean_next_token_nll, nll_from_hidden

# tiny configs, one per family / variant, with what makes each one different switched on
TINY = {
    "gpt2": gpt2.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0,
                            eos_token_id=1, scale_attn_by_inverse_layer_idx=True),
    "llama": llama.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=12, qkv_bias=True, o_bias=True,
                               mlp_bias=True, initializer_range=0.3, bos_token_id=1, eos_token_id=2,
                               rope=hc.Rope(theta=500.0, type="llama3", factor=8.0, low_freq_factor=1.0,
                                            high_freq_factor=4.0, original_max_position_embeddings=16)),
    "mistral": llama.LlamaConfig(model_type="mistral", vocab_size=64, hidden_size=32, intermediate_size=48,
                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=8,
                                 initializer_range=0.3, sliding_window=3, layer_windows=(3, 3), bos_token_id=1,
                                 eos_token_id=2),
    "qwen2": llama.LlamaConfig(model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=48,
                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                               qkv_bias=True, tie_word_embeddings=True, initializer_range=0.3, sliding_window=3,
                               use_sliding_window=True, max_window_layers=1, layer_windows=(None, 3),
                               eos_token_id=2),
    "gpt_neox": gpt_neox.GPTNeoXConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=64, initializer_range=0.3),
    "gemma2": gemma2.Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=12,
                                  sliding_window=3, layer_windows=(3, None), attn_logit_softcapping=2.0,
                                  final_logit_softcapping=3.0, initializer_range=0.3),
}
IDS = np.array([[5, 17, 33, 8, 61, 40, 12, 3, 7], [9, 2, 44, 21, 30, 6, 50, 11, 19]], np.int32)


@functools.lru_cache(maxsize=None)
def _model(name):
    """(config, family, params) of a tiny family model, initialised once per session."""
    cfg = TINY[name]
    fam = registry.family_of_config(cfg)
    params = fam.init_params(cfg, 0)
    return cfg, fam, params


@pytest.mark.parametrize("name", list(TINY))
def test_save_load_round_trip(name, tmp_path):
    cfg, fam, params = _model(name)
    out = hf.save_pretrained(params, cfg, tmp_path / name)
    d = json.loads((out / "config.json").read_text())
    assert registry.family_of(d, "x") is fam
    cfg2, params2 = hf.load_pretrained(out)
    assert cfg2 == cfg
    assert jax.tree_util.tree_structure(params2) == jax.tree_util.tree_structure(params)
    jax.tree_util.tree_map(np.testing.assert_array_equal, params2, jax.tree_util.tree_map(np.asarray, params))
    assert fam.lm_head(params2).shape == (cfg.vocab_size, cfg.width)


@pytest.mark.parametrize("name", list(TINY))
def test_cache_padding_and_packing_agree_with_the_plain_forward(name):
    cfg, fam, params = _model(name)
    m = fam.module(cfg)
    full, hid = m.apply({"params": params}, IDS)
    full = np.asarray(full)
    assert hid.shape == IDS.shape + (cfg.width,)
    # KV cache: a prompt of 4, then one token at a time (the sliding windows of 3 matter from token 4 on)
    cache = fam.init_cache(cfg, 2, IDS.shape[1])
    lg, _, cache = m.apply({"params": params}, IDS[:, :4], cache=cache)
    steps = [np.asarray(lg)]
    for t in range(4, IDS.shape[1]):
        lg, _, cache = m.apply({"params": params}, IDS[:, t:t + 1], cache=cache)
        steps.append(np.asarray(lg))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, rtol=1e-5, atol=1e-5)
    # left padding: the real tokens give the unpadded logits
    pad = np.concatenate([np.zeros((2, 3), np.int32), IDS], 1)
    mask = np.concatenate([np.zeros((2, 3), np.int32), np.ones_like(IDS)], 1)
    lg, _ = m.apply({"params": params}, pad, mask)
    np.testing.assert_allclose(np.asarray(lg)[:, 3:], full, rtol=1e-5, atol=1e-5)
    # packed: the first 5 tokens of row 0 and all 9 of row 1 in one row, positions restarting, block mask
    a, b = IDS[0, :5], IDS[1]
    row = np.concatenate([a, b])[None]
    pos = np.concatenate([np.arange(5), np.arange(9)])[None]
    seg = np.concatenate([np.zeros(5), np.ones(9)])
    block = (seg[:, None] == seg[None, :])[None]
    lg, _ = m.apply({"params": params}, row, jnp.asarray(block), jnp.asarray(pos))
    alone_a, _ = m.apply({"params": params}, a[None])
    np.testing.assert_allclose(np.asarray(lg)[0, :5], np.asarray(alone_a)[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(lg)[0, 5:], full[1], rtol=1e-5, atol=1e-5)
    # return_logits=False gives the same hidden states
    none, hid2 = m.apply({"params": params}, IDS, return_logits=False)
    assert none is None
    np.testing.assert_array_equal(np.asarray(hid2), np.asarray(hid))


@pytest.mark.parametrize("name", ["mistral", "qwen2", "gemma2"])
def test_sliding_window_changes_the_result_only_beyond_the_window(name):
    cfg, fam, params = _model(name)
    full = np.asarray(fam.module(cfg).apply({"params": params}, IDS)[0])
    nowin = np.asarray(fam.module(cfg.__class__(**{**cfg.__dict__, "layer_windows": ()})).apply(
        {"params": params}, IDS)[0])
    np.testing.assert_array_equal(full[:, :3], nowin[:, :3])  # within the window: identical
    assert np.abs(full[:, 3:] - nowin[:, 3:]).max() > 1e-3  # beyond it: the window matters


def test_logits_and_nll_use_the_family_head_and_softcap():
    for name in ("llama", "gpt_neox", "gemma2", "qwen2"):
        cfg, fam, params = _model(name)
        lg, h = fam.module(cfg).apply({"params": params}, IDS)
        z = np.asarray(h) @ np.asarray(fam.lm_head(params)).T
        cap = fam.logit_softcap(cfg)
        if cap is not None:
            z = cap * np.tanh(z / cap)
        np.testing.assert_allclose(np.asarray(lg), z, rtol=1e-5, atol=1e-5)
        assert ("lm_head" in params or "embed_out" in params) == (not cfg.tie_word_embeddings)
        # bf16 compute: bf16 matmul inputs, float32 outputs (accumulation, norms, softmax, residual stream)
        lb, hb = fam.module(cfg, dtype=jnp.bfloat16).apply({"params": params}, IDS)
        assert lb.dtype == jnp.float32 and hb.dtype == jnp.float32
        assert np.abs(np.asarray(lb) - np.asarray(lg)).max() < 0.05 * np.abs(np.asarray(lg)).max()


@pytest.mark.parametrize("cap", [None, 2.5])
def test_chunked_nll_softcap_value_and_exact_gradient(cap):
    h = jax.random.normal(jax.random.PRNGKey(0), (2, 6, 16)) * 2.0
    emb = jax.random.normal(jax.random.PRNGKey(1), (37, 16))
    ids = jax.random.randint(jax.random.PRNGKey(2), (2, 6), 0, 37)
    mask = jnp.array([[1, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1]])

    def ref(h, emb):
        z = h[:, :-1] @ emb.T
        z = z if cap is None else cap * jnp.tanh(z / cap)
        nll = jax.nn.logsumexp(z, -1) - jnp.take_along_axis(z, ids[:, 1:, None], -1)[..., 0]
        m = mask[:, 1:] * mask[:, :-1]
        return jnp.sum(nll * m) / jnp.sum(m)

    # chunk 8 over V=37: five chunks, the last one overlapping, so the masking of repeated columns is exercised
    v, g = jax.value_and_grad(lambda h, e: mean_next_token_nll(h, e, ids, mask, chunk=8, softcap=cap), (0, 1))(h, emb)
    vr, gr = jax.value_and_grad(ref, (0, 1))(h, emb)
    np.testing.assert_allclose(v, vr, rtol=1e-6)
    np.testing.assert_allclose(g[0], gr[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g[1], gr[1], rtol=1e-5, atol=1e-6)
    # K targets from one state: the capped log-sum-exp minus each capped target logit
    two = nll_from_hidden(h[0], emb, jnp.stack([ids[0], ids[1]], -1), softcap=cap)
    np.testing.assert_allclose(two[:, 0], nll_from_hidden(h[0], emb, ids[0], softcap=cap), rtol=1e-6)


# ------------------------------------------------------------------------------------------------ config fields


def _hf_dict(name):
    cfg = TINY[name]
    return registry.family_of_config(cfg).config_to_hf(cfg)


def _refused(d, match):
    fam = registry.family_of(d, "cfg.json")
    with pytest.raises(ValueError, match=match):
        fam.config_from_hf(d, "cfg.json")


def test_config_from_hf_round_trips_each_family():
    for name, cfg in TINY.items():
        fam = registry.family_of_config(cfg)
        assert fam.config_from_hf(json.loads(json.dumps(fam.config_to_hf(cfg))), "x") == cfg, name


@pytest.mark.parametrize("name,field", [("gpt2", "eos_token_id"), ("llama", "eos_token_id"), ("qwen2", "pad_token_id"),
                                        ("gemma2", "bos_token_id"), ("gpt_neox", "eos_token_id")])
def test_special_token_ids_outside_the_vocabulary_are_refused(name, field):
    d = _hf_dict(name)
    d[field] = 50256  # GPT-2's default eos on a 64-token vocabulary: generation would read a logit that is not there
    _refused(d, rf"cfg.json: config field {field}=50256 is outside the vocabulary \(vocab_size=64\)")
    if name != "gpt2":  # the other families accept a list of eos ids (Llama 3)
        d[field] = [1, 70]
        _refused(d, rf"{field}=\[1, 70\] is outside the vocabulary")


def test_unsupported_fields_are_refused_by_name():
    d = _hf_dict("llama")
    for rtype in ("yarn", "dynamic", "longrope"):
        d["rope_scaling"] = {"rope_type": rtype, "factor": 2.0}
        _refused(d, rf"config field rope_scaling.rope_type='{rtype}' is not supported")
    d.pop("rope_scaling")
    d["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}
    _refused(d, r"rope_parameters.rope_type='yarn' is not supported")
    d = _hf_dict("llama")
    d["rope_scaling"] = {"type": "dynamic", "factor": 2.0}  # the transformers 4.x spelling
    _refused(d, r"rope_scaling.rope_type='dynamic'")
    d = _hf_dict("llama")
    d["num_key_value_heads"] = 3
    _refused(d, r"num_key_value_heads=3 is not supported.*must divide num_attention_heads=4")
    d = _hf_dict("llama")
    d["hidden_act"] = "mish"
    _refused(d, r"hidden_act='mish' is not supported")
    d = _hf_dict("llama")
    d["quantization_config"] = {"quant_method": "bitsandbytes"}
    _refused(d, r"quantization_config")
    d = _hf_dict("qwen2")
    d["use_mrope"] = True
    _refused(d, r"use_mrope=True")
    d = _hf_dict("qwen2")
    d["layer_types"] = ["full_attention", "chunked_attention"]
    _refused(d, r"layer_types='chunked_attention'")
    d = _hf_dict("gemma2")
    d["use_bidirectional_attention"] = True
    _refused(d, r"use_bidirectional_attention=True")
    d = _hf_dict("gpt2")
    d["add_cross_attention"] = True
    _refused(d, r"add_cross_attention=True")
    d = _hf_dict("gpt2")
    d["model_type"] = "t5"
    with pytest.raises(ValueError, match=r"model_type is 't5'; rbjax supports .*'gpt2'.*'llama'.*'gemma2'"):
        registry.family_of(d, "cfg.json")


def test_unknown_config_keys_warn_by_name():
    d = _hf_dict("gemma2")
    d["frobnicate_attention"] = True
    with pytest.warns(UserWarning, match=r"\['frobnicate_attention'\] are not read by rbjax's gemma2 family"):
        registry.family_of(d, "x").config_from_hf(d, "x")


def test_legacy_config_spellings():
    # transformers 4.x configs: rope_theta + rope_scaling (type), NeoX rotary_pct / rotary_emb_base, Qwen2
    # use_sliding_window + max_window_layers without layer_types
    d = _hf_dict("llama")
    d.pop("rope_scaling")
    d.update(rope_theta=123.0, rope_scaling={"type": "linear", "factor": 2.0})
    c = llama.LlamaConfig.from_hf(d, "x")
    assert c.rope == hc.Rope(theta=123.0, type="linear", factor=2.0)
    d = {"model_type": "gpt_neox", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2,
         "num_attention_heads": 2, "intermediate_size": 64, "rotary_pct": 0.5, "rotary_emb_base": 777}
    c = gpt_neox.GPTNeoXConfig.from_hf(d, "x")
    assert (c.rope.theta, c.rope.partial_rotary_factor, c.rotary_ndims) == (777.0, 0.5, 8)
    d = _hf_dict("qwen2")
    d.pop("layer_types")
    assert llama.LlamaConfig.from_hf(d, "x").layer_windows == (None, 3)
    d["use_sliding_window"] = False  # transformers drops the window without use_sliding_window
    assert llama.LlamaConfig.from_hf(d, "x").layer_windows == ()


def test_every_transformers_config_field_is_handled_or_refused():
    transformers = pytest.importorskip("transformers")
    classes = {"gpt2": transformers.GPT2Config, "llama": transformers.LlamaConfig,
               "mistral": transformers.MistralConfig, "qwen2": transformers.Qwen2Config,
               "gpt_neox": transformers.GPTNeoXConfig, "gemma2": transformers.Gemma2Config}
    for mt, cls in classes.items():
        fields = set(cls().to_dict()) | (set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs"})
        handled, refused = registry.config_fields(mt)
        assert not fields - handled - set(refused), (mt, sorted(fields - handled - set(refused)))
        assert mt in {m for f in registry.FAMILIES.values() for m in f.model_types}


# ------------------------------------------------------------------------------------------------ weight files


def _write_bf16_safetensors(path, state):
    """A safetensors file with bfloat16 tensors, written by hand (the numpy backend cannot write bf16)."""
    import ml_dtypes

    header, blobs, off = {}, [], 0
    for k, v in state.items():
        b = np.asarray(v, np.float32).astype(ml_dtypes.bfloat16).tobytes()
        header[k] = {"dtype": "BF16", "shape": list(v.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def test_bf16_and_sharded_checkpoints_load_without_torch(tmp_path):
    import ml_dtypes
    from safetensors.numpy import save_file

    cfg, fam, params = _model("llama")
    out = hf.save_pretrained(params, cfg, tmp_path / "m")
    state = fam.params_to_hf(params, cfg)
    keys = sorted(state)
    # sharded, bf16: two shards and an index
    (out / "model.safetensors").unlink()
    shards = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2],
              "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    for f, ks in shards.items():
        _write_bf16_safetensors(out / f, {k: state[k] for k in ks})
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: f for f, ks in shards.items() for k in ks}}))
    cfg2, p2 = hf.load_pretrained(out)
    want = fam.params_from_hf({k: v.astype(ml_dtypes.bfloat16).astype(np.float32) for k, v in state.items()}, cfg,
                              "x")
    jax.tree_util.tree_map(np.testing.assert_array_equal, p2, want)
    assert all(a.dtype == np.float32 for a in jax.tree_util.tree_leaves(p2))
    # a shard missing is named
    (out / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="shard model-00002-of-00002.safetensors is missing"):
        hf.load_pretrained(out)
    # fp32 shards through the numpy backend
    for f, ks in shards.items():
        save_file({k: state[k] for k in ks}, str(out / f))
    jax.tree_util.tree_map(np.testing.assert_array_equal, hf.load_pretrained(out)[1],
                           jax.tree_util.tree_map(np.asarray, params))


def test_weights_that_do_not_match_are_named(tmp_path):
    cfg, fam, params = _model("qwen2")
    state = fam.params_to_hf(params, cfg)
    bad = dict(state)
    bad.pop("model.layers.1.self_attn.k_proj.bias")
    with pytest.raises(ValueError, match=r"missing weights \['model.layers.1.self_attn.k_proj.bias'\]"):
        fam.params_from_hf(bad, cfg, "w.safetensors")
    bad = dict(state, **{"model.layers.0.self_attn.o_proj.bias": np.zeros(32, np.float32)})
    with pytest.raises(ValueError, match=r"unexpected qwen2 weights \['model.layers.0.self_attn.o_proj.bias'\]"):
        fam.params_from_hf(bad, cfg, "w.safetensors")
    bad = dict(state, **{"model.layers.0.mlp.up_proj.weight": np.zeros((32, 48), np.float32)})
    with pytest.raises(ValueError, match=r"model.layers.0.mlp.up_proj.weight has shape \(32, 48\), config expects "
                                         r"\(48, 32\)"):
        fam.params_from_hf(bad, cfg, "w.safetensors")
    bad = dict(state, **{"lm_head.weight": state["model.embed_tokens.weight"] + 1})
    with pytest.raises(ValueError, match="lm_head.weight differs from model.embed_tokens.weight"):
        fam.params_from_hf(bad, cfg, "w.safetensors")
    ok = dict(state, **{"lm_head.weight": state["model.embed_tokens.weight"]})  # a tied copy is accepted
    fam.params_from_hf(ok, cfg, "w.safetensors")


@pytest.mark.parametrize("name", list(TINY))
def test_query_positions_give_the_full_states_at_those_positions(name):
    """``query_positions``: the last layer computes its outputs at a few positions only (the DST classifier's
    pooled token); states, logits and their gradients equal the full call's there, for plain, left-padded and
    packed rows (sliding windows, soft-caps and parallel residuals included)."""
    cfg, fam, params = _model(name)
    m = fam.module(cfg)
    pad = np.concatenate([np.zeros((2, 3), np.int32), IDS], 1)
    mask = np.concatenate([np.zeros((2, 3), np.int32), np.ones_like(IDS)], 1)
    seg = np.concatenate([np.zeros(5), np.ones(9)])
    packed = (np.concatenate([IDS[0, :5], IDS[1]])[None], jnp.asarray((seg[:, None] == seg[None, :])[None]),
              jnp.asarray(np.concatenate([np.arange(5), np.arange(9)])[None]))
    cases = [((IDS,), np.array([[8, 0, 3], [4, 4, 7]], np.int32)),
             ((pad, mask), np.array([[11, 3, 6], [5, 9, 11]], np.int32)),
             (packed, np.array([[4, 13, 7]], np.int32))]
    for args, pos in cases:
        lg, hid = m.apply({"params": params}, *args)
        lq, hq = m.apply({"params": params}, *args, query_positions=jnp.asarray(pos))
        assert hq.shape == pos.shape + (cfg.width,)
        at = lambda x: np.take_along_axis(np.asarray(x), pos[..., None], axis=1)  # noqa: E731
        np.testing.assert_allclose(np.asarray(hq), at(hid), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(lq), at(lg), rtol=1e-5, atol=1e-6)
        w = jnp.asarray(np.random.default_rng(0).normal(size=pos.shape + (cfg.width,)), jnp.float32)
        g_full = jax.grad(lambda p: jnp.sum(jnp.take_along_axis(
            m.apply({"params": p}, *args, return_logits=False)[1], jnp.asarray(pos)[..., None], axis=1) * w))(params)
        g_sel = jax.grad(lambda p: jnp.sum(m.apply({"params": p}, *args, return_logits=False,
                                                   query_positions=jnp.asarray(pos))[1] * w))(params)
        for a, b in zip(jax.tree.leaves(g_full), jax.tree.leaves(g_sel)):  # float32 sums in another order
            a, b = np.asarray(a), np.asarray(b)
            assert np.linalg.norm(b - a) <= 1e-5 * np.linalg.norm(a) + 1e-7
    with pytest.raises(ValueError, match="cache"):
        m.apply({"params": params}, IDS[:, :4], cache=fam.init_cache(cfg, 2, 9), query_positions=jnp.zeros((2, 1), int))
    with pytest.raises(ValueError, match=r"\(B, Q\)"):
        m.apply({"params": params}, IDS, query_positions=jnp.zeros((2,), jnp.int32))
