"""With worker processes only worker 0 serves ``/admin/prefix-report``: a follower keeps
no ring of recent request bodies that nothing could read."""

from __future__ import annotations

from gateway.capture import PrefixReportConfig
from gateway.config import GatewayConfig, ReplicaConfig
from gateway.request_parse import parse_body
from gateway.state import build_state
from gateway.workers import share_of


def test_only_the_worker_serving_the_prefix_report_keeps_its_ring() -> None:
    config = GatewayConfig(replicas=[ReplicaConfig("r0", "http://127.0.0.1:9")],
                           prefix_report=PrefixReportConfig(enabled=True))
    raw = b'{"model": "m", "prompt": "a prompt no follower need keep", "max_tokens": 2}'
    kept: dict[int, int] = {}
    for index in range(3):
        gw = build_state(share_of(config, 3, index))
        gw.capture.observe(parse_body(raw, "completions"), None, len(raw))
        kept[index] = 0 if gw.capture.recent is None else len(gw.capture.recent)
    assert kept == {0: 1, 1: 0, 2: 0}
    assert share_of(config, 3, 0).prefix_report == config.prefix_report
