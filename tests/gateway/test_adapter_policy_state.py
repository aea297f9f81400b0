"""A LoRA adapter is routed by its base model's policy state: the adapters run on the base
model's replicas, so one state sees all their load and places all their hot prefixes."""

from __future__ import annotations

import httpx

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import AUTH, Serve, start_gateway
from tests.support.waiting import wait_until


def test_adapters_share_their_base_models_policy_state(serve: Serve) -> None:
    lora = Behaviour("lora", adapters=3)
    gw = start_gateway(serve, [("r0", serve(fake_replica(lora)).url),
                               ("r1", serve(fake_replica(Behaviour("r1", adapters=3))).url)],
                       policy={"name": "cost"})
    wait_until(lambda: len(httpx.get(f"{gw.url}/v1/models").json()["data"]) == 4, 10,
               "the replicas' adapters")
    for model in ("sim-model", "sim-model-lora-0", "sim-model-lora-1", "sim-model-lora-2"):
        r = httpx.post(f"{gw.url}/v1/completions", json={"model": model, "prompt": "x" * 500})
        assert r.status_code == 200, r.text
    shown = httpx.post(f"{gw.admin}/admin/explain", headers=AUTH,
                       json={"model": "sim-model-lora-1", "prompt": "x" * 500}).json()
    # one state (with one per adapter it reads {"models": {name: state, ...}})
    assert "models" not in shown["policy_state"], shown["policy_state"]
    assert "placed_hot_tokens" in shown["policy_state"]
