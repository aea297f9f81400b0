"""``/admin/explain`` shows the policy state of the explained request's model: in a fleet
of two models where only one has been routed, explaining the other's request shows none of
the first one's hot placement."""

from __future__ import annotations

import httpx

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import AUTH, Serve, start_gateway
from tests.support.waiting import wait_until

DOC = " ".join(f"clause {i}: the parties agree that the term shall be five years."
               for i in range(60))


def _body(model: str, question: str) -> dict[str, object]:
    return {"model": model, "max_tokens": 2, "prompt": f"{DOC}\n\nQ: {question}"}


def test_explaining_another_models_request_shows_its_own_state(serve: Serve) -> None:
    replicas = [(f"{m}{i}", serve(fake_replica(Behaviour(f"{m}{i}", model=m))).url)
                for m in ("alpha", "beta") for i in range(2)]
    gw = start_gateway(serve, replicas, policy={"name": "cost"})
    wait_until(lambda: len(httpx.get(f"{gw.url}/v1/models").json()["data"]) == 2, 10,
               "both models listed")
    for i in range(12):  # one document asked again and again: hot, placed for alpha
        r = httpx.post(f"{gw.url}/v1/completions", json=_body("alpha", str(i)))
        assert r.status_code == 200, r.text
    explained = {m: httpx.post(f"{gw.admin}/admin/explain", headers=AUTH,
                               json=_body(m, "again")).json() for m in ("alpha", "beta")}
    placed = explained["alpha"]["policy_state"]["placed_hot_tokens"]
    assert placed and all(rid.startswith("alpha") for rid in placed), explained["alpha"]
    assert not explained["beta"]["policy_state"]["placed_hot_tokens"], explained["beta"]
    assert explained["beta"]["chosen"].startswith("beta")
