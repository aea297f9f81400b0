"""An embeddings input that encodes to an id past the model's vocabulary is a 400 naming
``input``, the field its text came in (not ``prompt``, which /v1/embeddings has none of)."""

from __future__ import annotations

from typing import Any

import httpx

from engine.executor import Executor
from engine.server import EngineServer, build_app
from engine.sim_embedding import SimEmbedder
from tests.support.engine_servers import running_engine

MODEL = "tiny-sim"
ROWS = 200  # the model's embedding rows: "hello" encodes to [263, 1357]


class _FewRows:
    """``inner`` (the sim executor), as a model of ``ROWS`` embedding rows."""

    vocab_size = ROWS

    def __init__(self, inner: Executor) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_an_embeddings_input_past_the_vocabulary_names_input() -> None:
    async with running_engine(MODEL, executor=_FewRows) as srv:
        assert isinstance(srv, EngineServer) and srv.vocab_size == ROWS
        srv.embedder = SimEmbedder(16, 0)  # as `kvgate engine --embedding-dim 16` gives
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(srv)),
                                     base_url="http://engine") as http:
            for given in ("hello", ["hi", "hello"]):
                r = await http.post("/v1/embeddings", json={"model": MODEL, "input": given})
                assert r.status_code == 400, r.text
                error = r.json()["error"]
                assert error["param"] == "input", error
                assert error["message"].startswith("input encodes to token id "), error
                assert f"past the model's vocabulary [0, {ROWS})" in error["message"]
