"""The engine holds at most ``--max-held-body-bytes`` of request bodies at once, all
requests together, from their first byte until they are parsed: past it a request gets
429 (``Retry-After``) naming the limit, a body larger than it alone 413, and the bytes come
back once a body is parsed, refused, or its client leaves."""

from __future__ import annotations

import argparse
import http.client
from collections.abc import Iterator

import httpx
import pytest

from engine import cli as engine_cli
from engine.server import DEFAULT_MAX_HELD_BODY_BYTES, MAX_BODY_BYTES, EngineServer, build_app
from kvwire.openai_schema import BadRequest
from kvwire.tokenizer import load_tokenizer
from tests.support.engine_cores import make_core
from tests.support.posted import posted
from tests.support.servers import ThreadServer
from tests.support.waiting import wait_until

HELD = 65536  # the budget under test


def _tokenize_body(size: int) -> bytes:
    """A ``/tokenize`` body of exactly ``size`` bytes."""
    head, tail = b'{"prompt": "', b'"}'
    return head + b"a" * (size - len(head) - len(tail)) + tail


class _Engine:
    def __init__(self, server: EngineServer, url: str, port: int) -> None:
        self.server = server
        self.url = url
        self.port = port


@pytest.fixture(scope="module")
def engine() -> Iterator[_Engine]:
    parser = argparse.ArgumentParser()
    engine_cli.add_arguments(parser)
    server = engine_cli.build_server(parser.parse_args(
        ["--kv-cache-gib", "0.05", "--max-held-body-bytes", str(HELD)]))
    served = ThreadServer(build_app(server)).start()
    try:
        yield _Engine(server, served.url, served.port)
    finally:
        served.stop()


def _partly_sent(port: int, body: bytes, sent: int) -> http.client.HTTPConnection:
    """A ``/tokenize`` request of ``body`` on a connection of its own, of which only the
    first ``sent`` bytes of body went out."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.putrequest("POST", "/tokenize")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders()
    conn.send(body[:sent])
    return conn


def test_bodies_past_the_budget_are_refused_while_others_are_held(engine: _Engine) -> None:
    bodies = engine.server.bodies
    assert bodies.limit == HELD
    held_body = _tokenize_body(60000)
    holder = _partly_sent(engine.port, held_body, 40000)
    try:
        wait_until(lambda: bodies.held == 40000, what="the first 40,000 bytes to be held")
        with httpx.Client(base_url=engine.url, timeout=10) as http:
            refused = http.post("/tokenize", content=_tokenize_body(30000),
                                headers={"content-type": "application/json"})
            assert refused.status_code == 429, refused.text
            assert refused.headers["retry-after"] == "1"
            error = refused.json()["error"]
            assert error["code"] == "engine_overloaded"
            assert "--max-held-body-bytes" in error["message"]
            assert str(HELD) in error["message"] and "40000" in error["message"]
            # a body that fits beside the held one is served meanwhile
            small = http.post("/tokenize", json={"prompt": "hello world"})
            assert small.status_code == 200, small.text
            # one larger than the whole budget could never be: 413 naming it
            huge = http.post("/tokenize", content=_tokenize_body(HELD + 1),
                             headers={"content-type": "application/json"})
            assert huge.status_code == 413, huge.text
            assert str(HELD) in huge.json()["error"]["message"]
            assert bodies.held == 40000
            # the held body sent whole: parsed, answered, and its bytes given back
            holder.send(held_body[40000:])
            answer = holder.getresponse()
            assert answer.status == 200
            assert b'"count"' in answer.read()
            wait_until(lambda: bodies.held == 0, what="the parsed body's bytes back")
            served = http.post("/tokenize", content=_tokenize_body(30000),
                               headers={"content-type": "application/json"})
            assert served.status_code == 200, served.text
            assert served.json()["count"] > 1
    finally:
        holder.close()
    assert bodies.held == 0


def test_a_client_leaving_mid_body_gives_its_bytes_back(engine: _Engine) -> None:
    bodies = engine.server.bodies
    leaving = _partly_sent(engine.port, _tokenize_body(60000), 50000)
    wait_until(lambda: bodies.held == 50000, what="the 50,000 bytes sent to be held")
    leaving.close()
    wait_until(lambda: bodies.held == 0, what="the bytes of a body never finished back")
    with httpx.Client(base_url=engine.url, timeout=10) as http:
        served = http.post("/tokenize", content=_tokenize_body(60000),
                           headers={"content-type": "application/json"})
    assert served.status_code == 200, served.text
    assert bodies.held == 0


def test_the_default_budget_is_a_few_bodies() -> None:
    parser = argparse.ArgumentParser()
    engine_cli.add_arguments(parser)
    assert parser.parse_args([]).max_held_body_bytes is None  # the server's default
    assert DEFAULT_MAX_HELD_BODY_BYTES == 4 * MAX_BODY_BYTES
    for bad in (["--max-held-body-bytes", "0"], ["--max-held-body-bytes", "-5"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


async def test_a_body_is_held_until_parsed_and_given_back_if_refused() -> None:
    server = EngineServer(make_core(), load_tokenizer(None), model_name="tiny",
                          sleep_modeled_time=False, max_held_body_bytes=HELD)
    raw = b'{"prompt": "hello"}'

    seen: list[int] = []

    def parse(body: object) -> object:
        seen.append(server.bodies.held)  # while it is decoded and checked
        return body

    assert await server.read_json(posted(raw, "/tokenize"), parse) == {"prompt": "hello"}
    assert seen == [len(raw)] and server.bodies.held == 0

    def refuse(body: object) -> object:
        raise BadRequest("no")

    with pytest.raises(BadRequest):
        await server.read_json(posted(raw, "/tokenize"), refuse)
    assert server.bodies.held == 0
