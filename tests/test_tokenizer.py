"""GPT-2 BPE tokenizer: vocabulary checks and agreement with transformers on all RedditBias phrases."""
import json

import pytest

from rbjax.model import tokenizer as tk
from rbjax.model.tokenizer import load_tokenizer


def test_vocabulary(tokenizer_dir):
    tok = load_tokenizer(tokenizer_dir)
    assert tok.vocab_size == 50257 and tok.eos_id == 50256
    assert tok.encode("Hello, my dog is cute") == [15496, 11, 616, 3290, 318, 13779]
    assert tok.encode("a  b") == [64, 220, 275]  # double space kept, as the reference
    assert tok.decode(tok.encode("the jews are  evil ")) == "the jews are  evil "


def test_matches_transformers_on_every_released_phrase(tokenizer_dir, redditbias_dir):
    transformers = pytest.importorskip("transformers")
    from rbjax.data.redditbias import load_pairs

    ref = transformers.GPT2TokenizerFast.from_pretrained(tokenizer_dir)
    tok = load_tokenizer(tokenizer_dir)
    phrases = []
    for b in ("religion1", "religion2", "race", "gender", "queerness"):
        p = load_pairs(b, "valid+test", redditbias_dir)
        phrases += p.biased + p.counterfactual
    ours = tok.encode_batch(phrases)
    for p, o in zip(phrases, ours):
        assert o == ref.convert_tokens_to_ids(ref.tokenize(p)), p
    lengths = [len(o) for o in ours]
    assert min(lengths) >= 4 and max(lengths) <= 26  # as docs/lmb.md "Data" says


def test_bad_tokenizer_folders(tmp_path, tokenizer_dir):
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        load_tokenizer(tmp_path)
    small = tmp_path / "small"
    small.mkdir()
    vocab = json.loads((tokenizer_dir / "vocab.json").read_text())
    (small / "vocab.json").write_text(json.dumps(dict(list(vocab.items())[:1000])))
    (small / "merges.txt").write_text("#version: 0.2\n")
    with pytest.raises(ValueError, match="has 1000 tokens, expected 50257"):
        load_tokenizer(small)


def test_a_folder_is_read_once_until_its_files_change(tmp_path, tokenizer_dir, monkeypatch):
    """A study loads the same tokenizer dozens of times: the files are read once per process (keyed on their
    content: a copy of the folder is the same tokenizer); a rewritten file (here tokenizer_config.json naming
    another eos token) is read again; every caller gets its own object, named by the path it gave."""
    import shutil

    folder = tmp_path / "tok"
    shutil.copytree(tokenizer_dir, folder)
    reads = []
    real = tk._read_folder
    monkeypatch.setattr(tk, "_READ", {})  # what earlier tests in this process read does not count here
    monkeypatch.setattr(tk, "_read_folder", lambda f: (reads.append(f), real(f))[1])
    monkeypatch.chdir(tmp_path)
    a, b = load_tokenizer(tokenizer_dir), load_tokenizer("tok")
    assert len(reads) == 1 and a is not b and b.source == "tok"  # the path as this caller gave it
    assert a.encode("hello there") == b.encode("hello there") and a.eos_id == 50256
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "!"}))
    c = load_tokenizer(folder, expected_vocab_size=None)
    assert len(reads) == 2 and c.eos_id == 0  # "!" is id 0 of the GPT-2 vocabulary
