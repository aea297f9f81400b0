"""A chat head's anchor is encoded once per conversation: later turns hash the head."""

from __future__ import annotations

import pytest

from gateway.fleet import Fleet
from gateway.head_anchors import HeadAnchors
from gateway.request_parse import ParsedRequest
from gateway.routing import Router
from kvwire.tokenizer import load_tokenizer
from policies.registry import build_policy


def test_an_anchor_is_computed_once_per_head_group_and_length_asked() -> None:
    anchors = HeadAnchors(capacity=2)
    calls: list[str] = []

    def compute(value: int | None, name: str) -> int | None:
        calls.append(name)
        return value
    assert anchors.anchor("head a", 64, "", lambda: compute(5, "a")) == 5
    assert anchors.anchor("head a", 64, "", lambda: compute(99, "again")) == 5
    assert anchors.anchor("head a", 64, "tenant-b", lambda: compute(None, "b")) is None
    assert anchors.anchor("head a", 64, "tenant-b", lambda: compute(7, "b again")) is None
    assert anchors.anchor("head a", 32, "", lambda: compute(3, "a 32")) == 3
    assert calls == ["a", "b", "a 32"] and anchors.hits == 2
    assert len(anchors) == 2  # bounded: the least recently used went first
    assert anchors.anchor("head a", 64, "", lambda: compute(5, "a evicted")) == 5
    assert calls[-1] == "a evicted"
    with pytest.raises(ValueError, match="capacity"):
        HeadAnchors(capacity=0)


def chat_turn(system: str, first: str, turns: int) -> ParsedRequest:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": first}]
    for i in range(turns - 1):
        messages += [{"role": "assistant", "content": f"answer {i}"},
                     {"role": "user", "content": f"follow-up question {i}"}]
    return ParsedRequest("chat", {}, "m", True, None, None, messages, None, None)


def test_a_later_turn_gets_its_conversations_anchor_without_encoding_the_head() -> None:
    tokenizer = load_tokenizer()
    token_keyed = {"name": "prefix_affinity", "chunk_chars": 0}
    router = Router(build_policy(token_keyed), tokenizer, Fleet([]), 1)
    fresh = Router(build_policy(token_keyed), tokenizer, Fleet([]), 1)
    original = tokenizer.encode_prefix
    try:
        system = "You answer questions about the contracts of the firm. " * 4
        first = router.build(chat_turn(system, "What does clause 4 say?", 1))
        assert first.anchor_tokens is not None
        encoded: list[str] = []

        def counting(text: str, *args: object, **kw: object):  # type: ignore[no-untyped-def]
            encoded.append(text)
            return original(text, *args, **kw)  # type: ignore[arg-type]
        tokenizer.encode_prefix = counting  # type: ignore[method-assign]
        later = router.build(chat_turn(system, "What does clause 4 say?", 3))
        assert later.anchor_tokens == first.anchor_tokens and router._anchors.hits == 1
        assert len(encoded) == 1  # the prompt's own prefix, not the head again
        other = router.build(chat_turn(system, "And clause 9?", 2))
        assert router._anchors.hits == 1 and len(encoded) == 3  # a new head is encoded
        # the remembered anchor is the one the head gets computed afresh
        assert fresh.build(chat_turn(system, "And clause 9?", 2)).anchor_tokens \
            == other.anchor_tokens
    finally:
        tokenizer.encode_prefix = original  # type: ignore[method-assign]
        router.close()
        fresh.close()


def test_a_pieces_keyed_conversation_keeps_its_key_and_is_never_encoded() -> None:
    """prefix_affinity's default keys on pieces: a chat's anchor is the whole pieces its
    head covers, so later turns keep the first turn's key, and nothing is tokenized."""
    tokenizer = load_tokenizer()
    policy = build_policy({"name": "prefix_affinity", "learn_common_prefix": False})
    router = Router(policy, tokenizer, Fleet([]), 1)
    original = tokenizer.encode_prefix
    encoded: list[str] = []

    def counting(text: str, *args: object, **kw: object):  # type: ignore[no-untyped-def]
        encoded.append(text)
        return original(text, *args, **kw)  # type: ignore[arg-type]
    tokenizer.encode_prefix = counting  # type: ignore[method-assign]
    try:
        system = "You answer questions about the contracts of the firm. " * 20
        first = router.build(chat_turn(system, "What does clause 4 say?", 1))
        later = router.build(chat_turn(system, "What does clause 4 say?", 6))
        other = router.build(chat_turn(system, "And clause 9?", 1))
        head = tokenizer.render_chat(chat_turn(system, "What does clause 4 say?", 1).messages
                                     or [], add_generation_prompt=False)
        assert first.anchor_chunks == later.anchor_chunks == len(head) // 64
        assert first.tokens == () and not encoded
        assert policy.key(first) == policy.key(later)  # type: ignore[attr-defined]
        assert policy.key(first) != policy.key(other)  # type: ignore[attr-defined]
    finally:
        tokenizer.encode_prefix = original  # type: ignore[method-assign]
        router.close()
