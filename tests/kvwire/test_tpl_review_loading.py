"""A tokenizer directory's chat template and special tokens are read as transformers
reads them (``PreTrainedTokenizerFast.from_pretrained``, which vLLM loads a model's
tokenizer with), so a chat renders to the replica's text."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from transformers import PreTrainedTokenizerFast

from kvwire.chat_messages import ChatFormatError
from kvwire.tokenizer import load_tokenizer
from kvwire.tokenizer_build import ASSET_DIR

TEMPLATE = (
    "{{ bos_token }}{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "<|im_end|>\n{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- endif %}")
CHAT = [{"role": "system", "content": "You read contracts."},
        {"role": "user", "content": "What does clause 4 say?"}]


def _directory(tmp_path: Path, config: dict[str, Any], files: dict[str, str]) -> Path:
    shutil.copy(ASSET_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    return tmp_path


def _transformers(directory: Path, chat: list[Any], tools: list[Any] | None = None) -> str:
    tok = PreTrainedTokenizerFast.from_pretrained(str(directory))
    return str(tok.apply_chat_template(chat, tools=tools, tokenize=False,
                                       add_generation_prompt=True))


def test_a_template_saved_beside_the_tokenizer_is_the_models(tmp_path: Path) -> None:
    # transformers saves a template as chat_template.jinja, not in tokenizer_config.json:
    # read from there, not the built-in layout; it wins over the config's own
    directory = _directory(tmp_path, {"bos_token": "<|endoftext|>",
                                      "chat_template": "{{ 'the config\\'s' }}"},
                           {"chat_template.jinja": "é " + TEMPLATE})
    ours = load_tokenizer(directory).render_chat(CHAT)
    assert ours == _transformers(directory, CHAT)
    assert ours.startswith("é <|endoftext|><|im_start|>system\n")


def test_a_config_that_is_no_json_is_named(tmp_path: Path) -> None:
    directory = _directory(tmp_path, {}, {})
    (directory / "tokenizer_config.json").write_text("{'chat_template': ")
    with pytest.raises(ValueError, match=r"tokenizer_config\.json cannot be read as JSON"):
        load_tokenizer(directory)


TOOLS = [{"type": "function", "function": {"name": "find_clause", "description": "Finds one.",
                                           "parameters": {"type": "object"}}}]
TOOL_TEMPLATE = "{%- for t in tools %}{{ t | tojson }}\n{%- endfor %}" + TEMPLATE


@pytest.mark.parametrize("saved", ["config", "files"])
def test_a_chat_with_tools_is_rendered_with_the_models_tool_use_template(
        tmp_path: Path, saved: str) -> None:
    # a model with named templates (Hermes 2 Pro's, Command-R's): transformers renders a
    # chat with tools (an empty list too) with its tool_use template, any other with its
    # default; the gateway rendered all with the default
    if saved == "config":
        directory = _directory(tmp_path, {"chat_template": [
            {"name": "default", "template": TEMPLATE},
            {"name": "tool_use", "template": TOOL_TEMPLATE}]}, {})
    else:
        directory = _directory(tmp_path, {}, {
            "chat_template.jinja": TEMPLATE,
            "additional_chat_templates/tool_use.jinja": TOOL_TEMPLATE})
    tok = load_tokenizer(directory)
    for tools in (TOOLS, [], None):
        assert tok.render_chat(CHAT, tools=tools) == _transformers(directory, CHAT, tools)
    assert tok.render_chat(CHAT, tools=TOOLS).startswith('{"type": "function"')


def test_named_templates_without_a_default_refuse_a_chat_without_tools(
        tmp_path: Path) -> None:
    directory = _directory(tmp_path, {"chat_template": [
        {"name": "tool_use", "template": TOOL_TEMPLATE}]}, {})
    tok = load_tokenizer(directory)
    assert tok.render_chat(CHAT, tools=TOOLS) == _transformers(directory, CHAT, TOOLS)
    with pytest.raises(ChatFormatError, match=r"named \['tool_use'\], and none 'default'"):
        tok.render_chat(CHAT)


# a template that writes the special tokens past bos and eos, tells a token the config
# lacks from an empty one, and tells documents given as null from none
SPECIAL_TEMPLATE = (
    "{{ bos_token }}|{{ unk_token }}|{{ pad_token }}|{{ image_token }}|{{ boi_token }}|"
    "{{ eos_token is defined }}|{{ documents is none }}|" + TEMPLATE)


def test_the_template_gets_the_special_tokens_transformers_gives_it(tmp_path: Path) -> None:
    directory = _directory(tmp_path, {
        "chat_template": SPECIAL_TEMPLATE, "bos_token": "<|im_start|>",
        "unk_token": {"__type": "AddedToken", "content": "<|im_end|>", "special": True},
        "pad_token": "<|endoftext|>", "image_token": "<|im_start|>",
        "extra_special_tokens": {"boi_token": "<|im_end|>"}, "add_bos_token": False}, {})
    ours = load_tokenizer(directory).render_chat(CHAT)
    assert ours == _transformers(directory, CHAT)
    assert ours.startswith("<|im_start|>|<|im_end|>|<|endoftext|>|<|im_start|>|<|im_end|>|"
                           "False|True|")
