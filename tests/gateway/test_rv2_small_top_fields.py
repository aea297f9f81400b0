"""``kvgate top`` on a snapshot that lacks fields (a gateway of another version): what is
there is shown, what is missing is marked and named, and a replica without an id is
refused naming the field; never a traceback."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pytest
from rich.console import Console
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.top import frame
from gateway.top_window import TopWindow
from kvgate.cli import main
from tests.support.servers import ThreadServer

Serve = Callable[..., ThreadServer]
TOKEN = "admin-token-0123456789"


def _admin(serve: Serve, snapshot: dict[str, Any]) -> str:
    async def top(request: Request) -> Response:
        return JSONResponse(snapshot)

    return serve(Starlette(routes=[Route("/admin/top", top)])).url


def _top(admin: str) -> int:
    return main(["top", "--once", "--interval", "0.05", "--admin", admin, "--token", TOKEN])


def test_a_replica_with_only_an_id_is_shown_with_its_missing_fields_marked(
        serve: Serve, capsys: pytest.CaptureFixture[str]) -> None:
    admin = _admin(serve, {"replicas": [{"id": "a"}]})
    assert _top(admin) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("│ a "))
    assert row.count("?") == 5  # health, queued, in flight, KV use, req/s
    words = " ".join(out.split())  # the console wraps at its width
    assert ("not in the gateway's snapshot (or no number): healthy, in_flight, kv_usage, "
            "queued_tokens, requests") in words
    assert "fleet: 1 replicas" in words


def test_fields_of_the_wrong_kind_are_marked_and_the_rest_shown() -> None:
    rep = {"id": "r0", "healthy": "yes", "queued_tokens": 1234, "in_flight": None,
           "kv_usage": 0.5, "token_hit_rate": "high", "hit_tokens": "x", "query_tokens": 10,
           "requests": 4, "reasons": {"affinity": 4, "bad": "many"}}
    window = TopWindow(10)
    window.add(0.0, {"replicas": [{**rep, "requests": 0, "reasons": {}}]})
    window.add(2.0, {"replicas": [rep]})
    out = io.StringIO()
    Console(file=out, width=160, color_system=None).print(
        frame({"replicas": [rep]}, window, "http://127.0.0.1:8001"))
    screen = out.getvalue()
    row = next(line for line in screen.splitlines() if line.startswith("│ r0 "))
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells == ["r0", "?", "1,234", "?", "50%", "-", "2.00", "affinity 4"]
    assert "(or no number): healthy, in_flight" in screen


@pytest.mark.parametrize("replica", [{"healthy": True}, {"id": None}, "r0"])
def test_a_replica_without_an_id_is_refused_naming_the_field(
        serve: Serve, capsys: pytest.CaptureFixture[str], replica: object) -> None:
    admin = _admin(serve, {"replicas": [{"id": "a"}, replica]})
    assert _top(admin) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"{admin}/admin/top: replica 1 of the snapshot" in err
    assert ("has no 'id'" if isinstance(replica, dict) else "is no object: str") in err
    with pytest.raises(ValueError, match="replica 1 of the snapshot"):
        TopWindow(10).add(0.0, {"replicas": [{"id": "a"}, replica]})
