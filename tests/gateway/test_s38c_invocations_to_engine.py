"""A gateway in front of kvgate engines sends an ``/invocations`` body that is neither a
chat nor a completion (an embedding) to a replica's own ``/invocations``, which the engine
serves as vLLM's does: answered, not ``404 no route``."""

from __future__ import annotations

import httpx

from engine.server import EngineServer, build_app
from engine.sim_embedding import SimEmbedder, seed_of
from kvwire.tokenizer import load_tokenizer
from tests.support.engine_servers import served_core
from tests.support.gateway_harness import Serve, start_gateway

MODEL = "tiny-sim"


def test_an_embedding_on_the_gateways_invocations_reaches_the_engines(serve: Serve) -> None:
    engine = EngineServer(served_core(max_model_len=128), load_tokenizer(None),
                          model_name=MODEL, sleep_modeled_time=True,
                          embedder=SimEmbedder(16, seed_of("t")))
    gw = start_gateway(serve, [("r0", serve(build_app(engine)).url)])
    embedded = httpx.post(f"{gw.url}/invocations", timeout=30,
                          json={"model": MODEL, "input": ["a", "b"]})
    assert embedded.status_code == 200, embedded.text
    assert [len(d["embedding"]) for d in embedded.json()["data"]] == [16, 16]
    chat = httpx.post(f"{gw.url}/invocations", timeout=30, json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert chat.status_code == 200 and chat.json()["object"] == "chat.completion", chat.text
