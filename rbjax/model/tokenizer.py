"""Tokenizers of the supported model families, via the ``tokenizers`` package.

Two kinds of folders are read:

* GPT-2's byte-level BPE files (``vocab.json`` + ``merges.txt``; DialoGPT, GPT-2). Encoding follows the reference
  code (``tokenizer.convert_tokens_to_ids(tokenizer.tokenize(text))`` of HF's GPT-2 tokenizer): no special tokens
  added, no prefix space, no lower-casing, whitespace kept (a double space becomes its own ``Ġ`` token).
* ``tokenizer.json`` (the ``tokenizers`` serialisation that Llama 3, Mistral, Qwen2, Gemma, Pythia ship), with the
  special tokens named in ``tokenizer_config.json`` / ``special_tokens_map.json``.

A folder with only a SentencePiece ``tokenizer.model`` (no ``tokenizer.json``) is refused with a message saying how
to convert it (rbjax does not depend on ``sentencepiece``).

:meth:`Tokenizer.encode` never adds special tokens. Whether the model's own tokenizer puts a BOS before a text —
``Tokenizer.adds_bos``, read off the ``tokenizer.json`` post-processor by encoding a probe text with and without
special tokens, exactly what ``transformers`` (5.x) does with it — is the *BOS policy* input of the callers
(:class:`rbjax.model.handle.ModelHandle`): they prepend ``bos_id`` themselves, so the policy is explicit and
recorded.

Note: in transformers 5.x, ``GPT2TokenizerFast(vocab_file=..., merges_file=...)`` silently builds an *empty*
tokenizer. rbjax therefore builds the BPE model itself from ``vocab.json`` + ``merges.txt`` and checks the
vocabulary.
"""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

from rbjax.core.digests import files_key
from rbjax.model.chat_template import ChatTemplate, load_chat_template, read_chat_template
from rbjax.model.hf import TOKENIZER_FILES, _looks_like_hub_id, resolve_model_dir

EOS_TOKEN = "<|endoftext|>"
GPT2_VOCAB_SIZE = 50257
GPT2_EOS_ID = 50256

_PROBE = "hello world"


class TokenizerError(ValueError):
    """A tokenizer folder that rbjax cannot use as it stands (message names the file and the problem)."""


class Tokenizer:
    """A loaded tokenizer.

    Attributes:
        source: the folder it was loaded from. kind: ``"gpt2-bpe"`` (vocab.json + merges.txt) or
            ``"tokenizer.json"``. vocab_size: number of tokens, added tokens included (50257 for GPT-2).
        eos_id, bos_id, pad_id: ids of the special tokens (``None`` when the tokenizer has none; GPT-2's
            ``<|endoftext|>`` is both its eos and its bos).
        adds_bos: ``True`` when the tokenizer's own encoding (``transformers``' ``tokenizer(text)``) puts ``bos_id``
            before a text (Llama, Mistral, Gemma), ``False`` when it adds nothing (GPT-2, Qwen2, Pythia).
    """

    def __init__(self, tok, source: str, *, kind: str = "gpt2-bpe", eos_id: int | None = None,
                 bos_id: int | None = None, pad_id: int | None = None, adds_bos: bool = False):
        self._tok = tok
        self.source = source
        self.kind = kind
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self.eos_id, self.bos_id, self.pad_id, self.adds_bos = eos_id, bos_id, pad_id, adds_bos
        self._chat_template: ChatTemplate | None | bool = False  # False: not read yet
        self._offsets_tok = None

    @property
    def default_bos_id(self) -> int | None:
        """The BOS to put before a scored text under the default policy (as the tokenizer itself encodes it):
        :attr:`bos_id` when :attr:`adds_bos`, else ``None``."""
        return self.bos_id if self.adds_bos else None

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def tokens(self, text: str) -> list[str]:
        """The token strings of ``text`` (no special tokens added), e.g. ``['Ġjews']`` or ``['▁jews']``."""
        return self._tok.encode(text, add_special_tokens=False).tokens

    def decode(self, ids) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(int(i))

    def encode_with_offsets(self, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """``[(ids, offsets)]`` of ``texts``: the ids of :meth:`encode` and each token's ``(start, end)`` character
        span in its text, untrimmed (a post-processor that trims whitespace from offsets — ``ByteLevel(trim_offsets=
        True)`` — is left out; with no special tokens added it changes no id)."""
        if self._offsets_tok is None:
            from tokenizers import Tokenizer as _Tok

            t = _Tok.from_str(self._tok.to_str())
            t.post_processor = None
            self._offsets_tok = t
        return [(e.ids, e.offsets) for e in self._offsets_tok.encode_batch(list(texts), add_special_tokens=False)]

    def is_added_token(self, i: int) -> bool:
        """Whether id ``i`` is an added token (a special or control token such as ``<|eot_id|>``, matched whole in
        a text before the model's own splitting)."""
        return int(i) in self._tok.get_added_tokens_decoder()

    # -- chat template -----------------------------------------------------------------------------------------
    @property
    def chat_template(self) -> ChatTemplate | None:
        """The chat template of :attr:`source` (:func:`rbjax.model.chat_template.read_chat_template`), or ``None``
        when the folder has none; read on first use."""
        if self._chat_template is False:
            self._chat_template = read_chat_template(self.source) if Path(self.source).is_dir() else None
        return self._chat_template

    def apply_chat_template(self, messages, *, add_generation_prompt: bool = False, tokenize: bool = True,
                            chat_template: ChatTemplate | None = None):
        """A conversation as the model reads it: ``transformers``' ``apply_chat_template(messages,
        add_generation_prompt=..., tokenize=...)`` (the text rendered by the chat template, then encoded with no
        special tokens added).

        Args:
            messages: ``[{"role": ..., "content": ...}, ...]``.
            chat_template: another template (default: this tokenizer's, :attr:`chat_template`).
        Returns:
            token ids (``tokenize``), else the rendered text.
        Raises:
            rbjax.model.chat_template.NoChatTemplateError: no template (the folder named).
            rbjax.model.chat_template.ChatTemplateError: the template refused the conversation.
        """
        t = chat_template if chat_template is not None else (self.chat_template or load_chat_template(self.source))
        text = t.render(messages, add_generation_prompt=add_generation_prompt)
        return self.encode(text) if tokenize else text

    def files(self) -> list[Path]:
        """The tokenizer files of :attr:`source` that exist (what its content key covers)."""
        p = Path(self.source)
        return [p / f for f in TOKENIZER_FILES if (p / f).is_file()]

    def __repr__(self) -> str:
        return f"Tokenizer(source={self.source!r}, kind={self.kind!r}, vocab_size={self.vocab_size})"


def _special(folder: Path, name: str) -> str | None:
    """The ``{name}_token`` string of ``tokenizer_config.json`` (else ``special_tokens_map.json``), or None."""
    for f in ("tokenizer_config.json", "special_tokens_map.json"):
        p = folder / f
        if not p.is_file():
            continue
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise TokenizerError(f"{p}: cannot read ({e})") from None
        v = d.get(f"{name}_token") if isinstance(d, dict) else None
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            return v
    return None


def _gpt2_bpe(folder: Path):
    from tokenizers import Tokenizer as _Tok
    from tokenizers import decoders, models, pre_tokenizers, processors

    tok = _Tok(models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    if tok.token_to_id(EOS_TOKEN) is not None:
        # like HF's GPT-2 tokenizer: a literal "<|endoftext|>" in text is the special token
        tok.add_special_tokens([EOS_TOKEN])
    return tok


#: tokenizers read in this process, keyed on their files' content (:func:`rbjax.core.digests.files_key` of
#: :data:`rbjax.model.hf.TOKENIZER_FILES`, as every key in rbjax): a study's stages load the same tokenizer dozens of
#: times (≈ 0.1 s each for GPT-2's BPE); its files are read and checked once.
_READ: dict[tuple, Tokenizer] = {}
_READ_MAX = 16


def _from_folder(folder: Path) -> Tokenizer | None:
    """The folder's tokenizer: read once per process while its files keep their content (each call gets its own
    :class:`Tokenizer`; they share the immutable ``tokenizers`` object)."""
    key = tuple(sorted(files_key(folder / f for f in TOKENIZER_FILES).items()))
    hit = _READ.get(key)
    if hit is None:
        hit = _read_folder(folder)
        if hit is None:
            return None
        if len(_READ) >= _READ_MAX:
            _READ.pop(next(iter(_READ)), None)
        _READ[key] = hit
    t = copy.copy(hit)
    t.source = str(folder)  # as this caller named it
    return t


def _read_folder(folder: Path) -> Tokenizer | None:
    from tokenizers import Tokenizer as _Tok

    if (folder / "tokenizer.json").exists():
        tok = _Tok.from_file(str(folder / "tokenizer.json"))
        kind = "tokenizer.json"
    elif (folder / "vocab.json").exists() and (folder / "merges.txt").exists():
        tok, kind = _gpt2_bpe(folder), "gpt2-bpe"
    elif (folder / "tokenizer.model").exists():
        raise TokenizerError(
            f"{folder / 'tokenizer.model'}: a SentencePiece model without tokenizer.json; rbjax reads tokenizer.json "
            "(the `tokenizers` format). Convert it once where `sentencepiece` is installed: "
            "python -c \"from transformers import AutoTokenizer; AutoTokenizer.from_pretrained('FOLDER')"
            ".save_pretrained('FOLDER')\" (writes FOLDER/tokenizer.json), or pass --tokenizer with a folder that has one")
    else:
        return None

    def tid(name: str) -> int | None:
        s = _special(folder, name)
        if s is None:
            return None
        i = tok.token_to_id(s)
        if i is None:
            raise TokenizerError(f"{folder}: the {name}_token {s!r} of tokenizer_config.json is not in the vocabulary")
        return i

    eos, bos, pad = tid("eos"), tid("bos"), tid("pad")
    gpt2_eos = tok.token_to_id(EOS_TOKEN)
    if eos is None and gpt2_eos is not None:
        eos = gpt2_eos
    if bos is None and kind == "gpt2-bpe":
        bos = gpt2_eos  # GPT-2's bos_token is <|endoftext|>
    with_sp = tok.encode(_PROBE, add_special_tokens=True).ids
    plain = tok.encode(_PROBE, add_special_tokens=False).ids
    adds_bos = False
    if with_sp != plain:
        if len(with_sp) == len(plain) + 1 and with_sp[1:] == plain and (bos is None or with_sp[0] == bos):
            adds_bos, bos = True, with_sp[0]
        else:
            extra = [tok.id_to_token(i) for i in with_sp if i not in plain]
            raise TokenizerError(
                f"{folder / 'tokenizer.json'}: its post-processor adds {extra} around a text ({plain} -> {with_sp}); "
                "rbjax scores a phrase as the model's tokenizer encodes it with at most one BOS token before it")
    return Tokenizer(tok, str(folder), kind=kind, eos_id=eos, bos_id=bos, pad_id=pad, adds_bos=adds_bos)


def load_tokenizer(source: str | os.PathLike, expected_vocab_size: int | None = GPT2_VOCAB_SIZE) -> Tokenizer:
    """Load a tokenizer from a folder (``tokenizer.json``, or GPT-2's ``vocab.json`` + ``merges.txt``) or a hub id.

    Args:
        source: folder or hub id (e.g. ``microsoft/DialoGPT-small``).
        expected_vocab_size: checked against the loaded vocabulary (``None`` skips the check: any family; the
            default is the GPT-2/DialoGPT BPE, whose ``<|endoftext|>`` must then be id 50256).
    Raises:
        FileNotFoundError: folder without tokenizer files.
        TokenizerError (a ValueError): unreadable files, a SentencePiece-only folder, a special token not in the
            vocabulary, a post-processor that adds more than one BOS, wrong vocabulary size.
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
        t = _from_folder(p)
    except TokenizerError:
        raise
    except Exception as e:  # the tokenizers library raises plain Exceptions on malformed files
        raise TokenizerError(f"{p}: cannot read the tokenizer files ({e}); truncated or mismatched "
                             "vocab.json/merges.txt or tokenizer.json?") from None
    if t is None:
        raise FileNotFoundError(f"{p}: no tokenizer files (need tokenizer.json, or vocab.json and merges.txt)")
    if expected_vocab_size is not None and t.vocab_size != expected_vocab_size:
        raise TokenizerError(
            f"{p}: tokenizer has {t.vocab_size} tokens, expected {expected_vocab_size} (the GPT-2/DialoGPT BPE). "
            "Wrong or incomplete vocab.json/merges.txt?"
        )
    if expected_vocab_size == GPT2_VOCAB_SIZE and t.eos_id != GPT2_EOS_ID:
        raise TokenizerError(f"{p}: {EOS_TOKEN} has id {t.eos_id}, expected {GPT2_EOS_ID} (GPT-2 BPE)")
    if not t.encode(_PROBE):
        raise TokenizerError(f"{p}: tokenizer encodes {_PROBE!r} to nothing; the vocabulary is empty or broken")
    return t
