"""``kvgate engine`` whose KV events endpoint, or replay endpoint, cannot be bound (another
socket holds its port, or both flags name one port) is refused as any other bad flag: one
line naming the flag and the endpoint, exit status 2, before it serves; not a traceback
and "Application startup failed" (exit 3)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from tests.support.processes import REPO


@pytest.fixture
def busy() -> Iterator[str]:
    """An endpoint a PUB socket of this test holds."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUB)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    try:
        yield f"tcp://127.0.0.1:{port}"
    finally:
        sock.close()
        ctx.term()


def _free_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _engine(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvgate", "engine", "--executor", "sim", "--model-name", "sim",
         "--kv-cache-gib", "1", "--port", _free_endpoint().rsplit(":", 1)[1], *flags],
        cwd=REPO, capture_output=True, text=True, timeout=60)


def _refused(result: subprocess.CompletedProcess[str], flag: str, endpoint: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if "kvgate engine:" in line]
    assert lines == [f"kvgate engine: {flag} {endpoint}: cannot bind: Address already in use"
                     ], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert "Application startup" not in result.stderr  # refused before it serves


def test_a_busy_kv_events_endpoint_is_refused_naming_the_flag(busy: str) -> None:
    _refused(_engine("--kv-events-endpoint", busy), "--kv-events-endpoint", busy)


def test_a_busy_replay_endpoint_is_refused_naming_the_flag(busy: str, tmp_path: Path
                                                           ) -> None:
    result = _engine("--kv-events-endpoint", f"ipc://{tmp_path}/kv-events",
                     "--kv-events-replay-endpoint", busy)
    _refused(result, "--kv-events-replay-endpoint", busy)


def test_both_endpoints_on_one_port_are_refused_naming_the_replay_flag() -> None:
    endpoint = _free_endpoint()
    result = _engine("--kv-events-endpoint", endpoint, "--kv-events-replay-endpoint", endpoint)
    _refused(result, "--kv-events-replay-endpoint", endpoint)
