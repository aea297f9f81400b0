"""A small, scriptable OpenAI-style replica for exercising the gateway's failure paths.

It answers like an engine (completions and chat, streamed or not, /health, /metrics in the
vLLM dialect, /v1/models; SGLang's native /generate; OpenAI's /v1/responses) and can be
told to fail with a status, stall before its first byte, stall between chunks, or hold
its first byte or a stream's last chunk until the test releases it. It records every body
it receives, byte for byte.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class Behaviour:
    name: str
    model: str = "sim-model"
    status: int = 200
    first_byte_delay_s: float = 0.0
    chunk_delay_s: float = 0.0
    chunks: int = 3
    healthy: bool = True
    hits: int = 0
    queries: int = 0
    queued_tokens: int | None = None
    received: list[bytes] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)  # of each request received
    paths: list[str] = field(default_factory=list)  # ... and its path
    query_strings: list[str] = field(default_factory=list)  # ... and its query string
    cancelled: int = 0
    release: threading.Event | None = None  # a stream's last chunk waits until it is set
    hold: threading.Event | None = None  # the first byte waits until it is set
    linger_s: float = 0.0  # a stream's body stays open this long after its [DONE]
    adapters: int = 0  # /v1/models lists this many adapters after the model
    root: str | None = None  # the model's /v1/models root (where it was loaded from; its id)
    usage: dict[str, object] | None = None  # answers carry this usage instead of its own
    metrics_status: int = 200  # /metrics answers this
    metrics_extra: bytes = b""  # raw bytes after /metrics' lines (odd values, padding)
    pad: int = 0  # characters of padding in each streamed chunk's text
    progressing: bool = False  # /metrics counts more generated tokens at every scrape
    generated: int = 0
    done: bool = True  # a stream ends with [DONE] (False: it ends without, as if cut)
    done_event: bytes = b"data: [DONE]\n\n"  # ... written so
    whole_body: bytes | None = None  # a non-streamed answer's body as it is (JSON's type)
    error_body: bytes | None = None  # an error status's body as it is (else OpenAI's shape)
    listed: int = 0  # /v1/models answered
    logprobs: int = 0  # /generate: log probability entries per output token in meta_info
    # completions: header lines added to each answer (a name may come more than once)
    answer_headers: tuple[tuple[str, str], ...] = ()
    header_lines: list[list[tuple[str, str]]] = field(default_factory=list)  # as received
    responded: int = 0  # /v1/responses answered (each response's id counts them)
    response_failed: bool = False  # a /v1/responses stream ends with response.failed
    numbered: bool = False  # a /v1/responses stream's events carry their sequence_number


def fake_replica(b: Behaviour) -> Starlette:
    def record(request: Request, raw: bytes) -> None:
        """What a request brought: its body, headers, path and query string."""
        b.received.append(raw)
        b.headers.append(dict(request.headers))
        b.paths.append(request.url.path)
        b.query_strings.append(request.url.query)

    async def complete(request: Request) -> Response:
        raw = await request.body()
        record(request, raw)
        b.header_lines.append(request.headers.items())
        body = json.loads(raw)
        chat = "messages" in body
        await asyncio.sleep(b.first_byte_delay_s)  # an error takes as long to come
        if b.status != 200 and b.error_body is not None:
            return Response(b.error_body, status_code=b.status, media_type="application/json")
        if b.status != 200:
            return JSONResponse({"error": {"message": f"{b.name} failing", "type": "x",
                                           "param": None, "code": None}}, status_code=b.status)
        if b.hold is not None:
            await asyncio.to_thread(b.hold.wait, 30)
        obj = "chat.completion" if chat else "text_completion"
        usage = {"prompt_tokens": 10, "completion_tokens": b.chunks,
                 "total_tokens": 10 + b.chunks, "prompt_tokens_details": {"cached_tokens": 4}}
        if b.usage is not None:
            usage = b.usage  # type: ignore[assignment]
        if not body.get("stream") and b.whole_body is not None:
            return Response(b.whole_body, media_type="application/json")
        if not body.get("stream"):
            choice = ({"index": 0, "message": {"role": "assistant", "content": f"{b.name} ok"},
                       "finish_reason": "stop"} if chat else
                      {"index": 0, "text": f"{b.name} ok", "finish_reason": "stop"})
            return with_lines(JSONResponse({"id": "x", "object": obj, "created": 0,
                                            "model": body.get("model"), "choices": [choice],
                                            "usage": usage}))

        async def events():  # type: ignore[no-untyped-def]
            try:
                for i in range(b.chunks):
                    if i:
                        await asyncio.sleep(b.chunk_delay_s)
                    if i == b.chunks - 1 and b.release is not None:
                        await asyncio.to_thread(b.release.wait, 10)
                    text = f"t{i} " + "x" * b.pad
                    # vLLM's last token's event tells its choice's finish reason
                    finish = "length" if i == b.chunks - 1 else None
                    delta = ({"index": 0, "delta": {"content": text}, "finish_reason": finish}
                             if chat else {"index": 0, "text": text, "finish_reason": finish})
                    chunk = {"id": "x", "object": obj + ".chunk" if chat else obj,
                             "created": 0, "model": body.get("model"), "choices": [delta]}
                    yield f"data: {json.dumps(chunk)}\n\n".encode()
                if b.done:
                    yield b.done_event
                await asyncio.sleep(b.linger_s)
            except asyncio.CancelledError:
                b.cancelled += 1
                raise

        return with_lines(StreamingResponse(events(), media_type="text/event-stream"))

    def with_lines(response: Response) -> Response:
        response.raw_headers.extend((k.encode(), v.encode()) for k, v in b.answer_headers)
        return response

    async def generate(request: Request) -> Response:
        """SGLang's native /generate: ``text`` (or a batch of texts) or ``input_ids``;
        a stream's events carry the whole text so far and ``meta_info``, then [DONE]."""
        raw = await request.body()
        record(request, raw)
        body = json.loads(raw)
        if b.status != 200:
            return JSONResponse({"error": {"message": f"{b.name} failing"}},
                                status_code=b.status)

        def meta(done: int, finished: bool) -> dict[str, object]:
            # SGLang's order: the prompt's count, the log probabilities so far, the others
            logprobs = {"output_token_logprobs": [[-0.25, 7, None]] * (done * b.logprobs)} \
                if b.logprobs else {}
            return {"id": body.get("rid") or "r",
                    "finish_reason": {"type": "length", "length": done} if finished else None,
                    "prompt_tokens": 10, **logprobs, "completion_tokens": done,
                    "cached_tokens": 4}

        if not body.get("stream"):
            one = {"text": f"{b.name} ok", "meta_info": meta(b.chunks, True)}
            texts = body.get("text")
            # SGLang answers n samples of a prompt as a list, each counting the prompt
            params = body.get("sampling_params")
            n = params.get("n", 1) if isinstance(params, dict) else 1
            answers = [one] * ((len(texts) if isinstance(texts, list) else 1) * n)
            return JSONResponse(answers if len(answers) > 1 or isinstance(texts, list)
                                else one)

        async def events():  # type: ignore[no-untyped-def]
            text = ""
            for i in range(b.chunks):
                if i:
                    await asyncio.sleep(b.chunk_delay_s)
                text += f"t{i} " + "x" * b.pad
                out = {"text": text, "meta_info": meta(i + 1, i == b.chunks - 1)}
                yield f"data: {json.dumps(out)}\n\n".encode()
            if b.done:
                yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def respond(request: Request) -> Response:
        """OpenAI's Responses API as vLLM serves it: a response object, or named events
        from response.created to response.completed (no [DONE]); each id names the
        replica and counts its answers."""
        raw = await request.body()
        record(request, raw)
        body = json.loads(raw)
        await asyncio.sleep(b.first_byte_delay_s)
        if b.status != 200:
            return JSONResponse({"error": {"message": f"{b.name} failing", "type": "x",
                                           "param": None, "code": b.status}},
                                status_code=b.status)
        b.responded += 1
        rid = f"resp_{b.name}{b.responded}"
        usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4},
                 "output_tokens": b.chunks, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": 10 + b.chunks}
        words = [f"t{i}" + "x" * b.pad for i in range(b.chunks)]
        # as vLLM's: the request's metadata echoed, the usage after the output
        done = {"id": rid, "object": "response", "created_at": 0, "model": body.get("model"),
                "status": "completed", "error": None, "metadata": body.get("metadata"),
                "output": [{"type": "message", "role": "assistant", "id": "msg_1",
                            "content": [{"type": "output_text", "text": " ".join(words)}]}],
                "usage": usage}
        if not body.get("stream"):
            if b.response_failed:
                return JSONResponse({**done, "status": "failed", "usage": None, "error": {
                    "code": "server_error", "message": "the engine failed"}})
            return JSONResponse(done)

        numbers = itertools.count()

        def event(kind: str, data: dict[str, object]) -> bytes:
            # pydantic's order, as vLLM writes them: the event's type last
            if b.numbered:
                data = {**data, "sequence_number": next(numbers)}
            return f"event: {kind}\ndata: {json.dumps({**data, 'type': kind})}\n\n".encode()

        async def events():  # type: ignore[no-untyped-def]
            yield event("response.created", {"response": {**done, "status": "in_progress",
                                                          "output": [], "usage": None}})
            for i in range(b.chunks):
                await asyncio.sleep(b.chunk_delay_s)
                yield event("response.output_text.delta", {"delta": f"{words[i]} ",
                                                           "item_id": "msg_1"})
            if not b.done:  # ended as if cut: no last event
                return
            if b.response_failed:
                yield event("response.failed", {"response": {
                    **done, "status": "failed", "usage": None,
                    "error": {"code": "server_error", "message": "the engine failed"}}})
            else:
                yield event("response.completed", {"response": done})

        return StreamingResponse(events(), media_type="text/event-stream")

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok", status_code=200 if b.healthy else 503)

    async def models(request: Request) -> Response:
        b.listed += 1
        return JSONResponse({"object": "list", "data": [  # as vLLM lists models and adapters
            {"id": b.model, "object": "model", "root": b.root or b.model, "parent": None,
             "max_model_len": 4096},
            *({"id": f"{b.model}-lora-{i}", "object": "model", "root": f"/adapters/{i}",
               "parent": b.model} for i in range(b.adapters))]})

    async def metrics(request: Request) -> Response:
        lines = [
            "# TYPE vllm:num_requests_running gauge",
            'vllm:num_requests_running{model_name="m"} 1.0',
            "# TYPE vllm:num_requests_waiting gauge",
            # none waiting: a standing queue says the replica is full (one slot, to a
            # slot learner that reads it)
            'vllm:num_requests_waiting{model_name="m"} 0.0',
            "# TYPE vllm:kv_cache_usage_perc gauge",
            'vllm:kv_cache_usage_perc{model_name="m"} 0.25',
            "# TYPE vllm:prefix_cache_queries counter",
            f'vllm:prefix_cache_queries_total{{model_name="m"}} {float(b.queries)}',
            "# TYPE vllm:prefix_cache_hits counter",
            f'vllm:prefix_cache_hits_total{{model_name="m"}} {float(b.hits)}',
            "# TYPE vllm:cache_config_info gauge",
            'vllm:cache_config_info{block_size="16",num_gpu_blocks="1000"} 1.0',
        ]
        if b.progressing:
            b.generated += 7
            lines += ["# TYPE vllm:generation_tokens counter",
                      f'vllm:generation_tokens_total{{model_name="m"}} {float(b.generated)}']
        if b.queued_tokens is not None:
            lines += ["# TYPE kvgate:num_prompt_tokens_waiting gauge",
                      f"kvgate:num_prompt_tokens_waiting {float(b.queued_tokens)}"]
        if b.metrics_status != 200:
            return PlainTextResponse("metrics broken", status_code=b.metrics_status)
        return Response(("\n".join(lines) + "\n").encode() + b.metrics_extra,
                        media_type="text/plain")

    async def invocations(request: Request) -> Response:  # vLLM's, for a pooling model
        raw = await request.body()
        b.received.append(raw)
        b.paths.append(request.url.path)
        b.query_strings.append(request.url.query)
        return JSONResponse({"object": "list", "data": [
            {"object": "embedding", "index": 0, "embedding": [0.5, -0.5]}]})

    async def transcribe(request: Request) -> Response:  # vLLM's audio uploads
        raw = await request.body()
        record(request, raw)
        if b'name="stream"\r\n\r\ntrue\r\n' in raw:
            events = [{"object": "transcription.chunk", "choices": [{"delta": {
                "content": word}}]} for word in ("hello ", "world")]
            body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
            return Response(body, media_type="text/event-stream")
        return JSONResponse({"text": f"{b.name} heard {len(raw)} bytes"})

    return Starlette(routes=[
        Route("/v1/audio/transcriptions", transcribe, methods=["POST"]),
        Route("/v1/audio/translations", transcribe, methods=["POST"]),
        Route("/invocations", invocations, methods=["POST"]),
        Route("/v1/completions", complete, methods=["POST"]),
        Route("/v1/chat/completions", complete, methods=["POST"]),
        Route("/generate", generate, methods=["POST"]),
        Route("/v1/responses", respond, methods=["POST"]),
        Route("/health", health), Route("/v1/models", models), Route("/metrics", metrics),
    ])
