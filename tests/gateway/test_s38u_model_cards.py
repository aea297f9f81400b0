"""``GET /v1/models`` through the gateway shows each model's card as its replica listed
it (``owned_by``, ``created``, any other field), as a client of a single vLLM server sees
it, but vLLM's ``permission`` list, which is left out; the gateway writes its own fields
only where the replica gave none."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tests.support.engine_servers import LiveEngine, serve_engine
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway
from tests.support.waiting import wait_until

_PERMISSION = {"id": "modelperm-1", "object": "model_permission", "created": 1700000000,
               "allow_create_engine": False, "allow_sampling": True,
               "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
               "allow_fine_tuning": False, "organization": "*", "group": None,
               "is_blocking": False}
_CARDS = [  # as vLLM lists a base model and a LoRA adapter of it
    {"id": "org/base", "object": "model", "created": 1700000000, "owned_by": "vllm",
     "root": "org/base", "parent": None, "max_model_len": 4096, "permission": [_PERMISSION],
     "x_extra": {"kept": True}},
    {"id": "sql-lora", "object": "model", "created": 1700000001, "owned_by": "vllm",
     "root": "/adapters/sql", "parent": "org/base", "max_model_len": None,
     "permission": [{**_PERMISSION, "id": "modelperm-2"}]},
]


def _vllm_like() -> Starlette:
    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": _CARDS})

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/v1/models", models), Route("/health", health),
                             Route("/metrics", lambda r: PlainTextResponse(""))])


@pytest.fixture
def engine() -> Iterator[LiveEngine]:
    served = serve_engine(LiveEngine, "eng-model")
    try:
        yield next(served)
    finally:
        served.close()


def _listed(url: str) -> dict[str, dict[str, Any]]:
    return {card["id"]: card for card in httpx.get(f"{url}/v1/models").json()["data"]}


def test_cards_are_the_replicas_own(serve: Serve, engine: LiveEngine) -> None:
    vllm = serve(_vllm_like())
    plain = serve(fake_replica(Behaviour("plain", model="plain-model")))  # lists no more
    gw = start_gateway(serve, [("v", vllm.url), ("e", engine.url), ("p", plain.url)])
    wait_until(lambda: len(_listed(gw.url)) == 4, 10, "the models listed")
    cards = _listed(gw.url)
    for card in _CARDS:
        kept = {key: value for key, value in card.items() if key != "permission"}
        assert cards[str(card["id"])] == kept
        assert httpx.get(f"{gw.url}/v1/models/{card['id']}").json() == kept
    # the kvgate engine's card: its own but for the permission list
    own = _listed(engine.url)["eng-model"]
    assert own.pop("permission")
    assert cards["eng-model"] == own and own["owned_by"] == "kvgate", (cards["eng-model"], own)
    # a replica whose listing gives nothing more: the gateway's own fields
    assert cards["plain-model"]["owned_by"] == "kvgate"
    assert isinstance(cards["plain-model"]["created"], int)
    assert "permission" not in cards["plain-model"]
