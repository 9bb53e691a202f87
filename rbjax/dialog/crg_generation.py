"""Response generation for dialog contexts (paper §3.2, CRG on DSTC-7; docs/dialog.md "CRG") → JSONL.

Each example is ``(key, context)``. The prompt is the GPT-2 tokens of the context followed by ``<|endoftext|>``
(the separator the fine-tuning examples ``context + <eos> + response + <eos>`` put before the response), the
context cut from the left so that the prompt fits ``max_prompt_tokens`` (64: the reference's prompt width).
The continuation up to (without) the next ``<|endoftext|>`` is the response. Generation itself is
:func:`rbjax.model.generate.generate` (jit, KV cache, batched, per-example seeds).

``semantics="reference"`` rebuilds the reference's prompt as well: its (empty-response) test example
``ctx[-126:] + [eos, eos]`` truncated to its first 64 tokens — a context of more than 62 tokens therefore has no
separator — and samples with top-k 50, top-p 0.95, 128 tokens in all. Two reference quirks are *not* copied:
the reference attends to the padding of its 64-column prompts and numbers positions from the padding
(its ``prepare_inputs_for_generation`` drops the attention mask); rbjax masks padding and numbers positions from
the first real token, so a response does not depend on the batch it was generated in.

Output: one JSON object per line, ``{"key", "context", "response"}``, written atomically.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from rbjax.core.io import atomic_file, to_json
from rbjax.core.progress import progress_bar
from rbjax.dialog.crg_data import context_turns, dialog_messages, system_first
from rbjax.model.generate import (
    Generated,
    SamplingSettings,
    generate,
    sampling_settings,
)

__all__ = ["build_prompt", "chat_prompt", "generate_responses", "REFERENCE_PROMPT_WIDTH", "CHAT_PROMPT_WIDTH"]

#: the reference generates from the first 64 columns of its padded test batch (lm_dstc7.py:468-491)
REFERENCE_PROMPT_WIDTH = 64
#: the chat format's prompt width: the template adds a BOS, role headers and end-of-turn tokens to every turn
#: (Llama 3: 5 tokens a turn and a BOS), so a chat prompt gets twice the reference's 64 tokens
CHAT_PROMPT_WIDTH = 128


def chat_prompt(chat, context: str, max_prompt_tokens: int = CHAT_PROMPT_WIDTH) -> list[int]:
    """The prompt of one context in the chat format: its turns (:func:`rbjax.dialog.crg_data.context_turns`) as a
    conversation ending with the user's turn (:func:`rbjax.dialog.crg_data.dialog_messages`, after ``chat``'s system
    prompt when it has one), rendered through ``chat``'s template with the header of the assistant's reply
    (``add_generation_prompt``). A prompt longer than ``max_prompt_tokens`` loses its oldest turns two by two (the
    dialog keeps starting with the user); a last turn that alone does not fit loses its first words.

    Raises:
        ValueError: the template's text alone takes more than ``max_prompt_tokens``.
    """
    msgs = dialog_messages(context_turns(context)) or [{"role": "user", "content": ""}]
    ids = chat.conversation_ids(system_first(chat, msgs), add_generation_prompt=True)
    while len(ids) > max_prompt_tokens and len(msgs) > 1:
        msgs = msgs[2:]
        ids = chat.conversation_ids(system_first(chat, msgs), add_generation_prompt=True)
    words = msgs[-1]["content"].split()
    while len(ids) > max_prompt_tokens and words:
        words = words[max(1, (len(ids) - max_prompt_tokens) // 2):]
        ids = chat.conversation_ids(system_first(chat, [{"role": "user", "content": " ".join(words)}]),
                                    add_generation_prompt=True)
    if len(ids) > max_prompt_tokens:
        raise ValueError(f"the chat template's own text takes {len(ids)} tokens, more than the prompt width "
                         f"{max_prompt_tokens}")
    return ids


def build_prompt(context_ids: Sequence[int], eos_id: int, *, semantics: str = "rbjax",
                 max_prompt_tokens: int = REFERENCE_PROMPT_WIDTH) -> list[int]:
    """The prompt token ids of one context.

    Args:
        context_ids: GPT-2 ids of the context. eos_id: ``<|endoftext|>`` (50256).
        semantics: ``"rbjax"``: the last ``max_prompt_tokens − 1`` context tokens + EOS. ``"reference"``: the
            reference's ``(ctx[-126:] + [eos, eos])[:64]``.
    Raises:
        ValueError: unknown semantics, ``max_prompt_tokens < 2``.
    """
    if max_prompt_tokens < 2:
        raise ValueError(f"max_prompt_tokens must be >= 2, got {max_prompt_tokens}")
    ctx = [int(t) for t in context_ids]
    if semantics == "rbjax":
        return ctx[-(max_prompt_tokens - 1):] + [eos_id]
    if semantics == "reference":
        return (ctx[-126:] + [eos_id, eos_id])[:REFERENCE_PROMPT_WIDTH]
    raise ValueError(f"semantics must be 'rbjax' or 'reference', got {semantics!r}")


def generate_responses(params, config, tokenizer, examples: Sequence[tuple[str, str]],
                       out_path: str | os.PathLike | None = None, *, semantics: str = "rbjax", seed: int = 0,
                       settings: SamplingSettings | None = None, batch_size: int = 16, precision: str = "fp32",
                       max_prompt_tokens: int | None = None, progress: bool = True,
                       mesh=None, chat=None, end_ids: Sequence[int] | None = None, self_debias=None,
                       prefix_ids: Sequence[Sequence[int]] | None = None, bos_id: int | None = None) -> list[dict]:
    """Generate a response for every ``(key, context)`` and (optionally) write them as JSONL.

    Args:
        params, config: the model. tokenizer: a :class:`rbjax.model.tokenizer.Tokenizer`.
        examples: ``(key, context)`` pairs; the example's position is its PRNG stream (with ``seed``).
        out_path: JSONL file to write (atomically), or None.
        semantics: ``"rbjax"`` (top-k 50, 64 new tokens) or ``"reference"`` (see the module docstring).
        settings: override the sampling preset of ``semantics`` (e.g. ``SamplingSettings(greedy=True)``).
        mesh: a named device mesh: parameters split by the family's logical axes, prompt rows and the KV cache over
            ``data``×``fsdp`` (:func:`rbjax.model.generate.generate`); ``None``: one device.
        max_prompt_tokens: prompt width (default: :data:`REFERENCE_PROMPT_WIDTH`, or :data:`CHAT_PROMPT_WIDTH` with
            ``chat``).
        chat: a :class:`rbjax.model.chat.ChatTurns`: each context rendered as a chat (:func:`chat_prompt`), the
            response the assistant's turn; ``None``: the raw format (:func:`build_prompt`).
        end_ids: the tokens a response ends at (default: the tokenizer's ``<|endoftext|>``; in the chat format pass
            :meth:`rbjax.model.handle.ModelHandle.end_token_ids` of the template: the end-of-turn token too).
        self_debias, prefix_ids, bos_id: Self-Debias decoding (:func:`rbjax.model.generate.generate`: every token
            drawn from the rescaled distribution, the prefixes inserted after a leading ``bos_id``); ``None``: the
            model's own distribution.
    Returns:
        the records ``{"key", "context", "response"}`` in input order.
    """
    eos = tokenizer.eos_id
    settings = settings or sampling_settings(semantics)
    if chat is not None:
        width = CHAT_PROMPT_WIDTH if max_prompt_tokens is None else max_prompt_tokens
        prompts = [chat_prompt(chat, c, width) for _, c in examples]
    else:
        if eos is None:
            raise ValueError(f"{tokenizer.source}: the tokenizer has no <|endoftext|> token")
        width = REFERENCE_PROMPT_WIDTH if max_prompt_tokens is None else max_prompt_tokens
        prompts = [build_prompt(ids, eos, semantics=semantics, max_prompt_tokens=width)
                   for ids in tokenizer.encode_batch([c for _, c in examples])]
    stops = tuple(end_ids) if end_ids else eos
    if stops is None:
        raise ValueError(f"{tokenizer.source}: no end token to stop a response at")
    bar = None
    if progress:

        bar = progress_bar(len(prompts), "generate", "context")
    try:
        gen: Generated = generate(params, config, prompts, settings=settings, seed=seed, batch_size=batch_size,
                                  precision=precision, eos_id=stops, progress=None if bar is None else bar.update,
                                  mesh=mesh, self_debias=self_debias, prefix_ids=prefix_ids, bos_id=bos_id)
    finally:
        if bar is not None:
            bar.close()
    records = [{"key": k, "context": c, "response": tokenizer.decode(t)}
               for (k, c), t in zip(examples, gen.tokens)]
    if out_path is not None:
        with atomic_file(Path(out_path), "w", encoding="utf-8") as f:
            for r in records:
                f.write(to_json(r, ensure_ascii=False) + "\n")
    return records
