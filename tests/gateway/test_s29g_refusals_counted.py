"""Every answered request is one ``kvgate_requests_total`` sample and one access-log line,
whichever handler (or none) answered it: ``/v1/models`` answered or refused for its key,
the admin API's refusals, a path the gateway does not serve, and the refusals routed and
``/invocations`` requests count themselves, once."""

from __future__ import annotations

import httpx

from tests.support.access_lines import access_lines
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import AUTH, Serve, metric, start_gateway
from tests.support.waiting import wait_until

KEY = "acme-key-0123456789"


def _none(status: str) -> str:
    return f'kvgate_requests_total{{replica="none",route="none",status="{status}"}}'


def test_every_answer_is_one_request_sample_and_one_access_line(serve: Serve) -> None:
    with access_lines() as lines:
        replica = serve(fake_replica(Behaviour("r0")))
        gw = start_gateway(serve, [("r0", replica.url)], access_log=True,
                           auth={"api_keys": [{"key": KEY, "tenant": "acme"}]})
        keyed = {"authorization": f"Bearer {KEY}"}
        answers = [
            httpx.get(f"{gw.url}/v1/models"),  # no key
            httpx.get(f"{gw.url}/v1/models",
                      headers={"authorization": "Bearer wrong-key-xyz"}),
            httpx.get(f"{gw.url}/v1/models", headers=keyed),
            httpx.get(f"{gw.admin}/admin/replicas"),  # no admin token
            httpx.delete(f"{gw.admin}/admin/replicas/nowhere", headers=AUTH),
            httpx.get(f"{gw.admin}/admin/nothing-here", headers=AUTH),
            httpx.get(f"{gw.url}/v1/nothing-here", headers=keyed),
            httpx.post(f"{gw.url}/invocations", json={"prompt": "x"}),  # no key
            httpx.post(f"{gw.url}/v1/completions", json={"prompt": "x"}),  # no key
        ]
        statuses = [r.status_code for r in answers]
        assert statuses == [401, 401, 200, 401, 404, 404, 404, 401, 401]
        wait_until(lambda: len(lines) == len(answers), 5, f"{len(answers)} access lines")
        assert metric(gw, _none("401")) == 5
        assert metric(gw, _none("404")) == 3
        assert metric(gw, _none("200")) == 1
        # one line each, with the id its answer carries; the keyed list names its tenant
        assert sorted(str(line["id"]) for line in lines) \
            == sorted(r.headers["x-request-id"] for r in answers)
        assert sorted(str(line["status"]) for line in lines) == sorted(map(str, statuses))
        listed = next(line for line in lines
                      if line["id"] == answers[2].headers["x-request-id"])
        assert listed["tenant"] == "acme" and listed["replica"] is None
        assert all(isinstance(line["duration_s"], float) for line in lines)
        # scraping /metrics above is no request of a client's: no line, no sample
        assert len(lines) == len(answers)


def test_a_not_ready_answer_is_a_probes_and_no_clients_request(serve: Serve) -> None:
    # a readiness probe asks every second or so: its 503s through an outage or a drain
    # must not read as clients refused
    with access_lines() as lines:
        behaviour = Behaviour("r0", healthy=False)
        replica = serve(fake_replica(behaviour))
        gw = start_gateway(serve, [("r0", replica.url)], access_log=True)
        wait_until(lambda: httpx.get(f"{gw.url}/ready").status_code == 503, 10, "not ready")
        assert httpx.get(f"{gw.url}/v1/nothing-here").status_code == 404  # a client's
        wait_until(lambda: metric(gw, _none("404")) == 1, 5, "the 404 counted")
        assert metric(gw, _none("503")) in (None, 0)
        assert [str(line["status"]) for line in lines] == ["404"]
