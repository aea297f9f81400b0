"""A chat's ``chat_template_kwargs`` reach the model's chat template as vLLM passes them to
transformers' ``apply_chat_template``: the variables the template reads, over the special
tokens, never the request's own turn fields; the keys vLLM refuses are refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from kvwire.chat_messages import ChatFormatError
from kvwire.openai_schema import BadRequest, parse_fields
from kvwire.tokenizer import PromptTokenizer, load_tokenizer
from kvwire.tokenizer_build import ASSET_DIR

# Qwen3's switch (enable_thinking), a note a deployment puts in the system turn, documents
# as transformers passes them, and the special tokens
TEMPLATE = (
    "{{- bos_token }}"
    "{%- if house_rules %}<|im_start|>system\n{{ house_rules }}<|im_end|>\n{%- endif %}"
    "{%- if documents %}<|im_start|>system\n{{ documents | tojson }}<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "<think>\n\n</think>\n\n{%- endif %}{%- endif %}{{- eos_token if max_length }}")

CHAT = [{"role": "user", "content": "What does clause 4 say?"}]


def _templated(tmp_path: Path) -> PromptTokenizer:
    shutil.copy(ASSET_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": TEMPLATE, "bos_token": "<s>", "eos_token": "</s>"}))
    return load_tokenizer(tmp_path)


def _transformers(variables: dict[str, Any], add_generation_prompt: bool = True) -> str:
    """transformers' rendering of CHAT with what vLLM passes it of ``variables``."""
    documents = variables.pop("documents", None)
    rendered, _ = render_jinja_template(
        conversations=[CHAT], chat_template=TEMPLATE, documents=documents,
        add_generation_prompt=add_generation_prompt,
        **{"bos_token": "<s>", "eos_token": "</s>", **variables})
    return rendered[0]


def test_the_variables_the_template_reads_render_as_transformers_renders_them(
        tmp_path: Path) -> None:
    tok = _templated(tmp_path)
    plain = tok.render_chat(CHAT)
    assert plain == _transformers({})
    cases: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({"enable_thinking": False}, {"enable_thinking": False}),
        ({"enable_thinking": True}, {"enable_thinking": True}),
        ({"house_rules": "Answer in French."}, {"house_rules": "Answer in French."}),
        ({"bos_token": "<|begin|>"}, {"bos_token": "<|begin|>"}),
        ({"documents": [{"title": "MSA", "text": "4. Term"}]},
         {"documents": [{"title": "MSA", "text": "4. Term"}]}),
        # what the template does not read is dropped, and transformers consumes its own
        # arguments (max_length, which the template names too); the request's
        # add_generation_prompt wins over one given here
        ({"unread": 1, "max_length": 9, "add_generation_prompt": False}, {}),
    ]
    for given, passed in cases:
        ours = tok.render_chat(CHAT, template_kwargs=given)
        assert ours == _transformers(dict(passed)), given
    assert tok.render_chat(CHAT, template_kwargs={"enable_thinking": False}) \
        == plain + "<think>\n\n</think>"
    assert tok.render_chat(CHAT, template_kwargs={"house_rules": "Answer in French."}) \
        .startswith("<s><|im_start|>system\nAnswer in French.")
    # the built-in layout reads none
    assert load_tokenizer().render_chat(CHAT, template_kwargs={"enable_thinking": False}) \
        == load_tokenizer().render_chat(CHAT)


def test_a_variable_nested_too_deeply_to_render_is_named(tmp_path: Path) -> None:
    tok = _templated(tmp_path)
    deep: Any = "x"
    for _ in range(1010):
        deep = [deep]
    with pytest.raises(ChatFormatError) as raised:
        tok.render_chat(CHAT, template_kwargs={"documents": deep})
    assert raised.value.param == "chat_template_kwargs"


@pytest.mark.parametrize(("value", "param", "words"), [
    ("enable_thinking=false", "chat_template_kwargs", "must be an object"),
    ([{"enable_thinking": False}], "chat_template_kwargs", "must be an object"),
    ({"tokenize": True}, "chat_template_kwargs.tokenize", "must not set 'tokenize'"),
    ({"chat_template": "{{ 1 }}"}, "chat_template_kwargs.chat_template", "chat_template"),
    ({"messages": []}, "chat_template_kwargs.messages", "'messages'"),
    ({"tools": []}, "chat_template_kwargs.tools", "'tools'"),
    ({"conversation": []}, "chat_template_kwargs.conversation", "'conversation'"),
    ({f"k{i}": i for i in range(300)}, "chat_template_kwargs", "300 keys"),
    ({"k" * 300: 1}, "chat_template_kwargs", "300 characters"),
])
def test_what_vllm_refuses_is_a_bad_request_naming_the_field(value: Any, param: str,
                                                             words: str) -> None:
    body = {"messages": CHAT, "chat_template_kwargs": value}
    with pytest.raises(BadRequest) as raised:
        parse_fields(body, chat=True)
    assert raised.value.param == param
    assert words in raised.value.message


def test_null_and_an_object_are_taken() -> None:
    assert parse_fields({"messages": CHAT, "chat_template_kwargs": None},
                        chat=True).chat_template_kwargs is None
    fields = parse_fields({"messages": CHAT, "chat_template_kwargs": {"enable_thinking": False,
                                                                     "documents": []}},
                          chat=True)
    assert fields.chat_template_kwargs == {"enable_thinking": False, "documents": []}
