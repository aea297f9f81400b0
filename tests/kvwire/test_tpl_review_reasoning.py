"""An assistant turn's ``reasoning`` (the thinking a client gives back to a model of
interleaved thinking) reaches the chat template as vLLM and transformers give it: as
``reasoning``, ``reasoning_content`` (Qwen3's templates) and ``thinking`` (gpt-oss')."""

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

# Qwen3's way with an assistant turn's reasoning, and gpt-oss'
TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{%- if m.reasoning_content is string %}<think>\n{{ m.reasoning_content }}\n</think>\n"
    "{%- endif %}{%- if m.thinking is defined %}[{{ m.thinking }}]{%- endif %}"
    "{{ m['content'] }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
CHAT = [{"role": "user", "content": "Find clause 4."},
        {"role": "assistant", "content": "", "reasoning": "The index lists it.",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "find_clause", "arguments": "{\"n\": 4}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Clause 4: the term."},
        {"role": "user", "content": "And clause 5?", "reasoning": "not an assistant's"}]


def _templated(tmp_path: Path) -> PromptTokenizer:
    shutil.copy(ASSET_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    return load_tokenizer(tmp_path)


def _vllm(chat: list[dict[str, Any]]) -> str:
    # vLLM's parse_chat_messages: an assistant turn's reasoning under both names, tool
    # calls' arguments read from JSON; another role's reasoning left out
    given = []
    for m in chat:
        message = {k: v for k, v in m.items() if k != "reasoning"}
        if m["role"] == "assistant" and m.get("reasoning") is not None:
            message.update(reasoning=m["reasoning"], reasoning_content=m["reasoning"])
        if "tool_calls" in m:
            message["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.loads(
                c["function"]["arguments"])}} for c in m["tool_calls"]]
        given.append(message)
    rendered, _ = render_jinja_template(conversations=[given], chat_template=TEMPLATE,
                                        add_generation_prompt=True)
    return str(rendered[0])


def test_an_assistant_turns_reasoning_is_rendered_as_the_replica_renders_it(
        tmp_path: Path) -> None:
    ours = _templated(tmp_path).render_chat(CHAT)
    assert ours == _vllm(CHAT)
    assert "<think>\nThe index lists it.\n</think>[The index lists it.]" in ours
    assert "not an assistant's" not in ours


def test_a_reasoning_that_is_no_string_is_named(tmp_path: Path) -> None:
    chat = [CHAT[0], {"role": "assistant", "content": "x", "reasoning": ["a"]}]
    with pytest.raises(ChatFormatError, match=r"messages\[1\]\.reasoning must be a string"):
        _templated(tmp_path).render_chat(chat)
