"""The capture log on a disk that takes nothing (``/dev/full``) or part of a line: a record
counts as written only once all of its line is in the file, one that failed counts as
lost (``kvgate_capture_records_dropped{cause="unwritten"}``), and the failures are logged
a line per ``FAILED_LOG_S`` with the count since, not a line per failed batch."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gateway.capture_log import FAILED_LOG_S, CaptureLog
from tests.support.waiting import wait_until_async

LINE = b'{"n": %4d, "pad": "' + b"x" * 77 + b'"}\n'  # 100 bytes


async def test_a_full_disk_counts_every_record_lost_and_warns_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "full.jsonl"
    path.symlink_to("/dev/full")
    caplog.set_level(logging.WARNING, logger="kvgate.capture")
    log = CaptureLog(str(path), 1 << 20, queue=16)
    await log.start()
    for n in range(100):  # 25 batches, as requests come
        log.offer(LINE % n)
        if n % 4 == 3:
            await wait_until_async(lambda done=n + 1: log.written + log.dropped >= done,
                                   5.0, "the writer to take the records")
    await log.stop()
    assert log.written == 0
    assert log.dropped_large == 100 and log.dropped_full == 0
    warnings = [r.getMessage() for r in caplog.records if r.name == "kvgate.capture"]
    assert FAILED_LOG_S >= 1.0  # the 100 failures come well within it
    assert len(warnings) == 1, warnings
    assert "cannot write (No space left on device)" in warnings[0]


# Run in a process of its own: the file size limit it sets is the whole process's.
_PART_OF_A_LINE = textwrap.dedent("""
    import asyncio, resource, signal, sys
    from gateway.capture_log import CaptureLog

    LINE = b'{"n": %4d, "pad": "' + b"x" * 77 + b'"}\\n'  # 100 bytes

    async def main(path):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (250, hard))  # 2.5 lines
        log = CaptureLog(path, 1 << 20, queue=16)
        await log.start()
        for n in range(4):  # one batch: two lines whole, half of the third
            log.offer(LINE % n)
        while log.written + log.dropped < 4:
            await asyncio.sleep(0.01)
        print(log.written, log.dropped, flush=True)
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # space again
        for n in range(4, 6):
            log.offer(LINE % n)
        await log.stop()
        print(log.written, log.dropped, flush=True)

    asyncio.run(main(sys.argv[1]))
""")


def test_a_line_written_in_part_is_counted_lost_and_ended_before_the_next(
        tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    done = subprocess.run([sys.executable, "-c", _PART_OF_A_LINE, str(path)],
                          capture_output=True, text=True, timeout=30,
                          cwd=Path(__file__).resolve().parents[2],
                          env={**os.environ, "PYTHONWARNINGS": "error"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["2 2", "4 2"]
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""  # the file ends in a whole line
    parsed = []
    for line in lines[:-1]:
        try:
            parsed.append(json.loads(line)["n"])
        except ValueError:
            parsed.append(None)
    assert parsed == [0, 1, None, 4, 5]  # the third's part, alone on its line
