"""The capture log's bounds hold while a batch is being written: lines taken off the queue
still count against ``queue`` and ``queue_bytes`` until the writer is done with them."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gateway.capture import CaptureRecord
from gateway.capture_log import CaptureLog
from tests.support.waiting import wait_until_async


def record(i: int) -> CaptureRecord:
    body = {"model": "m", "prompt": f"request {i:04d} " + "word " * 40}
    return CaptureRecord(1764547200.0 + i, "m", "acme", "completions", body, 100)


@pytest.mark.parametrize("bound", ["queue_bytes", "queue"])
async def test_a_batch_being_written_counts_against_the_bounds(tmp_path: Path,
                                                              bound: str) -> None:
    line = len(record(0).to_json())  # every record's line is as long
    held = 10
    size = {"queue": held, "queue_bytes": 1 << 30} if bound == "queue" else \
        {"queue": 1024, "queue_bytes": held * line}
    log = CaptureLog(str(tmp_path / "c.jsonl"), 1 << 20, **size)
    await log.start()
    # the writer's worker thread is busy (as on a disk that stalls): a batch taken off
    # the queue waits to be written
    release = threading.Event()
    workers = ThreadPoolExecutor(1)
    asyncio.get_running_loop().set_default_executor(workers)
    workers.submit(release.wait)
    try:
        for i in range(held):
            log.offer(record(i))
        queue = log._queue
        assert queue is not None and log.dropped_full == 0
        await wait_until_async(queue.empty, 10, "the writer to take the batch")
        for i in range(held, 2 * held):  # nothing was written: all are held still
            log.offer(record(i))
        assert log.dropped_full == held and log.queued_bytes == held * line
    finally:
        release.set()
    await log.stop()
    assert log.written == held and log.queued_bytes == 0
    lines = (tmp_path / "c.jsonl").read_bytes().splitlines()
    assert [CaptureRecord.from_json(x).ts for x in lines] == [record(i).ts for i in range(held)]
