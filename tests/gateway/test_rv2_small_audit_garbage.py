"""``kvgate audit`` over a log of unreadable lines: they are counted in memory that does not
grow with them."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

from gateway.audit_cli import read_records

GARBAGE = 30_000


def _line(i: int) -> str:
    return json.dumps({"ts": i, "model": "m", "tenant": None, "endpoint": "completions",
                       "body": {"model": "m", "prompt": f"request {i}"}})


def _bad_lines(n: int) -> str:
    return "not json\n" * n


def test_unreadable_lines_are_counted_in_bounded_memory(tmp_path: Path) -> None:
    log = tmp_path / "c.jsonl"
    log.write_text(_bad_lines(GARBAGE))
    tracemalloc.start()
    try:
        records, bad = read_records([log], keep=10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert records == [] and bad == GARBAGE
    # a line number kept per unreadable line held over 1 MB here (an int and a slot each)
    assert peak < 256 << 10, f"peak {peak} bytes reading {GARBAGE} unreadable lines"


def test_the_unreadable_lines_among_those_read_are_counted(tmp_path: Path) -> None:
    """Those after the first record kept; all of them when every record was kept."""
    log = tmp_path / "c.jsonl"
    log.write_text(_bad_lines(5) + f"{_line(0)}\n" + _bad_lines(2) + f"{_line(1)}\n"
                   + _bad_lines(3) + f"{_line(2)}\n" + _bad_lines(4))
    cases = {1: ([2], 4), 2: ([1, 2], 7), 3: ([0, 1, 2], 14), 50: ([0, 1, 2], 14)}
    for keep, (kept, bad) in cases.items():
        records, counted = read_records([log], keep=keep)
        assert ([r.ts for r in records], counted) == (kept, bad), keep
