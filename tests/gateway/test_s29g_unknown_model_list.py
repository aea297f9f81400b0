"""A request for a model no replica serves is refused with an error that names a few of
the models there are and how many more, not every one: a fleet of LoRA adapters lists
thousands (up to 1,024 ids of 256 characters per replica), and each such refusal wrote
them all, sorted, on the event loop."""

from __future__ import annotations

import httpx

from gateway.intake import SHOWN_MODELS
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway
from tests.support.waiting import wait_until


def test_an_unknown_model_names_a_few_of_many_models_and_counts_the_rest(
        serve: Serve) -> None:
    model = "base-model-" + "x" * 120
    replica = serve(fake_replica(Behaviour("a", model=model, adapters=600)))
    gw = start_gateway(serve, [("a", replica.url)])
    wait_until(lambda: len(httpx.get(f"{gw.url}/v1/models").json()["data"]) == 601, 10,
               "the replica's 601 models listed")
    for path, body in (("/v1/completions", {"model": "nope", "prompt": "x"}),
                       ("/v1/embeddings", {"model": "nope", "input": "x"})):
        r = httpx.post(f"{gw.url}{path}", json=body, timeout=10)
        error = r.json()["error"]
        assert r.status_code == 404 and error["code"] == "model_not_found", r.text[:300]
        message = error["message"]
        # the first names in order, then how many were left out
        assert f"available: {model}, {model}-lora-0, " in message, message[:300]
        assert message.endswith(f"and {601 - SHOWN_MODELS} more (GET /v1/models lists "
                                "them)"), message[-200:]
        assert message.count(model) == SHOWN_MODELS
        assert len(r.content) < 4096, len(r.content)
