"""A chat request's top-level ``documents`` reach the chat template as vLLM gives them
(RAG templates such as Command-R's render them), in the engine and in the prompt the
gateway routes on; a bad value is a 400 naming it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gateway.request_parse import ParsedRequest
from gateway.routing import _template_kwargs
from kvwire.openai_schema import BadRequest, parse_fields
from kvwire.tokenizer import load_tokenizer
from kvwire.tokenizer_build import ASSET_DIR

TEMPLATE = (
    "{%- if documents %}<docs>{%- for d in documents %}[{{ d['title'] }}] {{ d['text'] }}"
    "{%- endfor %}</docs>{%- endif %}"
    "{%- for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{%- endfor %}")
CHAT = [{"role": "user", "content": "What does clause 4 say?"}]
DOCS = [{"title": "Lease", "text": "Clause 4: rent is due on the first."}]


def test_the_requests_documents_are_rendered_by_the_engine_and_the_gateway(
        tmp_path: Path) -> None:
    shutil.copy(ASSET_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    tokenizer = load_tokenizer(tmp_path)
    body = {"model": "m", "messages": CHAT, "documents": DOCS}
    fields = parse_fields(body, chat=True)  # the engine's reading
    assert fields.chat_template_kwargs == {"documents": DOCS}
    text = tokenizer.render_chat(CHAT, template_kwargs=fields.chat_template_kwargs)
    assert text.startswith("<docs>[Lease] Clause 4: rent is due on the first.</docs>")
    parsed = ParsedRequest("chat", body, "m", False, None, None, CHAT, None, None)
    assert _template_kwargs(parsed) == {"documents": DOCS}  # the gateway's
    # chat_template_kwargs' own documents win, as in vLLM
    other = [{"title": "Deed", "text": "x"}]
    assert parse_fields({**body, "chat_template_kwargs": {"documents": other}},
                        chat=True).chat_template_kwargs == {"documents": other}
    assert parse_fields({**body, "documents": None}, chat=True).chat_template_kwargs is None


@pytest.mark.parametrize("documents, param", [
    ("Lease", "documents"), ([["Lease"]], "documents[0]"), ([{"title": 4}], "documents[0]")])
def test_documents_of_another_shape_are_a_400_naming_them(documents: object,
                                                           param: str) -> None:
    with pytest.raises(BadRequest) as err:
        parse_fields({"model": "m", "messages": CHAT, "documents": documents}, chat=True)
    assert err.value.param == param
