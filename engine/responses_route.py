"""OpenAI's Responses API on the engine (``POST /v1/responses``), as vLLM serves it.

A request runs as the chat it stands for (``kvwire.responses_input``: the gateway routes it
as the same chat, so both see one prompt): ``instructions``, then the stored conversation
of ``previous_response_id`` (a 404 naming it when this replica holds none, or holds it
under another ``cache_salt``: the gateway sends a continuation back to the replica that
answered), then ``input``; a
``text.format`` or ``tool_choice`` asking for constrained output is refused, as the chat's
are. The answer is a response object, or its events (``response.created`` ...
``response.completed``, each named and numbered, no ``[DONE]`` after the last; one that
fails ends with an ``error`` event, then the terminal ``response.failed``); its
``usage`` counts ``input_tokens`` (``cached_tokens`` of them) and ``output_tokens``. A
response is stored (``store``, true unless false) as its conversation and the
``cache_salt`` it was made under, the latest kept (``ResponseStore``: so many, so many
characters); only a request under that same salt (none where it had none) continues it: a
salt is a tenant's (the gateway's ``tenancy.isolate``), and another tenant's request is
told the response does not exist, as for an id never stored; with ``client_salt: replace``
the client's own ``cache_salt`` is mixed into it, so the same tenant is told so too when it
changes its ``cache_salt`` between turns. Instructions are not carried into a
continuation, as OpenAI's are not.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
import uuid
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response

from engine.generate_params import GenerateParams, context_error, parse_generate
from engine.generation import AnswerStream, Generation
from engine.request import RequestOutput
from kvwire.bounded_memo import BoundedMemo
from kvwire.media_parts import shown
from kvwire.openai_schema import (
    BadRequest,
    NotFound,
    OpenAIError,
    check_cache_salt,
    checked_as_sent,
    optional,
    positive_int,
)
from kvwire.request_edge import (
    PARSE_ON_THREAD_COMMAS,
    decoded_body,
    parses_on_loop,
    unless_disconnected,
)
from kvwire.responses_input import ResponsesChat, responses_chat

if TYPE_CHECKING:
    from engine.server import EngineServer

STORE_LIMIT = 1024  # stored responses kept, the oldest forgotten first
STORE_CHARS = 1 << 26  # ... and the characters of their conversations, all together
_MESSAGE_CHARS = 64  # what a message counts beyond its text (its dict, its role)
# the fields a Responses request shares with a chat (sampling), and those it names anew
_SHARED = ("temperature", "top_p", "cache_salt", "stream")
_RENAMED = {"max_output_tokens": "max_tokens"}
# the fields of a request its response echoes as sent
_ECHOED = ("instructions", "previous_response_id", "tool_choice", "tools", "metadata")


class _Stored(NamedTuple):
    """A stored response: its conversation, and the ``cache_salt`` it was made under."""

    turns: list[dict[str, Any]]
    salt: str | None


class ResponseStore:
    """The conversations of the latest stored responses, by response id, each with the
    ``cache_salt`` it was made under: ``limit`` of them at most, holding ``max_chars``
    characters at most in all (each conversation counts all of its turns, those it shares
    with the one it continues too); the oldest forgotten first. A conversation longer than
    ``max_chars`` alone is not stored."""

    def __init__(self, limit: int = STORE_LIMIT, max_chars: int = STORE_CHARS) -> None:
        self._memo: BoundedMemo[str, _Stored] = BoundedMemo(
            limit, weight=_stored_chars, max_weight=max_chars)

    def __len__(self) -> int:
        return len(self._memo)

    @property
    def chars(self) -> int:
        """The stored conversations' characters, as ``_chars`` counts them."""
        return self._memo.weight

    def put(self, response: str, turns: list[dict[str, Any]], *, salt: str | None) -> None:
        """Keep ``turns`` as ``response``'s conversation, made under ``salt`` (None: the
        request had none), unless they alone hold more than the store's characters."""
        max_chars = self._memo.max_weight
        if max_chars is None or _chars(turns) <= max_chars:  # else it would push out all
            self._memo.put(response, _Stored(turns, salt))

    def get(self, response: str, *, salt: str | None) -> list[dict[str, Any]] | None:
        """The conversation of ``response`` when it was stored under ``salt``; None when it
        was not stored, or under another salt (a salt where it had none, or none where it
        had one): not told apart, so a tenant learns nothing of another's ids."""
        stored = self._memo.get(response, None)
        return stored.turns if stored is not None and stored.salt == salt else None

    def check_integrity(self) -> None:
        memo = self._memo
        counted = sum(_stored_chars(stored) for stored in memo.values())
        if counted != memo.weight or counted > (memo.max_weight or counted) \
                or len(memo) > memo.capacity:
            raise AssertionError(f"{len(memo)} conversations (limit {memo.capacity}) "
                                 f"of {counted} characters, counted {memo.weight} (limit "
                                 f"{memo.max_weight})")


def _stored_chars(stored: _Stored) -> int:
    return _chars(stored.turns)


def _chars(turns: list[dict[str, Any]]) -> int:
    """The characters a conversation holds: every string a client gave its messages
    (text, the parts of a content with images: their text, each image's address and
    detail; an assistant message's reasoning, a tool message's ``tool_call_id``) and
    their tool calls (id, name, arguments)."""
    size = 0
    for message in turns:
        size += _MESSAGE_CHARS + _strings(message.get("content"), message.get("reasoning"),
                                          message.get("tool_call_id"))
        content = message.get("content")
        for part in content if isinstance(content, list) else ():
            image = part.get("image_url")
            size += _MESSAGE_CHARS + _strings(part.get("text"), *(
                image.values() if isinstance(image, dict) else ()))
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            size += _MESSAGE_CHARS + _strings(call.get("id"), *function.values())
    return size


def _strings(*values: Any) -> int:
    return sum(len(v) for v in values if isinstance(v, str))


class ResponsesRoute:
    """``handle`` serves ``POST /v1/responses`` for one :class:`EngineServer`."""

    def __init__(self, server: EngineServer, *, max_body_bytes: int,
                 store_limit: int = STORE_LIMIT) -> None:
        self.server = server
        self.max_body_bytes = max_body_bytes
        self.store = ResponseStore(store_limit)

    async def handle(self, request: HTTPRequest) -> Response:
        srv = self.server
        p, asked, turns = await self._parse(request)
        ids = await srv.prompt_ids(p)
        limit = p.max_tokens if p.max_tokens is not None \
            else max(1, srv.max_request_tokens - len(ids))
        if len(ids) + limit > srv.max_model_len:
            raise context_error(len(ids), limit, srv.max_model_len,
                                limit_param=p.limit_param, prompt_field=p.prompt_field)
        rid = f"resp_{uuid.uuid4().hex}"
        queue = await srv.submit(rid, ids, p, limit)
        answer = _Answer(srv, rid, p, len(ids), queue, asked,
                         self.store if asked.store else None, turns)
        if p.stream:
            return AnswerStream(answer.events(), [answer])
        return JSONResponse(await unless_disconnected(request, answer.collect()))

    async def _parse(self, request: HTTPRequest
                     ) -> tuple[GenerateParams, _Asked, list[dict[str, Any]]]:
        """The request's chat, checked as a chat's, what its response echoes, and the
        turns its stored conversation holds. Its body's bytes and decoded JSON end here:
        the request runs on these alone."""
        srv = self.server
        # a large body (in bytes or in items) is read in a worker thread, and so is the
        # chat it stands for, as is one continuing a long conversation
        async with srv.held_body(request, self.max_body_bytes) as raw:
            inline = parses_on_loop(raw)
            asked, chat = _read(raw) if inline else await asyncio.to_thread(_read, raw)
        history: list[dict[str, Any]] = []
        if asked.previous is not None:
            stored = self.store.get(asked.previous, salt=asked.salt)
            if stored is None:  # never stored, forgotten, or another tenant's: one answer
                raise NotFound(f"Response with id {shown(asked.previous)} not found.",
                               param="previous_response_id")
            history = stored
        turns = [*history, *chat.turns]
        messages = [*chat.instructions, *turns]
        if not messages:
            raise BadRequest("'input' holds no message", param="input")
        chat_body: dict[str, Any] = {"model": srv.model_name, **asked.chat_fields,
                                     "messages": messages, "tools": chat.tools}
        # checked where the body may not have been decoded (``_read`` in another thread):
        # its errors still name an integer past 64 bits as sent
        parse = functools.partial(checked_as_sent, raw, functools.partial(
            parse_generate, chat_body, chat=True, model_name=srv.model_name,
            vocab_size=srv.vocab_size))
        p = dataclasses.replace(  # its errors name the Responses fields
            parse() if inline and len(history) <= PARSE_ON_THREAD_COMMAS
            else await asyncio.to_thread(parse),
            limit_param="max_output_tokens", prompt_field="input")
        return p, asked, turns


class _Asked(NamedTuple):
    """A Responses body, checked, in the parts a request runs on (never the body itself):
    the fields its response echoes (``_ECHOED``), those its chat takes (``model``,
    ``_SHARED``, ``_RENAMED`` renamed), the response it continues and the ``cache_salt``
    it runs under (which its stored response must have been made under), whether it is
    stored, and its ``parallel_tool_calls`` (echoed, not acted on)."""

    echoed: dict[str, Any]
    chat_fields: dict[str, Any]
    previous: str | None
    salt: str | None
    store: bool
    parallel_tool_calls: bool


def _read(raw: bytes) -> tuple[_Asked, ResponsesChat]:
    """What a Responses body asks, and the chat it stands for: a body nested too deep to
    echo (``check_nesting``) refused before its stream starts."""
    body = decoded_body(raw)
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    chat = responses_chat(body)
    positive_int(body, "max_output_tokens")  # named so, before it is the chat's max_tokens
    _refuse_constrained(body)
    _refuse_unacted(body)
    # echoed in the answer: an object of strings, as vLLM's
    metadata = optional(body, "metadata", dict, {})
    bad = next(((k, v) for k, v in metadata.items() if not isinstance(v, str)), None)
    if bad is not None:
        raise BadRequest(f"'metadata' values must be strings, got {shown(bad[1])} for "
                         f"{shown(bad[0])}", param="metadata")
    previous = optional(body, "previous_response_id", str, None)
    # checked before the stored response is looked up under it (as the chat checks it)
    salt = check_cache_salt(body.get("cache_salt"))
    store = optional(body, "store", bool, True)  # "false" read as false, as pydantic
    parallel = optional(body, "parallel_tool_calls", bool, True)
    echoed = {k: body[k] for k in _ECHOED if k in body}
    chat_fields = {k: body[k] for k in ("model", *_SHARED) if k in body}
    chat_fields.update((new, body[old]) for old, new in _RENAMED.items() if old in body)
    return _Asked(echoed, chat_fields, previous, salt, bool(store), bool(parallel)), chat


def _refuse_constrained(body: dict[str, Any]) -> None:
    """What asks for constrained output, refused (as a chat's ``response_format`` and
    ``tool_choice`` are) rather than answered with free text: a ``text.format`` other
    than text (a JSON schema, a JSON object), a ``tool_choice`` that forces or restricts
    the tool calls (``required``, a named tool, allowed tools)."""
    text = optional(body, "text", dict, None) or {}
    fmt = text.get("format")
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if not isinstance(fmt, dict) or kind not in ("text", "json_object", "json_schema"):
            raise BadRequest("'text.format' must be an object of type 'text', "
                             f"'json_object' or 'json_schema', got {shown(fmt)}",
                             param="text.format")
        if kind != "text":
            raise BadRequest(f"'text.format' of type {shown(kind)} (constrained output) is "
                             "not supported by this engine", param="text.format")
    choice = body.get("tool_choice")
    if choice is None or choice in ("none", "auto"):
        return
    if choice != "required" and not isinstance(choice, dict):
        raise BadRequest(f"'tool_choice' must be 'none', 'auto', 'required' or an object, "
                         f"got {shown(choice)}", param="tool_choice")
    raise BadRequest(f"'tool_choice' {shown(choice)} forces or restricts the tool calls "
                     "(constrained output), which this engine does not support",
                     param="tool_choice")


def _refuse_unacted(body: dict[str, Any]) -> None:
    """What this engine cannot do on a Responses request, refused naming the field rather
    than answered as if done: output log probabilities (``top_logprobs`` above 0, or an
    entry of ``include``, a list of strings, asking for them), ``truncation: "auto"``
    (the input is never cut; one too long is a 400), ``background: true`` (no response
    is kept to poll), a ``reasoning`` effort or summary (the model does not reason
    apart)."""
    top = optional(body, "top_logprobs", int, 0)  # "0" or 0.0 asks for none, as vLLM's
    if top != 0:
        raise BadRequest(f"'top_logprobs' {shown(top)}: output log probabilities are not "
                         "supported on /v1/responses by this engine (the chat route gives "
                         "them)", param="top_logprobs")
    include = optional(body, "include", list, [])  # of strings, as vLLM's schema
    bad = [item for item in include if not isinstance(item, str)]
    if bad:
        raise BadRequest(f"'include' must be a list of strings, got {shown(bad[0])} in it",
                         param="include")
    logprobs = next((item for item in include if "logprobs" in item), None)
    if logprobs is not None:
        raise BadRequest(f"'include' asks for log probabilities ({shown(logprobs)}), which "
                         "/v1/responses does not give on this engine", param="include")
    truncation = body.get("truncation")
    if truncation not in (None, "disabled"):
        raise BadRequest(f"'truncation' {shown(truncation)} is not supported by this "
                         "engine: an input too long for the context is refused",
                         param="truncation")
    if body.get("background") not in (None, False):
        raise BadRequest("'background' responses are not supported by this engine: the "
                         "response is answered in the request", param="background")
    reasoning = body.get("reasoning")
    asked = any(v is not None for v in reasoning.values()) if isinstance(reasoning, dict) \
        else reasoning is not None
    if asked:
        raise BadRequest(f"'reasoning' {shown(reasoning)} is not supported by this engine",
                         param="reasoning")


class _Answer(Generation):
    """One response: its generation's text as a response object or its events."""

    def __init__(self, server: EngineServer, rid: str, p: GenerateParams, num_prompt: int,
                 queue: asyncio.Queue[RequestOutput | BaseException], asked: _Asked,
                 store: ResponseStore | None, turns: list[dict[str, Any]]) -> None:
        super().__init__(server, rid, p, num_prompt, queue)
        self.echoed = asked.echoed
        self.parallel_tool_calls = asked.parallel_tool_calls
        self.store = store
        self.salt = asked.salt  # the salt its conversation is stored under, as it was read
        self.turns = turns
        self.created = int(time.time())
        self.item = f"msg_{uuid.uuid4().hex}"
        self.sequence = 0

    def _message(self, text: str, status: str) -> dict[str, Any]:
        """The answer's message item: ``in_progress`` (no content yet), ``completed``, or
        ``incomplete`` (what came before its response failed)."""
        content = [] if status == "in_progress" else [
            {"type": "output_text", "text": text, "annotations": []}]
        return {"type": "message", "id": self.item, "role": "assistant", "status": status,
                "content": content}

    def _response(self, text: str | None, reason: str | None,
                  failure: OpenAIError | None = None) -> dict[str, Any]:
        """The response object: in progress while ``text`` is None, else ended with
        ``reason`` (``length``: incomplete at ``max_output_tokens``; ``abort``: cancelled
        on the engine, ``/abort_request``), or failed with ``failure`` after ``text``."""
        body = self.echoed
        status = "in_progress" if text is None else "failed" if failure is not None \
            else "incomplete" if reason == "length" \
            else "cancelled" if reason == "abort" else "completed"
        error = None
        if failure is not None:
            # a response's error code is one of OpenAI's (ResponseError.code): the engine's
            # own (engine_step_failed) goes in its message, and in the stream's error event
            error = {"code": "server_error",
                     "message": f"{failure.code or failure.type}: {failure.message}"}
        elif status == "cancelled":
            error = {"code": "cancelled", "message": self.interrupted or "aborted"}
        usage = None
        if text is not None:
            usage = {"input_tokens": self.num_prompt,
                     "input_tokens_details": {"cached_tokens": max(0, self.num_cached)},
                     "output_tokens": self.num_output,
                     "output_tokens_details": {"reasoning_tokens": 0},
                     "total_tokens": self.num_prompt + self.num_output}
        return {
            "id": self.rid, "object": "response", "created_at": self.created,
            "status": status, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status == "incomplete" else None,
            "instructions": body.get("instructions"), "model": self.server.model_name,
            "output": [] if text is None else [
                self._message(text, "completed" if failure is None else "incomplete")],
            "parallel_tool_calls": self.parallel_tool_calls,
            "previous_response_id": body.get("previous_response_id"),
            "max_output_tokens": self.p.max_tokens,  # as read: None unless given
            "temperature": self.p.temperature, "top_p": self.p.sampling.get("top_p", 1.0),
            "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
            "text": {"format": {"type": "text"}}, "truncation": "disabled",
            "metadata": body.get("metadata") or {}, "store": self.store is not None,
            "usage": usage}

    def _ended(self, text: str, reason: str | None) -> dict[str, Any]:
        if self.store is not None and reason != "abort":
            self.store.put(self.rid, [*self.turns, {"role": "assistant", "content": text}],
                           salt=self.salt)
        return self._response(text, reason)

    async def collect(self) -> dict[str, Any]:
        return self._ended(*await self.read())

    def _event(self, kind: str, data: dict[str, Any]) -> str:
        data = {**data, "type": kind, "sequence_number": self.sequence}
        self.sequence += 1
        return f"event: {kind}\ndata: {orjson.dumps(data).decode()}\n\n"

    async def events(self) -> AsyncGenerator[str, None]:
        where = {"item_id": self.item, "output_index": 0, "content_index": 0}
        yield self._event("response.created", {"response": self._response(None, None)})
        yield self._event("response.in_progress", {"response": self._response(None, None)})
        yield self._event("response.output_item.added",
                          {"output_index": 0, "item": self._message("", "in_progress")})
        yield self._event("response.content_part.added", {**where, "part": {
            "type": "output_text", "text": "", "annotations": []}})
        parts: list[str] = []
        reason = None
        try:
            # closed mid-answer: its reader too, now, not when it is collected
            async with contextlib.aclosing(self._deltas()) as deltas:
                async for delta, reason in deltas:  # noqa: B007
                    self.forget_sent()  # its events name no output ids
                    if delta:
                        parts.append(delta)
                        yield self._event("response.output_text.delta",
                                          {**where, "delta": delta, "logprobs": []})
        except OpenAIError as exc:
            # the error, then the terminal event an OpenAI client waits for
            yield self._event("error", {"code": exc.code or exc.type, "message": exc.message,
                                        "param": exc.param})
            yield self._event("response.failed",
                              {"response": self._response("".join(parts), reason, exc)})
            return
        text = "".join(parts)
        yield self._event("response.output_text.done", {**where, "text": text, "logprobs": []})
        yield self._event("response.content_part.done", {**where, "part": {
            "type": "output_text", "text": text, "annotations": []}})
        yield self._event("response.output_item.done",
                          {"output_index": 0, "item": self._message(text, "completed")})
        response = self._ended(text, reason)
        # a cancelled response ends as a failed one: its answer is not whole
        kind = {"incomplete": "response.incomplete",
                "cancelled": "response.failed"}.get(response["status"], "response.completed")
        yield self._event(kind, {"response": response})
