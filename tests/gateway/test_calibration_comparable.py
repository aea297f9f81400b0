"""The token calibration learns only from answers whose prompt tokens count what the
gateway counted: not a chat carrying an image (the replica counts its image tokens, the
gateway its placeholder), nor a Responses request that continues a stored response (the
replica counts the stored history too)."""

from __future__ import annotations

import httpx
import pytest

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import AUTH, Serve, start_gateway

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


def test_an_image_chat_teaches_the_token_calibration_nothing(serve: Serve) -> None:
    replica = serve(fake_replica(Behaviour("a")))  # it counts 10 tokens for any prompt
    gw = start_gateway(serve, [("a", replica.url)])

    def ratio() -> float:
        listed = httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH).json()
        return float(listed["replicas"][0]["replica_tokens_per_gateway_token"])

    text = "a question about the picture, long enough to count many tokens " * 8
    for _ in range(12):
        r = httpx.post(f"{gw.url}/v1/chat/completions", json={"model": "sim-model", "messages": [
            {"role": "user", "content": [{"type": "text", "text": text}, IMAGE]}]})
        assert r.status_code == 200, r.text
    assert ratio() == 1.0  # unlearned
    for _ in range(12):
        r = httpx.post(f"{gw.url}/v1/chat/completions", json={
            "model": "sim-model", "messages": [{"role": "user", "content": text}]})
        assert r.status_code == 200, r.text
    assert ratio() == pytest.approx(10 / 130, rel=0.5)  # learned from the text chats
