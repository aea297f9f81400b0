"""Chat rendering that leaves the final message open (``continue_final_message``), in the
built-in layout and through a model's chat template."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvwire.chat_messages import ChatFormatError
from kvwire.tokenizer import PromptTokenizer, load_tokenizer
from kvwire.tokenizer_build import ASSET_DIR

# a final message whose text also occurs in the end of its turn ("m" in "<|im_end|>")
CHAT = [{"role": "user", "content": "start a word"}, {"role": "assistant", "content": "m"}]


def _templated(tmp_path: Path, template: str) -> PromptTokenizer:
    shutil.copy(ASSET_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return load_tokenizer(tmp_path)


def test_the_built_in_layout_ends_right_after_the_final_content() -> None:
    tok = load_tokenizer()
    assert tok.render_chat(CHAT, add_generation_prompt=False, continue_final_message=True) \
        == "<|im_start|>user\nstart a word<|im_end|>\n<|im_start|>assistant\nm"
    assert tok.render_chat(CHAT, add_generation_prompt=False).endswith("\nm<|im_end|>\n")
    with pytest.raises(ChatFormatError, match="cannot both be true"):
        tok.render_chat(CHAT, continue_final_message=True)


def test_a_template_is_cut_after_the_final_content(tmp_path: Path) -> None:
    tok = _templated(tmp_path, "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                               "{{ m['content'] }}<|im_end|>\n{% endfor %}"
                               "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    assert tok.render_chat(CHAT, add_generation_prompt=False, continue_final_message=True) \
        == "<|im_start|>user\nstart a word<|im_end|>\n<|im_start|>assistant\nm"


def test_a_trimming_template_loses_the_trailing_spacing(tmp_path: Path) -> None:
    tok = _templated(tmp_path, "{% for m in messages %}[{{ m['role'] }}] "
                               "{{ m['content'] | trim }}<eot>{% endfor %}")
    chat = [CHAT[0], {"role": "assistant", "content": "Once upon a "}]
    assert tok.render_chat(chat, add_generation_prompt=False, continue_final_message=True) \
        == "[user] start a word<eot>[assistant] Once upon a"


def test_a_template_that_drops_the_final_content_is_refused(tmp_path: Path) -> None:
    tok = _templated(tmp_path, "{% for m in messages %}{% if m['role'] == 'user' %}"
                               "{{ m['content'] }}{% endif %}{% endfor %}")
    with pytest.raises(ChatFormatError, match="final message's content"):
        tok.render_chat(CHAT, add_generation_prompt=False, continue_final_message=True)
