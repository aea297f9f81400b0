"""An Authorization header sent twice is refused (400, ``repeated_authorization``) by the
client key check and by the admin API, whichever of the two values is the good one: a
proxy in front may have read the other, and a client key names a tenant."""

from __future__ import annotations

import httpx

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import ADMIN_TOKEN, Serve, start_gateway

KEY = "acme-key-0123456789"
JUNK = "junk-0123456789abcdef"


def test_an_authorization_header_sent_twice_is_refused(serve: Serve) -> None:
    rec = Behaviour("rec")
    gw = start_gateway(serve, [("r0", serve(fake_replica(rec)).url)],
                       scrape={"enabled": False},
                       auth={"api_keys": [{"key": KEY, "tenant": "acme"}]})
    body = {"model": "sim-model", "prompt": "x"}
    for url, good in [(f"{gw.url}/v1/completions", KEY),
                      (f"{gw.admin}/admin/explain", ADMIN_TOKEN)]:
        for pair in [(good, JUNK), (JUNK, good)]:
            headers = [("authorization", f"Bearer {k}") for k in pair]
            r = httpx.post(url, headers=headers, json=body)
            assert r.status_code == 400, (url, pair, r.text)
            error = r.json()["error"]
            assert error["code"] == "repeated_authorization" and good not in r.text
        once = httpx.post(url, headers={"authorization": f"Bearer {good}"}, json=body)
        assert once.status_code == 200, once.text
    assert len(rec.received) == 1  # the completion sent once; explain sends nothing
