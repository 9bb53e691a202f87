"""The model handle (rbjax.model.handle): content key over every shard, vocabulary and special-token checks, the
BOS policy, and tokenizer.json tokenizers (byte-level BPE and SentencePiece-style ▁ pieces) equal to transformers."""
import json
import shutil

import numpy as np
import pytest

from rbjax.model.handle import ModelHandle, SpecialTokenError, VocabularyError, model_files_key
from rbjax.model.tokenizer import TokenizerError, load_tokenizer
from tests.conftest import make_rbjax_gpt2_folder, make_tokenizer_json


def _reshard(folder, n=2):
    """Split ``model.safetensors`` into ``n`` shards + ``model.safetensors.index.json`` (the HF sharded layout)."""
    from safetensors.numpy import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    keys = sorted(state)
    wm = {}
    for i in range(n):
        name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        part = {k: state[k] for k in keys[i::n]}
        save_file(part, str(folder / name), metadata={"format": "pt"})
        wm.update({k: name for k in part})
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    return wm


def test_sharded_key_covers_every_shard(tmp_path, tokenizer_dir):
    from safetensors.numpy import load_file, save_file

    from rbjax.model.hf import load_pretrained

    single = make_rbjax_gpt2_folder(tmp_path / "single", tokenizer_dir=tokenizer_dir)
    _, want = load_pretrained(single)
    d = shutil.copytree(single, tmp_path / "sharded")
    wm = _reshard(d)
    shards = sorted(set(wm.values()))
    h = ModelHandle.open(d)
    _, got, _ = h.load()
    import jax

    assert jax.tree.all(jax.tree.map(np.array_equal, want, got))  # the sharded folder is the same model
    key0 = h.files_key()
    assert set(shards) <= set(key0) and "model.safetensors.index.json" in key0
    for shard in shards:  # changing any one shard changes the key
        p = d / shard
        orig = p.read_bytes()
        state = load_file(str(p))
        k = sorted(state)[0]
        state[k] = state[k] + np.float32(1e-3)
        save_file(state, str(p), metadata={"format": "pt"})
        assert ModelHandle.open(d).digest != h.digest, shard
        p.write_bytes(orig)
    assert ModelHandle.open(d).digest == h.digest
    # a shard with another name than model-*.safetensors (the index decides)
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    (d / shards[0]).rename(d / "weights-a.safetensors")
    idx["weight_map"] = {k: ("weights-a.safetensors" if v == shards[0] else v) for k, v in idx["weight_map"].items()}
    (d / "model.safetensors.index.json").write_text(json.dumps(idx))
    assert "weights-a.safetensors" in model_files_key(d)
    (d / "weights-a.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="names the shard weights-a.safetensors"):
        model_files_key(d)


def test_special_tokens_and_vocabulary_checked_at_load(tmp_path, redditbias_dir):
    tok = make_tokenizer_json(tmp_path / "tok", add_bos=True)
    # GPT-2's default eos/bos 50256 lie outside a 400-token vocabulary: named error, not NaN later
    m = make_rbjax_gpt2_folder(tmp_path / "m", vocab_size=400, tokenizer_dir=tok)
    with pytest.raises(ValueError, match=r"50256 is outside the (model )?vocabulary"):
        ModelHandle.open(m).load()
    cfg = json.loads((m / "config.json").read_text())
    cfg.update(eos_token_id=2, bos_token_id=1)
    (m / "config.json").write_text(json.dumps(cfg))
    h = ModelHandle.open(m)
    config, params, t = h.load()
    assert (t.bos_id, t.eos_id, t.pad_id, t.adds_bos) == (1, 2, 3, True)
    assert h.bos_id(None) == 1 and h.bos_id(False) is None and h.resolve_bos(None) is True
    small = make_rbjax_gpt2_folder(tmp_path / "small", vocab_size=300, tokenizer_dir=tok)
    cfg = json.loads((small / "config.json").read_text())
    cfg.update(eos_token_id=2, bos_token_id=1)
    (small / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(VocabularyError, match="has 400 tokens but the model .* only 300"):
        ModelHandle.open(small).load()
    # in memory too
    from rbjax.model.gpt2 import GPT2Config

    with pytest.raises(SpecialTokenError, match=r"eos token id 50256 of the config.json is outside the model "
                                                r"vocabulary \[0, 400\)"):
        ModelHandle.from_params(params, GPT2Config(vocab_size=400, n_positions=128, n_embd=32, n_layer=2, n_head=2,
                                                   bos_token_id=1), t, name="x")
    with pytest.raises(VocabularyError):
        ModelHandle.from_params(params, config, load_tokenizer(make_tokenizer_json(tmp_path / "big", vocab_size=500),
                                                               None), name="x")


def test_gpt2_policy_unchanged(tiny_model_dir):
    h = ModelHandle.open(tiny_model_dir)
    _, _, t = h.load()
    assert t.adds_bos is False and h.bos_id(None) is None and h.bos_id(True) == 50256 == t.eos_id


def test_sentencepiece_only_folder_refused(tmp_path):
    (tmp_path / "tokenizer.model").write_bytes(b"\x00")
    with pytest.raises(TokenizerError, match="SentencePiece model without tokenizer.json"):
        load_tokenizer(tmp_path, None)


def test_post_processor_adding_eos_refused(tmp_path):
    from tokenizers import Tokenizer, processors

    d = make_tokenizer_json(tmp_path / "t", add_bos=False)
    t = Tokenizer.from_file(str(d / "tokenizer.json"))
    t.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)])
    t.save(str(d / "tokenizer.json"))
    with pytest.raises(TokenizerError, match="post-processor adds"):
        load_tokenizer(d, None)


@pytest.mark.parametrize("kind", ["bytelevel", "metaspace"])
@pytest.mark.parametrize("add_bos", [True, False])
def test_tokenizer_json_equals_transformers(tmp_path, redditbias_dir, kind, add_bos):
    """Ours (+ the BOS the policy adds) == ``transformers.AutoTokenizer(text)`` on RedditBias test phrases."""
    transformers = pytest.importorskip("transformers")
    from rbjax.data.redditbias import load_pairs

    d = make_tokenizer_json(tmp_path / "t", kind=kind, add_bos=add_bos)
    ref = transformers.AutoTokenizer.from_pretrained(str(d))
    tok = load_tokenizer(d, None)
    assert tok.adds_bos is add_bos
    p = load_pairs("religion1", "test", redditbias_dir)
    phrases = p.biased + p.counterfactual + ["a  b", " leading space", "Jews are  greedy "]
    ours = tok.encode_batch(phrases)
    for s, o in zip(phrases, ours):
        assert ([tok.bos_id] if tok.adds_bos else []) + o == ref(s)["input_ids"], s
        assert o == ref(s, add_special_tokens=False)["input_ids"], s


def test_a_bad_tokenizer_is_named_as_given(tmp_path, tiny_model_dir, tiny_model_dir_no_tokenizer, redditbias_dir,
                                           capsys):
    """``--tokenizer`` pointing at a folder that does not exist (or holds no tokenizer) says what is wrong with the
    tokenizer given, never "pass --tokenizer"; a model folder without one asks for it."""
    from rbjax.cli import main

    missing, empty = tmp_path / "no" / "such", tmp_path / "empty"
    empty.mkdir()
    for tok, why in ((missing, f"--tokenizer {missing}: tokenizer folder not found"),
                     (empty, f"--tokenizer {empty}: no tokenizer files (need tokenizer.json")):
        with pytest.raises(FileNotFoundError) as e:
            ModelHandle.open(tiny_model_dir, tok).tokenizer  # noqa: B018 (loads it)
        assert str(e.value).startswith(why) and "pass --tokenizer" not in str(e.value)
        assert main(["measure", "--model", str(tiny_model_dir), "--tokenizer", str(tok), "--out",
                     str(tmp_path / "out"), "--bias", "religion1", "--data-dir", str(redditbias_dir)]) == 1
        err = capsys.readouterr().err
        assert why in err and "pass --tokenizer" not in err
    with pytest.raises(FileNotFoundError, match="the model folder has no tokenizer files; pass --tokenizer"):
        ModelHandle.open(tiny_model_dir_no_tokenizer).tokenizer  # noqa: B018


def test_model_resolved_once_and_its_config_read_once_per_command(tiny_model_dir, tokenizer_dir, redditbias_dir,
                                                                  tmp_path, monkeypatch, capsys):
    """--model goes through one ModelHandle per command (the memory plan, the content keys and the loader share it):
    one resolution and one read of its config.json for measure, debias and a sweep's dry run (which reads no
    weights)."""
    from pathlib import Path

    from rbjax.cli import main
    from rbjax.model import hf

    opens, reads = [], []
    real_open, real_read = ModelHandle.open.__func__, hf.read_config_json

    def counting_open(cls, model, tokenizer=None):
        opens.append(str(model))
        return real_open(cls, model, tokenizer)

    monkeypatch.setattr(ModelHandle, "open", classmethod(counting_open))
    monkeypatch.setattr(hf, "read_config_json", lambda folder: reads.append(Path(folder).resolve()) or real_read(folder))
    model = Path(tiny_model_dir).resolve()

    def counts():
        n = (opens.count(str(tiny_model_dir)), reads.count(model))
        opens.clear(), reads.clear()
        return n

    assert main(["measure", "--model", str(tiny_model_dir), "--bias", "religion1", "--data-dir", str(redditbias_dir),
                 "--n-bootstrap", "0", "--no-progress", "--out", str(tmp_path / "m")]) == 0
    assert counts() == (1, 1)
    assert main(["debias", "--method", "lm", "--bias", "religion1", "--model", str(tiny_model_dir), "--tokenizer",
                 str(tokenizer_dir), "--data-dir", str(redditbias_dir), "--out", str(tmp_path / "d"),
                 "--batch-size", "4", "--max-steps", "1", "--layout", "padded", "--no-eval", "--no-lmp",
                 "--no-export", "--no-progress"]) == 0
    assert counts() == (1, 1)
    assert main(["sweep", "--method", "lmd", "--bias", "religion1", "--model", str(tiny_model_dir), "--tokenizer",
                 str(tokenizer_dir), "--data-dir", str(redditbias_dir), "--out", str(tmp_path / "s"),
                 "--lambda-lms", "0.01", "--lambda-ds", "10,100", "--max-points", "2", "--dry-run"]) == 0
    assert counts() == (1, 1)
    capsys.readouterr()
