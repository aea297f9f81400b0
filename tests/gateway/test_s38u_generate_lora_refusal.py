"""SGLang's native /generate with a ``lora_path`` no replica serves: the refusal names
``lora_path``, the field that named the adapter (a /generate body need have no
``model``), and lists what the fleet serves, as an unserved model's refusal does."""

from __future__ import annotations

import httpx

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway
from tests.support.waiting import wait_until


def test_unserved_lora_path_named(serve: Serve) -> None:
    replica = Behaviour("a", adapters=1)
    gw = start_gateway(serve, [("a", serve(fake_replica(replica)).url)])
    with httpx.Client(timeout=10) as client:
        wait_until(lambda: "sim-model-lora-0" in client.get(f"{gw.url}/v1/models").text,
                   what="the adapter listed")
        for body in ({"text": "x", "lora_path": "nope"},
                     {"text": ["x", "y"], "lora_path": ["nope", None]},
                     {"text": "x", "model": "sim-model", "lora_path": "nope"}):
            r = client.post(f"{gw.url}/generate", json=body)
            error = r.json()["error"]
            assert r.status_code == 404 and error["code"] == "model_not_found", r.text
            assert error["param"] == "lora_path", r.text
            assert "'lora_path'" in error["message"] and "'nope'" in error["message"]
            assert "sim-model-lora-0" in error["message"], error["message"]
        # a model named by ``model`` is still refused as a model
        r = client.post(f"{gw.url}/generate", json={"text": "x", "model": "other"})
        assert r.status_code == 404 and r.json()["error"]["param"] == "model", r.text
        assert r.json()["error"]["message"].startswith("model 'other'"), r.text
        assert replica.received == []
        r = client.post(f"{gw.url}/generate",
                        json={"text": "x", "lora_path": "sim-model-lora-0"})
        assert r.status_code == 200, r.text
