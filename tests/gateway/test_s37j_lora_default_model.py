"""A request without ``model`` is for the fleet's one base model when its replicas also
list LoRA adapters of it (vLLM serves such a request with its base model, adapters loaded
or not): completions, chats and pass-through bodies alike, forwarded as they came. A fleet
of several base models still refuses one with a 400 naming them."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from gateway.fleet import Fleet
from gateway.intake import _BaseModels, unnamed_model
from kvwire.openai_schema import BadRequest
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway
from tests.support.waiting import wait_until

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def _listed(url: str, count: int) -> None:
    wait_until(lambda: len(httpx.get(f"{url}/v1/models").json()["data"]) == count, 5,
               f"{count} models listed")


def test_a_request_without_a_model_is_for_the_one_base_model_beside_its_adapters(
        serve: Serve) -> None:
    a = Behaviour("a", model="base", adapters=2)
    b = Behaviour("b", model="base", adapters=3)
    gw = start_gateway(serve, [("a", serve(fake_replica(a)).url),
                               ("b", serve(fake_replica(b)).url)])
    _listed(gw.url, 4)  # base and its adapters lora-0..2
    large = {"prompt": "x" * (1 << 20) + "y"}  # parsed off the event loop
    sent: list[tuple[str, dict[str, Any]]] = [
        ("/v1/completions", {"prompt": "x"}), ("/v1/chat/completions", CHAT),
        ("/v1/completions", large), ("/invocations", {"input": "some text"})]
    for path, body in sent:
        r = httpx.post(f"{gw.url}{path}", json=body, timeout=10)
        assert r.status_code == 200, (path, r.text)
        received = a.received + b.received
        assert json.loads(received[-1]) == body, path  # forwarded as it came
        a.received.clear()
        b.received.clear()


def test_several_base_models_are_named_when_a_request_names_none(serve: Serve) -> None:
    a = Behaviour("a", model="base-a", adapters=2)
    b = Behaviour("b", model="base-b", adapters=1)
    gw = start_gateway(serve, [("a", serve(fake_replica(a)).url),
                               ("b", serve(fake_replica(b)).url)])
    _listed(gw.url, 5)
    for path, body in (("/v1/completions", {"prompt": "x"}), ("/v1/chat/completions", CHAT),
                       ("/invocations", {"input": "some text"})):
        r = httpx.post(f"{gw.url}{path}", json=body)
        assert r.status_code == 400, (path, r.text)
        error = r.json()["error"]
        assert error["param"] == "model", error
        assert "several models" in error["message"], error
        assert "base-a, base-b" in error["message"], error
        assert "lora" not in error["message"], error  # the base models, not every name
    assert not a.received and not b.received


def test_a_fleet_whose_models_are_not_known_yet_says_so() -> None:
    fleet = Fleet([])
    with pytest.raises(BadRequest, match="no replica's models are known yet"):
        unnamed_model(_BaseModels()(SimpleNamespace(fleet=fleet)))  # type: ignore[arg-type]
