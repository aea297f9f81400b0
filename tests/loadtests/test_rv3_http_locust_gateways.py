"""The Locust users under a real headless run in front of two gateway copies: which copy a
request goes to is drawn by its index (the order the clients happened to come in decided
it, so the same seed split the requests differently between runs), and a stream's error
event in the older flat form (``{"object": "error", "message": ...}``: older vLLM's,
SGLang's) is told as the error it is, not as a stream without a finish reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from loadtests.run import LOCUSTFILE
from tests.support.processes import REPO

SEED = 5


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


_ANSWER = [_event({"choices": [{"index": 0, "delta": {"content": "hi"},
                                "finish_reason": None}]}),
           _event({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}),
           b"data: [DONE]\n\n"]
_FLAT_ERROR = [_event({"object": "error", "message": "out of blocks", "type": "server_error",
                       "code": 500}),
               b"data: [DONE]\n\n"]


def _backend(events: list[bytes], name: str) -> Starlette:
    """A gateway copy that streams ``events`` to every chat request, naming itself."""

    async def chat(request: Request) -> Response:
        await request.body()

        async def body() -> AsyncIterator[bytes]:
            for event in events:
                yield event

        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={"x-kvgate-served-by": name})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def test_each_request_goes_to_the_copy_its_index_draws_and_flat_errors_are_errors(
        tmp_path: Path, serve: Callable[..., Any]) -> None:
    hosts = [serve(_backend(_ANSWER, "g0")).url, serve(_backend(_FLAT_ERROR, "g1")).url]
    samples_path = tmp_path / "samples.json"
    env = dict(os.environ, KVGATE_MODEL="m", KVGATE_RATE="400",
               KVGATE_SAMPLES=str(samples_path), KVGATE_HOSTS=json.dumps(hosts),
               KVGATE_WORKLOAD=json.dumps({"params": {"num_docs": 4, "hot_docs": 1,
                                                      "seed": SEED}, "requests": 5000}))
    # many users, each free most of the time: each sleeps until its request is due, and
    # they wake in an order of their own
    run = subprocess.run(
        [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "ContractsUser",
         "--headless", "-u", "16", "-r", "16", "-t", "1s", "--stop-timeout", "1",
         "--host", hosts[0], "--only-summary", "--loglevel", "WARNING"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert samples_path.exists(), run.stderr[-2000:]
    sent = [s for s in json.loads(samples_path.read_text())
            if not s.get("unsent") and not s.get("unfinished")]
    assert len(sent) >= 50
    # the simulator's draws for the seed (one per request, in the order they arrive)
    draws = np.random.default_rng([SEED, 11])
    picks = [int(draws.integers(2)) for _ in range(max(s["index"] for s in sent) + 1)]
    assert [s["gateway"] for s in sent] == [picks[s["index"]] for s in sent]
    assert {s["gateway"] for s in sent} == {0, 1}
    for s in sent:
        assert s["replica"] == f"g{s['gateway']}"
        if s["gateway"] == 0:
            assert s["ok"] and "error" not in s, s
        else:
            assert not s["ok"], s
            assert s["error"].startswith("bad stream: ") and "out of blocks" in s["error"], s
