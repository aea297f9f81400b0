"""An embeddings request the engine ends before its answer (``/abort_request`` with
``abort_all``, or the engine shutting down) is answered as a server error (503) whose
OpenAI error body says why, not as the client's error (400)."""

from __future__ import annotations

import threading
from typing import Any

import httpx

from engine.sim_embedding import SimEmbedder, seed_of
from tests.support.engine_cores import HeldExecutor
from tests.support.engine_servers import LiveEngine, serve_engine
from tests.support.waiting import wait_until


def _embed_in_thread(live: LiveEngine, out: dict[str, Any]) -> threading.Thread:
    def post() -> None:
        out["r"] = httpx.post(live.url + "/v1/embeddings", timeout=30,
                              json={"model": "tiny-sim", "input": "the supplier shall deliver"})
    thread = threading.Thread(target=post)
    thread.start()
    return thread


def test_an_embedding_aborted_on_the_engine_is_a_server_error() -> None:
    held: list[HeldExecutor] = []

    def hold(inner: Any) -> HeldExecutor:
        held.append(HeldExecutor(inner))
        return held[0]

    for live in serve_engine(LiveEngine, "tiny-sim", {"embedder": SimEmbedder(8, seed_of("t"))},
                             executor=hold):
        out: dict[str, Any] = {}
        thread = _embed_in_thread(live, out)
        try:
            # its prefill is in a step held on the device: then every request is aborted
            assert held[0].entered.wait(10)
            assert any(r.startswith("embd-") for r in live.server.engine.in_flight())
            assert live.http.post("/abort_request", json={"abort_all": True}).status_code == 200
            thread.join(10)
        finally:
            held[0].release.set()
            thread.join(10)
        r = out["r"]
        assert r.status_code == 503, r.text
        error = r.json()["error"]
        assert error["type"] == "service_unavailable" and error["param"] is None
        assert "Aborted by /abort_request" in error["message"]
        assert error["code"] == "request_aborted"
        # the engine goes on: the same request is answered once nothing aborts it
        wait_until(lambda: not live.server.engine.in_flight(), 10,  # noqa: B023
                   "the aborted request to leave the engine")
        again = live.http.post("/v1/embeddings", json={"model": "tiny-sim", "input": "again"})
        assert again.status_code == 200, again.text
