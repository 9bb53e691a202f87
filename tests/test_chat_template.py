"""Chat templates read and rendered as ``transformers`` does (rbjax/model/chat_template.py), and phrases located in
the rendered chats (rbjax/model/chat.py).

The tokenizer folders (tests/conftest.py ``make_chat_tokenizer``) carry the real templates of Llama-3-Instruct
(header ids, ``<|eot_id|>``), Qwen2.5-Instruct (ChatML, a default system prompt) and Gemma-2-it (no system role,
alternating turns); for every phrase of the religion1 test split, in every conversation shape, rbjax's token ids
equal ``transformers``' ``apply_chat_template(..., tokenize=True)``.
"""
import json

import pytest

from rbjax.core.errors import SettingError
from rbjax.data.redditbias import load_pairs
from rbjax.lmb.config import MeasureConfig
from rbjax.model.chat import ChatError, ChatTurns, end_of_turn_id
from rbjax.model.chat_template import (ChatTemplate, ChatTemplateError, NoChatTemplateError, load_chat_template,
                                       read_chat_template, special_tokens_map)
from rbjax.model.tokenizer import load_tokenizer

transformers = pytest.importorskip("transformers")

#: conversation shapes: (role, system prompt, fixed user message)
SHAPES = [("assistant", None, None), ("assistant", "You are a helpful assistant.", None),
          ("assistant", "You are a helpful assistant.", "What do you think?"), ("assistant", None, "Tell me."),
          ("user", None, None), ("user", "Answer briefly.", None)]
#: the end-of-turn token of each style's template
EOT = {"llama3": "<|eot_id|>", "qwen2": "<|im_end|>", "gemma2": "<end_of_turn>"}


@pytest.fixture(scope="module")
def phrases(redditbias_dir):
    p = load_pairs("religion1", "test", redditbias_dir)
    return p.biased + p.counterfactual


@pytest.fixture(scope="module")
def tokenizers(chat_tokenizer_dirs):
    return {s: (load_tokenizer(d, expected_vocab_size=None), transformers.AutoTokenizer.from_pretrained(d))
            for s, d in chat_tokenizer_dirs.items()}


def _refused_by_gemma(role, system, prompt):
    # Gemma's template refuses a system turn and a first turn that is not the user's
    return system is not None or (role == "assistant" and prompt is None)


@pytest.mark.parametrize("style", ["llama3", "qwen2", "gemma2"])
def test_every_phrase_renders_to_transformers_ids(style, tokenizers, phrases):
    tok, ref = tokenizers[style]
    assert tok.chat_template is not None
    n_shapes = 0
    for role, system, prompt in SHAPES:
        if style == "gemma2" and _refused_by_gemma(role, system, prompt):
            continue
        n_shapes += 1
        chat = ChatTurns(tok, tok.chat_template, role=role, system=system, prompt=prompt)
        convs = [chat.messages(p) for p in phrases]
        want = ref.apply_chat_template(convs, tokenize=True, return_dict=False)
        assert [tok.apply_chat_template(c) for c in convs] == want
        spans = chat.encode(phrases)
        for p, sp, w in zip(phrases, spans, want):
            assert list(sp.ids) == w[:len(sp.ids)], p  # the scored span ends the ids; the rest is the template's
            assert len(sp.span) >= 1
            assert tok.decode(sp.span).strip() == p.strip(), p  # the phrase's tokens, nothing of the template
            assert tok.decode(w[len(sp.ids):]).startswith(EOT[style])  # what is left out starts at end of turn
        with_eot = ChatTurns(tok, tok.chat_template, role=role, system=system, prompt=prompt,
                             score_end_of_turn=True).encode(phrases[:20])
        for sp, w in zip(with_eot, want):
            assert list(sp.ids) == w[:len(sp.ids)] and tok.id_to_token(sp.ids[-1]) == EOT[style]
        if role == "user":  # the history of a dialog: the header of the assistant's turn after it
            gen = ref.apply_chat_template(convs[:50], tokenize=True, add_generation_prompt=True, return_dict=False)
            assert [chat.conversation_ids(c, add_generation_prompt=True) for c in convs[:50]] == gen
    assert n_shapes >= (2 if style == "gemma2" else len(SHAPES))


@pytest.mark.parametrize("style", ["llama3", "qwen2", "gemma2"])
def test_end_of_turn_token_and_special_tokens(style, tokenizers, chat_tokenizer_dirs):
    tok, ref = tokenizers[style]
    assert tok.id_to_token(end_of_turn_id(tok, tok.chat_template)) == EOT[style]
    assert special_tokens_map(chat_tokenizer_dirs[style]) == {
        k: v for k, v in ref.special_tokens_map.items() if k != "mask_token"}  # GemmaTokenizer's class default


def test_gemma_refuses_a_system_prompt_as_its_template_does(tokenizers):
    tok, ref = tokenizers["gemma2"]
    conv = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "the jews are"}]
    with pytest.raises(Exception, match="System role not supported"):
        ref.apply_chat_template(conv, tokenize=False)
    with pytest.raises(ChatTemplateError, match="System role not supported.*system, user"):
        ChatTurns(tok, tok.chat_template, role="user", system="Be kind.")
    with pytest.raises(ChatTemplateError, match="roles must alternate.*conversation was \\[assistant\\]"):
        ChatTurns(tok, tok.chat_template, role="assistant")


ENV_TEMPLATE = (
    "{%- set ns = namespace(n=0) -%}"
    "{%- for m in messages -%}{%- if loop.index0 > 1 %}{% break %}{% endif -%}"
    "{%- set ns.n = ns.n + 1 -%}"
    "{% generation %}[{{ m['role'] }}|{{ m['content'] | tojson }}|{{ {'a': '<&>'} | tojson(indent=1) }}]"
    "{% endgeneration %}\n"
    "    {% if m.extra is defined %}extra{% endif %}\n"
    "{%- endfor -%}{{ ns.n }}{{ bos_token }}{{ dict(x=1) | tojson }}{{ strftime_now('%Y') }}"
    "{% if add_generation_prompt %}<gen>{% endif %}")


def test_environment_matches_transformers(tokenizers):
    # trim_blocks / lstrip_blocks, loopcontrols, namespace, the generation tag, transformers' tojson (no HTML
    # escaping, indent), dict, strftime_now, the special tokens and None-valued keys dropped
    tok, ref = tokenizers["llama3"]
    conv = [{"role": "user", "content": "a \"quoted\" <b> & é", "extra": None},
            {"role": "assistant", "content": "x"}, {"role": "user", "content": "never rendered"}]
    t = ChatTemplate(ENV_TEMPLATE, "test", special_tokens_map(tok.source))
    for gen in (False, True):
        want = ref.apply_chat_template(conv, chat_template=ENV_TEMPLATE, tokenize=False, add_generation_prompt=gen)
        assert t.render(conv, add_generation_prompt=gen) == want
        assert tok.apply_chat_template(conv, chat_template=t, tokenize=False, add_generation_prompt=gen) == want
    with pytest.raises(ChatTemplateError, match="boom"):
        ChatTemplate("{{ raise_exception('boom') }}", "t").render(conv)
    with pytest.raises(ChatTemplateError, match="underscore"):
        ChatTemplate("{% set ns = namespace() %}{% set ns._x = 1 %}", "t").render(conv)
    with pytest.raises(ChatTemplateError, match="unsafe|SecurityError"):  # the sandbox
        ChatTemplate("{{ messages.append(1) }}", "t").render(conv)
    with pytest.raises(ChatTemplateError, match="t: the chat template is not valid Jinja \\(line 1"):
        ChatTemplate("{% for %}", "t").render(conv)


def test_where_the_template_comes_from(tmp_path, chat_tokenizer_dirs, tokenizers):
    src = chat_tokenizer_dirs["qwen2"]
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text((src / "tokenizer.json").read_text())
    base = json.loads((src / "tokenizer_config.json").read_text())
    qwen = base.pop("chat_template")
    conv = [{"role": "user", "content": "hi"}]

    def write_cfg(**extra):
        (folder / "tokenizer_config.json").write_text(json.dumps({**base, **extra}))

    def agree():  # rbjax's choice renders what transformers' choice renders
        ref = transformers.AutoTokenizer.from_pretrained(folder)
        tok = load_tokenizer(folder, expected_vocab_size=None)
        assert tok.apply_chat_template(conv, tokenize=False) == ref.apply_chat_template(conv, tokenize=False)
        return tok.chat_template

    write_cfg()
    assert read_chat_template(folder) is None
    with pytest.raises(NoChatTemplateError, match=f"{folder}: the model has no chat template.*--chat-template FILE"):
        load_chat_template(folder)
    with pytest.raises(NoChatTemplateError, match=str(folder)):
        MeasureConfig(format="chat").chat_turns(load_tokenizer(folder, expected_vocab_size=None))
    write_cfg(chat_template=[{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": qwen}])
    t = agree()
    assert t.name == "default" and t.text == qwen
    write_cfg(chat_template=[{"name": "tool_use", "template": "TOOLS"}])
    with pytest.raises(ChatTemplateError, match="several chat templates \\(tool_use\\) and none named 'default'"):
        read_chat_template(folder)
    write_cfg(chat_template="{{ 'from the config' }}")
    (folder / "chat_template.jinja").write_text("{{ 'from the jinja file' }}")
    assert agree().source.endswith("chat_template.jinja")  # the .jinja file wins, as in transformers
    (folder / "chat_template.jinja").unlink()
    write_cfg()
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": qwen}))
    assert read_chat_template(folder).text == qwen  # the processors' legacy file, read last
    override = tmp_path / "mine.jinja"
    override.write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    assert read_chat_template(folder, override).render(conv) == "<user>hi"
    (tmp_path / "mine.json").write_text(json.dumps({"chat_template": "J{{ messages[0].content }}"}))
    assert read_chat_template(folder, tmp_path / "mine.json").render(conv) == "Jhi"
    with pytest.raises(FileNotFoundError, match="--chat-template .*nope.jinja: no such file"):
        read_chat_template(folder, tmp_path / "nope.jinja")


def test_chat_settings_are_checked():
    assert MeasureConfig().format == "raw"
    with pytest.raises(SettingError, match="role has no effect with the raw format"):
        MeasureConfig(role="user")
    with pytest.raises(SettingError, match="system has no effect with the raw format"):
        MeasureConfig(system="Be kind.")
    with pytest.raises(SettingError, match="score_end_of_turn has no effect"):
        MeasureConfig(score_end_of_turn=True)
    with pytest.raises(SettingError, match="prompt is the user message"):
        MeasureConfig(format="chat", role="user", prompt="Hi")
    with pytest.raises(SettingError, match="format must be raw or chat"):
        MeasureConfig(format="chatml")
    with pytest.raises(SettingError, match="system is empty"):
        MeasureConfig(format="chat", system=" ")


def test_a_template_that_rewrites_the_content_is_refused(tokenizers):
    tok, _ = tokenizers["llama3"]
    t = ChatTemplate("{% for m in messages %}<{{ m.content | replace('jews', 'JEWS') }}>{% endfor %}", "r.jinja")
    with pytest.raises(ChatError, match="r.jinja: cannot locate the content"):
        ChatTurns(tok, t).encode(["the jews are greedy"])
    upper = ChatTemplate("{% for m in messages %}<{{ m.content | upper }}>{% endfor %}", "upper.jinja")
    with pytest.raises(ChatTemplateError, match="does not write a message's content unchanged"):
        ChatTurns(tok, upper)
    twice = ChatTemplate("{% for m in messages %}{{ m.content }}{{ m.content }}{% endfor %}", "twice.jinja")
    with pytest.raises(ChatTemplateError, match="writes a message's content 2 times"):
        ChatTurns(tok, twice)
    no_eot = ChatTemplate("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}", "plain.jinja")
    # said of the template when the settings are read, not of the first phrase, as text ('\n', not 'Ċ')
    with pytest.raises(ChatError, match=r"^plain.jinja: the chat template writes no end-of-turn token after the "
                                        r"user's message \(it writes '\\n' after it\)"):
        ChatTurns(tok, no_eot, role="user", score_end_of_turn=True)
    ChatTurns(tok, no_eot)  # fine when the end of turn is not scored
