"""``kvgate top`` against what is not the admin API it expects: the admin token never
follows a redirect to another address."""

from __future__ import annotations

from collections.abc import Callable

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

