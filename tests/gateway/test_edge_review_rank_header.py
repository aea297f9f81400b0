"""Which engine of a replica a request goes to is the gateway's to say: a client's own
``X-Data-Parallel-Rank`` never reaches a replica (vLLM and SGLang send a request to the
rank it names, past their own balancing, and refuse a rank they do not have), whether the
replica is configured as one server or rank by rank."""

from __future__ import annotations

import httpx

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway


def test_a_clients_rank_header_reaches_no_replica(serve: Serve) -> None:
    rec = Behaviour("rec")
    gw = start_gateway(serve, [("r0", serve(fake_replica(rec)).url)],
                       scrape={"enabled": False})
    body = {"model": "sim-model", "prompt": "hi", "max_tokens": 3}
    for stream in (False, True):
        r = httpx.post(f"{gw.url}/v1/completions", json={**body, "stream": stream},
                       headers={"X-Data-Parallel-Rank": "3"})
        assert r.status_code == 200, r.text
    assert len(rec.headers) == 2
    assert all("x-data-parallel-rank" not in seen for seen in rec.headers), rec.headers
