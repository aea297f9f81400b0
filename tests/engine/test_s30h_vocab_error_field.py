"""A text that encodes to an id past the model's vocabulary (a tokenizer with more ids
than the checkpoint's embedding rows) is a 400 naming the field the text came in:
/generate's ``text``, a chat's ``messages``, a completion's ``prompt``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from engine.server import EngineServer, build_app
from tests.support.engine_servers import running_engine
from tests.support.few_rows import ROWS, FewRows

MODEL = "tiny-sim"


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with running_engine(MODEL, executor=FewRows) as srv:
        assert isinstance(srv, EngineServer) and srv.vocab_size == ROWS
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(srv)),
                                     base_url="http://engine") as client:
            yield client


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/generate", {"text": "hello"}, "text"),
    ("/generate", {"text": ["hi", "hello"]}, "text"),
    ("/v1/completions", {"model": MODEL, "prompt": "hello"}, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": ["hi", "hello"]}, "prompt"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [
        {"role": "user", "content": "hello"}]}, "messages"),
])
async def test_an_id_past_the_vocabulary_names_the_field_of_its_text(
        http: httpx.AsyncClient, path: str, body: dict[str, Any], field: str) -> None:
    r = await http.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field, error
    assert error["message"].startswith(f"{field} encodes to token id ")
    assert f"past the model's vocabulary [0, {ROWS})" in error["message"]
