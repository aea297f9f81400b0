"""A captured prompt of token ids the tokenizer cannot decode (SGLang's /generate passes
``input_ids`` through unchecked, a negative one included) is a request the audit skips
and counts, never the end of the audit or of ``kvgate audit``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.capture import CaptureRecord, record_of
from gateway.layout_audit import audit
from gateway.request_parse import parse_body
from kvgate.cli import main
from kvwire.tokenizer import load_tokenizer

READABLE = {"model": "m", "prompt": "You are a contracts assistant. Question one?"}
UNDECODABLE = [
    ({"model": "m", "input_ids": [1, 2, -4]}, "generate"),  # as the gateway served it
    ({"model": "m", "input_ids": [1, 2, 1 << 40]}, "generate"),
]


def _captured() -> list[CaptureRecord]:
    bodies = [(READABLE, "completions"), *UNDECODABLE, (READABLE, "completions")]
    out = []
    for body, endpoint in bodies:
        raw = json.dumps(body).encode()
        out.append(record_of(parse_body(raw, endpoint), None, len(raw)))
    return out


def test_undecodable_token_ids_are_skipped_and_counted() -> None:
    report = audit(_captured(), load_tokenizer())
    assert (report.requests, report.skipped) == (2, 2)


def test_kvgate_audit_reports_a_log_with_undecodable_token_ids(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "capture.jsonl"
    log.write_bytes(b"".join(record.to_json() for record in _captured()))
    assert main(["audit", str(log)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("2 requests, ") and first.endswith("(2 not readable)")
