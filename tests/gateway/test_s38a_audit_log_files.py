"""``kvgate audit`` over the files a gateway writes: the rotated ``PATH.1`` that the docs
name beside ``PATH`` may not exist yet (no rotation so far): the audit reads those that
exist, says which were left out, and fails only when none exists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate.cli import main


def _write(path: Path, first: int, count: int) -> Path:
    lines = [json.dumps({"ts": 1.0 + i, "model": "m", "tenant": None,
                         "endpoint": "completions",
                         "body": {"model": "m", "prompt": f"Request {i}: tell me more."}})
             for i in range(first, first + count)]
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_a_rotation_not_made_yet_is_left_out_and_said(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _write(tmp_path / "capture.jsonl", 0, 3)
    assert main(["audit", f"{log}.1", str(log)]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("3 requests, ")
    assert out.err == f"kvgate audit: no such file, left out: {log}.1\n"


def test_no_log_at_all_is_an_error_naming_each(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "capture.jsonl"
    assert main(["audit", f"{log}.1", str(log)]) == 2
    assert capsys.readouterr().err == f"kvgate audit: no such file: {log}.1, {log}\n"
