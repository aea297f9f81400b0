"""``kvgate audit`` over a line longer than any capture record (``/dev/zero``'s one line
grew to gigabytes): read past in pieces, in memory bounded by the line bound, counted among
the lines not readable and named in a note of its own."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from gateway.audit_cli import MAX_LINE_BYTES, LongLines, read_records
from kvgate.cli import main

LONG = 24 << 20  # bytes of the long line, with no newline for most of it
BOUND = 64 << 10


def _line(i: int) -> bytes:
    return json.dumps({"ts": i, "model": "m", "tenant": None, "endpoint": "completions",
                       "body": {"model": "m", "prompt": f"request {i}"}}).encode() + b"\n"


def _log(path: Path, long_bytes: int) -> Path:
    with path.open("wb") as f:
        f.write(_line(0))
        f.write(b"\0" * long_bytes + b"\n")
        f.write(_line(1))
        f.write(b"x" * (BOUND - 1) + b"\n")  # at the bound (with its newline): read
        f.write(b"y" * (3 * BOUND))  # the last line, over it, and with no newline
    return path


def test_a_line_over_the_bound_is_counted_in_memory_bounded_by_it(tmp_path: Path) -> None:
    log = _log(tmp_path / "c.jsonl", LONG)
    long_lines = LongLines()
    tracemalloc.start()
    try:
        records, bad = read_records([log], keep=10, max_line_bytes=BOUND,
                                    long_lines=long_lines)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [r.ts for r in records] == [0, 1]
    assert long_lines.count == 2 and bad == 3  # the two long, and the one of x's
    # the long line read whole held all of its 24 MiB (twice, joined)
    assert peak < 4 << 20, f"peak {peak} bytes reading a line of {LONG} bytes"


def test_the_default_bound_is_past_any_record_a_gateway_writes() -> None:
    from gateway.capture import CaptureConfig
    from gateway.config import GatewayConfig

    largest_written = int(CaptureConfig().max_mb * (1 << 20)) // 2  # CaptureLog's file
    assert 2 * largest_written <= MAX_LINE_BYTES
    assert 16 * GatewayConfig().max_body_bytes <= MAX_LINE_BYTES


def test_the_cli_names_the_long_lines_it_skipped(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    log = _log(tmp_path / "c.jsonl", 1 << 20)
    assert main(["audit", "--max-line-mb", str(BOUND / (1 << 20)), str(log)]) == 0
    out, err = capsys.readouterr()
    assert "2 requests" in out and "(3 not readable)" in out
    assert "2 lines longer than 0.0625 MiB skipped" in err
    assert main(["audit", "--max-line-mb", "0", str(log)]) == 2
    assert "--max-line-mb must be from 9.5e-07 (one byte) to 4398046511104 MiB, got 0.0" \
        in capsys.readouterr().err


def test_the_cli_refuses_a_line_bound_under_one_byte(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _log(tmp_path / "c.jsonl", 0)
    assert main(["audit", "--max-line-mb", "1e-7", str(log)]) == 2  # 0.1 bytes
    out, err = capsys.readouterr()
    assert out == ""
    assert "--max-line-mb must be from 9.5e-07 (one byte) to 4398046511104 MiB, got 1e-07" \
        in err
