"""The engine's ``POST /invocations`` (SageMaker's, as vLLM serves it): a chat, a completion
or, on an engine that embeds, an embedding, by the body's keys; the keys agree with the
gateway's own reading of an ``/invocations`` body."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import Response

from engine.invocations_route import InvocationsRoute
from engine.sim_embedding import SimEmbedder, seed_of
from gateway.request_parse import generates
from kvwire.openai_schema import BadRequest
from tests.support.engine_servers import LiveEngine, serve_engine

MODEL = "tiny-sim"


@pytest.fixture(scope="module")
def live() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, MODEL, {"embedder": SimEmbedder(16, seed_of("t"))},
                            max_model_len=128)


@pytest.fixture(scope="module")
def plain() -> Iterator[LiveEngine]:  # an executor without an embedder
    yield from serve_engine(LiveEngine, MODEL, max_model_len=128)


def _post(engine: LiveEngine, body: Any) -> Any:
    return engine.http.post("/invocations", json=body)


def test_each_shape_gets_its_routes_answer(live: LiveEngine) -> None:
    chat = _post(live, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 3})
    assert chat.status_code == 200 and chat.json()["object"] == "chat.completion", chat.text
    completion = _post(live, {"model": MODEL, "prompt": "hello", "max_tokens": 3})
    assert completion.status_code == 200, completion.text
    assert completion.json()["object"] == "text_completion"
    assert completion.json()["usage"]["completion_tokens"] == 3
    embedded = _post(live, {"model": MODEL, "input": ["a", "b"]})
    assert embedded.status_code == 200, embedded.text
    assert [len(d["embedding"]) for d in embedded.json()["data"]] == [16, 16]
    chunks = live.stream("/invocations", {"model": MODEL, "prompt": "hello", "max_tokens": 2})
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    # a malformed chat gets the chat route's own error
    bad = _post(live, {"model": MODEL, "messages": "hi"})
    assert bad.status_code == 400 and "messages" in bad.text, bad.text


def test_a_body_of_no_shape_is_refused_naming_its_keys(live: LiveEngine,
                                                       plain: LiveEngine) -> None:
    none = _post(live, {"model": MODEL, "query": "q", "documents": ["d"]})
    assert none.status_code == 400, none.text
    message = none.json()["error"]["message"]
    assert "`messages`" in message and "`prompt`" in message and "`input`" in message
    assert "'documents', 'model', 'query'" in message, message
    listed = _post(live, [1, 2])
    assert listed.status_code == 400 and "JSON list, not an object" in listed.text
    # no embedder: an embedding body is none of this engine's shapes
    unembedded = _post(plain, {"model": MODEL, "input": "a"})
    assert unembedded.status_code == 400, unembedded.text
    assert "serves no embeddings" in unembedded.json()["error"]["message"]


@pytest.mark.parametrize("body", [
    {"messages": []}, {"prompt": "x"}, {"prompt_embeds": "e"}, {"messages": [], "prompt": "x"},
    {"input": "x"}, {"text": "x"}, {"query": "q", "documents": []}, {}])
def test_the_engine_generates_what_the_gateway_routes_as_generating(
        live: LiveEngine, body: dict[str, Any]) -> None:
    async def embed(request: Request) -> Response:
        return Response()

    try:
        handler: Any = InvocationsRoute(live.server, embed).route_for(body)
    except BadRequest:
        handler = None
    generating = handler in (live.server.chat_completions, live.server.completions)
    assert generating == generates(body), body
