"""``kvgate top`` against an admin endpoint that answers slowly, hugely, deeply or with
terminal codes, and with a proxy in the environment: one read is bounded in time and in
bytes, what the endpoint answers reaches the terminal only as printable text, numbers no
float holds are shown as unknown, and the admin token never goes to a proxy."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from gateway.top import MAX_SNAPSHOT_BYTES, TOKEN_ENV, AdminError, fetch
from kvgate.cli import main
from tests.support.foreign_raw import raw_replica
from tests.support.servers import ThreadServer

Serve = Callable[..., ThreadServer]
TOKEN = "admin-token-0123456789"
ESC = "\x1b]0;PWNED\x07\x1b[2J\x1b[31mRED"
REPLICA = {"id": "r0", "healthy": True, "queued_tokens": 0, "in_flight": 0, "kv_usage": 0.1,
           "requests": 5, "reasons": {"affinity": 5}, "hit_tokens": 10, "query_tokens": 20}
SNAPSHOT = {"policy": "p", "scrape_interval_s": 1, "replicas": [REPLICA]}


def _top(admin: str) -> int:
    return main(["top", "--once", "--interval", "0.05", "--admin", admin, "--token", TOKEN])


def _streamed(first: bytes, then: Callable[[], AsyncIterator[bytes]],
              status: int = 200) -> Starlette:
    """An admin API whose /admin/top answers ``first`` and then what ``then`` yields."""

    async def body() -> AsyncIterator[bytes]:
        yield first
        async for piece in then():
            yield piece

    async def top(request: Request) -> Response:
        return StreamingResponse(body(), status_code=status, media_type="application/json")

    return Starlette(routes=[Route("/admin/top", top)])


def test_an_answer_dripping_in_is_given_up_as_a_whole(serve: Serve) -> None:
    """A server sending a byte at a time, each within the timeout, held ``--once`` for as
    long as it kept sending: the timeout was for each read, not for the answer."""
    async def drip() -> AsyncIterator[bytes]:
        for _ in range(40):
            await asyncio.sleep(0.05)
            yield b" "

    admin = serve(_streamed(json.dumps(SNAPSHOT).encode(), drip))
    with pytest.raises(AdminError, match=r"did not answer within 0\.3 s"):
        fetch(admin.url, TOKEN, timeout_s=0.3)


def test_an_answer_past_the_bound_is_refused_naming_it(serve: Serve) -> None:
    """A body of 1.2 GB was read whole (2.6 GB of memory) before it was looked at."""
    async def padding() -> AsyncIterator[bytes]:
        for _ in range(MAX_SNAPSHOT_BYTES // (1 << 20) + 1):
            yield b" " * (1 << 20)
        yield b"}"

    admin = serve(_streamed(b'{"replicas": []', padding))
    with pytest.raises(AdminError, match=f"over {MAX_SNAPSHOT_BYTES} bytes"):
        fetch(admin.url, TOKEN)


def test_an_error_body_past_its_bound_is_left_unread(serve: Serve) -> None:
    async def padding() -> AsyncIterator[bytes]:
        for _ in range(MAX_SNAPSHOT_BYTES // (1 << 20) + 1):
            yield b"A" * (1 << 20)

    admin = serve(_streamed(b"", padding, status=500))
    with pytest.raises(AdminError, match=r"answered 500: .*a body over 65536 bytes, not read"):
        fetch(admin.url, TOKEN)


def test_json_nested_past_what_python_reads_is_an_error_not_a_traceback() -> None:
    body = b'{"replicas": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" \
             b"Connection: close\r\n\r\n%s" % (len(body), body)
    with raw_replica(lambda: answer) as url, pytest.raises(AdminError, match="nested too deep"):
        fetch(url, TOKEN)


@pytest.mark.parametrize("head", [
    # the gateway's error message, and the reason phrase of a status line
    b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\n",
    b"HTTP/1.1 500 " + ESC.encode() + b"\r\n"])
def test_what_an_error_answer_says_reaches_the_terminal_as_text(
        head: bytes, capsys: pytest.CaptureFixture[str]) -> None:
    """A planted ``ESC[2J`` in either cleared the operator's screen."""
    body = json.dumps({"error": {"message": ESC}}).encode() if b"403" in head else b"xx"
    answer = head + b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
    with raw_replica(lambda: answer) as url:
        assert _top(url) == 1
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err
    assert "\\x1b]0;PWNED\\x07\\x1b[2J\\x1b[31mRED" in err


def test_numbers_no_float_holds_are_shown_as_unknown(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A counter of 10**400 was an OverflowError traceback (``format(.., '.0%')``), and
    NaN and Infinity were drawn as ``nan%``, ``inf`` and ``nan req/s``."""
    body = json.dumps({"replicas": [
        {**REPLICA, "id": "big", "kv_usage": 10**400, "queued_tokens": 10**400,
         "hit_tokens": 10**400, "query_tokens": 10**401},
        {**REPLICA, "id": "odd", "queued_tokens": float("nan"),
         "in_flight": float("inf"), "kv_usage": float("-inf"),
         "hit_tokens": float("nan"), "query_tokens": 1e308, "requests": float("nan")}]}
    ).encode()
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" \
             b"Connection: close\r\n\r\n%s" % (len(body), body)
    with raw_replica(lambda: answer) as url:
        assert _top(url) == 0
    out = capsys.readouterr().out
    assert "big" in out and "odd" in out
    assert "nan" not in out.lower() and "inf" not in out.lower()
    assert "not in the gateway's snapshot (or no number): in_flight, kv_usage, " \
           "queued_tokens, requests" in " ".join(out.split())


def test_the_token_never_goes_to_a_proxy_of_the_environment(serve: Serve) -> None:
    """docs/top.md: the token is sent only to --admin; an ``http_proxy`` in the
    environment of the process was used."""
    seen: list[str | None] = []

    async def top(request: Request) -> Response:
        seen.append(request.headers.get("authorization"))
        return Response(json.dumps(SNAPSHOT), media_type="application/json")

    admin = serve(Starlette(routes=[Route("/admin/top", top)]))
    proxied: list[bool] = []

    def as_proxy() -> bytes:
        proxied.append(True)
        return b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n"

    with raw_replica(as_proxy) as proxy:
        env = {k: v for k, v in os.environ.items() if k.lower() != "no_proxy"}
        env.update({name: proxy for name in ("http_proxy", "HTTP_PROXY", "https_proxy",
                                             "HTTPS_PROXY", "all_proxy", "ALL_PROXY")})
        env[TOKEN_ENV] = TOKEN
        done = subprocess.run(
            [sys.executable, "-m", "kvgate", "top", "--once", "--interval", "0.05",
             "--admin", admin.url], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert proxied == [] and seen == [f"Bearer {TOKEN}"] * 2
