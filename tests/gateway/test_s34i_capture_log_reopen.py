"""The capture log on a file it opens that is not as it left it: one still full after a
rotation (``PATH.1`` a hard link to ``PATH``, so the rename moves nothing) takes the record
anyway rather than waiting for room that never comes; one ending part-way through a line
has that line ended before the first record."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from gateway.capture_log import CaptureLog

LINE = b'{"n": %4d, "pad": "' + b"x" * 77 + b'"}\n'  # 100 bytes

# Run in a process of its own: a writer thread that never finishes cannot be stopped, so
# the subprocess's timeout is what bounds it.
_STILL_FULL = textwrap.dedent("""
    import asyncio, sys
    from gateway.capture_log import CaptureLog

    LINE = b'{"n": %4d, "pad": "' + b"x" * 77 + b'"}\\n'  # 100 bytes

    async def main(path):
        log = CaptureLog(path, 1000, queue=16)  # files of 500 bytes: the one there is full
        await log.start()
        for n in range(5, 7):
            log.offer(LINE % n)
        await log.stop()
        print(log.written, log.dropped, flush=True)

    asyncio.run(main(sys.argv[1]))
""")


def test_a_file_still_full_after_rotating_takes_the_record(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_bytes(b"".join(LINE % n for n in range(5)))  # 500 bytes: full
    os.link(path, tmp_path / "c.jsonl.1")  # renaming PATH to PATH.1 leaves it in place
    done = subprocess.run([sys.executable, "-c", _STILL_FULL, str(path)],
                          capture_output=True, text=True, timeout=20,
                          cwd=Path(__file__).resolve().parents[2],
                          env={**os.environ, "PYTHONWARNINGS": "error"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "2 0"
    assert path.read_bytes() == b"".join(LINE % n for n in range(7))


async def test_a_file_opened_ending_in_part_of_a_line_is_ended_before_the_first_record(
        tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_bytes(LINE % 0 + (LINE % 1)[:40])  # a writer stopped part-way through
    log = CaptureLog(str(path), 1 << 20, queue=16)
    await log.start()
    log.offer(LINE % 2)
    await log.stop()
    assert log.written == 1
    assert path.read_bytes().split(b"\n") == [
        (LINE % 0)[:-1], (LINE % 1)[:40], (LINE % 2)[:-1], b""]

