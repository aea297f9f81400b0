"""The access log's way to standard error: a reader that falls behind holds no request
up, and what is dropped is counted."""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Iterator

import pytest

from gateway.access_log import AccessLog

ACCESS = logging.getLogger("kvgate.access")


@pytest.fixture
def fresh_access_logger() -> Iterator[None]:
    """The access logger without the handlers earlier tests left on it (they hold the
    standard error of their time), restored after."""
    saved = ACCESS.handlers[:]
    for handler in saved:
        ACCESS.removeHandler(handler)
    yield
    for handler in ACCESS.handlers[:]:
        ACCESS.removeHandler(handler)
    for handler in saved:
        ACCESS.addHandler(handler)


def test_a_stalled_stderr_holds_no_request_and_dropped_lines_are_counted(
        fresh_access_logger: None, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    read_end, write_end = os.pipe()
    stderr = os.fdopen(write_end, "w")  # a pipe nobody reads yet: full after 64 KiB
    monkeypatch.setattr(sys, "stderr", stderr)
    access = AccessLog(True)
    sent = 10_000  # about 1.7 MB of lines

    def requests_end() -> None:
        for i in range(sent):
            access.write(request_id=f"req-{i}", tenant="acme", model="sim-model",
                         replica="r0", route="affinity", status="200", prompt_tokens=10,
                         cached_tokens=4, ttft_s=0.01, duration_s=0.02)

    ending = threading.Thread(target=requests_end)
    received = bytearray()
    reader = threading.Thread(target=lambda: received.extend(_read_all(read_end)))
    try:
        with caplog.at_level(logging.WARNING, logger="kvgate.gateway"):
            ending.start()
            ending.join(10)
            stalled = ending.is_alive()
            reader.start()  # the reader comes back
            ending.join(30)
            drained = [handler.drain(10) for handler in ACCESS.handlers
                       if hasattr(handler, "drain")]
            stderr.close()  # the reader sees the end of what was written
            reader.join(10)
        assert not stalled, "a request's end waited for standard error"
        assert drained == [True]
        lines = bytes(received).splitlines()
        told = [int(m.group(1)) for r in caplog.records
                if (m := re.match(r"access log: (\d+) lines dropped", r.getMessage()))]
        assert told and sum(told) == sent - len(lines)
        assert len(lines) >= 8192 and lines[0].startswith(b'{"id":"req-0",')
    finally:
        ending.join(30)
        if not stderr.closed:
            stderr.close()
        reader.join(10)


def _read_all(fd: int) -> bytes:
    chunks = []
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read1(1 << 16):
            chunks.append(chunk)
    return b"".join(chunks)
