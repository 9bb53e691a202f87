"""GPT-2 module and HF checkpoint loader/exporter: layout, tying, export round trip, errors — without PyTorch.

The parity tests against PyTorch ``transformers`` (same weights, same logits) are in ``test_model_torch.py``; the
fixtures here are built by rbjax itself (``tiny_model_dir``, or :func:`rbjax.model.gpt2.init_params`), so these
tests run on an install without the test extra.
"""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rbjax.model import hf
from rbjax.model.gpt2 import GPT2Config, GPT2LMHeadModel, _Dense, init_params
from rbjax.model.layers import Dropout, keep_mask
from rbjax.model.tokenizer import load_tokenizer


def _state_from_params(params, cfg):
    return {k: v.copy() for k, v in hf.params_to_state_dict(params, cfg).items()}


def test_conv1d_layout_square_c_proj_is_not_transposed():
    # HF Conv1D stores (in, out); a transposed square c_proj raises no shape error and is silently wrong.
    cfg = GPT2Config(vocab_size=8, n_positions=8, n_embd=4, n_layer=1, n_head=1)
    state = _state_from_params(init_params(cfg, 0), cfg)
    state["transformer.h.0.attn.c_proj.weight"] = np.arange(16, dtype=np.float32).reshape(4, 4)
    state["transformer.h.0.attn.c_proj.bias"] = np.zeros(4, np.float32)
    params = hf.state_dict_to_params(state, cfg)
    layer = params["h_0"]["attn"]["c_proj"]
    y = _Dense(4, 0.02).apply({"params": layer}, jnp.array([1.0, 0.0, 0.0, 0.0]))
    np.testing.assert_array_equal(np.asarray(y), [0.0, 1.0, 2.0, 3.0])  # x @ W with W (in, out), as Conv1D
    # (the same weights in a PyTorch Conv1D: test_model_torch.py)


def test_missing_lm_head_ties_to_wte():
    cfg = GPT2Config(vocab_size=3, n_positions=4, n_embd=2, n_layer=1, n_head=1)
    state = _state_from_params(init_params(cfg, 0), cfg)
    wte = np.array([[1, 0], [0, 1], [1, 1]], np.float32)
    state["transformer.wte.weight"] = wte
    assert "lm_head.weight" not in state
    params = hf.state_dict_to_params(state, cfg)
    # the head of our model is wte.attend: hidden [2, 3] gives [2, 3, 5]
    import flax.linen as nn

    logits = nn.Embed(3, 2).apply({"params": params["wte"]}, jnp.array([2.0, 3.0]), method="attend")
    np.testing.assert_allclose(np.asarray(logits), [2.0, 3.0, 5.0])
    # and the full model's logits are exactly hidden @ wte.T
    lg, h = GPT2LMHeadModel(cfg).apply({"params": params}, jnp.array([[0, 2, 1]]))
    np.testing.assert_allclose(np.asarray(lg), np.asarray(h) @ wte.T, rtol=1e-6, atol=1e-6)


def test_untied_lm_head_is_refused():
    cfg = GPT2Config(vocab_size=3, n_positions=4, n_embd=2, n_layer=1, n_head=1)
    state = _state_from_params(init_params(cfg, 0), cfg)
    state["lm_head.weight"] = state["transformer.wte.weight"] + 1.0
    with pytest.raises(ValueError, match="tied"):
        hf.state_dict_to_params(state, cfg)


def test_shape_mismatch_and_missing_weights_named():
    cfg = GPT2Config(vocab_size=8, n_positions=8, n_embd=4, n_layer=1, n_head=1)
    state = _state_from_params(init_params(cfg, 0), cfg)
    bad = dict(state)
    bad["transformer.h.0.mlp.c_fc.weight"] = np.zeros((16, 4), np.float32)  # transposed
    with pytest.raises(ValueError, match=r"h_0\.mlp\.c_fc\.kernel has shape \(16, 4\)"):
        hf.state_dict_to_params(bad, cfg)
    del state["transformer.ln_f.bias"]
    with pytest.raises(ValueError, match="missing weights.*ln_f.bias"):
        hf.state_dict_to_params(state, cfg)


IDS = np.array([[1169, 15849, 373, 1611, 0, 484, 389, 1611], [31373, 995, 13, 198, 50256, 7, 8, 9]])


def test_export_roundtrip(tiny_model_dir, tmp_path):
    """save_pretrained then load_pretrained gives the same config, bit-identical weights and logits."""
    cfg, params = hf.load_pretrained(tiny_model_dir)
    out = hf.save_pretrained(params, cfg, tmp_path / "export", tokenizer_dir=tiny_model_dir)
    assert (out / "model.safetensors").exists() and (out / "vocab.json").exists() and (out / "merges.txt").exists()
    cfg2, params2 = hf.load_pretrained(out)
    assert cfg2 == cfg
    jax.tree_util.tree_map(np.testing.assert_array_equal, params2, params)
    a, _ = GPT2LMHeadModel(cfg).apply({"params": params}, IDS)
    b, _ = GPT2LMHeadModel(cfg2).apply({"params": params2}, IDS)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_flax_msgpack_checkpoint(tiny_model_dir, tmp_path):
    # HF's Flax GPT-2 layout: params under 'transformer', blocks under 'h' / '<i>', FlaxConv1D kernels (out, in)
    from flax.serialization import msgpack_serialize

    cfg, params = hf.load_pretrained(tiny_model_dir)
    blocks = {}
    for i in range(cfg.n_layer):
        p = params[f"h_{i}"]
        blocks[str(i)] = {
            "ln_1": p["ln_1"], "ln_2": p["ln_2"],
            "attn": {k: {"kernel": p["attn"][k]["kernel"].T, "bias": p["attn"][k]["bias"]} for k in ("c_attn", "c_proj")},
            "mlp": {k: {"kernel": p["mlp"][k]["kernel"].T, "bias": p["mlp"][k]["bias"]} for k in ("c_fc", "c_proj")},
        }
    tree = {"transformer": {"wte": params["wte"], "wpe": params["wpe"], "ln_f": params["ln_f"], "h": blocks}}
    d = tmp_path / "flax"
    d.mkdir()
    (d / "flax_model.msgpack").write_bytes(msgpack_serialize(tree))
    (d / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    cfg2, params2 = hf.load_pretrained(d)
    jax.tree_util.tree_map(np.testing.assert_array_equal, params2, params)


def test_pytorch_bin_without_torch_is_a_clear_error(tiny_model_dir, tmp_path, monkeypatch):
    import builtins
    import sys

    d = tmp_path / "bin"
    d.mkdir()
    (d / "pytorch_model.bin").write_bytes(b"not really")
    (d / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    real_import = builtins.__import__

    def no_torch(name, *a, **k):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("No module named 'torch'")
        return real_import(name, *a, **k)

    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setattr(builtins, "__import__", no_torch)
    with pytest.raises(RuntimeError, match="PyTorch is not installed"):
        hf.load_pretrained(d)


def test_folder_errors(tmp_path, tiny_model_dir):
    with pytest.raises(FileNotFoundError, match="model folder not found"):
        hf.load_pretrained(tmp_path / "nope")
    d = tmp_path / "noweights"
    d.mkdir()
    (d / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="no model weights found"):
        hf.load_pretrained(d)
    e = tmp_path / "noconfig"
    e.mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        hf.load_pretrained(e)
    f = tmp_path / "bert"
    f.mkdir()
    (f / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ValueError, match="model_type is 'bert'"):
        hf.load_pretrained(f)


def test_hub_id_without_network_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import importlib

    import huggingface_hub.constants as c

    importlib.reload(c)
    try:
        with pytest.raises(RuntimeError, match="cannot download 'config.json' of hub model 'microsoft/DialoGPT-small'"):
            hf.load_pretrained("microsoft/DialoGPT-small")
    finally:
        monkeypatch.undo()
        importlib.reload(c)


def test_broken_files_are_clear_errors(tiny_model_dir, tmp_path, tokenizer_dir):
    import shutil

    d = tmp_path / "m"
    shutil.copytree(tiny_model_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "n_embd": "lots"}))
    with pytest.raises(ValueError, match="n_embd must be a non-negative integer, got 'lots'"):
        hf.load_pretrained(d)
    (d / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="invalid JSON"):
        hf.load_pretrained(d)
    (d / "config.json").write_text(json.dumps(cfg))
    w = d / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    with pytest.raises(ValueError, match="cannot read safetensors file"):
        hf.load_pretrained(d)
    t = tmp_path / "tok"
    t.mkdir()
    (t / "vocab.json").write_text((tokenizer_dir / "vocab.json").read_text()[:5000])
    shutil.copy(tokenizer_dir / "merges.txt", t / "merges.txt")
    with pytest.raises(ValueError, match="cannot read the tokenizer files"):
        load_tokenizer(t)
    with pytest.raises(FileNotFoundError, match="tokenizer folder not found"):
        load_tokenizer(tmp_path / "nope")


def test_dropout_mask_probability_keys_and_scaling():
    """rbjax's dropout (rbjax.model.layers): the mask keeps each element with probability 1 − rate (within the
    binomial error of 2²⁰ draws), is a function of the key alone, takes a traced keep probability (LoRA's stored
    rate), and the kept elements are scaled by 1 / keep as PyTorch's nn.Dropout does."""
    n = 1 << 20
    key = jax.random.key(3, impl="rbg")
    for keep in (0.9, 0.5, 0.1):
        m = np.asarray(keep_mask(key, keep, (n,)))
        assert abs(m.mean() - keep) < 5 * np.sqrt(keep * (1 - keep) / n), (keep, m.mean())
        # neighbours independent: the pairs of adjacent elements both kept occur keep² of the time
        both = (m[1:] & m[:-1]).mean()
        assert abs(both - keep ** 2) < 5 * np.sqrt(keep ** 2 * (1 - keep ** 2) / n), (keep, both)
    a, b = keep_mask(key, 0.9, (64, 64)), keep_mask(key, 0.9, (64, 64))
    np.testing.assert_array_equal(a, b)
    other = keep_mask(jax.random.fold_in(key, 1), 0.9, (64, 64))
    assert np.asarray(a != other).any()
    traced = jax.jit(lambda k, p: keep_mask(k, p, (64, 64)))(key, jnp.float32(0.9))
    np.testing.assert_array_equal(traced, a)
    raw = keep_mask(jax.random.PRNGKey(3), 0.9, (4096,))  # a raw two-word threefry key works too
    assert raw.shape == (4096,) and 0.85 < float(raw.mean()) < 0.95

    x = jnp.arange(1.0, 4097.0, dtype=jnp.float32).reshape(64, 64)
    drop = Dropout(0.1)
    y = drop.apply({}, x, deterministic=False, rngs={"dropout": key})
    kept = np.asarray(y != 0)
    np.testing.assert_allclose(np.asarray(y)[kept], np.asarray(x)[kept] / np.float32(0.9), rtol=2e-7)  # (1 ulp)
    assert 0.85 < kept.mean() < 0.95
    np.testing.assert_array_equal(drop.apply({}, x, deterministic=True), x)
    np.testing.assert_array_equal(Dropout(0.0).apply({}, x, deterministic=False, rngs={"dropout": key}), x)
