"""A request body that does not come whole within the engine's body timeout is refused 408
(``body_timeout``) and its bytes go back to the held-bytes budget: a client that stops
mid-body no longer holds its share of ``--max-held-body-bytes`` for as long as it stays.
The same holds for ``/v1/responses``, whose body counts in the budget as the others do."""

from __future__ import annotations

import argparse
import http.client
import json
from collections.abc import Iterator

import pytest

from engine import cli as engine_cli
from engine.server import EngineServer, build_app
from tests.support.servers import ThreadServer
from tests.support.waiting import wait_until


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[EngineServer, int]]:
    parser = argparse.ArgumentParser()
    engine_cli.add_arguments(parser)
    server = engine_cli.build_server(parser.parse_args(["--kv-cache-gib", "0.05"]))
    server.body_timeout_s = 0.5
    served = ThreadServer(build_app(server)).start()
    try:
        yield server, served.port
    finally:
        served.stop()


@pytest.mark.parametrize("path", ["/tokenize", "/v1/responses", "/abort_request"])
def test_a_body_stopped_midway_is_refused_408_and_its_bytes_given_back(
        engine: tuple[EngineServer, int], path: str) -> None:
    server, port = engine
    body = b'{"input": "' + b"a" * 5000 + b'"}'
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("POST", path)
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders()
        conn.send(body[:3000])
        wait_until(lambda: server.bodies.held == 3000, what="the bytes sent to be held")
        answer = conn.getresponse()
        assert answer.status == 408
        error = json.loads(answer.read())["error"]
        assert error["code"] == "body_timeout"
        assert "0.5 s" in error["message"]
    finally:
        conn.close()
    wait_until(lambda: server.bodies.held == 0, what="the bytes to be given back")
