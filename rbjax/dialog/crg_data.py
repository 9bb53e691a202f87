"""DSTC-7 conversational response generation (CRG) data: the TSV files, the offline test contexts and the
fine-tuning examples (paper §3.2, Table 5; docs/dialog.md "CRG").

**Files.** DSTC-7 Task 2 conversation files (``train_convos.txt``, ``test_convos.txt``) are UTF-8 TSV, one
conversation turn per line, no header, seven fields::

    hash  subreddit  conv_id  score  turn  context  response

The context carries the organisers' literal markers ``START`` (conversation start) and ``EOS`` (turn separator) as
text; they are kept as text, as the reference feeds them to GPT-2. In the official test file the response is the
placeholder ``__UNDISCLOSED__``; RedditBias's ``test_convos_processed.txt`` has it deleted (empty response). Both
read as "no response" (``None``). :func:`read_dstc7_tsv` checks every row and names file and line of a bad one.

**Offline test contexts.** The DSTC-7 conversation text is not distributed (it is rebuilt from Reddit dumps; see
``../shared/dialog-data/dstc7/SOURCE.md``). The RedditBias release carries ``data/dstc7/response_hyp.txt``: a
single-line JSON object ``{hash: "<context>__UNDISCLOSED__<text>"}`` with **1,472** DSTC-7 test contexts (the
text after the marker, present in 733 records, is a generated hypothesis of the authors' pipeline, not a human
reference, and is not used). :func:`read_response_hyp` returns ``(hash, context)`` in file
order.

**Fine-tuning examples** (:func:`crg_example`, :func:`build_crg_arrays`): ``context + <eos> + response + <eos>``
as GPT-2 ids (context and response encoded separately, no special tokens), at most ``block_size`` = 128 tokens,
with a loss on the response tokens and the final ``<eos>`` only (``loss_mask``; the trainer's ``crg`` method).
When the example is too long, the reference's rule (``lm_dstc7.py:ConvoDataset``) applies: a response of fewer
than ``block_size − 2`` tokens keeps its context's **last** ``block_size − 2 − len(response)`` tokens (the context is
cut from the left); a longer response keeps the whole context and is cut to ``block_size − 2 − len(context)``
tokens (which may be none), and when the context alone is longer than ``block_size − 2`` the example is dropped.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Sequence

import numpy as np

from rbjax.core.padding import pad_sequences
from rbjax.dialog.crg_metrics import read_lines
from rbjax.train.lm import forward_and_nll

__all__ = ["FIELDS", "UNDISCLOSED", "BLOCK_SIZE", "RESPONSE_HYP", "DSTC7Row", "read_dstc7_tsv",
           "read_response_hyp", "crg_example", "build_crg_arrays", "read_reference_sets", "CRGObjective",
           "context_turns", "dialog_messages", "system_first", "build_chat_crg_arrays"]

#: the seven TSV fields of a DSTC-7 conversation file
FIELDS = ("hash", "subreddit", "conv_id", "score", "turn", "context", "response")
#: the official test file's placeholder response (and the marker in RedditBias's ``response_hyp.txt``)
UNDISCLOSED = "__UNDISCLOSED__"
#: the reference's hard-coded example length (``lm_dstc7.py``: ``max_seq_length = 128``)
BLOCK_SIZE = 128
#: the 1,472 DSTC-7 test contexts in the RedditBias release (upstream path; in ``redditbias_manifest.json``)
RESPONSE_HYP = "data/dstc7/response_hyp.txt"


@dataclasses.dataclass(frozen=True)
class DSTC7Row:
    """One line of a DSTC-7 conversation file.

    Attributes:
        hash: the instance key (56 hex digits in the official files). subreddit, conv_id: as written.
        score: the response's Reddit score. turn: the turn number. context: the context text (``START``/``EOS``
        markers kept). response: the response text, or ``None`` (empty or ``__UNDISCLOSED__``). line: 1-based line.
    """

    hash: str
    subreddit: str
    conv_id: str
    score: int
    turn: int
    context: str
    response: str | None
    line: int


def _read_text(path: Path, what: str) -> str:
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path}: no such file" if not path.exists() else f"{what} {path}: not a file")
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise ValueError(f"{what} {path}: not UTF-8 text (line {line}, byte offset {e.start}: {e.reason})") from None


def read_dstc7_tsv(path: str | os.PathLike, *, need_response: bool = False, what: str = "DSTC-7 file"
                   ) -> list[DSTC7Row]:
    """Rows of a DSTC-7 conversation TSV (module docstring). Blank lines are skipped (as the reference does).

    Args:
        path: the file. need_response: every row must have a response (training data).
        what: how the file is named in errors (``"--train-file"``).
    Returns:
        list of :class:`DSTC7Row` in file order.
    Raises:
        FileNotFoundError: no such file.
        ValueError: not UTF-8; a row without exactly 7 tab-separated fields, a score or turn that is not an integer,
            an empty hash, or (``need_response``) no response — each naming the file and line; no row at all.
    """
    p = Path(path)
    text = _read_text(p, what)
    rows = []
    for n, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != len(FIELDS):
            raise ValueError(f"{what} {p} line {n}: expected {len(FIELDS)} tab-separated fields "
                             f"({', '.join(FIELDS)}), got {len(parts)}")
        h, sub, conv, score, turn, ctx, resp = parts
        if not h.strip():
            raise ValueError(f"{what} {p} line {n}: empty hash (field 1)")
        vals = {}
        for name, v in (("score", score), ("turn", turn)):
            try:
                vals[name] = int(v.strip())
            except ValueError:
                raise ValueError(f"{what} {p} line {n}: {name} (field {FIELDS.index(name) + 1}) must be an integer, "
                                 f"got {v!r}") from None
        r = resp.strip()
        response = None if r in ("", UNDISCLOSED) else resp
        if need_response and response is None:
            raise ValueError(f"{what} {p} line {n}: no response (field 7 is {resp!r}); training rows need one")
        rows.append(DSTC7Row(h.strip(), sub, conv, vals["score"], vals["turn"], ctx, response, n))
    if not rows:
        raise ValueError(f"{what} {p}: no row (expected one tab-separated conversation turn per line)")
    return rows


def read_response_hyp(path: str | os.PathLike) -> list[tuple[str, str]]:
    """The DSTC-7 test contexts of RedditBias's ``data/dstc7/response_hyp.txt``: ``[(hash, context), ...]``.

    The file is one JSON object ``{hash: "<context>__UNDISCLOSED__<text>"}``; the context is the part before the
    marker (file order kept; 1,472 records in the release).

    Raises:
        FileNotFoundError: no such file. ValueError: not a JSON object of strings, or a value without the
        ``__UNDISCLOSED__`` marker (names the key).
    """
    p = Path(path)
    text = _read_text(p, "DSTC-7 context file")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e})") from None
    if not isinstance(obj, dict) or not obj:
        raise ValueError(f"{p}: expected a JSON object {{hash: 'context{UNDISCLOSED}...'}}")
    out = []
    for k, v in obj.items():
        if not isinstance(v, str) or UNDISCLOSED not in v:
            raise ValueError(f"{p}: record {k!r} is not a string with the {UNDISCLOSED} marker")
        out.append((k, v.split(UNDISCLOSED, 1)[0]))
    return out


def crg_example(context_ids: Sequence[int], response_ids: Sequence[int], eos_id: int,
                block_size: int = BLOCK_SIZE) -> tuple[list[int], int] | None:
    """Token ids of one fine-tuning example and where its response starts.

    ``ids = ctx + [eos] + resp + [eos]`` with the reference's truncation (module docstring).

    Returns:
        ``(ids, n_context)`` — the loss covers ``ids[n_context + 1:]`` (response and final ``<eos>``) — or ``None``
        when the example is dropped (a context longer than ``block_size − 2`` with a response that does not fit).
    Raises:
        ValueError: ``block_size < 3``.
    """
    if block_size < 3:
        raise ValueError(f"block_size must be >= 3, got {block_size}")
    ctx, resp = [int(t) for t in context_ids], [int(t) for t in response_ids]
    room = block_size - 2
    if len(ctx) + len(resp) > room:
        if len(resp) < room:
            ctx = ctx[len(ctx) + len(resp) - room:]  # cut the context from the left
        elif len(ctx) > room:
            return None
        else:
            resp = resp[:room - len(ctx)]
    return ctx + [eos_id] + resp + [eos_id], len(ctx)


def build_crg_arrays(rows: Sequence[DSTC7Row], tokenizer, *, block_size: int = BLOCK_SIZE,
                     pad_id: int | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """The fine-tuning arrays of DSTC-7 rows for the trainer's ``crg`` method (``ArrayData``).

    Args:
        rows: rows with responses (:func:`read_dstc7_tsv` with ``need_response=True``).
        tokenizer: GPT-2 BPE (``encode_batch``, ``eos_id``).
        block_size: tokens per example (128, the reference's). pad_id: filler id (default ``<eos>``; masked).
    Returns:
        ``(arrays, stats)``: ``input_ids``, ``attention_mask``, ``loss_mask`` int32 ``(N, block_size)`` (right
        padded; ``loss_mask`` = 1 on the response tokens and the final ``<eos>``), and ``{"n_rows", "n_examples",
        "n_dropped_too_long", "n_context_cut", "n_response_cut", "n_tokens", "n_loss_tokens"}``.
    Raises:
        ValueError: a row without response (names its line), or no example left.
    """
    eos = tokenizer.eos_id
    if eos is None:
        raise ValueError(f"{tokenizer.source}: the tokenizer has no <|endoftext|> token")
    pad = eos if pad_id is None else int(pad_id)
    for r in rows:
        if r.response is None:
            raise ValueError(f"line {r.line} (hash {r.hash}): no response to train on")
    ctxs = tokenizer.encode_batch([r.context for r in rows]) if rows else []
    resps = tokenizer.encode_batch([r.response for r in rows]) if rows else []
    ids_list, starts = [], []
    stats = {"n_rows": len(rows), "n_dropped_too_long": 0, "n_context_cut": 0, "n_response_cut": 0}
    for c, r in zip(ctxs, resps):
        ex = crg_example(c, r, eos, block_size)
        if ex is None:
            stats["n_dropped_too_long"] += 1
            continue
        ids, n_ctx = ex
        stats["n_context_cut"] += n_ctx < len(c)
        stats["n_response_cut"] += len(ids) - n_ctx - 2 < len(r)
        ids_list.append(ids)
        starts.append(n_ctx)
    if not ids_list:
        raise ValueError(f"no fine-tuning example left of {len(rows)} row(s) (every context is longer than "
                         f"{block_size - 2} tokens with a response that does not fit)")
    # the loss starts after the context's closing <eos>: the first response token is predicted from it
    return _training_arrays(ids_list, [s + 1 for s in starts], block_size, pad, stats)


def _training_arrays(ids_list: Sequence[Sequence[int]], loss_starts: Sequence[int], block_size: int, pad_id: int,
                     stats: dict) -> tuple[dict[str, np.ndarray], dict]:
    """The fine-tuning arrays of examples given as token ids (each ≤ ``block_size``) and the position where each
    one's loss starts: ``input_ids`` (padded with ``pad_id``), ``attention_mask`` and ``loss_mask`` (1 from the
    start to the example's end), all int32 ``(N, block_size)``; ``stats`` gains the example and token counts."""
    n = len(ids_list)
    input_ids, mask = pad_sequences(ids_list, pad_id, width=block_size)
    loss_mask = np.zeros_like(mask)
    for i, (ids, start) in enumerate(zip(ids_list, loss_starts)):
        loss_mask[i, start:len(ids)] = 1
    stats.update(n_examples=n, n_tokens=int(mask.sum()), n_loss_tokens=int(loss_mask.sum()))
    return {"input_ids": input_ids, "attention_mask": mask, "loss_mask": loss_mask}, stats


# ------------------------------------------------------------------------------------------------ chat format
_START = re.compile(r"^\s*START\b")
_TURN_SEP = re.compile(r"(?:^|\s)EOS(?=\s|$)")


def context_turns(context: str) -> list[str]:
    """The turns of a DSTC-7 context: the text split at the organisers' ``EOS`` separators, the leading ``START``
    marker dropped, empty turns left out (``"START EOS a. EOS b"`` → ``["a.", "b"]``)."""
    return [t.strip() for t in _TURN_SEP.split(_START.sub("", context, count=1)) if t.strip()]


def dialog_messages(turns: Sequence[str], response: str | None = None) -> list[dict]:
    """A dialog as chat messages whose next (or given) reply is the assistant's: the last context turn is the
    user's, the turns before it alternate backwards (assistant, user, ...); an oldest turn that would be the
    assistant's is left out, so that every conversation starts with the user (as Gemma's template demands and
    every template accepts). ``response``: the assistant's reply, appended."""
    turns = list(turns)
    if len(turns) % 2 == 0 and turns:
        turns = turns[1:]
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    return msgs + ([] if response is None else [{"role": "assistant", "content": response}])


def system_first(chat, messages: list[dict]) -> list[dict]:
    """``messages`` after ``chat``'s system prompt (:class:`rbjax.model.chat.ChatTurns`), when it has one."""
    return ([{"role": "system", "content": chat.system}] if chat.system is not None else []) + list(messages)


def build_chat_crg_arrays(rows: Sequence[DSTC7Row], chat, *, block_size: int = BLOCK_SIZE,
                          pad_id: int = 0) -> tuple[dict[str, np.ndarray], dict]:
    """The fine-tuning arrays of DSTC-7 rows in the chat format: each row's context turns
    (:func:`context_turns`, :func:`dialog_messages`) and its response as the assistant's reply, rendered through
    ``chat`` (:class:`rbjax.model.chat.ChatTurns` with ``score_end_of_turn``), with the loss on the response's tokens
    and the end-of-turn token after them (so the model learns to end its turn, as the raw format's final ``<eos>``).
    Too long an example loses its oldest turns two by two (a user turn and the assistant's answer) until it fits
    ``block_size``; one whose last user turn and response alone do not fit is dropped.

    Returns:
        ``(arrays, stats)`` as :func:`build_crg_arrays` (``n_context_cut``: examples that lost turns).
    Raises:
        ValueError: a row without response (names its line), or no example left.
    """
    for r in rows:
        if r.response is None:
            raise ValueError(f"line {r.line} (hash {r.hash}): no response to train on")
    stats = {"n_rows": len(rows), "n_dropped_too_long": 0, "n_context_cut": 0, "n_response_cut": 0}
    kept = []
    for r in rows:
        turns = context_turns(r.context)
        msgs = dialog_messages(turns, r.response)
        cut = False
        while True:
            (sp,) = chat.encode_messages([system_first(chat, msgs)])
            if len(sp.ids) <= block_size or len(msgs) <= 2:
                break
            msgs, cut = msgs[2:], True
        if len(sp.ids) > block_size:
            stats["n_dropped_too_long"] += 1
            continue
        stats["n_context_cut"] += cut
        kept.append(sp)
    if not kept:
        raise ValueError(f"no fine-tuning example left of {len(rows)} row(s) (the last context turn and the response "
                         f"of every row take more than {block_size} tokens in the chat template)")
    return _training_arrays([sp.ids for sp in kept], [sp.n_context for sp in kept], block_size, pad_id, stats)


def read_reference_sets(paths: Sequence[str | os.PathLike], n_examples: int) -> list[list[str]]:
    """Reference files for the CRG metrics: one file per reference set, each line-aligned with the test examples.

    Args:
        paths: the files. n_examples: number of test examples (every file must have exactly this many lines).
    Returns:
        ``refs[k][i]`` = line ``i`` of file ``k``.
    Raises:
        FileNotFoundError, ValueError: missing, empty or non-UTF-8 file; a line count other than ``n_examples``
        (names the file and both counts).
    """

    out = []
    for p in paths:
        lines = read_lines(p, "reference file")
        if len(lines) != n_examples:
            raise ValueError(f"reference file {p} has {len(lines)} lines but there are {n_examples} test examples: "
                             "references must be line-aligned with the test examples (one file per reference set, "
                             "one line per example)")
        out.append(lines)
    return out


@dataclasses.dataclass(frozen=True)
class CRGObjective:
    """The CRG fine-tuning loss for the shared trainer (an :class:`rbjax.train.step.Objective`; paper §3.2): the
    causal LM loss on the response tokens only of ``context <eos> response <eos>`` rows (:func:`crg_example`).

    The micro-batch holds ``input_ids``/``attention_mask`` ``(B, L)`` and ``loss_mask`` ``(B, L)`` (1 on the
    response tokens); every real token may predict, only the response tokens are scored
    (:func:`rbjax.train.lm.forward_and_nll`). No settings: one value, one compiled program per batch shape.
    """

    hparam_names = ()
    metric_names = ("lm_loss",)

    def __call__(self, params, batch: dict, hparams, key, spec):
        _, lm = forward_and_nll(params, batch, key, spec, batch["attention_mask"] * batch["loss_mask"])
        return lm, {"lm_loss": lm}
