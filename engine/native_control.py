"""SGLang's control endpoints that RL clients call on each replica, on this engine.

- ``POST /abort_request`` ``{"rid": str}`` or ``{"abort_all": true}``: the requests end
  at once, answered as finished with ``{"type": "abort", "message": ...}`` (a stream's
  last event carries it); an id not in flight is no error. Answers 200, empty.
- ``GET /get_model_info``: ``model_path``, ``tokenizer_path``, ``is_generation``,
  ``preferred_sampling_params`` (null) and ``weight_version``.
- ``GET /v1/loads``: ``{"timestamp" (ISO 8601), "version", "dp_rank_count": 1,
  "loads": [one rank's counts], "aggregate": {...}}``; ``GET /get_load`` the older
  list of one ``{"dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens",
  "num_pending_tokens", "ts_tic"}``. Tokens are KV-cache tokens: ``num_used_tokens``
  held by requests, ``num_total_tokens`` those plus the prompt tokens still waiting.
  Throughput and utilization, which the engine does not track, are left out.
- ``GET`` or ``POST /flush_cache``: the prefix cache forgotten, as
  ``POST /reset_prefix_cache`` (an AllBlocksCleared KV event); answers 200 with text.
"""

from __future__ import annotations

import importlib.metadata
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response

from engine.core import EngineCore
from kvwire.media_parts import shown
from kvwire.openai_schema import BadRequest
from kvwire.request_edge import decoded_body

if TYPE_CHECKING:
    from engine.server import EngineServer

try:  # what SGLang's /v1/loads and vLLM's /version name
    ENGINE_VERSION = importlib.metadata.version("kvgate")
except importlib.metadata.PackageNotFoundError:  # run from a source tree
    ENGINE_VERSION = "0+unknown"
ABORT_MESSAGE = "Aborted by /abort_request"
_MAX_BODY_BYTES = 64 * 1024


class NativeControlRoutes:
    """The handlers of one :class:`EngineServer`; ``routes`` lists them."""

    def __init__(self, server: EngineServer) -> None:
        self.server = server

    async def abort_request(self, request: HTTPRequest) -> Response:
        srv = self.server
        async with srv.held_body(request, _MAX_BODY_BYTES) as raw:
            body = decoded_body(raw)
        if not isinstance(body, dict):
            raise BadRequest(f"request body must be a JSON object, got {shown(body)}")
        abort_all = body.get("abort_all", False)
        if not isinstance(abort_all, bool):
            raise BadRequest(f"'abort_all' must be a boolean, got {shown(abort_all)}",
                             param="abort_all")
        rid = body.get("rid")
        engine = self.server.engine
        if abort_all:
            rids = engine.in_flight()
        elif isinstance(rid, str) and rid:
            rids = [rid]
        else:
            raise BadRequest(f"'rid' must be a non-empty string (or 'abort_all' true), got "
                             f"{shown(rid)}", param="rid")
        for one in rids:
            engine.interrupt(one, ABORT_MESSAGE)
        return Response(status_code=200)

    async def get_model_info(self, request: HTTPRequest) -> Response:
        srv = self.server
        return JSONResponse({"model_path": srv.model_name,
                             "tokenizer_path": getattr(srv.tokenizer, "source", None),
                             "is_generation": True, "preferred_sampling_params": None,
                             "weight_version": srv.weight_version})

    async def loads(self, request: HTTPRequest) -> Response:
        load = await self.server.engine.call(_load)
        load["num_total_reqs"] = load["num_running_reqs"] + load["num_waiting_reqs"]
        aggregate = {
            "total_running_reqs": load["num_running_reqs"],
            "total_waiting_reqs": load["num_waiting_reqs"],
            "total_reqs": load["num_total_reqs"],
            "total_used_tokens": load["num_used_tokens"],
            "total_tokens": load["num_total_tokens"],
            "avg_token_usage": load["token_usage"],
        }
        return JSONResponse({"timestamp": datetime.now(UTC).isoformat(), "version": ENGINE_VERSION,
                             "dp_rank_count": 1, "loads": [load], "aggregate": aggregate})

    async def get_load(self, request: HTTPRequest) -> Response:
        load = await self.server.engine.call(_load)
        return JSONResponse([{
            "dp_rank": 0,
            "num_reqs": load["num_running_reqs"] + load["num_waiting_reqs"],
            "num_waiting_reqs": load["num_waiting_reqs"],
            "num_tokens": load["num_total_tokens"],
            "num_pending_tokens": load["num_total_tokens"] - load["num_used_tokens"],
            "ts_tic": time.perf_counter(),
        }])

    async def flush_cache(self, request: HTTPRequest) -> Response:
        await self.server.reset_prefix_cache(request)
        return PlainTextResponse("Cache flushed.")


def _load(core: EngineCore) -> dict[str, Any]:
    """One rank's load as SGLang's ``/v1/loads`` names it (read between engine steps)."""
    pool = core.kv.pool
    capacity = core.config.num_blocks * core.config.block_size
    used = pool.num_used_blocks * core.config.block_size
    return {"dp_rank": 0, "timestamp": time.time(),
            "num_running_reqs": core.num_running, "num_waiting_reqs": core.num_waiting,
            "num_used_tokens": used,
            "num_total_tokens": used + core.stats.prompt_tokens_waiting,
            "max_total_num_tokens": capacity, "token_usage": pool.usage(),
            "max_running_requests": core.config.max_num_seqs}
