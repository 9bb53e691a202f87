"""Host-side (numpy) triggers of the debiasing losses: where the target terms and attributes are in a batch.

Computed once per batch outside ``jit`` from token ids; the losses in :mod:`rbjax.debias.losses` see arrays only.
Build one :class:`TriggerBuilder` per (bias spec, tokenizer, semantics) and call it on every batch::

    tb = TriggerBuilder(load_spec("religion1"), tokenizer, semantics="paper")
    pair_ids, pair_mask = tb.pair_ids("lmd")           # (P, 2, W) -> losses.gather_targets(wte, ...)
    lmd = tb.lmd(input_ids, attention_mask)            # LMDTriggers(mask (B, L, P), norm (B,), ...)
    occ = tb.attributes(input_ids, attention_mask)     # Occurrences(weights (B, N, L), mask (B, N), ...)

``input_ids`` is ``(B, L)`` int, right-padded; ``attention_mask`` ``(B, L)`` is 1 on real tokens and is required
in both semantics: a mask derived from ``input_ids != pad_id`` would drop real tokens whenever the pad id is also a
real token (DialoGPT pads with ``<|endoftext|>``, id 50256, which also separates dialogue turns). Sentences are one
line each, as the reference's ``LineByLineTextDataset``.

``semantics="paper"`` (default)
    * Terms are words, matched as whole words on the decoded text (the same boundary rules as
      :func:`rbjax.data.swap.term_regex`: case-insensitive, hyphen and apostrophe are boundaries), then mapped to
      tokens. This finds a term whatever its BPE split (sentence-initial "jews" is ``j|ews``, mid-sentence ``Ġjews``).
    * LMD (§4.1): a term from the pairs (t1 **or** t2 side) occurring at token ``i`` puts the pairs containing it
      (P_t) on position ``i − 1``: ``h_{i−1}`` is the state whose logits predict the term, so "the probability of
      the term at that position" is read off it. A term at position 0 has no predicting state (no BOS is added, as
      in the reference); it is skipped and counted in ``LMDTriggers.unpredicted``.
    * Target vectors (§4.2 fn): each term is encoded in its mid-sentence form (``" " + term``, lower-case: ``Ġjews``
      for byte-level BPE, ``▁jews`` for a SentencePiece-style tokenizer) and its subword embeddings (rows of the LM
      head) are averaged (``pair_ids`` / ``pair_mask`` of width W). Terms are matched on decoded text, so any
      tokenizer whose pieces decode one by one works (byte-level ``Ġ`` or SentencePiece ``▁``).
    * ADD / HD attributes (§4.2, §4.3): occurrences of the A1 attributes (wildcards ``*``, multi-word
      attributes), each represented by the mean of the hidden states over the tokens its words cover.

``semantics="reference"`` (umanlp/redditbias_debias_conv_ai@996c6e1 ``modeling_gpt2.py``, docs/debiasing.md §3
and §4; works on ids alone, no tokenizer needed)
    * LMD (1113-1167): pair p fires for a sentence when the id t1_p occurs anywhere in it (the t2 id never fires);
      it then applies to **every** position whose label is > 0, i.e. real tokens other than id 0 ("!").
      ``norm`` is the number of real tokens (the code counts ids != 50257, its pad id).
    * ADD / HD (1424-1439, 2067-2090): walking positions, then attribute rows in list order, a row fires when the
      id at ``i`` is a member of the row *including its zero padding* (so "!" = id 0 fires every padded row).
      A row with n > 1 non-zero ids takes the window ``i : i+n`` (cut at the batch's longest sentence, where the
      code's padded tensor ends); if every id in it is a member (order-free, zeros allowed) the occurrence is the
      window mean, otherwise a **zero vector** (all-zero weights, still a valid occurrence: it adds 0 to ADD and
      ``‖r‖₁`` to HD). Rows with one id use ``h_i``. Occurrences are emitted in the code's loop order, which HD's
      running sum depends on.
    * Target pairs are the code's single-token id lists (``reference.lmd_pairs``, ``reference.add_hd_pairs``):
      GPT-2 BPE ids, so reference semantics is refused for any other tokenizer (:func:`is_gpt2_bpe`).
"""
from __future__ import annotations

import bisect
from typing import Callable, NamedTuple, Sequence

import numpy as np

from rbjax.data.swap import term_regex
from rbjax.specs import BiasSpec

__all__ = ["TriggerBuilder", "LMDTriggers", "Occurrences", "pad_occurrences", "is_gpt2_bpe"]

#: GPT-2 BPE ids of "Hello, my dog is cute" (the HF GPT-2 docs' example)
_GPT2_PROBE = ("Hello, my dog is cute", [15496, 11, 616, 3290, 318, 13779])


def is_gpt2_bpe(tokenizer) -> bool:
    """Whether ``tokenizer`` is GPT-2's byte-level BPE (DialoGPT's), whose ids the reference lists use: 50,257
    tokens and the ids of a probe sentence."""
    return (getattr(tokenizer, "vocab_size", None) == 50257
            and list(_encode_fn(tokenizer)(_GPT2_PROBE[0])) == _GPT2_PROBE[1])


class LMDTriggers(NamedTuple):
    """Masks of the equalising loss (a pytree of numpy arrays).

    Attributes:
        mask: ``(B, L, P)`` float32, 1 where pair p applies to the hidden state ``h[b, i]``.
        norm: ``(B,)`` float32, real tokens per sentence (the reference's n_s; unused in paper mode).
        unpredicted: ``(B,)`` int32, paper mode: term occurrences at position 0 that no state predicts (skipped).
    """

    mask: np.ndarray
    norm: np.ndarray
    unpredicted: np.ndarray


class Occurrences(NamedTuple):
    """Attribute occurrences of ADD / HD (a pytree of numpy arrays).

    Attributes:
        weights: ``(B, N, L)`` float32, averaging weights of occurrence n over positions (``1/len`` over its span;
            all zero for the reference's failed-window zero vector and for padding rows).
        mask: ``(B, N)`` float32, 1 for real occurrences.
        spans: ``(B, N, 2)`` int32, ``[start, end)`` token span of each occurrence (the window tried, for a
            reference zero vector); ``[0, 0]`` for padding rows.
        rows: ``(B, N)`` int32, index of the attribute (``spec.attributes_a1`` in paper mode, row of
            ``reference.attribute_rows`` in reference mode); -1 for padding rows.
    """

    weights: np.ndarray
    mask: np.ndarray
    spans: np.ndarray
    rows: np.ndarray


def _encode_fn(tokenizer) -> Callable[[str], list[int]]:
    enc = getattr(tokenizer, "encode", None)
    if not callable(enc):
        raise TypeError(f"tokenizer {tokenizer!r} has no encode(text) method")

    def f(text: str) -> list[int]:
        r = enc(text)
        return list(getattr(r, "ids", r))

    return f


class _PieceText:
    """id -> decoded text piece (cached), so a token sequence maps to text with exact per-token char offsets.

    Byte-level BPE (GPT-2, Llama 3, Qwen2: ``Ġ`` pieces) decodes one id at a time exactly. A SentencePiece-style
    decoder (``▁`` pieces: Llama 2, Mistral, Gemma) drops the space of a sequence's first piece, so there a piece is
    decoded after an anchor token and the anchor's text is cut off (``decode([a, i])[len(decode([a])):]``), which
    keeps its leading space.
    """

    def __init__(self, tokenizer):
        dec = getattr(tokenizer, "decode", None)
        if not callable(dec):
            raise TypeError(f"tokenizer {tokenizer!r} has no decode(ids) method")
        self._dec = dec
        self._cache: dict[int, str] = {}
        self._anchor: list[int] | None = None
        ids = _encode_fn(tokenizer)(" the cat")
        if "".join(self.piece(i) for i in ids) != " the cat":
            anchor = _encode_fn(tokenizer)("a")
            self._anchor, self._anchor_text, self._cache = anchor, dec(anchor), {}
            if "".join(self.piece(i) for i in ids) != " the cat":
                raise ValueError("tokenizer.decode must undo the encoding piece by piece (a byte-level or "
                                 "SentencePiece-style decoder)")

    def piece(self, i: int) -> str:
        s = self._cache.get(i)
        if s is None:
            try:
                if self._anchor is None:
                    s = self._dec([int(i)])
                else:
                    s = self._dec(self._anchor + [int(i)])
                    s = s[len(self._anchor_text):] if s.startswith(self._anchor_text) else s
            except Exception:  # ids outside the vocabulary (e.g. an added pad row)
                s = ""
            self._cache[i] = s
        return s

    def text(self, ids: Sequence[int]) -> tuple[str, list[int]]:
        """Concatenated text and the start offset of every token."""
        starts, pos, parts = [], 0, []
        for i in ids:
            p = self.piece(i)
            starts.append(pos)
            parts.append(p)
            pos += len(p)
        return "".join(parts), starts


def _real_mask(input_ids: np.ndarray, attention_mask) -> np.ndarray:
    if attention_mask is None:
        raise ValueError(
            "attention_mask is required (1 on real tokens): it is not derived from the ids, because the pad id can "
            "be a real token (DialoGPT pads with <|endoftext|>, which also separates turns)")
    m = np.asarray(attention_mask)
    if m.shape != input_ids.shape:
        raise ValueError(f"attention_mask {m.shape} does not match input_ids {input_ids.shape}")
    return m.astype(bool)


def _check_right_padded(real: np.ndarray) -> None:
    n = real.sum(axis=1)
    if not np.array_equal(real, np.arange(real.shape[1])[None, :] < n[:, None]):
        raise ValueError("paper-semantics triggers need right-padded batches (real tokens first in every row)")


def pad_occurrences(n: int, multiple: int = 8) -> int:
    """Occurrence-axis size for ``n`` occurrences: ``n`` rounded up to a multiple (at least one), to limit recompiles."""
    return max(multiple, -(-n // multiple) * multiple)


class TriggerBuilder:
    """Builds the trigger arrays of one bias specification (see the module docstring for the rules).

    Args:
        spec: bias specification (:func:`rbjax.specs.load_spec`).
        tokenizer: object with ``encode(text)`` (list of ids or an object with ``.ids``) and ``decode(ids)``, e.g.
            ``rbjax.model.tokenizer.load_tokenizer(...)`` or a ``tokenizers.Tokenizer`` with a ByteLevel decoder.
            Required in paper mode; unused (may be ``None``) in reference mode.
        semantics: ``"paper"`` or ``"reference"``.
        pad_id: accepted for compatibility and not used: every call takes the batch's ``attention_mask``.

    Raises:
        ValueError: unknown semantics, missing tokenizer in paper mode, or a spec without reference lists in
            reference mode.
    """

    def __init__(self, spec: BiasSpec, tokenizer=None, *, semantics: str = "paper", pad_id: int | None = None):
        if semantics not in ("paper", "reference"):
            raise ValueError(f"semantics must be 'paper' or 'reference', got {semantics!r}")
        self.spec, self.semantics, self.pad_id = spec, semantics, pad_id
        if semantics == "paper":
            if tokenizer is None:
                raise ValueError("paper semantics needs a tokenizer (terms are matched on decoded text)")
            self._encode = _encode_fn(tokenizer)
            self._text = _PieceText(tokenizer)
            terms: list[str] = []
            self._term_pairs: dict[str, list[int]] = {}
            for p, (a, b) in enumerate(spec.pairs):
                for t in (a, b):
                    if t not in self._term_pairs:
                        terms.append(t)
                        self._term_pairs[t] = []
                    if p not in self._term_pairs[t]:
                        self._term_pairs[t].append(p)
            self._term_rx = term_regex(terms)
            self._term_lookup = {t.lower(): t for t in terms}
            # the paper's quotes around a multi-word attribute ('"heavy drinker*"', kept in a user's spec file, as
            # retrieval reads it) are not part of the words: without this, such an attribute never matched
            attrs = [a.replace('"', " ").strip() for a in spec.attributes_a1]
            self._attr_rx = term_regex(attrs)
            # a match is attributed to the first literal attribute it equals, else to the first wildcard one
            order = sorted(range(len(attrs)), key=lambda k: ("*" in attrs[k], k))
            self._attr_patterns = [(k, term_regex([attrs[k]])) for k in order]
            self.n_pairs = len(spec.pairs)
        else:
            ref = spec.reference or {}
            missing = [k for k in ("lmd_pairs", "add_hd_pairs", "attribute_rows") if not ref.get(k)]
            if missing:
                raise ValueError(f"spec {spec.name!r} has no reference list(s) {missing}")
            self._lmd_pairs = np.asarray(ref["lmd_pairs"], np.int64)
            self._add_pairs = np.asarray(ref["add_hd_pairs"], np.int64)
            self._rows = [list(map(int, r)) for r in ref["attribute_rows"]]
            self.n_pairs = len(self._lmd_pairs)

    # ------------------------------------------------------------------------------------------ target pairs
    def pair_ids(self, which: str = "lmd") -> tuple[np.ndarray, np.ndarray]:
        """Subword ids of the target pairs, for :func:`rbjax.debias.losses.gather_targets`.

        Args:
            which: ``"lmd"`` or ``"add_hd"``: the reference code has separate lists (they differ for religion1);
                paper mode uses ``spec.pairs`` for both.

        Returns:
            ``(ids, mask)``: ``(P, 2, W)`` int32 and bool; ``[:, 0]`` is t1, ``[:, 1]`` is t2, W the longest
            subword count (1 in reference mode).
        """
        if which not in ("lmd", "add_hd"):
            raise ValueError(f"which must be 'lmd' or 'add_hd', got {which!r}")
        if self.semantics == "reference":
            p = self._lmd_pairs if which == "lmd" else self._add_pairs
            return p[:, :, None].astype(np.int32), np.ones(p.shape + (1,), bool)
        enc = [[self._mid_sentence(t) for t in pair] for pair in self.spec.pairs]
        w = max(len(e) for pair in enc for e in pair)
        ids = np.zeros((len(enc), 2, w), np.int32)
        mask = np.zeros((len(enc), 2, w), bool)
        for p, pair in enumerate(enc):
            for k, e in enumerate(pair):
                ids[p, k, : len(e)] = e
                mask[p, k, : len(e)] = True
        return ids, mask

    def _mid_sentence(self, term: str) -> list[int]:
        """Subword ids of ``term`` in its mid-sentence form: GPT-2 ``encode(" " + term)`` (``Ġjews``); for a
        tokenizer that marks word starts itself (SentencePiece ``▁``, which would turn the leading space into a
        lone ``▁`` piece) the ids that follow an anchor word (``encode("a " + term)`` minus ``encode("a")``)."""
        plain = self._encode(" " + term)
        if self._text._anchor is None:
            return plain
        pre = self._encode("a")
        full = self._encode("a " + term)
        return full[len(pre):] if full[:len(pre)] == pre and len(full) > len(pre) else plain

    # ------------------------------------------------------------------------------------------------- LMD
    def lmd(self, input_ids, attention_mask, context=None) -> LMDTriggers:
        """Masks of the equalising loss for a batch (see the module docstring).

        Args:
            input_ids: ``(B, L)`` int token ids, right-padded.
            attention_mask: ``(B, L)`` 1 on real tokens (required).
            context: ``(B,)`` leading tokens of each row that are context only (a chat template's prefix, paper
                semantics): terms are searched in the tokens after them; a term on the first token after the
                context is predicted by the context's last token. ``None``: no context.

        Returns:
            :class:`LMDTriggers` with ``mask`` ``(B, L, P)``.

        Raises:
            ValueError: ``input_ids`` not 2-D, ``attention_mask`` missing (``None``) or of another shape, or (paper
                semantics) a batch that is not right-padded.
        """
        ids = np.asarray(input_ids)
        if ids.ndim != 2:
            raise ValueError(f"input_ids must be (B, L), got {ids.shape}")
        real = _real_mask(ids, attention_mask)
        B, L = ids.shape
        mask = np.zeros((B, L, self.n_pairs), np.float32)
        unpred = np.zeros((B,), np.int32)
        norm = real.sum(axis=1).astype(np.float32)
        ctx = _context(context, B, self.semantics)
        if self.semantics == "reference":
            for b in range(B):
                present = set(ids[b, real[b]].tolist())
                fired = np.array([int(t1) in present for t1 in self._lmd_pairs[:, 0]])
                pos = real[b] & (ids[b] > 0)  # labels > 0: drops pads and id 0 ("!")
                mask[b] = pos[:, None] & fired[None, :]
            return LMDTriggers(mask, norm, unpred)
        _check_right_padded(real)
        for b in range(B):
            n, c = int(real[b].sum()), int(ctx[b])
            text, starts = self._text.text(ids[b, c:n].tolist())
            for m in self._term_rx.finditer(text):
                i = c + bisect.bisect_right(starts, m.start()) - 1  # token holding the term's first character
                if i == 0:
                    unpred[b] += 1
                    continue
                term = self._term_lookup[_norm_ws(m.group(0))]
                mask[b, i - 1, self._term_pairs[term]] = 1.0
        return LMDTriggers(mask, norm, unpred)

    # ------------------------------------------------------------------------------------------ attributes
    def attributes(self, input_ids, attention_mask, max_occurrences: int | None = None,
                   context=None) -> Occurrences:
        """Attribute occurrences of ADD / HD for a batch (see the module docstring).

        Args:
            input_ids: ``(B, L)`` int token ids, right-padded.
            attention_mask: ``(B, L)`` 1 on real tokens (required).
            context: ``(B,)`` leading context tokens of each row (a chat template's prefix, paper semantics):
                attributes are searched only in the tokens after them. ``None``: no context.
            max_occurrences: size N of the occurrence axis; ``None`` rounds the batch's maximum up to a multiple
                of 8 (:func:`pad_occurrences`). A fixed N avoids recompiling the step.

        Returns:
            :class:`Occurrences` with ``weights`` ``(B, N, L)``, in the order HD's reference running sum uses.

        Raises:
            ValueError: ``attention_mask`` missing or of another shape; a sentence has more than
                ``max_occurrences`` occurrences; a batch that is not right-padded (paper semantics).
        """
        ids = np.asarray(input_ids)
        if ids.ndim != 2:
            raise ValueError(f"input_ids must be (B, L), got {ids.shape}")
        real = _real_mask(ids, attention_mask)
        B, L = ids.shape
        if self.semantics == "paper":
            _check_right_padded(real)
        ctx = _context(context, B, self.semantics)
        per_sent = [self._ref_occ(ids[b], real[b], int(real.sum(1).max(initial=0))) if self.semantics == "reference"
                    else self._paper_occ(ids[b], real[b], int(ctx[b])) for b in range(B)]
        most = max((len(o) for o in per_sent), default=0)
        N = pad_occurrences(most) if max_occurrences is None else int(max_occurrences)
        if most > N:
            raise ValueError(f"a sentence has {most} attribute occurrences, more than max_occurrences={N}")
        weights = np.zeros((B, N, L), np.float32)
        mask = np.zeros((B, N), np.float32)
        spans = np.zeros((B, N, 2), np.int32)
        rows = np.full((B, N), -1, np.int32)
        for b, occs in enumerate(per_sent):
            for n, (row, s, e, ok) in enumerate(occs):
                mask[b, n] = 1.0
                spans[b, n] = (s, e)
                rows[b, n] = row
                if ok:
                    weights[b, n, s:e] = 1.0 / (e - s)
        return Occurrences(weights, mask, spans, rows)

    def _paper_occ(self, ids_b, real_b, c: int = 0):
        n = int(real_b.sum())
        text, starts = self._text.text(ids_b[c:n].tolist())
        out = []
        for m in self._attr_rx.finditer(text):
            s = c + bisect.bisect_right(starts, m.start()) - 1
            e = c + bisect.bisect_right(starts, m.end() - 1)  # one past the token holding the last character
            row = next(k for k, rx in self._attr_patterns if rx.fullmatch(m.group(0)))
            out.append((row, s, e, True))
        return out

    def _ref_occ(self, ids_b, real_b, batch_len):
        out = []
        for i in range(batch_len):
            if not real_b[i]:
                continue  # the code walks pads too, but its pad id (50257) is never in a row
            x = int(ids_b[i])
            for r, row in enumerate(self._rows):
                members = set(row)  # zero padding included: "!" (id 0) fires every padded row
                if x not in members:
                    continue
                n = sum(1 for v in row if v != 0)
                if n <= 1:
                    out.append((r, i, i + 1, True))
                    continue
                e = min(i + n, batch_len)  # the code's padded tensor ends at the batch's longest sentence
                ok = all(real_b[j] and int(ids_b[j]) in members for j in range(i, e))
                out.append((r, i, e, ok))
        return out

    def __repr__(self) -> str:
        return f"TriggerBuilder(spec={self.spec.name!r}, semantics={self.semantics!r}, pairs={self.n_pairs})"


def _context(context, B: int, semantics: str) -> np.ndarray:
    """The ``(B,)`` context lengths of a batch (zeros when ``None``); reference semantics has none (its id lists
    walk every real token, as the official code does)."""
    if context is None:
        return np.zeros((B,), np.int64)
    c = np.asarray(context, np.int64).reshape(-1)
    if c.shape != (B,):
        raise ValueError(f"context must have shape ({B},), got {c.shape}")
    if semantics == "reference" and c.any():
        raise ValueError("reference semantics walks every real token (the official code's id lists); it has no "
                         "context tokens (chat format): use paper semantics")
    return c


def _norm_ws(s: str) -> str:
    return " ".join(s.lower().split())
