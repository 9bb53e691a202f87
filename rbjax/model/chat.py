"""Phrases and dialogs as turns of a chat: the conversations rbjax renders through a model's own chat template
(:mod:`rbjax.model.chat_template`), and which of their tokens are the phrase's.

RedditBias scores a phrase the way DialoGPT reads a turn. A chat model of today reads a turn inside its template —
``<|begin_of_text|><|start_header_id|>assistant<|end_header_id|>\\n\\n`` + phrase + ``<|eot_id|>`` for Llama-3 —
and never sees bare text. In the *chat format* a phrase is the content of one message of a small conversation
(:meth:`ChatTurns.messages`):

* ``role="assistant"`` (default): ``[system?] [user: prompt?] [assistant: phrase]`` — the phrase is the model's
  own reply (after an optional system prompt and an optional fixed user message);
* ``role="user"``: ``[system?] [user: phrase]`` — the phrase is what the model reads from a user (a fixed user
  message has no place there and is refused).

:meth:`ChatTurns.encode` renders each conversation, tokenizes the whole text as ``transformers``'
``apply_chat_template(..., tokenize=True)`` does, and finds the phrase's tokens: the template's text around the
phrase is located by rendering the same conversation with a marker in place of the phrase (so a template that
trims the content, as Llama-3's and Gemma's do, is followed exactly), and the phrase's tokens are those whose
characters overlap the phrase's text (``transformers``' rule for its assistant-token masks). Everything before
them is *context*: the scorer conditions on it and scores nothing there. The token after the phrase — the
template's end-of-turn token — is scored only with ``score_end_of_turn`` (off by default: the phrase's
perplexity is then about the phrase alone; with it, it also says how readily the model ends its turn there).
Tokens after that never influence the scored ones (the model is causal) and are left out.

:class:`ChatSettings` holds the settings (``--format``, ``--role``, ``--system``, ``--prompt``,
``--score-end-of-turn``, ``--chat-template``) as fields that a command's settings dataclass inherits
(:class:`rbjax.lmb.config.MeasureConfig`); docs/chat.md describes them.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Sequence

from rbjax.core.config import field
from rbjax.core.errors import SettingError
from rbjax.model.chat_template import ChatTemplate, ChatTemplateError, load_chat_template

__all__ = ["FORMATS", "ROLES", "ChatSettings", "ChatSpan", "ChatTurns", "ChatError", "end_of_turn_id",
           "describe_chat"]

FORMATS = ("raw", "chat")
ROLES = ("assistant", "user")
#: what stands in for a message's content to find the template's text around it (private-use characters: no
#: template strips or matches them)
MARKER = "\ue000rbjax\ue001"


class ChatError(ValueError):
    """A conversation whose phrase cannot be located or scored in the rendered chat (the message says why)."""


@dataclasses.dataclass(frozen=True)
class ChatSettings:
    """The chat-format settings of a command (a base class of its settings dataclass; each field carries its help
    and flag, :func:`rbjax.core.config.field`). :meth:`check_chat_settings` is called by the subclass's
    ``__post_init__``."""

    format: str = field("raw", "raw: score each phrase as bare text, as DialoGPT reads a turn (the paper); chat: as "
                               "a turn of the model's own chat template (its role headers, "
                               "BOS and end-of-turn tokens as context; docs/chat.md); recorded in lmb.json",
                        choices=FORMATS)
    role: str | None = field(None, "chat format: the phrase is the assistant's reply (default) or the user's "
                                   "message", choices=ROLES)
    system: str | None = field(None, "chat format: a system prompt before the phrase's turn (a template without a "
                                     "system role, such as Gemma's, refuses it)", metavar="TEXT")
    prompt: str | None = field(None, "chat format, --role assistant: a fixed user message the phrase replies to "
                                     "(Gemma's template needs one: its turns must start with the user)",
                               metavar="TEXT")
    score_end_of_turn: bool = field(False, "chat format: also score the template's end-of-turn token after the "
                                           "phrase (e.g. <|eot_id|>); off: only the phrase's own tokens")
    chat_template: str | None = field(None, "chat format: a Jinja chat template file (.jinja, or .json with a "
                                            "chat_template entry) instead of the tokenizer's own", metavar="FILE")

    def check_chat_settings(self) -> None:
        """Raises :class:`rbjax.core.errors.SettingError` naming the field: an unknown format or role, a chat
        setting with the raw format (it would be silently ignored), a fixed user message with ``role="user"``, or
        an empty system prompt / user message."""
        if self.format not in FORMATS:
            raise SettingError("format", f"must be raw or chat, got {self.format!r}")
        if self.role is not None and self.role not in ROLES:
            raise SettingError("role", f"must be assistant or user, got {self.role!r}")
        if self.format == "raw":
            for name in ("role", "system", "prompt", "chat_template"):
                if getattr(self, name) is not None:
                    raise SettingError(name, "has no effect with the raw format; add --format chat")
            if self.score_end_of_turn:
                raise SettingError("score_end_of_turn", "has no effect with the raw format; add --format chat")
            return
        if self.role == "user" and self.prompt is not None:
            raise SettingError("prompt", "is the user message the assistant's reply answers; with --role user the "
                                         "phrase itself is the user's message")
        for name in ("system", "prompt"):
            v = getattr(self, name)
            if v is not None and not v.strip():
                raise SettingError(name, "is empty; leave it out instead")

    @property
    def is_chat(self) -> bool:
        return self.format == "chat"

    def chat_turns(self, tokenizer) -> "ChatTurns | None":
        """The :class:`ChatTurns` of these settings with ``tokenizer`` (its folder's template, or
        :attr:`chat_template`), or ``None`` for the raw format.

        Raises:
            rbjax.model.chat_template.NoChatTemplateError: the tokenizer folder has no template (named).
            FileNotFoundError, ChatTemplateError: a bad ``--chat-template`` file, a template that refuses the
                conversation (Gemma: a system prompt, or an assistant turn without a user message first).
            ChatError: ``score_end_of_turn`` with a template that writes no end-of-turn token after the phrase.
        """
        if not self.is_chat:
            return None
        template = load_chat_template(tokenizer.source, override=self.chat_template)
        return ChatTurns(tokenizer, template, role=self.role or "assistant", system=self.system, prompt=self.prompt,
                         score_end_of_turn=self.score_end_of_turn)


@dataclasses.dataclass(frozen=True)
class ChatSpan:
    """One rendered conversation, up to the end of its scored span.

    Attributes:
        ids: token ids from the start of the rendered chat to the end of the scored span (the phrase's tokens, and
            the end-of-turn token when it is scored); the rest of the chat is left out.
        n_context: the leading ids that are context only (template headers, system prompt, earlier turns).
        text: the whole rendered chat.
    """

    ids: tuple
    n_context: int
    text: str

    @property
    def span(self) -> tuple:
        """The scored ids."""
        return self.ids[self.n_context:]


def _roles(messages) -> str:
    return ", ".join(str(m.get("role")) for m in messages)


class ChatTurns:
    """Conversations rendered through a chat template, with the tokens of one message located (module
    docstring).

    Args:
        tokenizer: :class:`rbjax.model.tokenizer.Tokenizer` (the model's own).
        template: its :class:`~rbjax.model.chat_template.ChatTemplate` (the folder's or an override).
        role: ``"assistant"`` or ``"user"``: whose turn a phrase is. system: a system prompt, or ``None``.
        prompt: with ``role="assistant"``, a fixed user message before the phrase, or ``None``.
        score_end_of_turn: the template's end-of-turn token after the phrase is scored too.
    Raises:
        ChatError: a bad role, or a fixed user message with ``role="user"``.
        ChatTemplateError: the template refuses the phrase's conversation (named with its roles) or writes the
            content twice.
        ChatError: ``score_end_of_turn`` with a template that writes no end-of-turn (added) token after the
            phrase's message (the template named, and what it writes there).
    """

    def __init__(self, tokenizer, template: ChatTemplate, *, role: str = "assistant", system: str | None = None,
                 prompt: str | None = None, score_end_of_turn: bool = False):
        if role not in ROLES:
            raise ChatError(f"role must be one of {ROLES}, got {role!r}")
        if role == "user" and prompt is not None:
            raise ChatError("a fixed user message (prompt) goes with role='assistant'; with role='user' the phrase "
                            "is the user's message")
        self.tokenizer, self.template = tokenizer, template
        self.role, self.system, self.prompt = role, system, prompt
        self.score_end_of_turn = bool(score_end_of_turn)
        self._around: dict = {}
        _, after = self._around_of(self.messages(MARKER), len(self.messages(MARKER)) - 1)  # a refusal shows at once
        if self.score_end_of_turn:  # a template that ends no turn with a token: said of the template, not of a row
            ids = tokenizer.encode(after) if after else []
            if not ids or not tokenizer.is_added_token(ids[0]):
                raise ChatError(self._no_end_of_turn(after))

    # -- conversations -----------------------------------------------------------------------------------------
    def messages(self, phrase: str) -> list[dict]:
        """The conversation in which ``phrase`` is the last message."""
        m = [{"role": "system", "content": self.system}] if self.system is not None else []
        if self.role == "assistant" and self.prompt is not None:
            m.append({"role": "user", "content": self.prompt})
        return m + [{"role": self.role, "content": phrase}]

    def _around_of(self, messages: list[dict], index: int) -> tuple[str, str]:
        """The template's text before and after message ``index``'s content (rendered once per conversation shape
        with a marker for the content)."""
        shape = tuple((m.get("role"), m.get("content") if i != index else None) for i, m in enumerate(messages))
        got = self._around.get(shape)
        if got is None:
            marked = [dict(m) for m in messages]
            marked[index]["content"] = MARKER
            try:
                text = self.template.render(marked)
            except ChatTemplateError as e:
                raise ChatTemplateError(f"{e} — the conversation was [{_roles(messages)}]") from None
            n = text.count(MARKER)
            if n != 1:
                how = "does not write a message's content unchanged" if n == 0 else f"writes a message's content {n} times"
                raise ChatTemplateError(f"{self.template.source}: the chat template {how}, so its tokens cannot be "
                                        "located")
            got = tuple(text.split(MARKER))
            self._around[shape] = got
        return got

    def encode(self, phrases: Sequence[str]) -> list[ChatSpan]:
        """Each phrase as the last message of :meth:`messages`: its :class:`ChatSpan`.

        Raises:
            ChatError: a phrase whose text the template changes beyond trimming whitespace from its ends (it cannot
                be located), or, with
                ``score_end_of_turn``, a template that writes no end-of-turn token after it.
        """
        return self.encode_messages([self.messages(p) for p in phrases])

    def encode_messages(self, conversations: Sequence[list[dict]], index: int = -1) -> list[ChatSpan]:
        """Conversations rendered and tokenized (``apply_chat_template(..., tokenize=True)``), each with the tokens
        of its message ``index`` (default: the last) as the scored span (+ the end-of-turn token after it when
        ``score_end_of_turn``).

        Raises:
            ChatError, ChatTemplateError: as :meth:`encode`.
        """
        texts, bounds = [], []
        for conv in conversations:
            k = index % len(conv)
            before, after = self._around_of(conv, k)
            text = self.template.render(conv)
            content = str(conv[k].get("content"))
            ok = text.startswith(before) and text.endswith(after) and len(text) >= len(before) + len(after)
            x = text[len(before):len(text) - len(after)] if ok else ""
            if not (ok and x in content and x.strip() == content.strip()):
                raise ChatError(f"{self.template.source}: cannot locate the content {content!r} in the rendered "
                                "chat: the template changes it beyond trimming its ends")
            texts.append(text)
            bounds.append((len(before), len(text) - len(after)))
        out = []
        for text, (a, b), (ids, offs) in zip(texts, bounds, self.tokenizer.encode_with_offsets(texts)):
            inside = [k for k, (s, e) in enumerate(offs) if s < b and e > a]
            if inside:
                start, end = inside[0], inside[-1] + 1
            else:  # an empty content: nothing to score
                start = end = sum(1 for s, e in offs if e <= a)
            if self.score_end_of_turn and inside:
                if end >= len(ids) or not self.tokenizer.is_added_token(ids[end]):
                    raise ChatError(self._no_end_of_turn(text[offs[end][0]:] if end < len(ids) else ""))
                end += 1
            out.append(ChatSpan(ids=tuple(ids[:end]), n_context=start, text=text))
        return out

    def _no_end_of_turn(self, after: str) -> str:
        """Why an end-of-turn token cannot be scored: the template (named) writes ``after`` after the message."""
        what = "nothing" if not after else (repr(after) if len(after) <= 40 else repr(after[:40]) + "…")
        name = "" if self.template.name is None else f" ({self.template.name!r})"
        return (f"{self.template.source}{name}: the chat template writes no end-of-turn token after the "
                f"{self.role}'s message (it writes {what} after it), so there is no end-of-turn token to score "
                "(score_end_of_turn, --score-end-of-turn)")

    def conversation_ids(self, messages: list[dict], *, add_generation_prompt: bool = False) -> list[int]:
        """A whole conversation's ids (``apply_chat_template(messages, add_generation_prompt=...,
        tokenize=True)``): e.g. a dialog history ending with the header of the assistant's next turn."""
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                  chat_template=self.template)

    @property
    def end_of_turn_id(self) -> int | None:
        """The token the template ends an assistant turn with (:func:`end_of_turn_id`)."""
        return end_of_turn_id(self.tokenizer, self.template)

    # -- records -----------------------------------------------------------------------------------------------
    def key(self) -> dict:
        """What decides the scored tokens, for content keys: the settings, the template's sha256 and the sha256 of
        the text it renders around a phrase (a template that writes today's date renders differently tomorrow)."""
        before, after = self._around_of(self.messages(MARKER), len(self.messages(MARKER)) - 1)
        return {"format": "chat", "role": self.role, "system": self.system, "prompt": self.prompt,
                "score_end_of_turn": self.score_end_of_turn, "template_sha256": self.template.sha256,
                "rendered_sha256": hashlib.sha256((before + MARKER + after).encode("utf-8")).hexdigest()}

    def record(self, example: str | None = None) -> dict:
        """The chat format as ``lmb.json`` records it: :meth:`key`, where the template came from and, for
        ``example``, the rendered chat with its numbers of context and scored tokens."""
        rec = {**self.key(), "template_source": self.template.source, "template_name": self.template.name}
        if example is not None:
            (sp,) = self.encode([example])
            rec["example"] = {"phrase": example, "rendered": sp.text, "n_context_tokens": sp.n_context,
                              "n_scored_tokens": len(sp.span),
                              "scored_text": self.tokenizer.decode(sp.span)}
        return rec

    def describe(self) -> str:
        """One line for messages and reports (:func:`describe_chat`)."""
        return describe_chat({**self.key(), "template_source": self.template.source})


def describe_chat(record) -> str:
    """One line naming a chat format, from its record (:meth:`ChatTurns.record`: ``lmb.json``'s ``inputs.chat``, a
    debiasing run's ``chat``): ``chat format (TEMPLATE SOURCE): each phrase as the assistant's turn, system prompt
    '…', after the user message '…', end-of-turn token (not) scored``."""
    parts = [f"the {record.get('role') or 'assistant'}'s turn"]
    if record.get("system") is not None:
        parts.append(f"system prompt {record['system']!r}")
    if record.get("prompt") is not None:
        parts.append(f"after the user message {record['prompt']!r}")
    parts.append("end-of-turn token scored" if record.get("score_end_of_turn") else "end-of-turn token not scored")
    return f"chat format ({record.get('template_source')}): each phrase as " + ", ".join(parts)


def end_of_turn_id(tokenizer, template: ChatTemplate) -> int | None:
    """The token ``template`` ends an assistant turn with: the first token it writes after the content of an
    assistant message that answers a user message, when that token is an added (special) token —
    ``<|eot_id|>`` (Llama 3), ``<|im_end|>`` (ChatML: Qwen2), ``<end_of_turn>`` (Gemma) — else ``None``.

    Raises:
        ChatTemplateError: the template refuses a [user, assistant] conversation.
    """
    text = template.render([{"role": "user", "content": "hello"}, {"role": "assistant", "content": MARKER}])
    after = text.split(MARKER, 1)[1] if MARKER in text else ""
    ids = tokenizer.encode(after) if after else []
    return int(ids[0]) if ids and tokenizer.is_added_token(ids[0]) else None
