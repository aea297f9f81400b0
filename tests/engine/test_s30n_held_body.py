"""``EngineServer.held_body``: a request body's bytes count in the server's held bytes
while the block using it runs, and go back when it ends, also when it raises."""

from __future__ import annotations

import asyncio

import pytest

from engine.server import EngineServer
from kvwire.openai_schema import BadRequest, decode_json
from kvwire.tokenizer import load_tokenizer
from tests.support.engine_cores import make_core
from tests.support.posted import posted


def test_a_body_is_held_while_its_block_runs_and_given_back_after() -> None:
    server = EngineServer(make_core(), load_tokenizer(None), model_name="tiny",
                          sleep_modeled_time=False)

    async def run() -> None:
        async with server.held_body(posted(b'{"prompt": "hi"}', "/tokenize")) as raw:
            assert raw == b'{"prompt": "hi"}'
            assert server.bodies.held == len(raw)
        assert server.bodies.held == 0
        with pytest.raises(BadRequest, match="not valid JSON"):
            async with server.held_body(posted(b"{nope", "/tokenize")) as raw:
                assert server.bodies.held == 5
                decode_json(raw)
        assert server.bodies.held == 0

    asyncio.run(run())
