"""With worker processes only worker 0 serves ``/admin/prefix-report``: a follower keeps
no ring of recent request bodies that nothing could read."""

from __future__ import annotations

from multiprocessing import shared_memory
from pathlib import Path

from gateway.capture import CaptureConfig, PrefixReportConfig
from gateway.config import GatewayConfig, ReplicaConfig
from gateway.request_parse import parse_body
from gateway.shared_load import SharedLoad
from gateway.state import build_state
from gateway.workers import share_of
from tests.support.shared_blocks import new_load_block


def test_only_the_worker_serving_the_prefix_report_keeps_its_ring() -> None:
    config = GatewayConfig(replicas=[ReplicaConfig("r0", "http://127.0.0.1:9")],
                           prefix_report=PrefixReportConfig(enabled=True))
    raw = b'{"model": "m", "prompt": "a prompt no follower need keep", "max_tokens": 2}'
    kept: dict[int, int] = {}
    block = new_load_block(workers=3, slots=4)
    try:
        for index in range(3):
            load = SharedLoad(shared_memory.SharedMemory(block.name), 3, index, 4)
            gw = build_state(share_of(config, 3, index), shared=load)
            gw.capture.observe(parse_body(raw, "completions"), None, len(raw))
            kept[index] = 0 if gw.capture.recent is None else len(gw.capture.recent)
            load.close()
    finally:
        block.close()
        block.unlink()
    assert kept == {0: 1, 1: 0, 2: 0}
    assert share_of(config, 3, 0).prefix_report == config.prefix_report


def test_a_follower_with_the_capture_log_on_keeps_no_ring(tmp_path: Path) -> None:
    # the capture log turns the ring on too (the report reads it): a follower, which
    # serves no report, writes its log and keeps no ring
    config = GatewayConfig(replicas=[ReplicaConfig("r0", "http://127.0.0.1:9")],
                           capture=CaptureConfig(path=str(tmp_path / "capture.jsonl")))
    block = new_load_block(workers=2, slots=4)
    try:
        kept = {}
        for index in range(2):
            load = SharedLoad(shared_memory.SharedMemory(block.name), 2, index, 4)
            gw = build_state(share_of(config, 2, index), shared=load)
            assert gw.capture.log is not None
            kept[index] = gw.capture.recent is not None
            load.close()
        assert kept == {0: True, 1: False}
    finally:
        block.close()
        block.unlink()
