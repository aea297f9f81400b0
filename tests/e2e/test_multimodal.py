"""Vision- and audio-shaped chats: the official OpenAI client -> the gateway process -> real
engine processes (sim executor), which serve them with a content-derived placeholder."""

from __future__ import annotations

import base64
import random
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from kvwire.tokenizer_build import sample_text
from tests.support.fleets import start_fleet
from tests.support.processes import Processes

pytestmark = pytest.mark.slow

SYSTEM = sample_text(random.Random(5), 300)
QUESTION = (" What does it show? Describe every detail of the picture: its colours, the "
            "people in it, the place and the time of day, in three short sentences.")


def picture(seed: int) -> str:
    return "data:image/png;base64," + base64.b64encode(random.Random(seed).randbytes(200_000)
                                                       ).decode()


def chat(*parts: dict[str, Any]) -> list[Any]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": [{"type": "text", "text": "Look at this: "}, *parts,
                                         {"type": "text", "text": QUESTION}]}]


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


def test_the_same_image_shares_its_prefix_and_another_does_not(
        spawn: Processes, tmp_path: Path) -> None:
    fleet = start_fleet(spawn, tmp_path, {"name": "radix", "min_match_tokens": 16,
                                          "cache_threshold": 0.1})
    client = openai.OpenAI(base_url=f"{fleet.gateway}/v1", api_key="unused", max_retries=0)
    a, b = chat(image(picture(1))), chat(image(picture(2)))

    # where the two prompts part, in the replicas' tokens (the engine's /tokenize, through
    # the gateway): inside the image's placeholder, after the shared system prompt
    ids = [httpx.post(f"{fleet.gateway}/tokenize",
                      json={"model": "sim-llama", "messages": m}).json()["tokens"]
           for m in (a, b)]
    parted = common_prefix(*ids)
    assert 300 < parted < len(ids[0]) - 5

    def explain(messages: list[Any]) -> dict[str, Any]:
        r = httpx.post(f"{fleet.admin}/admin/explain", headers=fleet.admin_headers,
                       json={"model": "sim-llama", "messages": messages})
        assert r.status_code == 200, r.text
        return dict(r.json())

    def send(messages: list[Any], prompt_tokens: int) -> tuple[str, int]:
        raw = client.chat.completions.with_raw_response.create(
            model="sim-llama", messages=messages, max_tokens=2)
        usage = raw.parse().usage
        assert usage is not None and usage.prompt_tokens == prompt_tokens
        cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details \
            else 0
        return raw.headers["x-kvgate-replica"], cached or 0

    home, first_cached = send(a, len(ids[0]))
    assert first_cached == 0
    # the routing key follows the image: the same image matches past the placeholder
    again, other = explain(a), explain(b)
    assert again["chosen"] == home
    assert again["matched_tokens"] > other["matched_tokens"]
    # the same image twice: its replica, and the engine's cache covers the image
    replica, cached = send(a, len(ids[0]))
    assert replica == home
    assert cached > parted
    # another image: nothing cached past the point where the prompts part
    _, cached_b = send(b, len(ids[1]))
    assert cached_b <= parted

    # audio and video parts go through too
    heard = client.chat.completions.create(model="sim-llama", max_tokens=2, messages=chat(
        {"type": "input_audio", "input_audio": {"data": "UklGRiQAAABXQVZF", "format": "wav"}},
        {"type": "video_url", "video_url": {"url": "https://example.com/clip.mp4"}}))
    assert heard.choices[0].finish_reason == "length"

    # a malformed part is the client's 400, naming the field
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="sim-llama", messages=chat(
            {"type": "image_url", "image_url": {"detail": "high"}}))
    error = bad.value.body
    assert isinstance(error, dict)
    assert error["param"] == "messages[1].content[1].image_url.url"
    assert "messages[1].content[1].image_url.url" in error["message"]
    assert bad.value.response.headers["x-request-id"]
