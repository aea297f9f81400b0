"""A chat that renders to far more text than it was sent (a tool schema nested deep,
written by a template with ``tojson(indent=4)`` as Llama 3.1's writes each tool: every
level indents every line below it, so a schema of 700 levels in ~1.5 KB renders to
~2 MB) is refused with a ChatFormatError naming the field, once the text passes
``MAX_RENDERED_CHARS``: not held in memory in whole (gigabytes from one 16 MiB body)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from kvwire.chat_messages import ChatFormatError
from kvwire.chat_template import MAX_RENDERED_CHARS
from kvwire.tokenizer import PromptTokenizer, load_tokenizer
from kvwire.tokenizer_build import ASSET_DIR
from tests.support.nesting import nested

# Llama 3.1's way with tools: each one written with tojson(indent=4)
TEMPLATE = (
    "{%- for t in tools or [] %}{{ t | tojson(indent=4) }}\n\n{%- endfor %}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{%- endfor %}")
CHAT = [{"role": "user", "content": "Find clause 4."}]
DEPTH = 700


def _tool(parameters: Any) -> dict[str, Any]:  # as vLLM's request model writes one
    return {"type": "function",
            "function": {"name": "f", "description": None, "parameters": parameters}}


@pytest.fixture
def tok(tmp_path: Path) -> PromptTokenizer:
    shutil.copy(ASSET_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    return load_tokenizer(tmp_path)


def test_a_deep_tool_renders_indented_as_transformers_writes_it(
        tok: PromptTokenizer) -> None:
    tool = _tool({"type": "object", "x": nested(5), "é": "<&>"})
    text = tok.render_chat(CHAT, tools=[tool])
    assert text == json.dumps(tool, indent=4, ensure_ascii=False) + \
        "<|im_start|>user\nFind clause 4.<|im_end|>"


@pytest.mark.parametrize("tools", [
    [_tool({"x": nested(DEPTH)})] * 20,  # many tools, each of a few megabytes
    [_tool({"x": [nested(DEPTH)] * 20})],  # one tool, one tojson call of 40 MB
], ids=["many-tools", "one-wide-tool"])
def test_a_chat_rendering_past_the_bound_is_refused_naming_tools(
        tok: PromptTokenizer, tools: list[Any]) -> None:
    sent = len(json.dumps(tools))
    assert sent * 500 < MAX_RENDERED_CHARS  # what was sent is small
    with pytest.raises(ChatFormatError, match=r"more than [0-9,]+ characters") as err:
        tok.render_chat(CHAT, tools=tools)
    assert err.value.param == "tools"
