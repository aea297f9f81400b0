"""``kvgate engine --drain-timeout-s``: after SIGTERM the engine lets the requests in flight
run that long; a stream still open then ends with its error event (a 503's type, naming
the drain), never a clean end, and the engine exits. A second SIGTERM stops it at once,
drain timeout or none. Before, the drain had no end: a stream with no ``max_tokens`` kept
the engine up until SIGKILL."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from tests.support.processes import Processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _engine(spawn: Processes, *flags: str) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = spawn("engine", "--executor", "sim", "--model-name", "sim", "--kv-cache-gib", "1",
                 "--max-model-len", "4096", "--port", str(port), *flags,
                 ready_url=url + "/health")
    return proc, url


def _endless_stream(url: str) -> Iterator[str]:
    """The data lines of a completion streamed with no ``max_tokens`` (it runs to the end
    of the context, far past the test)."""
    body = {"model": "sim", "prompt": "a story", "max_tokens": None, "ignore_eos": True,
            "stream": True}
    with httpx.Client(timeout=30) as client, \
            client.stream("POST", url + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                yield line[6:]


def test_a_stream_open_at_the_drain_timeout_ends_with_an_error_event(spawn: Processes
                                                                    ) -> None:
    proc, url = _engine(spawn, "--drain-timeout-s", "0.5")
    datas = []
    for data in _endless_stream(url):
        datas.append(data)
        if len(datas) == 1:  # it runs: the engine is told to stop
            proc.send_signal(signal.SIGTERM)
    assert datas[-1] == "[DONE]"
    error = json.loads(datas[-2])["error"]  # not a clean end: the error, then [DONE]
    assert error["type"] == "service_unavailable"
    assert "still running at the end of its 0.5 s drain" in error["message"]
    assert all("choices" in json.loads(d) for d in datas[:-2])
    assert proc.wait(timeout=30) is not None  # and the engine is gone


@pytest.mark.parametrize("flags", [(), ("--drain-timeout-s", "600")])
def test_a_second_sigterm_stops_the_engine_at_once(spawn: Processes, flags: tuple[str, ...]
                                                   ) -> None:
    proc, url = _engine(spawn, *flags)
    chunks = 0
    with pytest.raises(httpx.HTTPError):  # the stream is cut: the engine is gone
        for _ in _endless_stream(url):
            chunks += 1
            # the first, then (still draining, the stream still going) the second
            if chunks in (1, 20):
                proc.send_signal(signal.SIGTERM)
    assert chunks >= 20
    assert proc.wait(timeout=30) is not None
