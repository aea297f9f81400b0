"""The engine's ``POST /v1/embeddings`` route.

Each input runs through the engine core as a pooling request: queued, batched with other
work and charged by the executor as a prefill (the sim executor's cost model, the prefix
cache's hits included), finishing with no output token. Once all have finished, the
server's embedder turns their token ids into vectors in a worker thread, which also
serialises the body. Pooling requests count in the engine's request metrics
(``vllm:request_success_total{finished_reason="stop"}``, prompt tokens, queue and e2e
times), as vLLM counts them. An input the engine ends before its answer is a server
error: 503 when it was aborted there (``/abort_request``, code ``request_aborted``) or the
engine stopped, 500 when the step computing it failed.

Which executors embed: ``sim`` (:mod:`engine.sim_embedding`). ``torch`` answers 400: its
model returns final hidden states, but a prefix hit or a chunked prefill leaves some
prompt positions uncomputed in a step, so mean pooling would need per-request prefix
caching off and hidden states summed across steps; not built.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING

from starlette.requests import Request as HTTPRequest
from starlette.responses import Response

from engine.async_engine import EngineDeadError, RequestFailed, RequestInterrupted
from engine.embedding_schema import (
    MAX_TOTAL_TOKENS,
    EmbeddingParams,
    check_dimensions,
    checked_ids,
    embedding_context_error,
    embedding_keep,
    parse_embedding,
    render_response,
    too_many_in_all,
)
from engine.generate_params import TooManyTokens
from engine.request import RequestOutput, SamplingParams
from kvwire.openai_schema import BadRequest, OpenAIError, ServiceUnavailable
from kvwire.request_edge import unless_disconnected

if TYPE_CHECKING:
    from engine.server import EngineServer

_POOLING = SamplingParams(max_tokens=1, pooling=True)

Queues = dict[str, asyncio.Queue[RequestOutput | BaseException]]


class EmbeddingsRoute:
    """``handle`` serves ``POST /v1/embeddings`` for one :class:`EngineServer`."""

    def __init__(self, server: EngineServer, *, max_body_bytes: int) -> None:
        self.server = server
        self.max_body_bytes = max_body_bytes

    async def handle(self, request: HTTPRequest) -> Response:
        srv = self.server
        p = await srv.read_json(request, lambda body: parse_embedding(
            body, model_name=srv.model_name), self.max_body_bytes)
        embedder = srv.embedder
        if embedder is None:
            raise BadRequest(f"The model `{srv.model_name}` does not support Embeddings API: "
                             "this engine's executor serves no embeddings (only the sim "
                             "executor does)", param="model")
        check_dimensions(p, embedder)
        encoded = await self._encode(p) if p.texts is not None else p.token_ids
        assert encoded is not None  # parse_embedding gives texts or token ids
        ids = checked_ids(p, encoded, max_model_len=srv.max_model_len,
                          vocab_size=srv.vocab_size)
        try:
            for one in ids:
                srv.core.validate(len(one), 0, pooling=True)
        except ValueError as exc:  # longer than the whole KV cache
            raise BadRequest(str(exc), param="input") from exc
        rid = "embd-" + uuid.uuid4().hex
        await self._pool(request, rid, ids)
        body = await asyncio.to_thread(render_response, request_id=rid, model=srv.model_name,
                                       params=p, embedder=embedder, token_ids=ids)
        return Response(body, media_type="application/json")

    async def _encode(self, p: EmbeddingParams) -> list[list[int]]:
        """The ids of each text input: its last ``truncate_prompt_tokens``, read from its end,
        or all of it, refused before it is encoded whole when it is proven longer than the
        model's context, and the inputs refused as soon as those encoded hold more than
        ``MAX_TOTAL_TOKENS`` (the memory a request costs stays about the context's and
        that total's, however many inputs it sends)."""
        srv = self.server
        assert p.texts is not None
        try:
            return await srv.encode_texts(p.texts, field="input", within=srv.max_model_len,
                                          keep=embedding_keep(p, srv.max_model_len),
                                          in_all=MAX_TOTAL_TOKENS)
        except TooManyTokens as exc:
            if exc.in_all:
                raise too_many_in_all(exc.index, exc.at_least) from None
            raise embedding_context_error(exc.at_least, srv.max_model_len, at_least=True) from None

    async def _pool(self, request: HTTPRequest, rid: str, ids: list[list[int]]) -> None:
        """Run every input's prefill through the engine; on any error or a client gone,
        abort those not finished."""
        srv = self.server
        reqs = await asyncio.to_thread(lambda: [
            srv.core.make_request(f"{rid}-{i}", one, _POOLING) for i, one in enumerate(ids)])
        queues: Queues = {}
        try:
            for req in reqs:
                queues[req.request_id] = srv.engine.add(req)
                srv.metrics.started(req.request_id)
            await unless_disconnected(request, _finish_all(queues))
        except EngineDeadError as exc:
            raise ServiceUnavailable(str(exc)) from exc
        finally:
            for left in queues:
                srv.stop_early(left, "abort", None, queues[left])


async def _finish_all(queues: Queues) -> None:
    """Wait for each pooling request's one output (its finish), dropping it from
    ``queues`` once seen."""
    for request_id in list(queues):
        item = await queues[request_id].get()
        if isinstance(item, EngineDeadError):
            raise ServiceUnavailable(str(item))
        if isinstance(item, RequestFailed):
            raise OpenAIError(str(item), code="engine_step_failed")
        if isinstance(item, RequestInterrupted):  # ended on the engine (/abort_request)
            raise ServiceUnavailable(f"the engine aborted this request: {item}",
                                     code="request_aborted")
        if isinstance(item, BaseException):  # refused by the core when it queued it
            raise BadRequest(str(item), param="input")
        del queues[request_id]
