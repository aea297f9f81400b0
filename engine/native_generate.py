"""The engine's ``POST /generate``: SGLang's native API (:mod:`engine.native_schema`).

Each prompt runs through the same engine core as the OpenAI routes: it is queued and
batched with them, reuses and fills the same prefix cache, publishes the same KV events
and counts in the same metrics; ``meta_info.cached_tokens`` is its prefix-cache hit. A
client's ``rid`` is the engine's request id (400 while one of that id is in flight).

Answers as SGLang gives them: one JSON object, or a list of them for a batch; streamed,
``data: {...}`` events each carrying the whole text and output ids so far (SGLang's
default, not incremental) and the ``meta_info`` of that point (``finish_reason`` null
until the last), then ``data: [DONE]``. Events go out, as SGLang sends them, at output
lengths 1, 1 + k, 1 + 2k ... (``stream_interval`` k; a length whose token added no text
goes with the next that does) and at the end. A stream that fails ends with an event
whose ``finish_reason`` is ``{"type": "abort", "message", "status_code", "err_type"}``.
A batch is answered whole, never streamed. Log probabilities: :mod:`engine.native_logprobs`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response

from engine.generation import AnswerStream, Generation, abort_unended
from engine.native_logprobs import LogprobFields, check_logprob_start
from engine.native_schema import NativeItem, answer_limit, finish_reason, parse_native
from engine.request import RequestOutput
from kvwire.openai_schema import BadRequest, OpenAIError
from kvwire.request_edge import json_answer, off_loop_past, unless_disconnected

if TYPE_CHECKING:
    from engine.server import EngineServer



class NativeGenerateRoute:
    """``handle`` serves ``POST /generate`` for one :class:`EngineServer`."""

    def __init__(self, server: EngineServer, *, max_body_bytes: int) -> None:
        self.server = server
        self.max_body_bytes = max_body_bytes

    async def handle(self, request: HTTPRequest) -> Response:
        srv = self.server
        req = await srv.read_json(request, lambda body: parse_native(
            body, model_name=srv.model_name, vocab_size=srv.vocab_size), self.max_body_bytes)
        started_s = time.monotonic()
        # each text inside the tokenizer's special tokens (a Llama's BOS first), as SGLang
        # encodes a ``text`` and the gateway routes it
        prompts = await srv.each_prompt_ids([item.params for item in req.items],
                                                    field="text")
        for item, ids in zip(req.items, prompts, strict=True):
            check_logprob_start(item.logprobs, len(ids))
        # every prompt checked before any is queued: a batch runs whole or not at all
        limits = [answer_limit(item, len(ids), max_model_len=srv.max_model_len,
                               max_request_tokens=srv.max_request_tokens)
                  for item, ids in zip(req.items, prompts, strict=True)]
        gens: list[_NativeGeneration] = []
        try:
            for item, ids, limit in zip(req.items, prompts, limits, strict=True):
                try:
                    queue = await srv.submit(item.rid, ids, item.params, limit)
                except ValueError as exc:  # its rid is in flight
                    raise BadRequest(str(exc), param="rid") from exc
                gens.append(_NativeGeneration(srv, item, ids if req.prompt_ids_back else None,
                                              len(ids), limit, queue, started_s))
            if req.stream:
                return AnswerStream(gens[0].sse(), gens)
            reasons = await unless_disconnected(request, _run_out_all(gens))
        except BaseException:
            abort_unended(gens)
            raise

        # every answer of the batch built, and written out, at once: on the loop when they
        # name few items in all, else in one worker thread (nothing changes the ended
        # generations meanwhile)
        def build() -> Any:
            answers = [gen.body(reason) for gen, reason in zip(gens, reasons, strict=True)]
            return answers if req.batch else answers[0]

        return await json_answer(build, sum(gen.num_items for gen in gens))


async def _run_out_all(gens: list[_NativeGeneration]) -> list[str | None]:
    # the engine runs them all at once; their queues hold what is not read yet
    return [await gen.run_out() for gen in gens]


class _NativeGeneration(Generation):
    """One prompt's outputs turned into SGLang's answer object or stream events."""

    def __init__(self, server: EngineServer, item: NativeItem, prompt_ids: list[int] | None,
                 num_prompt: int, max_tokens: int,
                 queue: asyncio.Queue[RequestOutput | BaseException], started_s: float
                 ) -> None:
        """``prompt_ids``: sent back in each answer (``return_prompt_token_ids``)."""
        super().__init__(server, item.rid, item.params, num_prompt, queue)
        self.prompt_ids = prompt_ids
        self.max_tokens = max_tokens
        self.interval = item.stream_interval
        self.started_s = started_s
        self.answer = ""
        self.logprob_fields = None if item.logprobs is None else LogprobFields(
            item.logprobs, server.decoder(skip_special_tokens=False))
        self.failure: OpenAIError | None = None  # what ended the stream, if it failed

    def _finish_reason(self, reason: str | None) -> dict[str, Any] | None:
        if reason is None:
            return None
        if self.failure is not None:
            fail = self.failure
            return {"type": "abort", "message": fail.message, "status_code": fail.status,
                    "err_type": fail.type}
        if reason == "abort":
            return {"type": "abort", "message": self.interrupted or "Aborted",
                    "status_code": None, "err_type": None}
        return finish_reason(reason, max_tokens=self.max_tokens, stop=self.text.stop,
                             token_ids=self.token_ids)

    def body(self, reason: str | None) -> dict[str, Any]:
        """The answer object of this point (``reason``: the finish, or None)."""
        meta: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": self._finish_reason(reason),
            "prompt_tokens": self.num_prompt,
            "weight_version": self.server.weight_version,
            "completion_tokens": self.num_output,
            "cached_tokens": max(0, self.num_cached),
        }
        if reason is not None:
            meta["e2e_latency"] = time.monotonic() - self.started_s
        if self.logprob_fields is not None:
            self.logprob_fields.extend(self.token_ids, self.logprobs)
            meta.update(self.logprob_fields.fields())
        body = {"text": self.answer, "output_ids": list(self.token_ids), "meta_info": meta}
        if self.prompt_ids is not None:
            body["prompt_token_ids"] = self.prompt_ids
        return body

    @property
    def num_items(self) -> int:
        """About how many items an answer of this generation now names: its output ids,
        their log probability entries with their alternatives, and its prompt ids."""
        items = len(self.token_ids) + len(self.prompt_ids or ())
        if self.logprob_fields is not None:
            items += len(self.logprobs) * (1 + self.logprob_fields.ask.top)
        return items

    async def _event(self, reason: str | None) -> bytes:
        """The stream event of this point (``reason``: the finish, or None), built and
        serialised in a worker thread when it names many items."""
        return await off_loop_past(
            self.num_items, lambda: b"data: " + orjson.dumps(self.body(reason)) + b"\n\n")

    async def run_out(self) -> str | None:
        """Read this generation's outputs to its end (its answer's text gathered); its
        finish reason, for :meth:`body`."""
        self.answer, reason = await self.read()
        return reason

    async def sse(self) -> AsyncGenerator[bytes, None]:
        due = 1  # the output length the next event waits for: 1, 1 + k, 1 + 2k ...
        unsent: list[str] = []  # the deltas since the last event, joined into it
        try:
            async with contextlib.aclosing(self._deltas()) as deltas:
                async for delta, reason in deltas:
                    unsent.append(delta)
                    if reason is None and self.num_output < due:
                        continue
                    # the first due length past this one
                    due += -(-(self.num_output + 1 - due) // self.interval) * self.interval
                    self.answer += "".join(unsent)
                    unsent.clear()
                    yield await self._event(reason)
        except OpenAIError as exc:
            self.answer += "".join(unsent)
            self.failure = exc
            yield await self._event("abort")
        yield b"data: [DONE]\n\n"
