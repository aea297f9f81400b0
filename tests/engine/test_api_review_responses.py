"""The Responses API on the engine: the store's bound counts every string a stored
conversation holds."""

from __future__ import annotations

from engine.responses_route import ResponseStore
from kvwire.responses_input import responses_chat


def test_call_ids_count_in_the_stores_characters() -> None:
    big = 1 << 16
    store = ResponseStore(limit=64, max_chars=4 * big)
    for i in range(8):
        chat = responses_chat({"input": [
            {"type": "function_call", "call_id": f"{i}" + "a" * big, "name": "f",
             "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"{i}" + "b" * big, "output": "ok"}]})
        store.put(f"resp_{i}", chat.turns)
        store.check_integrity()
    # the call ids alone held are within the store's characters
    held = [store.get(f"resp_{i}") for i in range(8)]
    ids = sum(len(m.get("tool_call_id", "")) + sum(len(c["id"]) for c in m.get("tool_calls", ()))
              for turns in held if turns is not None for m in turns)
    assert 0 < ids <= store.chars <= 4 * big
    assert held[-1] is not None and held[0] is None  # the latest kept, the oldest gone
