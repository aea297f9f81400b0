"""A body small in bytes but of many items (a chat of tens of thousands of empty content
parts) is checked on a thread: each item's check costs microseconds, and a megabyte of
them held the event loop most of a second. An ordinary chat is checked on the loop."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.config import parse_config
from gateway.state import build_state
from kvwire import chat_messages
from kvwire.request_edge import PARSE_ON_THREAD_BYTES
from tests.support.loop_check import taken_in

CHECK = chat_messages._normalize_message.__code__  # one call per message checked


def _checked_on_loop(body: bytes) -> tuple[int, list[Any] | None]:
    """(the messages checked on the event loop's thread, the messages taken in)."""
    state = build_state(parse_config({"replicas": [{"id": "a", "url": "http://127.0.0.1:9"}]}))
    calls, intake = taken_in(state, body, "/v1/chat/completions", "chat", CHECK)
    return calls, intake.parsed.messages


def test_a_small_body_of_many_parts_is_checked_off_the_event_loop() -> None:
    parts = [{}] * 30_000  # parts the gateway leaves its replica to judge
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": parts}]})
    assert len(body) < PARSE_ON_THREAD_BYTES  # small: its bytes alone kept it on the loop
    calls, messages = _checked_on_loop(body)
    assert messages is not None and len(messages[0]["content"]) == 30_000
    assert calls == 0


def test_an_ordinary_chat_is_checked_on_the_event_loop() -> None:
    body = orjson.dumps({"model": "m", "messages": [
        {"role": "system", "content": "You are terse, precise, and kind. " * 50},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}]})
    calls, messages = _checked_on_loop(body)
    assert messages is not None and len(messages) == 2
    assert calls == 2
