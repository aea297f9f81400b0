"""An embeddings input that encodes to an id past the model's vocabulary is a 400 naming
``input``, the field its text came in (not ``prompt``, which /v1/embeddings has none of)."""

from __future__ import annotations

import httpx

from engine.server import EngineServer, build_app
from engine.sim_embedding import SimEmbedder
from tests.support.engine_servers import running_engine
from tests.support.few_rows import ROWS, FewRows

MODEL = "tiny-sim"


async def test_an_embeddings_input_past_the_vocabulary_names_input() -> None:
    async with running_engine(MODEL, executor=FewRows) as srv:
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
