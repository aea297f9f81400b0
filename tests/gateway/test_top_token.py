"""``kvgate top``'s admin token: taken as the gateway takes its own (a file's line end,
a Windows one too, stripped), and one no header can carry refused without being shown;
urllib's error quoted the header, token and all."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kvgate.cli import main
from tests.support.servers import ThreadServer

Serve = Callable[..., ThreadServer]
TOKEN = "admin-token-0123456789"
SNAPSHOT = {"policy": "p", "scrape_interval_s": 1, "replicas": [
    {"id": "r0", "healthy": True, "queued_tokens": 0, "in_flight": 0, "kv_usage": 0.0,
     "requests": 0, "reasons": {}, "hit_tokens": None, "query_tokens": None}]}


def _top(admin: str, token: str) -> int:
    return main(["top", "--once", "--interval", "0.05", "--admin", admin, "--token", token])


def test_a_token_with_a_windows_line_end_is_read_as_the_gateway_reads_it(
        serve: Serve) -> None:
    seen: list[str | None] = []

    async def top(request: Request) -> Response:
        seen.append(request.headers.get("authorization"))
        return JSONResponse(SNAPSHOT)

    admin = serve(Starlette(routes=[Route("/admin/top", top)]))
    assert _top(admin.url, TOKEN + "\r\n") == 0
    assert seen == [f"Bearer {TOKEN}"] * 2


def test_a_token_no_header_can_carry_is_refused_unshown(
        capsys: pytest.CaptureFixture[str]) -> None:
    secret = "admin-token-01234\x0156789"
    assert _top("http://127.0.0.1:9", secret) == 2
    err = capsys.readouterr().err
    assert "control character" in err and "admin-token" not in err and "Traceback" not in err
