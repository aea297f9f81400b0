"""``kvgate engine --served-by``: every answer names the replica that gave it, streamed or
not, errors too, so a client behind any router can tell which replica answered."""

import httpx
import pytest

from engine.server import EngineServer, ServedBy, build_app
from kvwire.tokenizer import load_tokenizer
from tests.support.engine_cores import make_core
from tests.support.servers import ThreadServer


def test_every_answer_names_the_replica():
    core = make_core(num_blocks=64, block_size=4, vocab=(259, 4096), max_model_len=256)
    srv = EngineServer(core, load_tokenizer(None), model_name="m", sleep_modeled_time=True)
    server = ThreadServer(ServedBy(build_app(srv), "r7")).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            plain = http.post("/v1/completions", json={"model": "m", "prompt": "hi",
                                                       "max_tokens": 2})
            with http.stream("POST", "/v1/completions", json={
                    "model": "m", "prompt": "hi", "max_tokens": 2, "stream": True}) as streamed:
                body = streamed.read()
            wrong = http.post("/v1/completions", json={"model": "other", "prompt": "hi"})
            health = http.get("/health")
        assert plain.status_code == 200 and streamed.status_code == 200
        assert body.endswith(b"data: [DONE]\n\n")
        assert wrong.status_code == 404
        for resp in (plain, streamed, wrong, health):
            assert resp.headers.get_list("x-kvgate-served-by") == ["r7"]
    finally:
        server.stop()


@pytest.mark.parametrize("name", ["", "r 1", "r1\r\nx-evil: 1", "ré"])
def test_a_name_that_is_no_header_value_is_refused(name):
    with pytest.raises(ValueError, match="served-by name"):
        ServedBy(object(), name)
