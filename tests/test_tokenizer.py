"""GPT-2 BPE tokenizer: vocabulary checks and agreement with transformers on all RedditBias phrases."""
import json

import pytest

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
