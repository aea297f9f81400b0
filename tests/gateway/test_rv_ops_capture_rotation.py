"""The capture log after a rotation that fails: it goes on writing (a new file when the
old one was moved away), and every record offered is counted once, as written or as
lost."""

from __future__ import annotations

from pathlib import Path

from gateway.capture_log import CaptureLog
from tests.support.waiting import wait_until_async

LINE = b'{"n": %04d, "pad": "' + b"x" * 77 + b'"}\n'  # 100 bytes


async def _offer(log: CaptureLog, numbers: range) -> None:
    for n in numbers:
        log.offer(LINE % n)
        if n % 8 == 7:  # let the writer catch up, as traffic would
            await wait_until_async(lambda done=n + 1: log.written + log.dropped >= done,
                                   10, "the writer to take the queue")


async def test_a_log_moved_away_is_begun_again_at_its_path(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    log = CaptureLog(str(path), 4_000, queue=64)  # files of 2,000 bytes: 20 lines
    await log.start()
    await _offer(log, range(0, 8))
    moved = tmp_path / "moved.jsonl"
    path.rename(moved)  # an operator takes the log away; rotating it then finds no file
    await _offer(log, range(8, 40))
    await log.stop()
    assert log.dropped == 0 and log.written == 40

    def numbers(file: Path) -> list[int]:
        return [int(line[6:10]) for line in file.read_bytes().splitlines()]

    assert numbers(moved) == list(range(0, 20))  # written to it until it was full
    assert numbers(path) == list(range(20, 40))  # then a new file at its path

async def test_records_lost_to_a_failed_rotation_are_counted_once(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    blocker = path.with_name("c.jsonl.1")
    blocker.mkdir()
    (blocker / "keep").write_text("a folder where the rotated file would go")
    log = CaptureLog(str(path), 4_000, queue=64)
    await log.start()
    await _offer(log, range(0, 48))
    await log.stop()
    in_file = len(path.read_bytes().splitlines())
    assert log.written == in_file == 20  # the file filled, then could not rotate
    assert log.written + log.dropped == 48
