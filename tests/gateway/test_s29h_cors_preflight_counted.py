"""A CORS preflight the gateway refuses (an origin, method or header not allowed: the
CORS layer's 400) ends a request as every other refusal does: one
``kvgate_requests_total`` sample under route none and one access-log line, with the
``x-request-id`` its answer carries. An accepted preflight is no client's request (a
browser sends one before most cross-origin requests) and is not counted."""

from __future__ import annotations

import httpx

from tests.support.access_lines import access_lines
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, metric, start_gateway
from tests.support.waiting import wait_until

ALLOWED = "https://app.example"


def _none(status: str) -> str:
    return f'kvgate_requests_total{{replica="none",route="none",status="{status}"}}'


def _preflight(url: str, origin: str, method: str = "POST") -> httpx.Response:
    return httpx.options(f"{url}/v1/chat/completions", timeout=10, headers={
        "origin": origin, "access-control-request-method": method,
        "access-control-request-headers": "content-type, authorization"})


def test_a_refused_preflight_is_counted_and_logged_an_accepted_one_is_not(
        serve: Serve) -> None:
    with access_lines() as lines:
        replica = serve(fake_replica(Behaviour("r0")))
        gw = start_gateway(serve, [("r0", replica.url)], access_log=True,
                           cors={"allow_origins": [ALLOWED]})
        accepted = _preflight(gw.url, ALLOWED)
        assert accepted.status_code == 200, accepted.text
        assert accepted.headers["access-control-allow-origin"] == ALLOWED
        refused = [_preflight(gw.url, "https://elsewhere.example"),
                   _preflight(gw.url, ALLOWED, method="DELETE")]
        assert [r.status_code for r in refused] == [400, 400]
        assert "origin" in refused[0].text and "method" in refused[1].text
        # a client's request after them: counted as before (a 404 for a path not served)
        after = httpx.get(f"{gw.url}/v1/nothing-here", headers={"origin": ALLOWED})
        assert after.status_code == 404
        last = after.headers["x-request-id"]
        wait_until(lambda: any(line["id"] == last for line in lines), 5,
                   "the 404's access line")
        assert metric(gw, _none("400")) == 2
        assert metric(gw, _none("404")) == 1
        assert metric(gw, _none("200")) in (None, 0)  # (the accepted preflight)
        ids = [r.headers.get("x-request-id") for r in refused]
        assert all(ids)
        assert [(line["id"], line["status"], line["route"]) for line in lines] \
            == [(ids[0], "400", "none"), (ids[1], "400", "none"), (last, "404", "none")]
        assert all(isinstance(line["duration_s"], float) for line in lines)
