"""``carries_media`` reads a chat's messages and parts by C-level passes; it finds what
``media_type`` finds part by part, whatever the shapes of the messages and parts."""

from __future__ import annotations

from typing import Any

import pytest

from kvwire.media_parts import carries_media, media_type

IMAGE = {"type": "image_url", "image_url": {"url": "https://x/a.png"}}
CASES: list[tuple[str, Any, bool]] = [
    ("none", [{"role": "user", "content": "hi"}], False),
    ("text parts", [{"role": "user", "content": [{"type": "text", "text": "h"}] * 5}], False),
    ("typed media last", [{"role": "user", "content": "hi"},
                          {"role": "user", "content": [{"type": "text", "text": "h"}, IMAGE]}],
     True),
    ("untyped url", [{"role": "user", "content": [{}, {"image_url": "https://x/a.png"}]}], True),
    ("untyped null", [{"role": "user", "content": [{}, {"image_url": None}]}], False),
    ("typed text with an untyped key", [{"role": "user", "content": [
        {"type": "text", "text": "h", "image_url": "https://x"}]}], False),
    ("type null with a key", [{"role": "user", "content": [
        {"type": None, "input_audio": {"data": "AA", "format": "wav"}}]}], True),
    ("unknown type", [{"role": "user", "content": [{"type": "x"}, {}] * 3}], False),
    ("unhashable type", [{"role": "user", "content": [{"type": ["image_url"]}, IMAGE]}], True),
    ("a part not an object", [{"role": "user", "content": ["text", 3, None, IMAGE]}], True),
    ("a message not an object", ["hi", None, {"role": "user", "content": [IMAGE]}], True),
    ("a message not an object, no media", ["hi", {"role": "user", "content": [{}]}], False),
    ("content not a list", [{"role": "user", "content": {"type": "image_url"}}], False),
    ("not a list", {"role": "user", "content": [IMAGE]}, False),
    ("empty", [], False),
]


@pytest.mark.parametrize(("messages", "expected"), [(m, e) for _, m, e in CASES],
                         ids=[name for name, _, _ in CASES])
def test_carries_media_finds_what_media_type_finds(messages: Any, expected: bool) -> None:
    assert carries_media(messages) is expected
    by_part = isinstance(messages, list) and any(
        media_type(part) is not None for m in messages if isinstance(m, dict)
        and isinstance(m.get("content"), list) for part in m["content"])
    assert by_part is expected
