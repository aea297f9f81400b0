"""With worker processes the capture log's bounds are the box's: each worker's log (its
own file, ``path.w<i>``) and queue take a share, so the box's files stay under
``capture.max_mb`` as one gateway's do, and its queues under ``capture.queue_mb``."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.capture import Capture, CaptureConfig, PrefixReportConfig
from gateway.config import GatewayConfig
from gateway.workers import share_of

MIB = 1 << 20


@pytest.mark.parametrize("workers", [1, 3, 4])
def test_the_workers_capture_logs_together_stay_under_the_configured_bounds(
        tmp_path: Path, workers: int) -> None:
    config = GatewayConfig(capture=CaptureConfig(path=str(tmp_path / "capture.jsonl"),
                                                 max_mb=256, queue=1000, queue_mb=64))
    logs = [Capture(share_of(config, workers, i).capture, PrefixReportConfig()).log
            for i in range(workers)]
    assert all(log is not None for log in logs)
    # a log and its rotated predecessor: two files of at most max_file_bytes each
    on_disk = sum(2 * log.max_file_bytes for log in logs if log is not None)
    assert 256 * MIB - 4 * workers <= on_disk <= 256 * MIB  # (whole bytes, halved)
    assert sum(log.queue_bytes for log in logs if log is not None) <= 64 * MIB
    assert sum(log.queue_size for log in logs if log is not None) >= 1000
    assert len({log.path for log in logs if log is not None}) == workers
