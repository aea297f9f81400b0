"""The access log's way to standard error: a reader that falls behind holds no request
up, and what is dropped is counted."""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.access_log import AccessLog
from gateway.app import create_app
from gateway.config import parse_config
from tests.support.access_lines import ACCESS, access_lines
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.observe_replicas import unlisted_replica
from tests.support.servers import ThreadServer
from tests.support.waiting import wait_until

Serve = Callable[..., ThreadServer]


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
    counted: list[int] = []  # what the gateway's kvgate_access_log_dropped_lines_total gets
    access = AccessLog(True, counted.append)
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
        assert told and sum(told) == sent - len(lines) == sum(counted)
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


def test_a_long_model_name_is_cut_in_its_line(serve: Serve) -> None:
    """A replica that lists no models: any model name is forwarded, and the client's
    2 MB name made a 2 MB access-log line."""
    replica = serve(unlisted_replica())
    with access_lines() as lines:
        config = parse_config({"replicas": [{"id": "r0", "url": replica.url}],
                               "scrape": {"enabled": False}, "access_log": True})
        url = serve(create_app(config)).url
        model = "m" * 2_000_000
        r = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": "x"},
                       timeout=30)
        assert r.status_code == 200
        wait_until(lambda: len(lines) == 1, 5, "the access line")
    (line,) = lines
    assert line["model"] == "m" * 256 + "... (2000000 characters)"
    assert line["status"] == "200" and line["prompt_tokens"] == 3


def test_a_retried_requests_times_count_from_its_arrival(serve: Serve) -> None:
    """A replica that takes 0.4 s to answer 500, and one that answers at once: a request
    tried on the first waited through both, and its line says so."""
    slow_behaviour = Behaviour("slow", status=500, first_byte_delay_s=0.4)
    slow, fast = serve(fake_replica(slow_behaviour)), serve(fake_replica(Behaviour("fast")))
    with access_lines() as lines:
        config = parse_config({"replicas": [{"id": "slow", "url": slow.url},
                                            {"id": "fast", "url": fast.url}],
                               "policy": {"name": "round_robin"},
                               "scrape": {"enabled": False}, "access_log": True})
        url = serve(create_app(config)).url
        for stream in (False, False, True, True):
            r = httpx.post(f"{url}/v1/completions", timeout=30, json={
                "model": "sim-model", "prompt": "x", "stream": stream})
            assert r.status_code == 200 and r.headers["x-kvgate-replica"] == "fast"
        wait_until(lambda: len(lines) == 4, 5, "the access lines")
    waited = [line for line in lines if float(str(line["duration_s"])) >= 0.4]
    assert len(waited) == len(slow_behaviour.received) > 0, lines
    for line in waited:
        assert line["ttft_s"] is None or float(str(line["ttft_s"])) >= 0.4, line


def test_a_refused_requests_line_has_its_answers_id_and_its_duration(serve: Serve) -> None:
    replica = serve(fake_replica(Behaviour("r0")))
    with access_lines() as lines:
        config = parse_config({"replicas": [{"id": "r0", "url": replica.url}],
                               "scrape": {"enabled": False}, "access_log": True})
        url = serve(create_app(config)).url
        bad = httpx.post(f"{url}/v1/completions", timeout=10,
                         json={"model": "sim-model", "prompt": "x", "max_tokens": -1})
        named = httpx.post(f"{url}/v1/embeddings", timeout=10, content=b"{not json",
                           headers={"x-request-id": "client-7"})
        wait_until(lambda: len(lines) == 2, 5, "the access lines")
    assert bad.status_code == 400 and named.status_code == 400
    assert [line["id"] for line in lines] == [bad.headers["x-request-id"], "client-7"]
    assert all(line["status"] == "400" and line["duration_s"] is not None for line in lines)


def _embedding_replica() -> Starlette:
    async def embeddings(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [
            {"object": "embedding", "index": 0, "embedding": [0.5]}], "model": "sim-model"})

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "sim-model"}]})

    return Starlette(routes=[Route("/v1/embeddings", embeddings, methods=["POST"]),
                             Route("/v1/models", models),
                             Route("/health", lambda request: Response())])


def test_a_pass_through_requests_line_names_its_tenant(serve: Serve) -> None:
    """The tenant a trusted proxy names is on the line of a pass-through request, answered
    or refused after its body was read, as on a routed one's."""
    replica = serve(_embedding_replica())
    with access_lines() as lines:
        config = parse_config({"replicas": [{"id": "r0", "url": replica.url}],
                               "scrape": {"enabled": False}, "access_log": True,
                               "trusted_proxies": ["127.0.0.1/32"]})
        url = serve(create_app(config)).url
        tenant = {"x-kvgate-tenant": "acme"}
        ok = httpx.post(f"{url}/v1/embeddings", timeout=10, headers=tenant,
                        json={"model": "sim-model", "input": "x"})
        bad = httpx.post(f"{url}/v1/embeddings", timeout=10, headers=tenant,
                         json={"model": 5, "input": "x"})
        wait_until(lambda: len(lines) == 2, 5, "the access lines")
    assert ok.status_code == 200 and bad.status_code == 400
    assert [(line["status"], line.get("tenant")) for line in lines] == [
        ("200", "acme"), ("400", "acme")]
