"""A replica that ends its streams cleanly but without their last event (``[DONE]``) cuts
them short: each is counted ``cause="cut_short"`` and logged as ended before its last
event, and a run of ``health.request_failures_to_eject`` such cuts ejects the replica
though its whole (non-streamed) answers between them succeed. A stream relayed whole ends
the run."""

from __future__ import annotations

import logging

import httpx
import pytest

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import AUTH, Gateway, Serve, metric, start_gateway

BODY = {"model": "sim-model", "prompt": "x", "max_tokens": 3}


def _healthy(gw: Gateway, replica: str) -> bool:
    listed = httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH).json()["replicas"]
    return {r["id"]: r["healthy"] for r in listed}[replica]


def _whole(gw: Gateway) -> None:
    r = httpx.post(f"{gw.url}/v1/completions", json=BODY, timeout=10)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "stop"


def _stream(gw: Gateway) -> str:
    r = httpx.post(f"{gw.url}/v1/completions", json={**BODY, "stream": True}, timeout=10)
    assert r.status_code == 200
    return r.text


def test_a_replica_cutting_every_stream_is_ejected_though_its_whole_answers_succeed(
        serve: Serve, caplog: pytest.LogCaptureFixture) -> None:
    replica = Behaviour("r7", done=False)
    gw = start_gateway(serve, [("r7", serve(fake_replica(replica)).url)], max_attempts=1)
    caplog.set_level(logging.WARNING, "kvgate.proxy")
    for _ in range(3):  # request_failures_to_eject: 3
        assert _healthy(gw, "r7")
        _whole(gw)  # each opened and answered whole between the cuts
        text = _stream(gw)
        assert "[DONE]" not in text and '"code":"upstream_broken"' in text
    assert not _healthy(gw, "r7")
    assert metric(gw, 'kvgate_upstream_cuts_total{cause="cut_short",replica="r7"}') == 3
    assert metric(gw, 'kvgate_upstream_cuts_total{cause="broken",replica="r7"}') == 0
    said = [r.getMessage() for r in caplog.records if r.name == "kvgate.proxy"]
    assert sum("ended its stream before its last event" in m for m in said) == 3, said
    assert not any("broke the connection" in m for m in said), said
    assert any("ejected after 3 streams in a row cut" in m for m in said), said


def test_a_stream_relayed_whole_ends_a_run_of_cuts(serve: Serve) -> None:
    replica = Behaviour("r7")
    gw = start_gateway(serve, [("r7", serve(fake_replica(replica)).url)], max_attempts=1)
    for _ in range(3):
        replica.done = False
        assert "[DONE]" not in _stream(gw)
        replica.done = True
        assert _stream(gw).rstrip().endswith("data: [DONE]")
        _whole(gw)
    assert metric(gw, 'kvgate_upstream_cuts_total{cause="cut_short",replica="r7"}') == 3
    assert _healthy(gw, "r7")
