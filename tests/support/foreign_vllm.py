"""What vLLM itself sends, built byte for byte as its releases send it, for tests of the
gateway in front of replicas it did not write.

KV events: vLLM's publisher encodes its structs with msgspec as maps (no ``array_like``):
the batch ``{"ts", "events", "data_parallel_rank"}``, each event tagged by its ``"type"``,
fields left at their defaults omitted, and fields this project does not read
(``extra_keys``, ``group_idx``, ``kv_cache_spec_kind``) present. Its KV offloading
connector publishes the blocks it copies to CPU memory on the same stream, under the GPU
blocks' own hashes: ``medium`` "CPU", no token ids, no parent and block size 0.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgpack
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


def kv_message(seq: int, events: list[dict[str, Any]], rank: int = 0) -> list[bytes]:
    """One published message: ``[topic, seq (u64 BE), payload]`` with vLLM's empty topic."""
    payload = msgpack.packb({"ts": 1767225600.25, "events": events,
                             "data_parallel_rank": rank}, use_bin_type=True)
    return [b"", seq.to_bytes(8, "big"), payload]


def block_stored(hashes: list[int | bytes], parent: int | bytes | None,
                 token_ids: list[int], block_size: int = 16) -> dict[str, Any]:
    """A GPU block pool's ``BlockStored`` of full blocks, as a full-attention model's."""
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": token_ids, "block_size": block_size, "lora_id": None,
            "medium": "GPU", "lora_name": None, "extra_keys": [None] * len(hashes),
            "group_idx": 0, "kv_cache_spec_kind": "full_attention"}


def block_removed(hashes: list[int | bytes], medium: str = "GPU") -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium,
            "group_idx": 0}


def offloaded(hashes: list[int | bytes], medium: str = "CPU") -> dict[str, Any]:
    """The offloading connector's ``BlockStored``: blocks copied to another tier."""
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None,
            "token_ids": [], "block_size": 0, "lora_id": None, "medium": medium,
            "lora_name": None}


# -- the OpenAI server ----------------------------------------------------------------------

def error_body(message: str, code: int, nested: bool = True) -> dict[str, Any]:
    """vLLM's error body: nested under ``error`` (current releases), or flat with
    ``object: "error"`` (releases before 0.10.2, and SGLang's today)."""
    error = {"message": message, "type": "InternalServerError" if code >= 500
             else "BadRequestError", "param": None, "code": code}
    return {"error": error} if nested else {"object": "error", **error}


@dataclass
class Script:
    """What a scripted vLLM answers on ``/v1/chat/completions``: ``status`` with
    ``error`` as its body; or a stream of ``tokens`` content chunks, which with
    ``stream_error`` set tells that error after ``error_after`` of them (vLLM's stream
    generator catching an exception: ``data: {"error": {...}}``, then ``[DONE]``)."""

    status: int = 200
    error: dict[str, Any] | None = None
    tokens: int = 3
    stream_error: dict[str, Any] | None = None
    error_after: int = 0
    split_error: bool = False  # the error event written in two pieces, its code in the second
    received: int = 0


def vllm_app(script: Script, model: str = "m") -> Starlette:
    """An OpenAI server that answers as vLLM's does (``Script``), with its /health (200,
    an empty body), /v1/models and an empty /metrics."""

    async def chat(request: Request) -> Response:
        body = await request.json()
        script.received += 1
        if script.status != 200:
            return JSONResponse(script.error, status_code=script.status)

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            data = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                    "model": body.get("model"),
                    "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                 "finish_reason": finish}]}
            return f"data: {json.dumps(data)}\n\n".encode()

        async def events() -> AsyncIterator[bytes]:
            for i in range(script.tokens):
                if script.stream_error is not None and i == script.error_after:
                    event = f"data: {json.dumps(script.stream_error)}\n\n".encode()
                    if script.split_error:
                        yield event[:20]
                        await asyncio.sleep(0.05)  # a read of its own
                        event = event[20:]
                    yield event
                    break
                yield chunk({"role": "assistant", "content": ""} if i == 0 else
                            {"content": f"t{i}"}, "stop" if i == script.tokens - 1 else None)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def health(request: Request) -> Response:
        return Response(b"", status_code=200)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": model, "object": "model", "created": 1, "owned_by": "vllm", "root": model,
             "parent": None, "max_model_len": 4096, "permission": []}]})

    async def metrics(request: Request) -> Response:
        return Response(b"", media_type="text/plain; version=0.0.4; charset=utf-8")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/health", health), Route("/v1/models", models),
                             Route("/metrics", metrics)])
