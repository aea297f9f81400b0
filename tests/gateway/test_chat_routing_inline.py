"""A chat the policy only chunk-hashes (no token ids) is rendered on the event loop when
it is small (bytes, messages and tools all bounded), and in the tokenizer pool when it is
not; both give the same request."""

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


def chat(words: int, messages: int = 1, tools: int = 1) -> bytes:
    text = " ".join(f"clause{i % 97}" for i in range(words))
    return orjson.dumps({"model": "m", "stream": True, "messages": [
        {"role": "system", "content": "You answer questions about contracts."},
        *({"role": "user", "content": text} for _ in range(messages))],
        "tools": [{"type": "function", "function": {"name": f"lookup{i}", "parameters": {}}}
                  for i in range(tools)]})


@pytest.mark.parametrize("policy", ["cost", "radix"])
def test_a_small_chat_is_hashed_inline_and_a_large_one_in_the_pool(policy: str) -> None:
    small = chat(200)
    large = {"bytes": chat(20_000), "messages": chat(1, messages=routing.INLINE_CHAT_MESSAGES),
             "tools": chat(1, tools=routing.INLINE_CHAT_TOOLS + 1)}
    assert len(small) <= routing.INLINE_CHAT_BYTES < len(large["bytes"])
    assert all(len(body) <= routing.INLINE_CHAT_BYTES
               for kind, body in large.items() if kind != "bytes")

    async def go() -> None:
        router = Router(build_policy({"name": policy}), load_tokenizer(), Fleet([]), 1)
        try:
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
        finally:
            router.close()  # no pool from here on: only what runs inline still routes
        assert (await router.route_request(parse_body(small, "chat"), None)).chunks
        for kind, body in large.items():
            with pytest.raises(RuntimeError, match="shutdown"):
                await router.route_request(parse_body(body, "chat"), None)
                pytest.fail(f"a chat over the {kind} bound was rendered inline")

    asyncio.run(go())
