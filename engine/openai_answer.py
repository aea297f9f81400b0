"""An OpenAI completions or chat answer of ``n`` choices for each of its prompts (a
completions batch has several), as vLLM gives it.

Each choice is one engine request (:class:`OpenAIGeneration`); the ``n`` of one prompt
share its blocks in the prefix cache. Prompt j's sequence i is choice ``j * n + i``.
:class:`OpenAIAnswer` answers them as one body, choices in index order, or as one SSE
stream whose chunks name their choice's ``index``. The engine runs the choices at once
and a stream interleaves their chunks as they come, as vLLM's does (a client showing
every choice sees each start with its first token, not after the choices before it).
Usage is vLLM's: each prompt counted once, the completion tokens of every choice summed;
``cached_tokens`` sums each prompt's first choice's. With ``continuous_usage_stats`` every
streamed chunk also carries, as vLLM's do, the usage of its own choice so far: its
prompt's tokens and the tokens that choice has produced (none yet in a chat's role chunk).

``echo`` (vLLM's): a completion's text starts with its prompt (its text, or its ids
decoded), its ``logprobs`` with the prompt's tokens; a stream sends them with its first
chunk. A chat's content starts with the last message's where that message has the
answer's role; a stream sends it in a chunk of its own after the role chunk.
``prompt_logprobs`` answer in a completion's every choice and at the top of a chat's
answer (null where not asked), never in a stream's chunks.

``return_token_ids`` (vLLM's): the prompt's ids as ``prompt_token_ids`` where
``prompt_logprobs`` would be (a stream's: in its first chunk, a completion's in each
choice's first), and each choice's output ids as its ``token_ids`` (the end-of-sequence
or stop token's and those a stop string cut too, as its log probabilities); each streamed
chunk of a choice carries the ids that arrived since its last.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import time
from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from starlette.responses import JSONResponse

from engine.generate_params import GenerateParams, usage
from engine.generation import Generation, abort_unended
from engine.openai_logprobs import LogprobRenderer, render_prompt_logprobs
from engine.request import RequestOutput, TokenLogprob
from kvwire.openai_schema import OpenAIError
from kvwire.request_edge import json_answer, off_loop_past

if TYPE_CHECKING:
    from engine.server import EngineServer

_INT64 = 1 << 64


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def child_params(p: GenerateParams, index: int) -> GenerateParams:
    """Choice ``index``'s parameters: a seeded request's ``seed + index`` (wrapped into 64
    bits), as vLLM seeds the sequences of ``n`` > 1, so they differ yet reproduce."""
    if p.seed is None or index == 0:
        return p
    seed = (p.seed + index + (1 << 63)) % _INT64 - (1 << 63)
    return dataclasses.replace(p, seed=seed)


def chat_echo(p: GenerateParams) -> str:
    """What a chat's ``echo`` puts before the answer, as vLLM: the last message's content
    (its text parts joined by newlines) where that message has the answer's role (the
    assistant's after a generation prompt, else the last message's own), else nothing."""
    if not p.echo or not p.messages or not isinstance(p.messages[-1], dict):
        return ""
    last = p.messages[-1]
    role = "assistant" if p.add_generation_prompt else last.get("role")
    content = last.get("content")
    if last.get("role") != role or not content:
        return ""
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content
                         if isinstance(part, dict) and part.get("type") == "text")
    return content if isinstance(content, str) else ""


class StreamChoice(NamedTuple):
    """One stream chunk's choice, and its generation's counts when it was made."""

    choice: dict[str, Any]
    num_prompt: int
    num_output: int

    def usage(self) -> dict[str, int]:
        """The usage a chunk carries with ``continuous_usage_stats``, in vLLM's shape."""
        return {"prompt_tokens": self.num_prompt, "completion_tokens": self.num_output,
                "total_tokens": self.num_prompt + self.num_output}


class OpenAIGeneration(Generation):
    """One choice's outputs as an OpenAI choice object or stream choices."""

    def __init__(self, server: EngineServer, rid: str, index: int, chat: bool,
                 p: GenerateParams, num_prompt: int,
                 queue: asyncio.Queue[RequestOutput | BaseException], sequence: int = 0,
                 prompt_ids: Sequence[int] = ()) -> None:
        """``index``: the choice's; ``sequence``: which of its prompt's ``n`` it is;
        ``prompt_ids``: its prompt's tokens (what ``echo`` and ``prompt_logprobs`` name)."""
        super().__init__(server, rid, p, num_prompt, queue)
        self.index = index
        self.sequence = sequence
        self.chat = chat
        self.prompt_ids = prompt_ids
        k = p.sampling.get("logprobs")
        self.renderer = None if k is None else LogprobRenderer(
            k, server.decoder(skip_special_tokens=False), p.return_tokens_as_token_ids)
        self.num_rendered = 0  # output tokens whose log probabilities went out
        # ``return_token_ids``: the output ids that went out, and whether a streamed
        # completion's prompt ids did
        self.num_ids_sent = 0
        self.sent_prompt_ids = False
        self.num_chars = 0  # characters of text that went out
        self.echoing = p.echo and not chat  # a completion's prompt, until it went out
        self.chat_echo = chat_echo(p) if chat else ""

    def _echo(self) -> tuple[str, list[int], list[TokenLogprob | None]]:
        """A completion's echoed prompt the first time it is asked for (its text, its ids,
        their log probabilities: none for the first), else nothing."""
        if not self.echoing:
            return "", [], []
        self.echoing = False
        p = self.p
        text = p.prompt_text if p.prompt_text is not None and \
            p.truncate_prompt_tokens is None else \
            self.server.decoder(skip_special_tokens=False).decode(self.prompt_ids)
        return text, list(self.prompt_ids), [None, *(self.prompt_logprobs or ())]

    def _logprobs(self, echo_ids: Sequence[int] = (),
                  echo_lps: Sequence[TokenLogprob | None] = ()) -> dict[str, Any] | None:
        """The log probabilities of the tokens that arrived since the last call, after an
        echoed prompt's (a completion's ``text_offset`` from the text sent before them),
        if asked; with ``echo_only`` the prompt's alone."""
        if self.renderer is None:
            return None
        ids, lps = self.token_ids[self.num_rendered:], self.logprobs[self.num_rendered:]
        self.num_rendered = len(self.token_ids)
        if self.chat:
            return self.renderer.chat(ids, lps)
        if self.p.echo_only:
            ids, lps = [], []
        return self.renderer.completion([*echo_ids, *ids], [*echo_lps, *lps],
                                        offset=self.num_chars)

    def _new_token_ids(self) -> list[int]:
        """The output ids that arrived since the last call."""
        ids = self.token_ids[self.num_ids_sent:]
        self.num_ids_sent = len(self.token_ids)
        return ids

    def forget_sent(self) -> None:
        super().forget_sent()
        self.num_rendered = self.num_ids_sent = 0

    def prompt_logprobs_json(self) -> list[dict[str, Any] | None] | None:
        """vLLM's ``prompt_logprobs`` of this choice's prompt, None where not asked."""
        if self.prompt_logprobs is None:
            return None
        return render_prompt_logprobs(self.prompt_ids, self.prompt_logprobs,
                                      self.server.decoder(skip_special_tokens=False))

    @property
    def num_logprob_tokens(self) -> int:
        """The tokens whose log probabilities :meth:`render` names: the outputs' where
        asked, the prompt's where asked or echoed with them."""
        n = 0 if self.renderer is None else len(self.token_ids)
        if self.prompt_logprobs is not None or (self.echoing and self.renderer is not None):
            n += len(self.prompt_ids)
        return n

    @property
    def num_render_tokens(self) -> int:
        """The tokens rendering this choice whole (or a stream's first chunk of it) reads:
        those whose log probabilities it names, and the ids of an echoed prompt that
        :meth:`_echo` decodes to its text (a prompt given as ids, or truncated)."""
        n = self.num_logprob_tokens
        if self.echoing and (self.p.prompt_text is None
                             or self.p.truncate_prompt_tokens is not None):
            n += len(self.prompt_ids)
        return n

    def render(self, text: str, reason: str | None) -> dict[str, Any]:
        """The choice object of the whole choice, of ``text`` and ``reason`` (what
        :meth:`read` returned)."""
        if self.chat:
            choice = {"index": self.index,
                      "message": {"role": "assistant", "content": self.chat_echo + text},
                      "logprobs": self._logprobs(), "finish_reason": reason,
                      "stop_reason": self._stop_reason()}
        else:
            head, ids, lps = self._echo()
            logprobs = self._logprobs(ids, lps)
            choice = {"index": self.index, "text": head + ("" if self.p.echo_only else text),
                      "logprobs": logprobs, "finish_reason": reason,
                      "stop_reason": self._stop_reason(),
                      "prompt_logprobs": self.prompt_logprobs_json()}
            if self.p.return_token_ids:
                choice["prompt_token_ids"] = list(self.prompt_ids)
        if self.p.return_token_ids:
            choice["token_ids"] = self._new_token_ids()
        return choice

    def _choice(self, delta: str | None, reason: str | None, role: bool = False
                ) -> dict[str, Any]:
        """One chunk's choice: ``delta`` and the log probabilities of the tokens that came
        with it (their text may be held back for a later chunk, or cut by a stop string),
        after a completion's echoed prompt in its first; a role chunk carries none."""
        stop_reason = self._stop_reason() if reason else None
        if not self.chat:
            head, ids, lps = self._echo()
            text = head + ("" if self.p.echo_only else delta or "")
            logprobs = self._logprobs(ids, lps)
            self.num_chars += len(text)
            choice = {"index": self.index, "text": text, "logprobs": logprobs,
                      "finish_reason": reason, "stop_reason": stop_reason}
            if self.p.return_token_ids:
                if not self.sent_prompt_ids:  # the choice's first chunk
                    self.sent_prompt_ids = True
                    choice["prompt_token_ids"] = list(self.prompt_ids)
                choice["token_ids"] = self._new_token_ids()
            return choice
        logprobs = None if role else self._logprobs()
        d: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
        if delta or logprobs is not None:
            d["content"] = delta or ""
        choice = {"index": self.index, "delta": d, "logprobs": logprobs,
                  "finish_reason": reason, "stop_reason": stop_reason}
        if self.p.return_token_ids and not role:
            choice["token_ids"] = self._new_token_ids()
        return choice

    async def choices(self) -> AsyncGenerator[StreamChoice, None]:
        """The stream choices of this choice, in order."""
        # as vLLM: the role chunk goes with the first token, so a stream's first byte is
        # its first token
        role = self.chat
        async with contextlib.aclosing(self._deltas()) as deltas:
            async for delta, reason in deltas:
                if role:
                    role = False
                    yield StreamChoice(self._choice(None, None, role=True), self.num_prompt, 0)
                    if self.chat_echo:
                        yield StreamChoice(
                            {"index": self.index, "delta": {"content": self.chat_echo},
                             "logprobs": None, "finish_reason": None, "stop_reason": None},
                            self.num_prompt, 0)
                # the chunk echoing a long prompt (decoded, or with its log
                # probabilities): off the loop
                choice = await off_loop_past(self.num_render_tokens if self.echoing else 0,
                                             functools.partial(self._choice, delta, reason))
                self.forget_sent()  # the chunk names every output id and log probability
                yield StreamChoice(choice, self.num_prompt, self.num_output)


class OpenAIAnswer:
    """The response of one request: ``gens`` are its choices, in index order."""

    def __init__(self, rid: str, chat: bool, p: GenerateParams,
                 gens: Sequence[OpenAIGeneration]) -> None:
        self.rid = rid
        self.chat = chat
        self.p = p
        self.gens = gens
        self.server = gens[0].server
        self.created = int(time.time())
        self.sent_prompt_ids = False  # a streamed chat's ``prompt_token_ids`` went out

    def _usage(self) -> dict[str, Any]:
        firsts = [g for g in self.gens if g.sequence == 0]  # one per prompt
        return usage(sum(g.num_prompt for g in firsts), sum(g.num_output for g in self.gens),
                     sum(max(0, g.num_cached) for g in firsts),
                     self.server.prompt_tokens_details)

    async def response(self) -> JSONResponse:
        """The whole answer, once the engine finished every choice; rendered and written
        out in a worker thread where it names many log probabilities (each token decodes
        its alternatives and builds their dicts) or echoes long prompts of token ids
        (decoded to their text once per choice: n = 64 of a 128k-token prompt, over a
        second)."""
        try:
            ends = [await gen.read() for gen in self.gens]
        finally:
            abort_unended(self.gens)
        return await json_answer(lambda: self._render(ends),
                                 sum(g.num_render_tokens for g in self.gens))

    def _render(self, ends: Sequence[tuple[str, str | None]]) -> dict[str, Any]:
        """The answer object of the choices' ``ends`` (text, finish reason)."""
        choices = [gen.render(text, reason)
                   for gen, (text, reason) in zip(self.gens, ends, strict=True)]
        answer: dict[str, Any] = {"id": self.rid,
                  "object": "chat.completion" if self.chat else "text_completion",
                  "created": self.created, "model": self.server.model_name,
                  "choices": choices, "usage": self._usage()}
        if self.chat:  # as vLLM: a chat's (one prompt) at the top, a completion's per choice
            answer["prompt_logprobs"] = self.gens[0].prompt_logprobs_json()
            if self.p.return_token_ids:
                answer["prompt_token_ids"] = list(self.gens[0].prompt_ids)
        return answer

    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None
               ) -> str:
        obj: dict[str, Any] = {
            "id": self.rid, "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created, "model": self.server.model_name, "choices": choices}
        if self.p.include_usage:
            obj["usage"] = usage
        if self.chat and self.p.return_token_ids and not self.sent_prompt_ids:
            self.sent_prompt_ids = True  # as vLLM: a chat stream's first chunk names them
            obj["prompt_token_ids"] = list(self.gens[0].prompt_ids)
        return f"data: {_dumps(obj)}\n\n"

    async def _interleaved(self) -> AsyncGenerator[StreamChoice, None]:
        """Every choice's stream choices, each as soon as it comes: a task per choice
        feeds one queue; the tasks end with the iteration, however it ends."""
        if len(self.gens) == 1:
            async with contextlib.aclosing(self.gens[0].choices()) as choices:
                async for choice in choices:
                    yield choice
            return
        merged: asyncio.Queue[StreamChoice | Exception | None] = asyncio.Queue()

        async def feed(gen: OpenAIGeneration) -> None:
            try:
                async for choice in gen.choices():
                    merged.put_nowait(choice)
                merged.put_nowait(None)
            except Exception as exc:  # an OpenAIError: the stream ends with it
                merged.put_nowait(exc)

        feeders = [asyncio.create_task(feed(gen)) for gen in self.gens]
        try:
            left = len(feeders)
            while left:
                item = await merged.get()
                if item is None:
                    left -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield item
        finally:
            for task in feeders:
                task.cancel()
            await asyncio.gather(*feeders, return_exceptions=True)

    async def sse(self) -> AsyncGenerator[str, None]:
        """The answer's SSE chunks; closing it (``AnswerStream`` does, however the
        response ended) ends every choice's task at once."""
        try:
            async with contextlib.aclosing(self._interleaved()) as pieces:
                async for piece in pieces:
                    yield self._chunk([piece.choice],
                                      piece.usage() if self.p.continuous_usage else None)
            if self.p.include_usage:
                yield self._chunk([], self._usage())
        except OpenAIError as exc:
            yield f"data: {_dumps(exc.body())}\n\n"
        finally:
            abort_unended(self.gens)
        yield "data: [DONE]\n\n"
