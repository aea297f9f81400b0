"""A Responses input's function calls join the assistant turn before them, as vLLM joins
them, in order and however many: each call is appended where it is (a list rebuilt for
every call made an input of 40,000 calls cost 5 s of CPU on the event loop's thread)."""

from __future__ import annotations

import json

from gateway.request_parse import parse_body


def _call(i: int) -> dict[str, str]:
    return {"type": "function_call", "call_id": f"c{i}", "name": f"f{i}", "arguments": "{}"}


def test_many_calls_join_one_turn_in_order_and_a_user_turn_starts_another() -> None:
    items = [{"role": "user", "content": "go"}, *map(_call, range(5000)),
             {"role": "user", "content": "again"}, *map(_call, range(5000, 5003))]
    parsed = parse_body(json.dumps({"model": "m", "input": items}).encode(), "responses")
    assert parsed.messages is not None
    turns = [(m["role"], [c["id"] for c in m.get("tool_calls", ())])
             for m in parsed.messages]
    assert turns == [("user", []), ("assistant", [f"c{i}" for i in range(5000)]),
                     ("user", []), ("assistant", ["c5000", "c5001", "c5002"])]
