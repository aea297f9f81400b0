"""The Responses API on the engine: the store's bound counts every string a stored
conversation holds, errors name the Responses request's own fields, and what asks for
constrained output is refused rather than ignored."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from engine.responses_route import ResponseStore
from kvwire.responses_input import responses_chat
from tests.support.engine_servers import LiveEngine, serve_engine

MODEL = "tiny-sim"


@pytest.fixture(scope="module")
def live() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, MODEL)


def test_call_ids_count_in_the_stores_characters() -> None:
    big = 1 << 16
    store = ResponseStore(limit=64, max_chars=4 * big)
    for i in range(8):
        chat = responses_chat({"input": [
            {"type": "function_call", "call_id": f"{i}" + "a" * big, "name": "f",
             "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"{i}" + "b" * big, "output": "ok"}]})
        store.put(f"resp_{i}", chat.turns, salt=None)
        store.check_integrity()
    # the call ids alone held are within the store's characters
    held = [store.get(f"resp_{i}", salt=None) for i in range(8)]
    ids = sum(len(m.get("tool_call_id", "")) + sum(len(c["id"]) for c in m.get("tool_calls", ()))
              for turns in held if turns is not None for m in turns)
    assert 0 < ids <= store.chars <= 4 * big
    assert held[-1] is not None and held[0] is None  # the latest kept, the oldest gone


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "max_output_tokens": "many"}, "max_output_tokens"),
    ({"input": "word " * 600, "max_output_tokens": 2}, "input"),
    ({"input": "x", "max_output_tokens": 600}, "max_output_tokens"),
])
def test_errors_name_the_responses_fields(live: LiveEngine, body: dict[str, Any],
                                          param: str) -> None:
    r = live.http.post("/v1/responses", json={"model": MODEL, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert "max_tokens" not in err["message"] and "messages" not in err["message"], err


TOOLS = [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}]


@pytest.mark.parametrize(("extra", "param"), [
    ({"text": {"format": {"type": "json_schema", "name": "a",
                          "schema": {"type": "object"}}}}, "text.format"),
    ({"text": {"format": {"type": "json_object"}}}, "text.format"),
    ({"text": {"format": "json"}}, "text.format"),
    ({"text": "plain"}, "text"),
    ({"tools": TOOLS, "tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "f"}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "g"}}, "tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    # what it cannot do besides: never answered as if done
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"truncation": "auto"}, "truncation"),
    ({"background": True}, "background"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
])
def test_constrained_output_is_refused_naming_the_field(
        live: LiveEngine, extra: dict[str, Any], param: str) -> None:
    r = live.http.post("/v1/responses", json={"model": MODEL, "input": "x",
                                              "max_output_tokens": 2, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_plain_text_and_free_tool_choice_pass(live: LiveEngine) -> None:
    done = live.client.responses.create(model=MODEL, input="x", max_output_tokens=2,
                                        text={"format": {"type": "text"}}, tools=TOOLS,
                                        tool_choice="auto")
    assert done.status == "incomplete" and done.text.format.type == "text"
    assert done.tool_choice == "auto"
    none = live.client.responses.create(model=MODEL, input="x", max_output_tokens=2,
                                        tool_choice="none", top_logprobs=0,
                                        truncation="disabled", background=False,
                                        reasoning={"effort": None}, include=[])
    assert none.tool_choice == "none"
