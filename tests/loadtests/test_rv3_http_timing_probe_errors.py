"""The timing probe times a first token, not an error event (one was counted as a fast
first token), and starts its fleet in a directory of its own (the default one's fleet,
``kvgate fleet up --detach``, made it refuse to run)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from loadtests.timing_probe import main, ttft

_ERRORS = {
    "nested": {"error": {"message": "no blocks left", "type": "server_error", "code": 500}},
    "flat": {"object": "error", "message": "no blocks left", "type": "server_error",
             "code": 500},
}


def _streams_errors() -> Starlette:
    """Streams the error event its ``x-form`` header names, or a token for ``token``."""

    async def completions(request: Request) -> Response:
        await request.body()
        form = request.headers["x-form"]
        event = _ERRORS.get(form) or {"choices": [{"index": 0, "text": "a"}]}

        async def body() -> AsyncIterator[bytes]:
            yield b"data: " + json.dumps(event).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])


def test_an_error_event_is_not_timed_as_a_first_token(serve: Callable[..., Any]) -> None:
    server = serve(_streams_errors())
    for form in ("token", *_ERRORS):
        with httpx.Client(base_url=server.url, headers={"x-form": form}) as http:
            if form == "token":
                assert ttft(http, "m", "a b", "t") > 0
                continue
            with pytest.raises(RuntimeError, match=r"first event is an error.*no blocks left"):
                ttft(http, "m", "a b", "t")


def test_the_probe_runs_beside_a_fleet_left_running_in_the_default_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    recorded = tmp_path / "fleet"
    recorded.mkdir()
    state = {"processes": []}  # what `kvgate fleet up --detach` left there
    (recorded / "fleet.json").write_text(json.dumps(state))
    monkeypatch.setenv("KVGATE_FLEET_DIR", str(recorded))
    report = main(["--probes", "2", "--words", "3", "--replicas", "1"])
    assert 0.0 <= report["auc_across_tenants"] <= 1.0
    assert 0.0 <= report["auc_within_a_tenant"] <= 1.0
    assert json.loads(capsys.readouterr().out)["probes"] == 2
    # the recorded fleet is left as it was
    assert json.loads((recorded / "fleet.json").read_text()) == state
    assert sorted(p.name for p in recorded.iterdir()) == ["fleet.json"]
