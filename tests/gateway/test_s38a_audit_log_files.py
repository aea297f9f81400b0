"""``kvgate audit`` over the files a gateway writes: the rotated ``PATH.1`` that the docs
name beside ``PATH`` may not exist yet (no rotation so far): the audit reads those that
exist, says which were left out, and fails only when none exists. With worker processes
the gateway writes ``PATH.w<i>`` (and ``PATH.w<i>.1``) beside an empty ``PATH``: the audit
of ``PATH`` reads them, and says so."""

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


def _workers(tmp_path: Path) -> Path:
    log = tmp_path / "capture.jsonl"
    log.write_text("")
    _write(tmp_path / "capture.jsonl.w0.1", 0, 2)
    _write(tmp_path / "capture.jsonl.w0", 2, 2)
    _write(tmp_path / "capture.jsonl.w1", 4, 3)
    for other in ("capture.jsonl.w1.2", "capture.jsonl.wx", "capture.jsonl.w2.bak",
                  "other.jsonl.w3"):
        _write(tmp_path / other, 10, 5)  # none of the gateway's: never read
    return log


def test_an_empty_capture_path_stands_for_its_workers_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _workers(tmp_path)
    for args in ([str(log)], [f"{log}.1", str(log)]):
        assert main(["audit", *args]) == 0
        out = capsys.readouterr()
        assert out.out.startswith("7 requests, "), out
        assert out.err.endswith(
            f"kvgate audit: {log} holds no record; reading the files of the gateway's "
            f"worker processes beside it: {log}.w0.1, {log}.w0, {log}.w1\n"), out.err


def test_workers_files_named_too_are_read_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _workers(tmp_path)
    assert main(["audit", f"{log}.w0", str(log)]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("7 requests, "), out  # w0 once, not 9: w0.1 and w1 added
    assert f"beside it: {log}.w0.1, {log}.w1\n" in out.err
