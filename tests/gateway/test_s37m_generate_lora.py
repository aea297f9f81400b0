"""SGLang's native /generate routed for its LoRA adapter: ``lora_path`` names the model
the request is for, as ``model`` names an adapter on the OpenAI routes."""

from __future__ import annotations

import httpx

from gateway.request_parse import parse_body
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway
from tests.support.waiting import wait_until


def _parsed(body: str) -> tuple[str, str | None, list[int] | None]:
    parsed = parse_body(body.encode(), "generate", default_model=lambda: "sim-model")
    return parsed.model, parsed.prompt_text, parsed.prompt_ids


def test_lora_path_names_the_model() -> None:
    model, text, _ = _parsed('{"text": "hi", "lora_path": "sql-lora"}')
    assert model == "sql-lora" and text == "hi"
    assert _parsed('{"text": "hi", "model": "sim-model", "lora_path": "sql-lora"}')[0] \
        == "sql-lora"
    assert _parsed('{"text": "hi"}')[0] == "sim-model"
    assert _parsed('{"text": "hi", "lora_path": null}')[0] == "sim-model"
    # a batch's list: its first prompt's adapter (null: the base model)
    assert _parsed('{"text": ["a", "b"], "lora_path": ["x", null]}')[0] == "x"
    assert _parsed('{"text": ["a", "b"], "lora_path": [null, "x"]}')[0] == "sim-model"


def test_lora_path_routed_to_replicas_listing_the_adapter(serve: Serve) -> None:
    with_adapter, without = Behaviour("a", adapters=1), Behaviour("b")
    gw = start_gateway(serve, [("a", serve(fake_replica(with_adapter)).url),
                               ("b", serve(fake_replica(without)).url)])
    with httpx.Client(timeout=10) as client:
        wait_until(lambda: "sim-model-lora-0" in client.get(f"{gw.url}/v1/models").text,
                   what="the adapter listed")
        chosen = set()
        for _ in range(6):
            r = client.post(f"{gw.url}/generate",
                            json={"text": "select 1", "lora_path": "sim-model-lora-0"})
            assert r.status_code == 200, r.text
            chosen.add(r.headers["x-kvgate-replica"])
        assert chosen == {"a"}  # round robin sent every other one to b before
        base = {client.post(f"{gw.url}/generate", json={"text": "select 1"}).headers[
            "x-kvgate-replica"] for _ in range(4)}
        assert base == {"a", "b"}
