"""Padding through the model itself (no PyTorch needed): position ids follow the attention mask."""
import jax.numpy as jnp
import numpy as np

from rbjax.model.gpt2 import GPT2Config, GPT2LMHeadModel, init_params


def test_left_padding_without_position_ids_matches_unpadded():
    """Field case: [0,0,5,9,17,3] with mask [0,0,1,1,1,1] and no position ids must give the logits of
    [5,9,17,3] at the real positions (the old arange default differed by 0.19 on this config)."""
    cfg = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    params = init_params(cfg, seed=0)
    model = GPT2LMHeadModel(cfg)
    plain, _ = model.apply({"params": params}, jnp.array([[5, 9, 17, 3]]))
    left, _ = model.apply({"params": params}, jnp.array([[0, 0, 5, 9, 17, 3]]),
                          attention_mask=jnp.array([[0, 0, 1, 1, 1, 1]]))
    right, _ = model.apply({"params": params}, jnp.array([[5, 9, 17, 3, 0, 0]]),
                           attention_mask=jnp.array([[1, 1, 1, 1, 0, 0]]))
    np.testing.assert_allclose(np.asarray(left[0, 2:]), np.asarray(plain[0]), atol=1e-6, rtol=0)
    np.testing.assert_allclose(np.asarray(right[0, :4]), np.asarray(plain[0]), atol=1e-6, rtol=0)
    # the old default (arange positions on a left-padded row) is visibly different: the test can tell
    shifted, _ = model.apply({"params": params}, jnp.array([[0, 0, 5, 9, 17, 3]]),
                             attention_mask=jnp.array([[0, 0, 1, 1, 1, 1]]),
                             position_ids=jnp.arange(6)[None])
    assert float(jnp.max(jnp.abs(shifted[0, 2:] - plain[0]))) > 1e-3


def test_unreachable_hub_fails_at_once_with_the_reason(monkeypatch, tmp_path):
    """Offline, a hub id must not sit in huggingface_hub's ~25 s retry loop: the endpoint is probed once and the
    error says the hub is unreachable and the file is not cached."""
    import huggingface_hub.constants as c
    import pytest

    from rbjax.model import hf

    monkeypatch.setattr(c, "ENDPOINT", "https://rbjax-unreachable.invalid")
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    calls = []
    real = hf._hub_unreachable
    monkeypatch.setattr(hf, "_hub_unreachable", lambda: calls.append(1) or real())
    with pytest.raises(RuntimeError, match="hub is not reachable .*rbjax-unreachable.invalid.* not in the local"):
        hf.resolve_model_dir("microsoft/DialoGPT-small")
    assert calls == [1]


def test_exported_model_folder_is_readable_by_others(tmp_path):
    import os
    import stat

    from rbjax.model.hf import save_pretrained

    cfg = GPT2Config(vocab_size=64, n_positions=16, n_embd=8, n_layer=1, n_head=2)
    old = os.umask(0o022)
    try:
        out = save_pretrained(init_params(cfg), cfg, tmp_path / "m")
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert {stat.S_IMODE(f.stat().st_mode) for f in out.iterdir()} == {0o644}
