"""The GPT-2 byte-level BPE tokenizer (shared by DialoGPT), via the ``tokenizers`` package.

Encoding follows the reference code (``tokenizer.convert_tokens_to_ids(tokenizer.tokenize(text))``
of HF's GPT-2 tokenizer): no special tokens added, no prefix space, no lower-casing,
whitespace kept (a double space becomes its own ``Ġ`` token).

Note: in transformers 5.x, ``GPT2TokenizerFast(vocab_file=..., merges_file=...)``
silently builds an *empty* tokenizer. rbjax therefore builds the BPE model itself from
``vocab.json`` + ``merges.txt`` (or reads ``tokenizer.json``) and checks the vocabulary.
"""
from __future__ import annotations

import os
from pathlib import Path

from rbjax.model.hf import _looks_like_hub_id, resolve_model_dir

EOS_TOKEN = "<|endoftext|>"
GPT2_VOCAB_SIZE = 50257
GPT2_EOS_ID = 50256


class GPT2BPETokenizer:
    """GPT-2 BPE tokenizer.

    Attributes:
        source: where it was loaded from.
        eos_id: id of ``<|endoftext|>`` (50256 for GPT-2).
        vocab_size: number of tokens (50257 for GPT-2).
    """

    def __init__(self, tok, source: str):
        self._tok = tok
        self.source = source
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self.eos_id = tok.token_to_id(EOS_TOKEN)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def __repr__(self) -> str:
        return f"GPT2BPETokenizer(source={self.source!r}, vocab_size={self.vocab_size})"


def _from_folder(folder: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    if (folder / "tokenizer.json").exists():
        return Tokenizer.from_file(str(folder / "tokenizer.json"))
    vocab, merges = folder / "vocab.json", folder / "merges.txt"
    if not (vocab.exists() and merges.exists()):
        return None
    tok = Tokenizer(models.BPE.from_file(str(vocab), str(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    if tok.token_to_id(EOS_TOKEN) is not None:
        # like HF's GPT-2 tokenizer: a literal "<|endoftext|>" in text is the special token
        tok.add_special_tokens([EOS_TOKEN])
    return tok


def load_tokenizer(source: str | os.PathLike, expected_vocab_size: int | None = GPT2_VOCAB_SIZE) -> GPT2BPETokenizer:
    """Load the GPT-2 tokenizer from a folder (``tokenizer.json``, or ``vocab.json`` + ``merges.txt``) or a hub id.

    Args:
        source: folder or hub id (e.g. ``microsoft/DialoGPT-small``).
        expected_vocab_size: checked against the loaded vocabulary (``None`` skips the
            check, e.g. for a model with added tokens).
    Raises:
        FileNotFoundError: folder without tokenizer files.
        ValueError: wrong vocabulary size or no ``<|endoftext|>`` token at id 50256.
        RuntimeError: hub download failed.
    """
    p = Path(source).expanduser()
    if not p.exists():

        if not _looks_like_hub_id(str(source)):
            raise FileNotFoundError(f"tokenizer folder not found: {source}")
        p = resolve_model_dir(str(source))
    if not p.is_dir():
        raise FileNotFoundError(f"{p}: expected a tokenizer folder (vocab.json + merges.txt or tokenizer.json)")
    try:
        tok = _from_folder(p)
    except Exception as e:  # the tokenizers library raises plain Exceptions on malformed files
        raise ValueError(f"{p}: cannot read the tokenizer files ({e}); truncated or mismatched vocab.json/merges.txt?") from None
    if tok is None:
        raise FileNotFoundError(f"{p}: no tokenizer files (need tokenizer.json, or vocab.json and merges.txt)")
    t = GPT2BPETokenizer(tok, str(p))
    if expected_vocab_size is not None and t.vocab_size != expected_vocab_size:
        raise ValueError(
            f"{p}: tokenizer has {t.vocab_size} tokens, expected {expected_vocab_size} (the GPT-2/DialoGPT BPE). "
            "Wrong or incomplete vocab.json/merges.txt?"
        )
    if expected_vocab_size == GPT2_VOCAB_SIZE and t.eos_id != GPT2_EOS_ID:
        raise ValueError(f"{p}: {EOS_TOKEN} has id {t.eos_id}, expected {GPT2_EOS_ID} (GPT-2 BPE)")
    if not t.encode("hello world"):
        raise ValueError(f"{p}: tokenizer encodes 'hello world' to nothing; the vocabulary is empty or broken")
    return t
