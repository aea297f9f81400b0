"""``kvgate audit``'s reading of capture logs: what it reports as read and as skipped."""

from __future__ import annotations

import json
from pathlib import Path

from gateway.audit_cli import read_records


def _line(i: int) -> str:
    return json.dumps({"ts": i, "model": "m", "tenant": None, "endpoint": "completions",
                       "body": {"model": "m", "prompt": f"request {i}"}})


def test_only_unreadable_lines_among_the_requests_read_are_counted(tmp_path: Path) -> None:
    """With ``--max-requests`` 10 of a log whose first lines are broken (a file cut by a
    crash, then rotated into ``.1``), the report said the broken lines it never reached
    were skipped among its 10 requests."""
    old, new = tmp_path / "c.jsonl.1", tmp_path / "c.jsonl"
    old.write_text("".join(f"{_line(i)}\n" for i in range(20)) + '{"ts": 20, "mo\n')
    new.write_text("not json\n" + "".join(f"{_line(i)}\n" for i in range(21, 31))
                   + "{broken\n" + "".join(f"{_line(i)}\n" for i in range(31, 35)))
    records, bad = read_records([old, new], keep=10)
    assert [r.ts for r in records] == list(range(25, 35)) and bad == 1
    records, bad = read_records([old, new], keep=100)  # the whole of both: every one
    assert len(records) == 34 and bad == 3
    records, bad = read_records([old, new], keep=14)  # from 21 on: the one after it
    assert records[0].ts == 21 and bad == 1


def test_worker_processes_logs_are_merged_by_time(tmp_path: Path) -> None:
    """With worker processes each writes a log of its own (``PATH.w<i>``), their requests
    interleaved in time: read one file after the other, the audit kept the last file's
    requests and compared a conversation's turns out of order."""
    w0, w1 = tmp_path / "c.jsonl.w0", tmp_path / "c.jsonl.w1"
    w0.write_text("".join(f"{_line(i)}\n" for i in range(0, 20, 2)) + "{cut\n")
    w1.write_text("".join(f"{_line(i)}\n" for i in range(1, 20, 2)))
    records, bad = read_records([w0, w1], keep=100)
    assert [r.ts for r in records] == list(range(20)) and bad == 1
    records, bad = read_records([w1, w0], keep=5)  # the latest of both, whatever order
    assert [r.ts for r in records] == list(range(15, 20)) and bad == 1
    records, bad = read_records([w0, w1], keep=4)  # w0's last (18) kept: the line after it counts
    assert [r.ts for r in records] == [16, 17, 18, 19] and bad == 1
    records, bad = read_records([w0, w1], keep=1)  # w0's last not kept: nor the line after it
    assert [r.ts for r in records] == [19] and bad == 0
