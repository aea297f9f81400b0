"""A chat whose tool schema nests as deep as JSON allows (past Python's recursion limit) is
relayed when the replica serves it, or refused with a 400 naming ``tools`` when the
gateway cannot render it to route; never a 500."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvwire.tokenizer_build import ASSET_DIR
from tests.support.foreign_raw import raw_replica
from tests.support.gateway_harness import start_gateway

DEEP = "[" * 985 + "1" + "]" * 985
BODY = (b'{"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}], '
        b'"tools": [{"type": "function", "function": {"name": "f", '
        b'"parameters": {"type": "object", "x": ' + DEEP.encode() + b'}}}]}')
HEADERS = {"content-type": "application/json"}


def _chunked(*events: bytes) -> bytes:
    """A streamed answer as vLLM writes one: SSE events in chunked encoding."""
    body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)
    return (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n" + body + b"0\r\n\r\n")


def _answer() -> bytes:
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]}
    return _chunked(f"data: {json.dumps(chunk)}\n\n".encode(), b"data: [DONE]\n\n")


def test_a_streamed_chat_with_a_deep_tool_schema_is_relayed(serve: Any) -> None:
    # round robin renders nothing to route; the replica's stream is tracked as resident
    # from its first byte, named by the prompt's head, which read the schema recursively
    with raw_replica(_answer) as url:
        gw = start_gateway(serve, [("a", url)])
        r = httpx.post(f"{gw.url}/v1/chat/completions", content=BODY, headers=HEADERS,
                       timeout=10)
        assert r.status_code == 200, r.text
        assert '"content": "ok"' in r.text and r.text.rstrip().endswith("data: [DONE]")


@pytest.mark.parametrize("templated", [False, True])
def test_a_tool_schema_too_deep_to_render_is_a_bad_request_naming_tools(
        serve: Any, tmp_path: Path, templated: bool) -> None:
    extra: dict[str, Any] = {}
    if templated:  # Qwen's and Hermes' way: each tool written with tojson
        shutil.copy(ASSET_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": (
            "{%- for tool in tools %}{{ tool | tojson }}\n{%- endfor %}"
            "{%- for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{%- endfor %}")}))
        extra["tokenizer"] = str(tmp_path)
    with raw_replica(_answer) as url:
        gw = start_gateway(serve, [("a", url)], policy={"name": "kv_events"}, **extra)
        r = httpx.post(f"{gw.url}/v1/chat/completions", content=BODY, headers=HEADERS,
                       timeout=10)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "tools", error
        assert "nested too deeply" in error["message"]
