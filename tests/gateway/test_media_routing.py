"""The routing key of a chat with media parts, for a policy that reads token ids
(prefix_affinity with ``chunk_chars: 0``) and ones that read text pieces (prefix_affinity's
default, radix): the image is in it."""

from __future__ import annotations

import base64
import os
from typing import Any

import orjson
import pytest

from gateway.fleet import Fleet
from gateway.request_parse import parse_body
from gateway.routing import Router
from kvwire.openai_schema import BadRequest
from kvwire.tokenizer import load_tokenizer
from policies.registry import build_policy

SYSTEM = "You answer questions about pictures of contracts. " * 8


def chat(url: str) -> bytes:
    return orjson.dumps({"model": "m", "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                     {"type": "text", "text": "Who signed it?"}]}]})


def picture() -> str:
    return "data:image/jpeg;base64," + base64.b64encode(os.urandom(1 << 20)).decode()


@pytest.mark.parametrize("policy", [
    {"name": "prefix_affinity", "prefix_tokens": 256, "chunk_chars": 0},
    {"name": "prefix_affinity", "prefix_tokens": 256},
    {"name": "radix", "chunk_chars": 64}])
def test_the_image_is_in_the_routing_key(policy: dict[str, Any]) -> None:
    router = Router(build_policy(policy), load_tokenizer(), Fleet([]), 1)
    try:
        a, b = picture(), picture()

        def key(url: str) -> tuple[Any, ...]:
            request = router.build(parse_body(chat(url), "chat"))
            assert request.prompt_tokens < 330  # a megabyte image costs a placeholder
            return (tuple(request.tokens), tuple(request.chunks), request.fingerprint)

        assert key(a) == key(a)
        ka, kb = key(a), key(b)
        assert ka != kb
        if policy.get("chunk_chars") == 0:
            shared = next(i for i, (x, y) in enumerate(zip(ka[0], kb[0], strict=True))
                          if x != y)
            assert shared > 50  # the system prompt is shared, the image is not
        else:
            assert ka[1][0] == kb[1][0] and ka[1] != kb[1]
    finally:
        router.close()


def test_a_bad_part_is_refused_before_routing() -> None:
    with pytest.raises(BadRequest) as bad:
        parse_body(chat(""), "chat")
    assert bad.value.param == "messages[1].content[0].image_url.url"
