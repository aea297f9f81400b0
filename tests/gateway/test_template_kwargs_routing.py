"""A chat's ``chat_template_kwargs`` are rendered into the prompt the gateway routes on, as
the replica's template renders them; what vLLM refuses in them is a 400 naming the key,
before any replica is asked."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx

from kvwire.tokenizer import load_tokenizer
from kvwire.tokenizer_build import ASSET_DIR
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import AUTH, start_gateway

# a deployment's note in the system turn, read from the request's chat_template_kwargs
TEMPLATE = (
    "{%- if house_rules %}<|im_start|>system\n{{ house_rules }}<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
CHAT = [{"role": "user", "content": "What does clause 4 say?"}]
RULES = "Answer in French, citing the clause by number, and never guess. " * 4


def test_the_routed_prompt_is_rendered_with_the_requests_template_variables(
        serve: Any, tmp_path: Path) -> None:
    shutil.copy(ASSET_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    tokenizer = load_tokenizer(tmp_path)
    a = Behaviour("a")
    gw = start_gateway(serve, [("a", serve(fake_replica(a)).url)],
                       policy={"name": "kv_events"}, tokenizer=str(tmp_path))

    def explained(body: dict[str, Any]) -> dict[str, Any]:
        r = httpx.post(f"{gw.admin}/admin/explain", headers=AUTH, timeout=10,
                       json={"model": "sim-model", "messages": CHAT, **body})
        assert r.status_code == 200, r.text
        return dict(r.json())

    ruled = tokenizer.encode(tokenizer.render_chat(CHAT, template_kwargs={
        "house_rules": RULES}))
    plain = tokenizer.encode(tokenizer.render_chat(CHAT))
    assert len(ruled) > len(plain) + 40
    assert explained({"chat_template_kwargs": {"house_rules": RULES}})["prompt_tokens"] \
        == len(ruled)
    assert explained({})["prompt_tokens"] == len(plain)
    # a key the template does not read changes nothing, as vLLM drops it
    assert explained({"chat_template_kwargs": {"unread": RULES}})["prompt_tokens"] \
        == len(plain)

    for kwargs, param in (([1], "chat_template_kwargs"),
                          ({"tokenize": False}, "chat_template_kwargs.tokenize"),
                          ({"messages": CHAT}, "chat_template_kwargs.messages")):
        r = httpx.post(f"{gw.url}/v1/chat/completions", timeout=10, json={
            "model": "sim-model", "messages": CHAT, "chat_template_kwargs": kwargs})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param
    assert a.received == []  # refused before any replica was asked
