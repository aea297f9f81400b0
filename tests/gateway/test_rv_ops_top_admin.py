"""``kvgate top`` against what is not the admin API it expects: an address it cannot use is
refused by name, and the admin token never follows a redirect to another address."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from kvgate.cli import main
from tests.support.servers import ThreadServer

Serve = Callable[..., ThreadServer]
TOKEN = "admin-token-0123456789"
SNAPSHOT = {"policy": "p", "scrape_interval_s": 1, "replicas": [
    {"id": "r0", "healthy": True, "queued_tokens": 0, "in_flight": 0, "kv_usage": 0.0,
     "requests": 0, "reasons": {}, "hit_tokens": None, "query_tokens": None}]}


def _top(admin: str) -> int:
    return main(["top", "--once", "--interval", "0.05", "--admin", admin, "--token", TOKEN])


def test_the_token_never_follows_a_redirect(serve: Serve,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[str | None] = []

    async def elsewhere(request: Request) -> Response:
        seen.append(request.headers.get("authorization"))
        return JSONResponse(SNAPSHOT)

    other = serve(Starlette(routes=[Route("/admin/top", elsewhere)]))

    async def moved(request: Request) -> Response:
        return RedirectResponse(f"{other.url}/admin/top", status_code=307)

    admin = serve(Starlette(routes=[Route("/admin/top", moved)]))
    assert _top(admin.url) == 1
    err = capsys.readouterr().err
    assert "307" in err and f"{other.url}/admin/top" in err and TOKEN not in err
    assert seen == []  # the other address was never asked, with the token or without
    assert _top(other.url) == 0 and seen == [f"Bearer {TOKEN}"] * 2  # --once reads twice


@pytest.mark.parametrize("admin", ["http://127.0.0.1:abc", "://127.0.0.1:8001",
                                   "http://[::1", "ftp://127.0.0.1:8001", "http://:8001",
                                   "http://127.0.0.1:70000"])
def test_an_admin_address_it_cannot_use_is_refused_by_name(
        admin: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        _top(admin)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--admin" in err and repr(admin) in err and "Traceback" not in err


@pytest.fixture
def not_http() -> Iterator[str]:
    """A listener on loopback that answers whatever it is sent with a line that is no
    HTTP (another service's port given as --admin)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # shut down: the test is over
                return
            with conn:
                conn.recv(4096)
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone does not)
    listener.close()
    thread.join(timeout=5)


def test_an_address_that_answers_no_http_is_an_error_naming_it(
        not_http: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _top(not_http) == 1
    err = capsys.readouterr().err
    assert f"cannot read http://{not_http}/admin/top" in err and "Traceback" not in err
