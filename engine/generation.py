"""One generation's engine outputs read as text, whatever wire format answers it.

:class:`Generation` reads the queue :meth:`AsyncEngine.add` returned for one request and
turns each output into a text delta (stop strings cut, a stop token's text left out, as
vLLM does), keeping the counts an answer reports. The OpenAI routes
(``engine.server``) and SGLang's native ``/generate`` (``engine.native_generate``)
render it, each in its own shape; a streamed answer goes out as an :class:`AnswerStream`,
which aborts the requests it did not read to their end however it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from engine.async_engine import EngineDeadError, RequestFailed, RequestInterrupted
from engine.generate_params import GenerateParams
from engine.request import RequestOutput, TokenLogprob
from engine.text_stream import TextStream
from kvwire.openai_schema import BadRequest, OpenAIError, ServiceUnavailable

if TYPE_CHECKING:
    from engine.server import EngineServer


class Generation:
    """One request's outputs as text deltas. ``_deltas`` is read once (by :meth:`read`, or
    inside ``contextlib.aclosing`` so that it ends then and there); leaving it before the
    engine finished the request (the client left, an error, a stop string) aborts the
    request there. A request interrupted on the engine (``/abort_request``) ends with
    the reason ``abort`` and ``interrupted`` its message."""

    def __init__(self, server: EngineServer, rid: str, p: GenerateParams, num_prompt: int,
                 queue: asyncio.Queue[RequestOutput | BaseException]) -> None:
        self.server = server
        self.rid = rid
        self.p = p
        self.num_prompt = num_prompt
        self.queue = queue
        self.text = TextStream(server.decoder(p.skip_special_tokens), p.stop,
                               include_stop=p.include_stop,
                               min_tokens=p.sampling.get("min_tokens", 0))
        # every output token so far, a stop token's too (a stream's: since it last called
        # :meth:`forget_sent`)
        self.token_ids: list[int] = []
        # one per token of ``token_ids`` where the request asked for log-probabilities
        self.logprobs: list[TokenLogprob] = []
        # the prompt's, where asked (``prompt_logprobs``): one per prompt token after the first
        self.prompt_logprobs: tuple[TokenLogprob, ...] | None = None
        # then every output with new tokens is yielded, its text released or not
        self.wants_logprobs = p.sampling.get("logprobs") is not None
        self.interrupted: str | None = None
        self.num_output = 0
        self.num_cached = 0
        self.last: RequestOutput | None = None
        self.done = False  # the engine finished the request
        self.ended = False  # ``_deltas`` is over: the request finished or was aborted
        # what ended it, as vLLM reports: the stop token id or (``text.stop``) string
        self.stop_reason: int | str | None = None

    async def _deltas(self) -> AsyncGenerator[tuple[str, str | None], None]:
        """(text delta, finish reason or None) per engine output that released text,
        finished, or (log probabilities asked) brought tokens; aborts on early exit."""
        try:
            while True:
                item = await self.queue.get()
                if isinstance(item, EngineDeadError):
                    raise ServiceUnavailable(str(item))
                if isinstance(item, RequestFailed):
                    raise OpenAIError(str(item), code="engine_step_failed")
                if isinstance(item, RequestInterrupted):
                    self.interrupted = str(item)
                    yield self.text.flush(), "abort"
                    return
                if isinstance(item, BaseException):
                    raise BadRequest(str(item))
                self.last = item
                self.num_output = item.num_output_tokens
                self.num_cached = item.num_cached_tokens
                self.token_ids.extend(item.new_token_ids)
                self.logprobs.extend(item.logprobs)
                if item.prompt_logprobs is not None:
                    self.prompt_logprobs = item.prompt_logprobs
                reason = item.finish_reason
                ids = item.new_token_ids
                if reason == "stop" and ids:
                    # ended by the end-of-sequence token or a stop token id: its text is
                    # not part of the answer (as vLLM, unless include_stop_str_in_output);
                    # a stop token id is named as what stopped it, kept in the text or not
                    if ids[-1] in self.p.stop_token_ids:
                        self.stop_reason = ids[-1]
                    if not self.p.include_stop:
                        ids = ids[:-1]
                delta = self.text.push(ids)
                if self.text.stopped:
                    reason = "stop"
                elif reason is not None:
                    delta += self.text.flush()
                if reason is not None:
                    self.done = item.finished
                    yield delta, reason
                    return
                if delta or (self.wants_logprobs and item.new_token_ids):
                    yield delta, None
        finally:
            stopped = self.ended  # by ``abort_unended``: stopped on the engine already
            self.ended = True
            if not self.done and not stopped:
                self.server.stop_early(self.rid, "stop" if self.text.stopped else "abort",
                                       self.last, self.queue)

    async def read(self) -> tuple[str, str | None]:
        """The outputs read to their end: the whole text (its deltas joined once, not
        copied again at each: a long answer comes in 100k+ deltas) and the finish reason."""
        parts: list[str] = []
        reason = None
        async with contextlib.aclosing(self._deltas()) as deltas:
            async for delta, reason in deltas:  # noqa: B007
                parts.append(delta)
        return "".join(parts), reason

    def forget_sent(self) -> None:
        """Drop the output ids and log probabilities read so far. A stream calls it once
        the event that names them is made, so that it holds only those of the output it
        is on, not every one of a long answer (``n`` choices of thousands of tokens with
        20 alternatives each), as vLLM's delta outputs; a whole answer, which names them
        all at its end, does not."""
        self.token_ids.clear()
        self.logprobs.clear()

    def _stop_reason(self) -> int | str | None:
        return self.text.stop if self.text.stopped else self.stop_reason


def abort_unended(gens: Sequence[Generation]) -> None:
    """Abort the engine requests of ``gens`` whose outputs were not read to their end."""
    for gen in gens:
        if not gen.ended:
            gen.ended = True
            gen.server.stop_early(gen.rid, "abort", gen.last, gen.queue)


class AnswerStream(StreamingResponse):
    """A streamed answer (``text/event-stream``) of ``gens``: once it is over, however it
    ended (the client gone, a send that failed or was cancelled, before the first event
    or after the last), the engine requests it did not read to their end are aborted and
    its ``events`` closed (the tasks they run, such as one per choice, ended), then and
    there, not when its events' iterator is collected."""

    def __init__(self, events: AsyncGenerator[str | bytes, None], gens: Sequence[Generation]
                 ) -> None:
        super().__init__(events, media_type="text/event-stream")
        self.events = events
        self.gens = gens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            abort_unended(self.gens)
            await self.events.aclose()
