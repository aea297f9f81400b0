"""A request body nested deeper than the engine can write back (orjson writes 254 levels, a
body may nest 1,024) is a 400 naming its field (``nesting_too_deep``) on every route,
before any answer starts: never a 500, never a stream cut after its 200. A body nested
``MAX_NESTING`` levels deep is served, echoes included; brackets inside strings are text."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from kvwire.request_edge import MAX_NESTING, _nesting_past
from tests.support.engine_servers import LiveEngine, serve_engine
from tests.support.nesting import nested

MODEL = "tiny-sim"
DEEP = 256  # levels of a chat body whose tools orjson cannot write (their own: 254)
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def live() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, MODEL)


def _chat_tool(levels: int) -> dict[str, Any]:
    """A chat's function tool that makes its body nest ``levels`` deep: the body, its
    ``tools``, the tool, its ``function``, its ``parameters``, then arrays."""
    return {"type": "function",
            "function": {"name": "f", "parameters": {"x": nested(levels - 5, 1)}}}


def _tool(levels: int) -> dict[str, Any]:
    """A Responses function tool that makes its body nest ``levels`` deep: the body, its
    ``tools``, the tool, its ``parameters``, then arrays."""
    return {"type": "function", "name": "f", "parameters": {"x": nested(levels - 4, 1)}}


def _refused(r: Any) -> dict[str, Any]:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"]) == ("tools", "nesting_too_deep"), error
    assert f"the most accepted is {MAX_NESTING}" in error["message"], error
    return error


def test_tools_nested_too_deep_are_a_400_naming_tools_on_chats_streams_and_tokenize(
        live: LiveEngine) -> None:
    tools = [_chat_tool(DEEP)]
    with pytest.raises(openai.BadRequestError) as caught:
        live.client.chat.completions.create(model=MODEL, messages=HI, tools=tools,
                                            max_tokens=2)
    assert caught.value.param == "tools" and caught.value.code == "nesting_too_deep"
    with pytest.raises(openai.BadRequestError):
        live.client.chat.completions.create(model=MODEL, messages=HI, tools=tools,
                                            max_tokens=2, stream=True)
    error = _refused(live.http.post("/tokenize", json={"model": MODEL, "messages": HI,
                                                       "tools": tools}))
    assert f"{DEEP} levels deep" in error["message"], error


def test_a_streamed_response_with_tools_too_deep_to_echo_is_refused_before_it_starts(
        live: LiveEngine) -> None:
    # its response.created event echoes the tools three levels deeper than the body held
    # them: refused at intake, not cut after the stream's 200
    tool = _tool(254)
    with pytest.raises(openai.BadRequestError) as caught:
        live.client.responses.create(model=MODEL, input="hi", tools=[tool],
                                     max_output_tokens=2, stream=True)
    assert caught.value.param == "tools" and caught.value.code == "nesting_too_deep"
    _refused(live.http.post("/v1/responses", json={"model": MODEL, "input": "hi",
                                                   "tools": [tool], "max_output_tokens": 2}))


def test_a_body_nested_to_the_bound_is_served_and_echoed(live: LiveEngine) -> None:
    tool = _tool(MAX_NESTING)
    events = list(live.client.responses.create(model=MODEL, input="hi", tools=[tool],
                                               max_output_tokens=2, stream=True))
    assert events[0].type == "response.created" and events[-1].type in (
        "response.completed", "response.incomplete"), [e.type for e in events]
    assert events[0].response.tools[0].parameters == tool["parameters"]
    chat = live.client.chat.completions.create(
        model=MODEL, messages=HI, max_tokens=2,
        tools=[_chat_tool(MAX_NESTING)])
    assert chat.choices[0].finish_reason == "length"
    error = _refused(live.http.post("/v1/responses", json={
        "model": MODEL, "input": "hi", "tools": [_tool(MAX_NESTING + 1)],
        "max_output_tokens": 2}))
    assert f"{MAX_NESTING + 1} levels deep" in error["message"], error


def test_brackets_and_escaped_quotes_inside_strings_do_not_nest(live: LiveEngine) -> None:
    text = '[{"\\' * 400 + ']"\\\\' * 300  # brackets, quotes and backslashes as text
    r = live.http.post("/tokenize", json={"model": MODEL,
                                          "messages": [{"role": "user", "content": text}]})
    assert r.status_code == 200, r.text
    assert r.json()["count"] > 0


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _value(rng: random.Random, level: int) -> Any:
    if level > 30 or rng.random() < 0.3:
        return rng.choice([1, None, "".join(rng.choices('[]{}"\\ a\n:,', k=rng.randrange(9)))])
    if rng.random() < 0.5:
        return [_value(rng, level + 1) for _ in range(rng.randrange(4))]
    return {"".join(rng.choices('[]{}"\\a', k=rng.randrange(5))): _value(rng, level + 1)
            for _ in range(rng.randrange(4))}


def test_the_measured_depth_is_the_decoded_values_in_any_pieces() -> None:
    rng = random.Random(36)
    for _ in range(200):
        value = _value(rng, 0)
        raw = json.dumps(value, ensure_ascii=rng.random() < 0.5).encode()
        assert _nesting_past(raw, 0, rng.choice([1, 2, 3, 7, 64, 1 << 20])) == _depth(value), raw
