"""A model's chat template renders a chat as transformers' ``apply_chat_template`` (which
vLLM calls) renders it: the same text for the same messages and tools."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from kvwire.chat_messages import ChatFormatError
from kvwire.tokenizer import PromptTokenizer, load_tokenizer
from kvwire.tokenizer_build import ASSET_DIR

# Qwen2.5's way with tools (each one ``tojson``), a loop cut short with ``break``, the
# assistant's text in a ``generation`` block, and the date line of Llama 3's
TEMPLATE = (
    "{{- strftime_now('') }}"
    "{%- if tools %}<|im_start|>system\n# Tools\n\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools><|im_end|>\n"
    "{%- endif %}"
    "{%- for m in messages %}{%- if loop.index > 8 %}{% break %}{%- endif %}"
    "<|im_start|>{{ m['role'] }}\n"
    "{%- if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}{% endgeneration %}"
    "{%- else %}{{ m['content'] }}{%- endif %}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")

TOOLS = [{"type": "function", "function": {
    "name": "find_clause", "description": "Finds a clause <by number> & returns it: 'é'",
    "parameters": {"type": "object", "required": ["n"],
                   "properties": {"n": {"type": "integer"}}}}}]


def _templated(tmp_path: Path, template: str) -> PromptTokenizer:
    shutil.copy(ASSET_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return load_tokenizer(tmp_path)


def _transformers(template: str, messages: list[Any], tools: list[Any] | None) -> str:
    rendered, _ = render_jinja_template(conversations=[messages], tools=tools,
                                        chat_template=template, add_generation_prompt=True)
    return rendered[0]


def test_tools_and_messages_render_as_transformers_renders_them(tmp_path: Path) -> None:
    # a tool's schema in its own key order, its <, &, ' and é as they are: Jinja's own
    # tojson sorted the keys and escaped them, a text the model is not served
    tok = _templated(tmp_path, TEMPLATE)
    chat = [{"role": "system", "content": "You read contracts."},
            {"role": "user", "content": "What does clause 4 say?"},
            {"role": "assistant", "content": "It sets the term."},
            {"role": "user", "content": "And clause 5?"}]
    for tools in (TOOLS, None):
        ours = tok.render_chat(chat, tools=tools)
        assert ours == _transformers(TEMPLATE, chat, tools)
    assert '{"type": "function", "function": {"name": "find_clause"' in \
        tok.render_chat(chat, tools=TOOLS)
    assert "<by number> & returns it: 'é'" in tok.render_chat(chat, tools=TOOLS)


def test_a_message_of_parts_reads_as_vllm_joins_them(tmp_path: Path) -> None:
    # vLLM gives a template that takes text a message's parts joined by newlines, an
    # empty or null text left out; they were joined with nothing between them
    parts = [{"type": "text", "text": "Clause 4:"}, {"type": "text", "text": None},
             "It sets the term.", {"type": "text", "text": ""},
             {"type": "text", "text": "What does it mean?"}]
    joined = "Clause 4:\nIt sets the term.\nWhat does it mean?"
    for tok in (load_tokenizer(), _templated(tmp_path, TEMPLATE)):
        assert tok.render_chat([{"role": "user", "content": parts}]) \
            == tok.render_chat([{"role": "user", "content": joined}])
    assert _templated(tmp_path, TEMPLATE).render_chat([{"role": "user", "content": parts}]) \
        == _transformers(TEMPLATE, [{"role": "user", "content": joined}], None)


def test_a_historys_tool_calls_and_names_reach_the_template_as_vllm_gives_them(
        tmp_path: Path) -> None:
    # a call's arguments as the object its JSON text writes (Qwen's and Hermes' templates
    # write ``arguments | tojson``: it was a string of a string), a message's name kept
    template = ("{%- for m in messages %}[{{ m.role }}{% if m.name %} {{ m.name }}{% endif %}]"
                " {{ m.content }}{%- for c in m.tool_calls or [] %}\n<tool_call>"
                "{\"name\": \"{{ c.function.name }}\", \"arguments\": "
                "{{ c.function.arguments | tojson }}}</tool_call>{%- endfor %}\n{%- endfor %}")
    tok = _templated(tmp_path, template)
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris", "n": 2}'}}
    chat = [{"role": "user", "name": "ada", "content": "weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                call, {**call, "function": {"name": "now", "arguments": ""}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18C"}]
    given = [{"role": "user", "name": "ada", "content": "weather in Paris?"},
             {"role": "assistant", "content": "", "tool_calls": [
                 {**call, "function": {"name": "get_weather",
                                       "arguments": {"city": "Paris", "n": 2}}},
                 {**call, "function": {"name": "now", "arguments": {}}}]},
             {"role": "tool", "tool_call_id": "call_1", "content": "18C"}]
    ours = tok.render_chat(chat, add_generation_prompt=False)
    assert ours == _transformers(template, given, None)
    assert '"arguments": {"city": "Paris", "n": 2}' in ours and "[user ada]" in ours
    bad = [chat[0], {"role": "assistant", "content": None, "tool_calls": [
        {**call, "function": {"name": "f", "arguments": "{city: Paris"}}]}]
    with pytest.raises(ChatFormatError) as refused:
        tok.render_chat(bad)
    assert refused.value.param == "messages[1].tool_calls[0].function.arguments"
    assert "{city: Paris" in str(refused.value)
    with pytest.raises(ChatFormatError, match=r"messages\[0\]\.name must be a string, got 7"):
        tok.render_chat([{"role": "user", "name": 7, "content": "x"}])


# Gemma 3's way with content: a text as it is, parts each trimmed (an image its own token)
PARTS_TEMPLATE = (
    "{{ bos_token }}{%- set loop_messages = messages %}"
    "{%- for message in loop_messages %}<start_of_turn>{{ message['role'] }}\n"
    "{%- if message['content'] is string %}{{ message['content'] | trim }}"
    "{%- else %}{%- for item in message['content'] %}{%- if item['type'] == 'image' %}"
    "<start_of_image>{%- elif item['type'] == 'text' %}{{ item['text'] | trim }}{%- endif %}"
    "{%- endfor %}{%- endif %}<end_of_turn>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<start_of_turn>model\n{%- endif %}")


def test_a_template_that_loops_over_content_gets_parts_as_vllm_gives_them(
        tmp_path: Path) -> None:
    # vLLM gives such a template (its "openai" content format) each message's content as
    # a list of text parts, a text as one part; it got the parts joined into one text
    tok = _templated(tmp_path, PARTS_TEMPLATE)
    chat = [{"role": "user", "content": [{"type": "text", "text": " Clause 4: "},
                                         {"type": "text", "text": "what does it mean? "}]},
            {"role": "assistant", "content": " It sets the term. "},
            {"role": "user", "content": "And clause 5?"}]
    given = [{"role": "user", "content": [{"type": "text", "text": " Clause 4: "},
                                          {"type": "text", "text": "what does it mean? "}]},
             {"role": "assistant", "content": [{"type": "text", "text": " It sets the term. "}]},
             {"role": "user", "content": [{"type": "text", "text": "And clause 5?"}]}]
    ours = tok.render_chat(chat)
    assert ours == _transformers(PARTS_TEMPLATE, given, None)
    assert "Clause 4:what does it mean?<end_of_turn>" in ours
    # rendered again from its normalized messages (the gateway renders what it read)
    from kvwire.chat_messages import normalize_messages

    assert tok.render_chat(normalize_messages(chat)) == ours
    # the final message left open: cut after its last part
    open_turn = [*chat[:1], {"role": "assistant", "content": [
        {"type": "text", "text": "It sets"}, {"type": "text", "text": "the term"}]}]
    assert tok.render_chat(open_turn, add_generation_prompt=False,
                           continue_final_message=True).endswith(
        "<start_of_turn>assistantIt setsthe term")
    # a template that reads content as text is given text, as before
    assert _templated(tmp_path, TEMPLATE).render_chat(chat) == _transformers(
        TEMPLATE, [{**m, "content": "\n".join(p["text"] for p in m["content"])}
                   for m in given], None)


@pytest.mark.parametrize(("source", "parts"), [
    ("{% for m in messages %}{% for c in m.content %}{{ c.text }}{% endfor %}{% endfor %}",
     True),
    ("{% set rest = messages[1:] %}{% for m in rest %}"
     "{% for c in m['content'] | list %}{{ c['text'] }}{% endfor %}{% endfor %}", True),
    ("{% for m in messages %}{{ m['content'] }}{% endfor %}", False),
    ("{% for m in messages %}{% for c in m.tool_calls or [] %}{% endfor %}{% endfor %}",
     False),
    ("{% for t in tools %}{% for c in t.content %}{% endfor %}{% endfor %}", False),
])
def test_a_template_reads_parts_where_vllm_finds_a_loop_over_content(
        source: str, parts: bool) -> None:
    from kvwire.chat_template import compile_template

    assert compile_template(source).content_parts is parts


def test_a_value_nested_past_what_json_dumps_writes_is_refused_as_a_chat_format_error(
        tmp_path: Path) -> None:
    # a tool schema or call arguments nested 1,000 levels deep (JSON allows 1,024) raised
    # RecursionError as tojson or the built-in layout wrote it: a 500 (vLLM answers 400)
    from kvwire.openai_schema import decode_json

    deep = b"[" * 1010 + b"]" * 1010
    tools = decode_json(b'[{"type": "function", "function": {"name": "f", '
                        b'"parameters": {"x": ' + deep + b"}}}]")
    call = {"id": "c", "type": "function",
            "function": {"name": "f", "arguments": (b"[" * 1015 + b"]" * 1015).decode()}}
    chat = [{"role": "user", "content": "x"},
            {"role": "assistant", "content": None, "tool_calls": [call]}]
    template = ("{% for t in tools or [] %}{{ t | tojson }}{% endfor %}{% for m in messages %}"
                "{% for c in m.tool_calls or [] %}{{ c.function.arguments | tojson }}"
                "{% endfor %}{% endfor %}")
    for tok in (load_tokenizer(), _templated(tmp_path, template)):
        with pytest.raises(ChatFormatError):
            tok.render_chat(chat[:1], tools=tools)
    with pytest.raises(ChatFormatError):
        _templated(tmp_path, template).render_chat(chat)
