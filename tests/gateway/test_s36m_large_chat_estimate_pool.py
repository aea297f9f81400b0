"""A chat whose policy needs only a length estimate (round robin) is estimated on the event
loop only within the INLINE_CHAT_* bounds; a larger one (bytes, messages or content parts)
is read on the tokenizer pool, as a chat to render is, with the same result. The same
parts bound holds for a chat rendered for chunk hashes: 64 KB holds 20,000 parts."""

from __future__ import annotations

import orjson
import pytest

from gateway import routing
from gateway.fleet import Fleet
from gateway.request_parse import parse_body
from gateway.routing import Router
from kvwire.tokenizer import load_tokenizer
from policies.registry import build_policy


def chat(messages: int = 1, words: int = 20, parts: int = 0) -> bytes:
    text = " ".join(f"clause{i % 97}" for i in range(words))
    content: object = [{"type": "text", "text": "a"}] * parts if parts else text
    return orjson.dumps({"model": "m", "messages": [
        {"role": "user", "content": content} for _ in range(messages)]})


@pytest.mark.parametrize("policy", ["round_robin", "cost"])
async def test_a_large_chat_is_read_on_the_pool_and_a_small_one_inline(policy: str) -> None:
    small = chat(messages=4, parts=0)
    large = {"bytes": chat(words=20_000),
             "messages": chat(messages=routing.INLINE_CHAT_MESSAGES + 1),
             "parts": chat(parts=routing.INLINE_CHAT_PARTS + 1)}
    assert len(small) <= routing.INLINE_CHAT_BYTES < len(large["bytes"])
    assert all(len(body) <= routing.INLINE_CHAT_BYTES
               for kind, body in large.items() if kind != "bytes")
    router = Router(build_policy({"name": policy}), load_tokenizer(), Fleet([]), 1)
    try:  # on the pool, the request the loop would have built
        for body in (small, *large.values()):
            pooled = await router.route_request(parse_body(body, "chat"), None)
            built = router.build(parse_body(body, "chat"))
            assert pooled.prompt_tokens == built.prompt_tokens > 1
            assert list(pooled.chunks) == list(built.chunks)
    finally:
        router.close()  # no pool from here on: only what runs inline still routes
    assert (await router.route_request(parse_body(small, "chat"), None)).prompt_tokens > 1
    for kind, body in large.items():
        with pytest.raises(RuntimeError, match="shutdown"):
            await router.route_request(parse_body(body, "chat"), None)
            pytest.fail(f"a chat over the {kind} bound was read inline")
