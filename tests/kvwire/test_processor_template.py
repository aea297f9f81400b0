"""A multimodal model's processor template (``chat_template.json``), which vLLM renders
its chats with before the tokenizer's own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvwire.tokenizer import load_tokenizer
from kvwire.tokenizer_build import ASSET_DIR

CHAT = [{"role": "user", "content": "What does clause 4 say?"}]


def _directory(tmp_path: Path, processor: str) -> Path:
    shutil.copy(ASSET_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{{ 'the tokenizer config' }}"}))
    (tmp_path / "chat_template.json").write_text(processor, encoding="utf-8")
    return tmp_path


def test_a_processors_template_is_the_models(tmp_path: Path) -> None:
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    directory = _directory(tmp_path, json.dumps({"chat_template": template}))
    assert load_tokenizer(directory).render_chat(CHAT) == "[user] What does clause 4 say?\n"


@pytest.mark.parametrize(("text", "named"), [("{'chat_template': ", "cannot be read as JSON"),
                                             ('{"chat_template": 3}', "holds no chat_template")])
def test_a_processor_file_without_a_template_is_named(tmp_path: Path, text: str,
                                                      named: str) -> None:
    with pytest.raises(ValueError, match=rf"chat_template\.json {named}"):
        load_tokenizer(_directory(tmp_path, text))
