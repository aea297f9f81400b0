"""The Responses store counts what a stored conversation's image parts hold (a ``data:``
URL is megabytes of base64) against its characters, as it counts text."""

from __future__ import annotations

from engine.responses_route import ResponseStore


def _image_turn(url: str) -> dict[str, object]:
    return {"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                        {"type": "image_url", "image_url": {"url": url}}]}


def test_image_parts_count_against_the_stores_characters() -> None:
    url = "data:image/png;base64," + "A" * 2000
    store = ResponseStore(limit=8, max_chars=3000)
    store.put("resp_0", [_image_turn(url), {"role": "assistant", "content": "a cat"}],
              salt=None)
    store.check_integrity()
    assert store.chars >= len(url) + len("what is this?")
    # a second such conversation pushes the first out: the two would hold 4,000 of 3,000
    store.put("resp_1", [_image_turn(url), {"role": "assistant", "content": "a dog"}],
              salt=None)
    store.check_integrity()
    assert store.get("resp_0", salt=None) is None
    assert store.get("resp_1", salt=None) is not None
    # one whose image alone is more than the store holds is not stored
    store.put("resp_huge", [_image_turn("data:image/png;base64," + "B" * 4000)], salt=None)
    assert store.get("resp_huge", salt=None) is None
    assert store.get("resp_1", salt=None) is not None
