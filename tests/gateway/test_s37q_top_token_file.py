"""``kvgate top --token-file PATH`` reads the admin token from a file (as the gateway reads
its ``admin.token_file``), so that it is not on the command line for ``ps`` to show; the
file wins over ``$KVGATE_ADMIN_TOKEN``, goes with ``--token`` never, and one that cannot be
read or holds no token is named, its contents never shown."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.top import TOKEN_ENV
from kvgate.cli import main
from tests.support.servers import ThreadServer

Serve = Callable[..., ThreadServer]
TOKEN = "admin-token-0123456789"
SNAPSHOT = {"policy": "p", "scrape_interval_s": 1, "replicas": [
    {"id": "r0", "healthy": True, "queued_tokens": 0, "in_flight": 0, "kv_usage": 0.0,
     "requests": 0, "reasons": {}, "hit_tokens": None, "query_tokens": None}]}


def _top(admin: str, *flags: str) -> int:
    return main(["top", "--once", "--interval", "0.05", "--admin", admin, *flags])


def test_the_token_is_read_from_its_file(serve: Serve, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str | None] = []

    async def top(request: Request) -> Response:
        seen.append(request.headers.get("authorization"))
        return JSONResponse(SNAPSHOT)

    admin = serve(Starlette(routes=[Route("/admin/top", top)]))
    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.setenv(TOKEN_ENV, "the-environments-token-0123")
    assert _top(admin.url, "--token-file", str(token_file)) == 0
    assert seen == [f"Bearer {TOKEN}"] * 2  # the file's, stripped, over the variable's


def test_a_token_file_that_gives_no_token_is_named_unshown(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.write_text(" \n")
    bad = tmp_path / "bad"
    bad.write_text("admin-token-01234\x0156789\n")
    missing = tmp_path / "none"  # (a path that names nothing is not shown: it may be the token)
    for path, said in ((missing, f"--token-file (a path of {len(str(missing))} characters, "
                                 "not shown in case it is the secret): No such file"),
                       (empty, f"--token-file {str(empty)!r} holds no token"),
                       (tmp_path, "is a directory, not a regular file"),
                       (bad, "the admin token holds a control character")):
        assert _top("http://127.0.0.1:9", "--token-file", str(path)) == 2, path
        err = capsys.readouterr().err
        assert said in err and "admin-token" not in err and "Traceback" not in err, err


def test_a_token_and_a_token_file_are_not_given_together(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN)
    with pytest.raises(SystemExit) as stopped:
        _top("http://127.0.0.1:9", "--token", TOKEN, "--token-file", str(token_file))
    assert stopped.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
