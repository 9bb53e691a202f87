"""GPT-2 module and HF checkpoints against PyTorch ``transformers`` on identical weights: Conv1D layout, logits,
export round trip through PyTorch, ``pytorch_model.bin`` checkpoints, the full DialoGPT-small shape (slow).

Skipped without PyTorch / ``transformers`` (the test extra); the pure tests are in ``test_model.py``.
"""
import json

import numpy as np
import pytest

from rbjax.model import hf
from rbjax.model.gpt2 import GPT2Config, GPT2LMHeadModel, _Dense, init_params
from tests.conftest import make_torch_gpt2_folder

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def test_conv1d_layout_agrees_with_pytorch_conv1d():
    # HF Conv1D stores (in, out); a transposed square c_proj raises no shape error and is silently wrong.
    import jax.numpy as jnp

    cfg = GPT2Config(vocab_size=8, n_positions=8, n_embd=4, n_layer=1, n_head=1)
    state = {k: v.copy() for k, v in hf.params_to_state_dict(init_params(cfg, 0), cfg).items()}
    w = np.arange(16, dtype=np.float32).reshape(4, 4)
    state["transformer.h.0.attn.c_proj.weight"] = w
    state["transformer.h.0.attn.c_proj.bias"] = np.zeros(4, np.float32)
    layer = hf.state_dict_to_params(state, cfg)["h_0"]["attn"]["c_proj"]
    x = np.array([[1.0, 0, 0, 0], [0.5, -1.0, 2.0, 0.25]], np.float32)
    ours = np.asarray(_Dense(4, 0.02).apply({"params": layer}, jnp.asarray(x)))
    conv = transformers.pytorch_utils.Conv1D(4, 4)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor(w))
        conv.bias.zero_()
        np.testing.assert_array_equal(ours, conv(torch.tensor(x)).numpy())


def _torch_logits(folder, ids):
    m = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    with torch.no_grad():
        return m(torch.tensor(ids)).logits.numpy()


IDS = np.array([[1169, 15849, 373, 1611, 0, 484, 389, 1611], [31373, 995, 13, 198, 50256, 7, 8, 9]])


def test_parity_with_pytorch_and_export_roundtrip(torch_tiny_model_dir, tmp_path):
    cfg, params = hf.load_pretrained(torch_tiny_model_dir)
    ours, _ = GPT2LMHeadModel(cfg).apply({"params": params}, IDS)
    ref = _torch_logits(torch_tiny_model_dir, IDS)
    # fp32 agreement is ~5e-7·max|logit| on this fixture; exact gelu instead of gelu_new is off by ~2e-4·max|logit|
    np.testing.assert_allclose(np.asarray(ours), ref, rtol=1e-5, atol=2e-5 * np.abs(ref).max())
    out = hf.save_pretrained(params, cfg, tmp_path / "export", tokenizer_dir=torch_tiny_model_dir)
    assert (out / "model.safetensors").exists() and (out / "vocab.json").exists()
    back = _torch_logits(out, IDS)
    np.testing.assert_array_equal(back, ref)  # identical weights -> identical PyTorch logits
    cfg2, params2 = hf.load_pretrained(out)
    assert cfg2 == cfg


def test_pytorch_bin_checkpoint(torch_tiny_model_dir, tmp_path):
    m = transformers.GPT2LMHeadModel.from_pretrained(torch_tiny_model_dir)
    d = tmp_path / "bin"
    d.mkdir()
    torch.save(m.state_dict(), d / "pytorch_model.bin")
    (d / "config.json").write_text((torch_tiny_model_dir / "config.json").read_text())
    cfg, params = hf.load_pretrained(d)
    ours, _ = GPT2LMHeadModel(cfg).apply({"params": params}, IDS)
    np.testing.assert_allclose(np.asarray(ours), _torch_logits(torch_tiny_model_dir, IDS), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_parity_full_dialogpt_small_shape(tmp_path, shared_dir, tokenizer_dir, redditbias_dir):
    cfg_json = json.loads((shared_dir / "models" / "dialogpt-small-config" / "config.json").read_text())
    d = make_torch_gpt2_folder(tmp_path / "full", n_embd=cfg_json["n_embd"], n_layer=cfg_json["n_layer"],
                               n_head=cfg_json["n_head"], n_positions=cfg_json["n_positions"], seed=1)
    cfg, params = hf.load_pretrained(d)
    assert (cfg.n_layer, cfg.n_embd, cfg.vocab_size) == (12, 768, 50257)
    ours, _ = GPT2LMHeadModel(cfg).apply({"params": params}, IDS)
    ref = _torch_logits(d, IDS)
    np.testing.assert_allclose(np.asarray(ours), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    # per-phrase perplexities on real RedditBias phrases, against the reference formula
    import math

    from rbjax.data.redditbias import load_pairs
    from rbjax.lmb.perplexity import PerplexityScorer
    from rbjax.model.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    pairs = load_pairs("religion2", "test", redditbias_dir)
    phrases = pairs.biased[:8] + pairs.counterfactual[:8]
    ours_ppl = PerplexityScorer(params, cfg, batch_size=8).score_texts(phrases, tok).perplexity
    m = transformers.GPT2LMHeadModel.from_pretrained(d).eval()
    for p, o in zip(phrases, ours_ppl):
        ids = torch.tensor([tok.encode(p)])
        with torch.no_grad():
            assert o == pytest.approx(math.exp(m(ids, labels=ids).loss.item()), rel=1e-4)
