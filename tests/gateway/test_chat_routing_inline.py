"""A chat the policy only chunk-hashes (no token ids) is rendered on the event loop when
its body is small, and in the tokenizer pool when it is large; both give one request."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from gateway import routing
from gateway.fleet import Fleet
from gateway.request_parse import parse_body
from gateway.routing import Router
from kvwire.tokenizer import load_tokenizer
from policies.registry import build_policy


def chat(words: int) -> bytes:
    text = " ".join(f"clause{i % 97}" for i in range(words))
    return orjson.dumps({"model": "m", "stream": True, "messages": [
        {"role": "system", "content": "You answer questions about contracts."},
        {"role": "user", "content": text}],
        "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]})


@pytest.mark.parametrize("policy", ["cost", "radix"])
def test_a_small_chat_is_hashed_inline_and_a_large_one_in_the_pool(policy: str) -> None:
    small, large = chat(200), chat(20_000)
    assert len(small) <= routing.INLINE_CHAT_BYTES < len(large)

    async def go() -> None:
        router = Router(build_policy({"name": policy}), load_tokenizer(), Fleet([]), 1)
        inline = await router.route_request(parse_body(small, "chat"), None)
        old = routing.INLINE_CHAT_BYTES
        try:  # the same chat through the pool: the same request
            routing.INLINE_CHAT_BYTES = 0
            via_pool = await router.route_request(parse_body(small, "chat"), None)
        finally:
            routing.INLINE_CHAT_BYTES = old
        assert list(inline.chunks) == list(via_pool.chunks) and inline.chunks
        assert inline.prompt_tokens == via_pool.prompt_tokens
        assert inline.fingerprint == via_pool.fingerprint
        router.close()  # no pool from here on: only what runs inline still routes
        assert (await router.route_request(parse_body(small, "chat"), None)).chunks
        with pytest.raises(RuntimeError, match="shutdown"):
            await router.route_request(parse_body(large, "chat"), None)

    asyncio.run(go())
