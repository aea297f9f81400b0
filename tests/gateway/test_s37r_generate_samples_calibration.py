"""SGLang answers ``/generate`` with ``sampling_params.n`` samples as a list whose every
answer counts the whole prompt: such an answer teaches the token calibration nothing
(learned from it, n samples made the replicas' tokens look n times the gateway's, and
every capacity and queue read in gateway tokens n times smaller)."""

from __future__ import annotations

import httpx
import pytest

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import AUTH, Serve, start_gateway

TEXT = "a question about the contract, long enough to count many tokens " * 8


def test_samples_of_one_prompt_teach_the_token_calibration_nothing(serve: Serve) -> None:
    replica = serve(fake_replica(Behaviour("a")))  # it counts 10 tokens for any prompt
    gw = start_gateway(serve, [("a", replica.url)])

    def ratio() -> float:
        listed = httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH).json()
        return float(listed["replicas"][0]["replica_tokens_per_gateway_token"])

    for _ in range(12):
        r = httpx.post(f"{gw.url}/generate", json={
            "model": "sim-model", "text": TEXT, "sampling_params": {"n": 8}})
        assert r.status_code == 200, r.text
        assert len(r.json()) == 8
    assert ratio() == 1.0  # unlearned
    for _ in range(12):
        r = httpx.post(f"{gw.url}/generate", json={
            "model": "sim-model", "text": TEXT, "sampling_params": {"n": 1}})
        assert r.status_code == 200, r.text
    learned = ratio()
    assert learned == pytest.approx(10 / 130, rel=0.5)  # from the single samples


def test_a_generate_with_an_image_teaches_the_token_calibration_nothing(serve: Serve) -> None:
    replica = serve(fake_replica(Behaviour("a")))
    gw = start_gateway(serve, [("a", replica.url)])
    for _ in range(12):
        r = httpx.post(f"{gw.url}/generate", json={
            "model": "sim-model", "text": TEXT, "image_data": "data:image/png;base64,iVBORw0KGgo="})
        assert r.status_code == 200, r.text
    listed = httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH).json()
    assert float(listed["replicas"][0]["replica_tokens_per_gateway_token"]) == 1.0
