"""An id of a replica's /v1/models is kept whole or left out, never cut: a cut id is a
name no replica serves (an adapter of 265 characters was refused while the gateway listed
a 256-character id of it that no replica knew)."""

from __future__ import annotations

import logging

import httpx
import pytest

from gateway.monitor import MODEL_ID_CHARS
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway
from tests.support.waiting import wait_until


def _ids(url: str) -> list[str]:
    return [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]]


def test_an_adapter_named_past_256_characters_is_listed_whole_and_served(
        serve: Serve, caplog: pytest.LogCaptureFixture) -> None:
    base = "my-org/" + "adapter-" * 37  # 303 characters, its adapter's 310
    too_long = "y" * (MODEL_ID_CHARS + 1)
    with caplog.at_level(logging.WARNING, logger="kvgate"):
        a = serve(fake_replica(Behaviour("a", model=base, adapters=1)))
        b = serve(fake_replica(Behaviour("b", model=too_long)))
        gw = start_gateway(serve, [("a", a.url), ("b", b.url)])
        wait_until(lambda: len(_ids(gw.url)) >= 2, 10, "the replicas' models")
        # b's ids are left out whole, not listed cut
        assert sorted(_ids(gw.url)) == [base, f"{base}-lora-0"]
        r = httpx.post(f"{gw.url}/v1/completions",
                       json={"model": f"{base}-lora-0", "prompt": "x"}, timeout=10)
        assert r.status_code == 200, r.text[:300]
        # a name too long to route by is refused, saying why
        r = httpx.post(f"{gw.url}/v1/completions", json={"model": too_long, "prompt": "x"},
                       timeout=10)
        error = r.json()["error"]
        assert r.status_code == 404 and error["code"] == "model_not_found", r.text[:300]
        assert f"model names over {MODEL_ID_CHARS} characters are not routed" \
            in error["message"], error["message"][-300:]
        wait_until(lambda: any("replica b lists" in m.getMessage() for m in caplog.records),
                   5, "the warning of b's ids left out")
    (said,) = [m.getMessage() for m in caplog.records if "replica b lists" in m.getMessage()]
    assert f"over {MODEL_ID_CHARS} characters" in said and "'yyy" in said, said
    assert len(said) < 400, said  # the id's start only
