"""SGLang's native /generate keyed by its media: the same text with another image is
another prompt, as a chat's media parts make it."""

from __future__ import annotations

import httpx

from gateway.request_parse import parse_body
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway

_TEXT = "<image>\nDescribe this picture in detail, listing every object you see. " * 3


def _parsed(body: str) -> tuple[str, str | None, list[int] | None]:
    parsed = parse_body(body.encode(), "generate", default_model=lambda: "sim-model")
    return parsed.model, parsed.prompt_text, parsed.prompt_ids


def test_images_key_the_prompt() -> None:
    text = '"text": "describe it"'
    plain = _parsed("{" + text + "}")[1]
    a = _parsed("{" + text + ', "image_data": "https://x/a.png"}')[1]
    b = _parsed("{" + text + ', "image_data": "https://x/b.png"}')[1]
    assert a == _parsed("{" + text + ', "image_data": ["https://x/a.png"]}')[1]
    assert len({plain, a, b}) == 3
    two = _parsed("{" + text + ', "image_data": ["https://x/a.png", "https://x/b.png"]}')[1]
    assert two is not None and two.endswith("describe it") and two not in (a, b)
    # a batch: its first prompt's images key it (routed by its first prompt)
    batch = _parsed('{"text": ["describe it", "and this"], '
                    '"image_data": ["https://x/a.png", "https://x/b.png"]}')[1]
    assert batch == a
    # ids: a few ids from the image's digest ahead of them
    ids_a = _parsed('{"input_ids": [5, 6, 7], "image_data": "https://x/a.png"}')[2]
    ids_b = _parsed('{"input_ids": [5, 6, 7], "image_data": "https://x/b.png"}')[2]
    assert ids_a is not None and ids_b is not None
    assert ids_a[-3:] == ids_b[-3:] == [5, 6, 7] and ids_a != ids_b
    assert all(0 <= i < 2 ** 28 for i in ids_a)


def test_images_spread_under_prefix_affinity(serve: Serve) -> None:
    behaviours = [Behaviour(f"r{i}") for i in range(4)]
    gw = start_gateway(serve, [(b.name, serve(fake_replica(b)).url) for b in behaviours],
                       policy={"name": "prefix_affinity"})
    with httpx.Client(timeout=10) as client:
        def replica(image: str) -> str:
            r = client.post(f"{gw.url}/generate", json={"text": _TEXT, "image_data": image})
            assert r.status_code == 200, r.text
            return r.headers["x-kvgate-replica"]

        spread = {replica(f"https://example.com/img{i}.png") for i in range(12)}
        assert len(spread) > 1  # one replica for all of them before
        again = {replica("https://example.com/img0.png") for _ in range(4)}
        assert len(again) == 1  # the same image keys the same
