"""A request's tools reach a model's chat template as vLLM gives them: its request model
written back (``[tool.model_dump() for tool in request.tools]``), then transformers'
``apply_chat_template``; an empty list is a list, not none."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from transformers.utils.chat_template_utils import render_jinja_template

from kvwire.tokenizer import PromptTokenizer, load_tokenizer
from kvwire.tokenizer_build import ASSET_DIR

# Qwen2.5's tool listing (each tool ``tojson``) and Llama 3.1's test for tools given
TEMPLATE = (
    "{%- if tools is not none %}Environment: ipython\n{%- endif %}"
    "{%- if tools %}<tools>{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}"
    "\n</tools>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
CHAT = [{"role": "user", "content": "Find clause 4."}]


class _Base(BaseModel):  # vLLM's OpenAIBaseModel: extra fields kept
    model_config = ConfigDict(extra="allow")


class _FunctionDefinition(_Base):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class _ToolParam(_Base):  # vLLM's ChatCompletionToolsParam
    type: Literal["function"] = "function"
    function: _FunctionDefinition


def _templated(tmp_path: Path) -> PromptTokenizer:
    shutil.copy(ASSET_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    return load_tokenizer(tmp_path)


def _vllm(tools: list[Any] | None) -> str:
    dumped = None if tools is None else [_ToolParam(**t).model_dump() for t in tools]
    rendered, _ = render_jinja_template(conversations=[CHAT], tools=dumped,
                                        chat_template=TEMPLATE, add_generation_prompt=True)
    return str(rendered[0])


def test_tools_reach_the_template_as_vllms_request_model_writes_them(
        tmp_path: Path) -> None:
    tok = _templated(tmp_path)
    params = {"type": "object", "properties": {"n": {"type": "integer"}}}
    for tools in (
        [{"type": "function", "function": {"name": "find", "parameters": params}}],
        [{"function": {"parameters": params, "name": "find", "strict": True}}],
        [{"function": {"description": "Finds.", "name": "find"}, "type": "function",
          "x-owner": "legal"}],
    ):
        assert tok.render_chat(CHAT, tools=tools) == _vllm(tools)
    assert '"description": null' in tok.render_chat(CHAT, tools=[
        {"type": "function", "function": {"name": "find", "parameters": params}}])


def test_an_empty_tool_list_reaches_the_template_as_a_list(tmp_path: Path) -> None:
    tok = _templated(tmp_path)
    assert tok.render_chat(CHAT, tools=[]) == _vllm([])
    assert tok.render_chat(CHAT, tools=[]).startswith("Environment: ipython")
    assert tok.render_chat(CHAT, tools=None) == _vllm(None)
