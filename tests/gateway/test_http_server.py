"""The gateway's HTTP server bounds what a client can make it hold: the request head's
size and the time to send it; and it writes a response head with the body's first bytes
when they follow at once, without holding it for a body that comes later."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator

import pytest
import uvicorn

from gateway.config import parse_config
from gateway.http_server import HeadWithBody, server_config
from tests.support.servers import free_port, gateway_server
from tests.support.waiting import wait_until


async def ok_app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def port() -> Iterator[int]:
    with gateway_server(ok_app, {"max_header_bytes": 8192, "header_timeout_s": 0.5}) \
            as (_, port):
        yield port


def exchange(port: int, data: bytes, wait: float = 3.0, half_close: bool = False) -> bytes:
    """What came back for ``data`` (with ``half_close``, the client's half of the
    connection shut after it)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(wait)
        with contextlib.suppress(OSError):  # closed on us mid-send: read what it said
            sock.sendall(data)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except (TimeoutError, ConnectionResetError):
            pass
        return b"".join(chunks)


def test_a_huge_request_head_gets_431(port: int) -> None:
    answer = exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000)
    assert answer.startswith(b"HTTP/1.1 431")
    assert b"\r\nx-request-id: gw-" in answer.split(b"\r\n\r\n")[0]  # a new one: no head


@pytest.mark.parametrize("size", [8193, 20_000, 60_000])
def test_a_head_over_the_limit_gets_431_even_when_it_ends_in_one_read(port: int,
                                                                     size: int) -> None:
    # the whole head (and its blank line) arrives in one read, as a small one does
    head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: "
    head += b"a" * (size - len(head) - 4) + b"\r\n\r\n"
    assert len(head) == size
    assert exchange(port, head).startswith(b"HTTP/1.1 431")
    # ... and so does the next request's head on a kept-alive connection
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(3)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        sock.sendall(head)
        assert sock.recv(65536).startswith(b"HTTP/1.1 431")


def test_a_pipelined_head_whose_blank_line_spans_two_reads_is_measured_right(
        port: int) -> None:
    # request 2's head starts in request 1's read and ends, with its body, in the next
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(3)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 30000\r\n\r")
        time.sleep(0.2)
        sock.sendall(b"\n" + b"b" * 30000)
        answer = b""
        with contextlib.suppress(TimeoutError):
            while answer.count(b"HTTP/1.1 ") < 2 and (chunk := sock.recv(65536)):
                answer += chunk
    assert answer.count(b"HTTP/1.1 200") == 2, answer[:300]


def test_a_head_at_the_limit_with_a_body_in_the_same_read_passes(port: int) -> None:
    body = b"b" * 30_000
    head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nX-Pad: " % len(body)
    head += b"a" * (8192 - len(head) - 4) + b"\r\n\r\n"
    assert exchange(port, head + body, wait=1.0).startswith(b"HTTP/1.1 200")


def test_past_max_connections_only_the_new_connection_is_refused() -> None:
    config = parse_config({"port": free_port(), "limits": {"max_connections": 3}})
    server = uvicorn.Server(server_config(ok_app, config, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 10, "the server to start")
    held = [socket.create_connection(("127.0.0.1", config.port)) for _ in range(3)]
    try:
        time.sleep(0.2)
        answer = exchange(config.port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503") and b"\r\nretry-after: 1" in head
        assert json.loads(body)["error"]["code"] == "too_many_connections"
        assert json.loads(body)["error"]["type"] == "service_unavailable"
        for sock in held:  # the connections within the limit are served
            sock.settimeout(3)
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    finally:
        for sock in held:
            sock.close()
        server.should_exit = True
        thread.join(5)


def test_a_head_that_never_ends_gets_408(port: int) -> None:
    started = time.monotonic()
    answer = exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: a")
    assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - started < 2


def test_normal_requests_and_kept_alive_ones_pass(port: int) -> None:
    two = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 2
    answer = exchange(port, two, wait=1.0)
    assert answer.count(b"HTTP/1.1 200") == 2


def test_an_answer_without_a_body_reaches_a_client_that_half_closed(port: int) -> None:
    # a HEAD answer is a head alone, held to the end of the turn; the client's end of
    # input, read meanwhile, makes the loop close the connection: the head goes out first
    heads = [exchange(port, b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n", half_close=True)
             for _ in range(40)]
    assert all(h.startswith(b"HTTP/1.1 200") for h in heads), \
        f"{sum(not h for h in heads)} of {len(heads)} got no answer"
    got = exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", half_close=True)
    assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"\r\nok\r\n0\r\n\r\n"), got


class _Recorder:
    """A transport that records what is asked of it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", bytes(data)))

    def writelines(self, lines: Iterable[bytes]) -> None:  # one gathered write
        self.calls.append(("writelines", b"".join(lines)))

    def close(self) -> None:
        self.calls.append(("close", b""))
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


def _held(steps: Callable[[HeadWithBody], Awaitable[None]]) -> list[tuple[str, bytes]]:
    async def main() -> list[tuple[str, bytes]]:
        recorder = _Recorder()
        await steps(HeadWithBody(recorder, asyncio.get_running_loop()))  # type: ignore[arg-type]
        await asyncio.sleep(0)  # a turn of the loop for anything scheduled
        return recorder.calls

    return asyncio.run(main())


def test_a_head_and_the_body_after_it_in_the_same_turn_go_out_in_one_write() -> None:
    async def steps(t: HeadWithBody) -> None:
        t.write(HEAD)
        t.write(b"ok")
        t.write(b"more")  # anything later is written as it comes

    assert _held(steps) == [("write", HEAD + b"ok"), ("write", b"more")]


def test_a_large_body_goes_out_with_its_head_in_one_gathered_write() -> None:
    body = b"x" * (1 << 20)

    async def steps(t: HeadWithBody) -> None:
        t.write(HEAD)
        t.write(body)

    assert _held(steps) == [("writelines", HEAD + body)]


def test_a_head_alone_goes_out_at_the_end_of_the_turn() -> None:
    async def steps(t: HeadWithBody) -> None:
        t.write(HEAD)
        await asyncio.sleep(0.01)  # the body comes turns later (a stream's first token)
        t.write(b"ok")

    assert _held(steps) == [("write", HEAD), ("write", b"ok")]


def test_a_held_head_is_written_before_the_connection_closes() -> None:
    async def steps(t: HeadWithBody) -> None:
        t.write(HEAD)
        t.close()

    assert _held(steps) == [("write", HEAD), ("close", b"")]


def test_bodies_pass_at_once_and_the_rest_of_the_transport_is_the_connections() -> None:
    async def steps(t: HeadWithBody) -> None:
        t.write(b"HTTP/1.1 in a body, not a head")
        assert t.get_extra_info("peername") == "info:peername"

    assert _held(steps) == [("write", b"HTTP/1.1 in a body, not a head")]


async def slow_body_app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await asyncio.sleep(0.5)
        await send({"type": "http.response.body", "body": b"late"})


def test_a_head_is_not_held_for_a_body_that_comes_later() -> None:
    config = parse_config({"port": free_port()})
    server = uvicorn.Server(server_config(slow_body_app, config, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 10, "the server to start")
        with socket.create_connection(("127.0.0.1", config.port)) as sock:
            sock.settimeout(3)
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            started = time.monotonic()
            first = sock.recv(65536)
            took = time.monotonic() - started
            rest = b""
            while b"late" not in first + rest:
                rest += sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200") and b"late" not in first
        assert took < 0.4  # the head came before the body was sent
    finally:
        server.should_exit = True
        thread.join(5)


def test_pipelined_requests_are_answered_in_turn_and_bounded(port: int) -> None:
    request = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    few = exchange(port, request * 10, wait=1.0)
    assert few.count(b"HTTP/1.1 200") == 10
    # a client pipelining hundreds without reading the answers: refused, not queued
    flood = exchange(port, request * 500, wait=2.0)
    assert b"HTTP/1.1 429" in flood and b"too_many_pipelined_requests" in flood
    refusal = flood[flood.index(b"HTTP/1.1 429"):]
    assert b"\r\nretry-after: 1\r\n" in refusal.split(b"\r\n\r\n")[0]  # as every 429
    assert flood.count(b"HTTP/1.1 200") < 100


def test_a_request_answered_before_its_body_came_closes_its_connection(port: int) -> None:
    # the app answers without reading the body; the client trickles the rest of it
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(3)
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"a" * 10)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        closed_at = None
        started = time.monotonic()
        while time.monotonic() - started < 2.5:
            try:
                sock.sendall(b"a")
                if sock.recv(65536) == b"":
                    closed_at = time.monotonic()
                    break
            except TimeoutError:
                continue
            except OSError:
                closed_at = time.monotonic()
                break
        assert closed_at is not None  # not held open while the body trickles in


def test_a_body_that_follows_its_answer_at_once_keeps_the_connection(port: int) -> None:
    # a client that sends its head, then its body: answered in between (the app reads
    # no body), it may go on using the connection
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(3)
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        time.sleep(0.05)
        sock.sendall(b"0123456789" + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")


def test_malformed_http_gets_an_openai_shaped_400(port: int) -> None:
    answer = exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
                            b"Transfer-Encoding: chunked\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head
    assert json.loads(body)["error"]["code"] == "invalid_http"


def test_max_connections_fits_the_open_files_the_process_may_hold() -> None:
    # in a process of its own: its hard limit is lowered for good
    script = (
        "import resource\n"
        "from gateway.config import parse_config\n"
        "from gateway.http_server import fit_open_files\n"
        "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (300, hard))\n"
        "raised = fit_open_files(parse_config({'limits': {'max_connections': 1000}}))\n"
        "print(raised.limits.max_connections, resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (300, 1000))\n"
        "cut = fit_open_files(parse_config({'limits': {'max_connections': 4096}}))\n"
        "print(cut.limits.max_connections, resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=60)
    # the soft limit raised to what 4,096 connections need; where the hard limit is too
    # low, the connections cut to fit it
    assert out.stdout.split() == ["1000", str(1000 * 2 + 256), str((1000 - 256) // 2), "1000"]
    assert "serving at most 372 connections" in out.stderr
