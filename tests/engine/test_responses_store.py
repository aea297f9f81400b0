"""The engine's store of Responses conversations stays bounded, in count and in the
characters of very long conversations."""

from __future__ import annotations

from engine.responses_route import STORE_CHARS, STORE_LIMIT, ResponseStore


def test_long_conversations_stored_stay_within_the_stores_characters() -> None:
    store = ResponseStore()
    text = "x" * (1 << 20)  # one string, held once however many turns name it
    conversation = [{"role": "user", "content": text}]
    for i in range(STORE_LIMIT):
        conversation = [*conversation, {"role": "assistant", "content": text}] if i < 8 \
            else conversation
        store.put(f"resp_{i}", conversation, salt=None)
        store.check_integrity()
    # the oldest forgotten first, the latest kept
    assert len(store) < STORE_LIMIT
    assert store.get(f"resp_{STORE_LIMIT - 1}", salt=None) == conversation
    assert store.get("resp_0", salt=None) is None and store.chars <= STORE_CHARS
    small = ResponseStore(limit=2, max_chars=1000)
    for i in range(3):
        small.put(f"resp_{i}", [{"role": "user", "content": "y" * 300},
                                {"role": "assistant", "content": "", "tool_calls": [
                                    {"id": "c", "type": "function",
                                     "function": {"name": "f", "arguments": "{}"}}]}],
                  salt=None)
        small.check_integrity()
    assert len(small) == 2 and small.get("resp_0", salt=None) is None
    # a conversation longer than all the store holds is not stored; the others stay
    small.put("resp_huge", [{"role": "user", "content": "z" * 1000}], salt=None)
    assert small.get("resp_huge", salt=None) is None and len(small) == 2
