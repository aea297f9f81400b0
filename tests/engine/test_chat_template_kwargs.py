"""The engine renders a chat with its request's ``chat_template_kwargs``, as vLLM does
(Qwen3's ``enable_thinking``: the prompt the model is served ends with an empty thinking
block), and refuses with a 400 naming the key what vLLM refuses."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import httpx
import pytest

from engine.server import EngineServer, build_app
from kvwire.tokenizer import load_tokenizer
from kvwire.tokenizer_build import ASSET_DIR
from tests.support.engine_cores import make_core
from tests.support.servers import ThreadServer

TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "<think>\n\n</think>\n\n{%- endif %}{%- endif %}")
CHAT = [{"role": "user", "content": "What does clause 4 say?"}]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, EngineServer]]:
    folder = tmp_path_factory.mktemp("templated")
    shutil.copy(ASSET_DIR / "tokenizer.json", folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    core = make_core(num_blocks=256, block_size=4, vocab=(259, 4096), max_model_len=512)
    srv = EngineServer(core, load_tokenizer(folder), model_name="m", sleep_modeled_time=True)
    server = ThreadServer(build_app(srv)).start()
    try:
        yield server.url, srv
    finally:
        server.stop()


def test_the_chat_is_rendered_with_the_requests_template_variables(
        engine: tuple[str, EngineServer]) -> None:
    url, srv = engine
    tok = srv.tokenizer
    off = tok.encode(tok.render_chat(CHAT, template_kwargs={"enable_thinking": False}))
    on = tok.encode(tok.render_chat(CHAT))
    assert len(off) > len(on)
    for kwargs, want in (({"enable_thinking": False}, off), ({"enable_thinking": True}, on),
                         (None, on), ({"not_read": 1}, on)):
        r = httpx.post(f"{url}/tokenize", json={"model": "m", "messages": CHAT,
                                                "chat_template_kwargs": kwargs})
        assert r.status_code == 200, r.text
        assert r.json()["tokens"] == want, kwargs
        r = httpx.post(f"{url}/v1/chat/completions", timeout=10, json={
            "model": "m", "messages": CHAT, "max_tokens": 2, "chat_template_kwargs": kwargs})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len(want), kwargs


def test_what_vllm_refuses_is_a_bad_request_naming_the_key(
        engine: tuple[str, EngineServer]) -> None:
    url, _ = engine
    for kwargs, param in (("enable_thinking", "chat_template_kwargs"),
                          ({"tokenize": True}, "chat_template_kwargs.tokenize"),
                          ({"chat_template": "{{ 1 }}"}, "chat_template_kwargs.chat_template"),
                          ({"tools": []}, "chat_template_kwargs.tools")):
        r = httpx.post(f"{url}/v1/chat/completions", timeout=10, json={
            "model": "m", "messages": CHAT, "chat_template_kwargs": kwargs})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error"
