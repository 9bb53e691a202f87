"""Chat templates, found and rendered exactly as ``transformers`` (5.x) finds and renders them.

A conversational model of today (Llama-3-Instruct, Qwen2.5-Instruct, Gemma-2-it, Mistral-Instruct) is used only
through its *chat template*: a Jinja program, shipped with the tokenizer, that turns a list of messages
(``[{"role": "user", "content": ...}, ...]``) into the text the model reads — role headers, a BOS, end-of-turn
tokens, often a default system prompt. This module reads that program and renders it; :mod:`rbjax.model.chat` puts
RedditBias phrases into conversations and finds their tokens.

Where the template comes from (:func:`read_chat_template`), in ``transformers``' order
(``PreTrainedTokenizerBase._from_pretrained`` and ``get_chat_template``):

1. ``chat_template.jinja`` beside the tokenizer, with the named templates of ``additional_chat_templates/*.jinja``:
   these files take priority over the template entry of ``tokenizer_config.json``;
2. ``tokenizer_config.json``'s ``chat_template``: a string, or a list of ``{"name", "template"}`` (named templates);
3. ``chat_template.json`` (``{"chat_template": ...}``), the legacy file of ``transformers``' *processors* (a
   tokenizer ignores it; rbjax reads it only when neither of the above exists);

or, instead of all of these, a file given by the user (``--chat-template FILE``: a ``.jinja`` text, or a ``.json``
holding a ``chat_template`` string as ``chat_template.json`` or ``tokenizer_config.json`` do). Of several named
templates the one named ``default`` is used, as ``transformers`` does when no tools are passed (rbjax passes none);
without one, the names are listed in the error.

How it is rendered (:meth:`ChatTemplate.render`), as ``transformers.utils.chat_template_utils``: ``jinja2``'s
``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension and the
``{% generation %}`` tag (rendered as its body); the ``tojson`` filter without HTML escaping; the globals
``raise_exception`` (a template's refusal: Gemma refuses a system turn), ``strftime_now`` (today's date, which
Llama-3.1's template writes), ``dict`` and a ``namespace`` that refuses underscore attributes. The variables are
``messages`` (``None`` values of a message dropped), ``tools`` and ``documents`` (``None``),
``add_generation_prompt`` and the tokenizer's named special tokens — ``bos_token``, ``eos_token``, ``unk_token``,
``sep_token``, ``pad_token``, ``cls_token``, ``mask_token`` as strings — from ``tokenizer_config.json`` (and from the
legacy ``special_tokens_map.json`` when ``tokenizer_config.json`` has no ``added_tokens_decoder``, as
``transformers`` reads it). ``transformers`` tokenizes the rendered text with ``add_special_tokens=False``; so does
:meth:`rbjax.model.tokenizer.Tokenizer.apply_chat_template`.

tests/test_chat_template.py checks, on every phrase of a RedditBias test split and three families' real templates,
that the token ids equal ``transformers``' ``apply_chat_template(..., tokenize=True)`` exactly.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import jinja2
import jinja2.exceptions
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["ChatTemplate", "ChatTemplateError", "NoChatTemplateError", "read_chat_template", "load_chat_template",
           "special_tokens_map", "CHAT_TEMPLATE_FILES", "SPECIAL_TOKEN_NAMES"]

#: the template files a tokenizer folder may hold beside ``tokenizer_config.json`` (the content key covers them)
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
ADDITIONAL_TEMPLATES_DIR = "additional_chat_templates"
#: ``transformers``' ``SPECIAL_TOKENS_ATTRIBUTES``: the special tokens a template sees as variables
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class ChatTemplateError(ValueError):
    """A chat template that cannot be read, compiled or rendered (the message names its file)."""


class NoChatTemplateError(ChatTemplateError):
    """The chat format was asked for, but the tokenizer folder has no chat template and none was given."""


# ------------------------------------------------------------------------------------------- the environment
class _Generation(jinja2.ext.Extension):
    """``{% generation %}…{% endgeneration %}`` (``transformers``' ``AssistantTracker`` tag, which marks the
    assistant's tokens for ``return_assistant_tokens_mask``): rendered as its body, as ``transformers`` renders it
    when it does not track."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' filter: no HTML escaping (jinja's own tojson escapes <, >, &, '), indent/separators exposed
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):  # noqa: A002 (the name templates call it with)
    return datetime.now().strftime(format)


class _TemplateDict:
    """``dict`` for templates without attribute access to the type (as ``transformers``)."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """jinja's ``namespace`` refusing underscore-prefixed attributes (as ``transformers``)."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}.")


@lru_cache(maxsize=64)
def _compile(text: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env.from_string(text)


def _plain(value: Any) -> Any:
    """What a template may see: JSON types only (``transformers``' ``_plain_template_data`` for text messages)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return f"<{type(value).__name__}>"


# ------------------------------------------------------------------------------------------------ the template
@dataclasses.dataclass(frozen=True)
class ChatTemplate:
    """A chat template and the special tokens it is rendered with.

    Attributes:
        text: the Jinja source.
        source: where it was read (a file, or ``FOLDER/tokenizer_config.json``), for messages and records.
        special_tokens: ``{"bos_token": "<|begin_of_text|>", ...}``: the named special tokens of the tokenizer's
            config (:func:`special_tokens_map`), variables of every rendering.
        name: the named template chosen among several (``"default"``), else ``None``.
    """

    text: str
    source: str
    special_tokens: Mapping[str, str] = dataclasses.field(default_factory=dict)
    name: str | None = None

    @property
    def sha256(self) -> str:
        """sha256 of the template text (UTF-8): what ``lmb.json`` records and the resume key covers."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    def compiled(self) -> jinja2.Template:
        """The compiled template (cached by text).

        Raises:
            ChatTemplateError: a Jinja syntax error (file and line named).
        """
        try:
            return _compile(self.text)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise ChatTemplateError(f"{self.source}: the chat template is not valid Jinja (line {e.lineno}: "
                                    f"{e.message})") from None

    def render(self, messages, *, add_generation_prompt: bool = False, **variables) -> str:
        """The text of a conversation, as ``transformers``' ``apply_chat_template(..., tokenize=False)``.

        Args:
            messages: ``[{"role": ..., "content": ...}, ...]`` (keys whose value is ``None`` are dropped).
            add_generation_prompt: end with the header that opens the assistant's turn.
            **variables: further template variables (they override the special tokens, as in ``transformers``).
        Returns:
            the rendered text (special tokens as their strings, e.g. ``<|eot_id|>``).
        Raises:
            ChatTemplateError: the template refused the conversation (its ``raise_exception`` message, e.g. Gemma's
                "System role not supported"), or failed while rendering.
        """
        if not isinstance(messages, (list, tuple)) or not messages:
            raise ChatTemplateError("a conversation is a non-empty list of messages")
        chat = []
        for m in messages:
            if not isinstance(m, Mapping):
                raise ChatTemplateError(f"a message is a dict with 'role' and 'content', got {m!r}")
            chat.append(_plain({k: v for k, v in m.items() if v is not None}))
        kwargs = _plain({**self.special_tokens, **variables})
        try:
            return self.compiled().render(messages=chat, tools=None, documents=None,
                                          add_generation_prompt=bool(add_generation_prompt), **kwargs)
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(f"{self.source}: the chat template refused the conversation "
                                    f"({type(e).__name__}: {e})") from None


# ------------------------------------------------------------------------------------------------- where it is
def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ChatTemplateError(f"{path}: cannot read ({e})") from None


def _token_string(v) -> str | None:
    if isinstance(v, dict):  # an AddedToken written as {"content": ..., "special": ...}
        v = v.get("content")
    return v if isinstance(v, str) else None


def special_tokens_map(folder: str | os.PathLike) -> dict[str, str]:
    """The named special tokens a template is rendered with (``transformers``' ``tokenizer.special_tokens_map``):
    the ``*_token`` entries of ``SPECIAL_TOKEN_NAMES`` in ``tokenizer_config.json`` (a string or an ``AddedToken``
    dict), overridden by the legacy ``special_tokens_map.json`` when ``tokenizer_config.json`` has no
    ``added_tokens_decoder`` (as ``transformers`` merges it). ``None`` entries are left out.

    Raises:
        ChatTemplateError: an unreadable file.
    """
    folder = Path(folder)
    cfg = _read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
    cfg = cfg if isinstance(cfg, dict) else {}
    values = {k: cfg.get(k) for k in SPECIAL_TOKEN_NAMES}
    legacy = folder / "special_tokens_map.json"
    if "added_tokens_decoder" not in cfg and legacy.is_file():
        m = _read_json(legacy)
        if isinstance(m, dict):
            values.update({k: m[k] for k in SPECIAL_TOKEN_NAMES if k in m})
    return {k: s for k, v in values.items() if (s := _token_string(v)) is not None}


def _pick(templates: dict[str, str], where: str) -> tuple[str, str]:
    if "default" in templates:
        return templates["default"], "default"
    raise ChatTemplateError(f"{where}: several chat templates ({', '.join(sorted(templates))}) and none named "
                            "'default'; pass --chat-template FILE with the one to use")


def _from_file(path: Path) -> tuple[str, str | None]:
    """``(text, name)`` of a template file given by the user: a ``.json`` holding ``chat_template`` (a string or a
    list of named templates), else the file's text."""
    if not path.is_file():
        raise FileNotFoundError(f"--chat-template {path}: no such file")
    if path.suffix == ".json":
        d = _read_json(path)
        t = d.get("chat_template") if isinstance(d, dict) else None
        if isinstance(t, list):
            return _pick(_named(t, str(path)), str(path))
        if not isinstance(t, str):
            raise ChatTemplateError(f"{path}: expected a JSON object with a 'chat_template' string")
        return t, None
    try:
        return path.read_text(encoding="utf-8"), None
    except (OSError, UnicodeDecodeError) as e:
        raise ChatTemplateError(f"{path}: cannot read ({e})") from None


def _named(entries: list, where: str) -> dict[str, str]:
    out = {}
    for e in entries:
        if not (isinstance(e, dict) and isinstance(e.get("name"), str) and isinstance(e.get("template"), str)):
            raise ChatTemplateError(f"{where}: a list of chat templates holds {{'name': ..., 'template': ...}} "
                                    f"objects, got {e!r}")
        out[e["name"]] = e["template"]
    return out


def read_chat_template(folder: str | os.PathLike, override: str | os.PathLike | None = None) -> ChatTemplate | None:
    """The chat template of a tokenizer folder (module docstring: the order of the files), or of ``override``.

    Args:
        folder: the tokenizer folder (its ``tokenizer_config.json`` gives the special tokens in any case).
        override: a template file that replaces the folder's (``--chat-template FILE``).
    Returns:
        a :class:`ChatTemplate`, or ``None`` when the folder has none and no override is given.
    Raises:
        FileNotFoundError: ``override`` does not exist.
        ChatTemplateError: an unreadable file, a malformed template entry, or several named templates without a
            ``default``.
    """
    folder = Path(folder)
    special = special_tokens_map(folder) if folder.is_dir() else {}
    if override is not None:
        p = Path(override).expanduser()
        text, name = _from_file(p)
        return ChatTemplate(text, str(p), special, name)
    templates: dict[str, str] = {}
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        templates["default"] = jinja_file.read_text(encoding="utf-8")
    extra = folder / ADDITIONAL_TEMPLATES_DIR
    if extra.is_dir():
        for f in sorted(extra.glob("*.jinja")):
            templates[f.name.removesuffix(".jinja")] = f.read_text(encoding="utf-8")
    if templates:
        if len(templates) == 1 and "default" in templates:
            return ChatTemplate(templates["default"], str(jinja_file), special)
        text, name = _pick(templates, str(folder))
        return ChatTemplate(text, str(jinja_file), special, name)
    cfg_file = folder / "tokenizer_config.json"
    if cfg_file.is_file():
        cfg = _read_json(cfg_file)
        t = cfg.get("chat_template") if isinstance(cfg, dict) else None
        if isinstance(t, str):
            return ChatTemplate(t, str(cfg_file), special)
        if isinstance(t, list):
            text, name = _pick(_named(t, str(cfg_file)), str(cfg_file))
            return ChatTemplate(text, str(cfg_file), special, name)
        if t is not None:
            raise ChatTemplateError(f"{cfg_file}: 'chat_template' must be a string or a list of named templates, "
                                    f"got {type(t).__name__}")
    legacy = folder / "chat_template.json"
    if legacy.is_file():
        d = _read_json(legacy)
        t = d.get("chat_template") if isinstance(d, dict) else None
        if not isinstance(t, str):
            raise ChatTemplateError(f"{legacy}: expected a JSON object with a 'chat_template' string")
        return ChatTemplate(t, str(legacy), special)
    return None


def load_chat_template(folder: str | os.PathLike, override: str | os.PathLike | None = None) -> ChatTemplate:
    """:func:`read_chat_template`, for a caller that needs one.

    Raises:
        NoChatTemplateError: the folder has no chat template and no ``override`` is given (the folder named, and
            how to go on); whatever :func:`read_chat_template` raises.
    """
    t = read_chat_template(folder, override)
    if t is None:
        raise NoChatTemplateError(
            f"{folder}: the model has no chat template (no chat_template.jinja, no 'chat_template' in "
            "tokenizer_config.json, no chat_template.json), so it cannot be used in the chat format; pass "
            "--chat-template FILE (a Jinja template) or use --format raw")
    return t
