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
``cache_salt`` it was made under, the latest kept (``ResponseStore``: so many, of so large
a size in all, ``kvgate engine --responses-store-limit``/``--responses-store-mib``), each
tenant (the ``x-kvgate-tenant`` the gateway sends) in its own share, the one holding the
most forgetting first; only a request under that same salt (none where it had none) continues it: a
salt is a tenant's (the gateway's ``tenancy.isolate``), and another tenant's request is
told the response does not exist, as for an id never stored; with ``client_salt: replace``
the client's own ``cache_salt`` is mixed into it, so the same tenant is told so too when it
changes its ``cache_salt`` between turns. A stored response is read back, listed by
its input items and deleted by its tenant alone (``ResponsesRoute``), as OpenAI's are;
another tenant is told it does not exist. Instructions are not carried into a
continuation, as OpenAI's are not; a ``conversation`` or a stored ``prompt`` (context this
engine does not keep) is refused naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import heapq
import sys
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response

from engine.generate_params import GenerateParams, context_error, parse_generate
from engine.generation import AnswerStream, Generation
from engine.request import RequestOutput
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

STORE_LIMIT = 1024  # stored responses kept, all tenants together
STORE_CHARS = 1 << 26  # ... and their conversations' size (as ``_chars`` counts it)
TENANT_HEADER = "x-kvgate-tenant"  # the gateway's ``tenancy.header`` by default
# what a message, part or tool call counts beyond its strings: a third of the dict holding
# it (184 bytes; a tool call's two, 368): a conversation of empty messages holds up to 3
# times its count, one of empty tool calls 6 times, one of text about its count
_MESSAGE_CHARS = 64
# a stored response object's fields, in bytes (about a dict of 25 keys and its output item)
_ANSWER_CHARS = 2048
_EMPTY_STR = sys.getsizeof("")  # a string's header: what counts is its characters' bytes
# the fields a Responses request shares with a chat (sampling), and those it names anew
_SHARED = ("temperature", "top_p", "cache_salt", "stream")
_RENAMED = {"max_output_tokens": "max_tokens"}
# the fields of a request its response echoes as sent
_ECHOED = ("instructions", "previous_response_id", "tool_choice", "tools", "metadata")


@dataclasses.dataclass(frozen=True, slots=True)
class StoreSettings:
    """How many stored responses an engine keeps (``limit``), how large their
    conversations may be in all (``max_chars``, as ``_chars`` counts them: about the bytes
    they hold), and the header naming the tenant each belongs to (``tenant_header``)."""

    limit: int = STORE_LIMIT
    max_chars: int = STORE_CHARS
    tenant_header: str = TENANT_HEADER

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError(f"the stored responses' limit must be >= 1, got {self.limit!r}")
        if self.max_chars < 1:
            raise ValueError(f"the stored responses' size must be >= 1, got "
                             f"{self.max_chars!r}")
        if not self.tenant_header:
            raise ValueError("the tenant header must not be empty")


class _Stored(NamedTuple):
    """A stored response: its conversation, the ``cache_salt`` it was made under, its size
    (``_chars`` and ``_answer_chars``), the response object its request was answered with
    (None: not kept, nothing to retrieve) and where its own input starts in ``turns``
    (those before are the conversation it continued; the last is its answer)."""

    turns: list[dict[str, Any]]
    salt: str | None
    chars: int
    answer: dict[str, Any] | None = None
    inputs: int = 0


class _Share:
    """One tenant's stored responses, the least recently used first, their size, and when
    the tenant last stored one (``serial``: of two shares as large, the one stored in
    least recently gives first)."""

    __slots__ = ("chars", "entries", "number", "serial", "tenant")

    def __init__(self, tenant: str | None, number: int) -> None:
        self.tenant = tenant
        self.number = number  # names it in the store's heaps
        self.entries: OrderedDict[str, _Stored] = OrderedDict()
        self.chars = 0
        self.serial = 0


class ResponseStore:
    """The conversations of the latest stored responses, by response id, each with the
    ``cache_salt`` it was made under and the tenant it belongs to: ``limit`` of them at
    most, of ``max_chars`` at most in all (``_chars``: about the bytes they hold; each
    conversation counts all of its turns, those it shares with the one it continues too).
    Each tenant has its own share: past either bound, the least recently used response of
    the tenant holding the most (in count or in size, by the bound passed) is forgotten,
    so a tenant holding less than its part (the bound over the tenants storing) keeps its
    responses however many others store. Requests with no tenant are one tenant's. A
    conversation larger than ``max_chars`` alone is not stored. Used on one thread (the
    event loop's)."""

    def __init__(self, limit: int = STORE_LIMIT, max_chars: int = STORE_CHARS) -> None:
        StoreSettings(limit, max_chars)  # checked as the engine's flags are
        self.limit = limit
        self.max_chars = max_chars
        self._shares: dict[str | None, _Share] = {}
        self._numbered: dict[int, _Share] = {}
        self._where: dict[str, _Share] = {}  # response id -> its tenant's share
        self._chars = 0
        self._serial = 0  # counts puts and shares made
        # the shares by count and by size, the largest first (as (-count or -size, serial,
        # number)): an entry whose count, size or serial is no longer its share's is stale,
        # skipped when met and dropped when the heap is built again
        self._by_count: list[tuple[int, int, int]] = []
        self._by_chars: list[tuple[int, int, int]] = []

    def __len__(self) -> int:
        return len(self._where)

    @property
    def chars(self) -> int:
        """The stored conversations' size, as ``_chars`` counts it."""
        return self._chars

    def tenants(self) -> dict[str | None, int]:
        """How many responses each tenant holds."""
        return {t: len(share.entries) for t, share in self._shares.items()}

    def put(self, response: str, turns: list[dict[str, Any]], *, salt: str | None,
            tenant: str | None = None, answer: dict[str, Any] | None = None,
            inputs: int = 0) -> None:
        """Keep ``turns`` as ``response``'s conversation, made under ``salt`` (None: the
        request had none) for ``tenant`` (None: a request naming none), with ``answer``,
        the response object it was answered with, and ``inputs``, where its own input
        starts in ``turns``, unless they alone hold more than the store does."""
        chars = _chars(turns) + _answer_chars(answer)
        if chars > self.max_chars:  # it would push out all
            return
        self._drop(response)
        share = self._shares.get(tenant)
        if share is None:
            self._serial += 1
            share = self._shares[tenant] = _Share(tenant, self._serial)
            self._numbered[share.number] = share
        self._serial += 1
        share.serial = self._serial
        share.entries[response] = _Stored(turns, salt, chars, answer, inputs)
        share.chars += chars
        self._chars += chars
        self._where[response] = share
        self._changed(share)
        while len(self._where) > self.limit:
            self._forget_oldest(self._largest(self._by_count, by_count=True))
        while self._chars > self.max_chars:
            self._forget_oldest(self._largest(self._by_chars, by_count=False))

    def get(self, response: str, *, salt: str | None) -> list[dict[str, Any]] | None:
        """The conversation of ``response`` (now its tenant's most recently used) when it
        was stored under ``salt``; None when it was not stored, or under another salt (a
        salt where it had none, or none where it had one): not told apart, so a tenant
        learns nothing of another's ids."""
        share = self._where.get(response)
        if share is None or share.entries[response].salt != salt:
            return None
        share.entries.move_to_end(response)
        return share.entries[response].turns

    def stored(self, response: str, *, tenant: str | None) -> _Stored | None:
        """``response`` as stored, when it is ``tenant``'s (its use not counted: reading a
        response keeps it no longer); None when it was not stored, was forgotten, or is
        another tenant's: not told apart."""
        share = self._where.get(response)
        if share is None or share.tenant != tenant:
            return None
        return share.entries[response]

    def delete(self, response: str, *, tenant: str | None) -> bool:
        """Forget ``response`` when it is ``tenant``'s; whether it was stored so."""
        if self.stored(response, tenant=tenant) is None:
            return False
        self._drop(response)
        return True

    def _drop(self, response: str) -> None:
        share = self._where.pop(response, None)
        if share is not None:
            self._remove(share, share.entries.pop(response))

    def _forget_oldest(self, share: _Share) -> None:
        response, stored = share.entries.popitem(last=False)
        del self._where[response]
        self._remove(share, stored)

    def _remove(self, share: _Share, stored: _Stored) -> None:
        share.chars -= stored.chars
        self._chars -= stored.chars
        if share.entries:
            self._changed(share)
        else:
            del self._shares[share.tenant], self._numbered[share.number]

    def _changed(self, share: _Share) -> None:
        """Pushes ``share`` as it is now on both heaps; built again from the shares once
        mostly stale (each then holds one entry a share)."""
        if len(self._by_count) > 2 * len(self._shares) + 64:
            shares = self._shares.values()
            self._by_count = [(-len(s.entries), s.serial, s.number) for s in shares]
            self._by_chars = [(-s.chars, s.serial, s.number) for s in shares]
            heapq.heapify(self._by_count)
            heapq.heapify(self._by_chars)
            return
        heapq.heappush(self._by_count, (-len(share.entries), share.serial, share.number))
        heapq.heappush(self._by_chars, (-share.chars, share.serial, share.number))

    def _largest(self, heap: list[tuple[int, int, int]], *, by_count: bool) -> _Share:
        """The share holding the most (stored in least recently among those as large)."""
        while True:
            size, serial, number = heap[0]
            share = self._numbered.get(number)
            if share is not None and share.serial == serial and -size == (
                    len(share.entries) if by_count else share.chars):
                return share
            heapq.heappop(heap)

    def check_integrity(self) -> None:
        """Each share's count and size are its responses', the store's theirs, within the
        bounds; every response is where it is said to be; no share is empty; each share
        has a current entry on both heaps."""
        count = sum(len(s.entries) for s in self._shares.values())
        chars = sum(s.chars for s in self._shares.values())
        for share in self._shares.values():
            counted = sum(_chars(stored.turns) + _answer_chars(stored.answer)
                          for stored in share.entries.values())
            if not share.entries or counted != share.chars or \
                    sum(stored.chars for stored in share.entries.values()) != counted:
                raise AssertionError(f"tenant {share.tenant!r}: {len(share.entries)} "
                                     f"responses of {counted}, counted {share.chars}")
            if any(self._where.get(r) is not share for r in share.entries):
                raise AssertionError(f"tenant {share.tenant!r}: a response placed elsewhere")
            for heap, size in ((self._by_count, len(share.entries)),
                               (self._by_chars, share.chars)):
                if (-size, share.serial, share.number) not in heap:
                    raise AssertionError(f"tenant {share.tenant!r} missing from a heap")
        if count != len(self._where) or chars != self._chars or count > self.limit \
                or chars > self.max_chars or set(self._numbered.values()) != set(
                    self._shares.values()):
            raise AssertionError(f"{count} conversations (limit {self.limit}, placed "
                                 f"{len(self._where)}) of {chars} characters, counted "
                                 f"{self._chars} (limit {self.max_chars})")


def _chars(turns: list[dict[str, Any]]) -> int:
    """The size of a conversation, about the bytes Python holds it in: every string a
    client gave its messages (text, the parts of a content with images: their text, each
    image's address and detail; an assistant message's reasoning, a tool message's
    ``tool_call_id``) and their tool calls (id, name, arguments), each the bytes of its
    characters (1, 2 or 4 each, by the widest), and each message, part and tool call
    ``_MESSAGE_CHARS``."""
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


def _answer_chars(answer: dict[str, Any] | None) -> int:
    """What a stored response object holds beyond its conversation: its fields
    (``_ANSWER_CHARS``), and the strings of what it echoes that the conversation does not
    hold (``instructions``, ``metadata``; its ``tools``, written as JSON). Its output's
    text is the conversation's last message's own string."""
    if answer is None:
        return 0
    tools = answer.get("tools")
    metadata = answer.get("metadata") or {}
    return _ANSWER_CHARS + _strings(answer.get("instructions"), *metadata.keys(),
                                    *metadata.values()) \
        + (len(orjson.dumps(tools)) if tools else 0)


def _strings(*values: Any) -> int:
    """The bytes of the strings' characters (``sys.getsizeof`` less a string's header)."""
    return sum(sys.getsizeof(v) - _EMPTY_STR for v in values if isinstance(v, str))


class ResponsesRoute:
    """``handle`` serves ``POST /v1/responses`` for one :class:`EngineServer`; ``retrieve``,
    ``delete``, ``input_items`` and ``cancel`` its stored responses (``GET`` and ``DELETE
    /v1/responses/{response_id}``, ``GET .../input_items``, ``POST .../cancel``), each to
    the tenant that stored it: another tenant's id is not found, as an id never stored."""

    def __init__(self, server: EngineServer, *, max_body_bytes: int,
                 store: StoreSettings | None = None) -> None:
        settings = store or StoreSettings()
        self.server = server
        self.max_body_bytes = max_body_bytes
        self.store = ResponseStore(settings.limit, settings.max_chars)
        self.tenant_header = settings.tenant_header

    async def handle(self, request: HTTPRequest) -> Response:
        srv = self.server
        p, asked, turns, inputs = await self._parse(request)
        ids = await srv.prompt_ids(p)
        limit = p.max_tokens if p.max_tokens is not None \
            else max(1, srv.max_request_tokens - len(ids))
        if len(ids) + limit > srv.max_model_len:
            raise context_error(len(ids), limit, srv.max_model_len,
                                limit_param=p.limit_param, prompt_field=p.prompt_field)
        rid = f"resp_{uuid.uuid4().hex}"
        queue = await srv.submit(rid, ids, p, limit)
        tenant = self._tenant(request)
        answer = _Answer(srv, rid, p, len(ids), queue, asked,
                         self.store if asked.store else None, turns, inputs, tenant)
        if p.stream:
            return AnswerStream(answer.events(), [answer])
        return JSONResponse(await unless_disconnected(request, answer.collect()))

    async def retrieve(self, request: HTTPRequest) -> Response:
        """The stored response object, as its request was answered (its status, output
        and usage)."""
        stored = self._stored(request)
        if request.query_params.get("stream", "false").lower() not in ("false", "0"):
            raise BadRequest("'stream' on retrieving a response streams a background "
                             "response's events, and this engine answers none in the "
                             "background: retrieve it without 'stream'", param="stream")
        assert stored.answer is not None
        return JSONResponse(stored.answer)

    async def delete(self, request: HTTPRequest) -> Response:
        """Forget a stored response (OpenAI's deletion object): it can be neither
        retrieved nor continued after."""
        response = request.path_params["response_id"]
        if not self.store.delete(response, tenant=self._tenant(request)):
            raise _not_found(response)
        return JSONResponse({"id": response, "object": "response", "deleted": True})

    async def input_items(self, request: HTTPRequest) -> Response:
        """The items of a stored response's own input (not those of the responses it
        continues), as the engine read them (``_items``), as OpenAI lists them: newest
        first unless ``order=asc``, ``limit`` of them (1 to 100, 20 unless given), after
        (or before) the item of id ``after`` (``before``) in that order."""
        stored = self._stored(request)
        query = request.query_params
        limit = _query_int(query.get("limit"), "limit", 20, 1, 100)
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise BadRequest(f"'order' must be 'asc' or 'desc', got {shown(order)}",
                             param="order")
        items = _items(stored.turns[stored.inputs:-1], request.path_params["response_id"])
        if order == "desc":
            items.reverse()
        after, before = query.get("after"), query.get("before")
        start, end = 0, len(items)
        ids = [item["id"] for item in items]
        for name, cursor in (("after", after), ("before", before)):
            if cursor is None:
                continue
            if cursor not in ids:
                raise BadRequest(f"'{name}' {shown(cursor)} is no input item of response "
                                 f"{shown(request.path_params['response_id'])}", param=name)
            if name == "after":
                start = ids.index(cursor) + 1
            else:
                end = ids.index(cursor)
        # a page after a cursor reads on from it; one only before a cursor, up to it
        page = items[start:end][:limit] if before is None or after is not None \
            else items[start:end][-limit:]
        more = len(items[start:end]) > len(page)
        return JSONResponse({"object": "list", "data": page,
                             "first_id": page[0]["id"] if page else None,
                             "last_id": page[-1]["id"] if page else None,
                             "has_more": more})

    async def cancel(self, request: HTTPRequest) -> Response:
        """OpenAI's answer for a response that was not made in the background (none is on
        this engine: ``background`` is refused): a 400; a 404 for one not stored (one
        being answered too: it is not stored until it ends; its client cancels it by
        leaving, as any request)."""
        self._stored(request)
        raise BadRequest("Cannot cancel a synchronous response.", param="response_id")

    def _tenant(self, request: HTTPRequest) -> str | None:
        # the tenant the gateway names (it sends the header only so, whatever the client
        # sent): its own share of the store; none named, the one share of all such
        return request.headers.get(self.tenant_header) or None

    def _stored(self, request: HTTPRequest) -> _Stored:
        """The stored response the path names, the request's tenant's; NotFound else."""
        response = request.path_params["response_id"]
        stored = self.store.stored(response, tenant=self._tenant(request))
        if stored is None or stored.answer is None:
            raise _not_found(response)
        return stored

    async def _parse(self, request: HTTPRequest
                     ) -> tuple[GenerateParams, _Asked, list[dict[str, Any]], int]:
        """The request's chat, checked as a chat's, what its response echoes, the turns
        its stored conversation holds, and where its own input starts in them (after
        those of the response it continues). Its body's bytes and decoded JSON end here:
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
        return p, asked, turns, len(history)


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
    if previous == "":  # else looked up on every replica, and a 404 from each
        raise BadRequest("'previous_response_id' must name a response, got ''",
                         param="previous_response_id")
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
    apart), a ``conversation`` (none is kept: a response is continued by its
    ``previous_response_id``; with one too, refused as OpenAI refuses the pair) or a
    stored ``prompt`` (none is kept to fill in)."""
    conversation = body.get("conversation")
    if conversation is not None:
        if body.get("previous_response_id") is not None:
            raise BadRequest("'conversation' and 'previous_response_id' cannot be given "
                             "together: give one", param="conversation")
        raise BadRequest(f"'conversation' {shown(conversation)} is not supported by this "
                         "engine: continue a response by its 'previous_response_id'",
                         param="conversation")
    prompt = body.get("prompt")
    if prompt is not None:
        raise BadRequest(f"'prompt' {shown(prompt)}: stored prompts are not supported by "
                         "this engine; send the prompt's text as 'instructions' or "
                         "'input'", param="prompt")
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
                 store: ResponseStore | None, turns: list[dict[str, Any]], inputs: int,
                 tenant: str | None) -> None:
        super().__init__(server, rid, p, num_prompt, queue)
        self.echoed = asked.echoed
        self.parallel_tool_calls = asked.parallel_tool_calls
        self.store = store
        self.salt = asked.salt  # the salt its conversation is stored under, as it was read
        self.turns = turns
        self.inputs = inputs  # where its own input starts in ``turns``
        self.tenant = tenant
        self.created = int(time.time())
        self.item = f"msg_{uuid.uuid4().hex}"
        self.sequence = 0

    def _message(self, text: str, status: str) -> dict[str, Any]:
        """The answer's message item: ``in_progress`` (no content yet), ``completed``, or
        ``incomplete`` (what came before its response was cut: at ``max_output_tokens``,
        cancelled, or failed)."""
        content = [] if status == "in_progress" else [
            {"type": "output_text", "text": text, "annotations": []}]
        return {"type": "message", "id": self.item, "role": "assistant", "status": status,
                "content": content}

    def _response(self, text: str | None, reason: str | None,
                  failure: OpenAIError | None = None) -> dict[str, Any]:
        """The response object: in progress while ``text`` is None, else ended with
        ``reason`` (``length``: incomplete at ``max_output_tokens``; ``abort``: cancelled
        on the engine, ``/abort_request``: its ``error`` null, as OpenAI's cancelled
        responses, whose error codes name failures alone), or failed with ``failure``
        after ``text``."""
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
                self._message(text, "completed" if status == "completed" else "incomplete")],
            "parallel_tool_calls": self.parallel_tool_calls,
            "previous_response_id": body.get("previous_response_id"),
            "max_output_tokens": self.p.max_tokens,  # as read: None unless given
            "temperature": self.p.temperature, "top_p": self.p.sampling.get("top_p", 1.0),
            "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
            "text": {"format": {"type": "text"}}, "truncation": "disabled",
            "metadata": body.get("metadata") or {}, "store": self.store is not None,
            "usage": usage}

    def _ended(self, text: str, reason: str | None) -> dict[str, Any]:
        response = self._response(text, reason)
        if self.store is not None and reason != "abort":
            # kept as answered: ``GET /v1/responses/{id}`` gives it back
            self.store.put(self.rid, [*self.turns, {"role": "assistant", "content": text}],
                           salt=self.salt, tenant=self.tenant, answer=response,
                           inputs=self.inputs)
        return response

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
        response = self._ended(text, reason)
        yield self._event("response.output_item.done",
                          {"output_index": 0, "item": response["output"][0]})
        # a cancelled response ends as a failed one: its answer is not whole
        kind = {"incomplete": "response.incomplete",
                "cancelled": "response.failed"}.get(response["status"], "response.completed")
        yield self._event(kind, {"response": response})


def _not_found(response: str) -> NotFound:
    """The answer for a response id this engine stores none under for the request's
    tenant: never stored, forgotten, deleted, or another tenant's (one answer for all)."""
    return NotFound(f"Response with id {shown(response)} not found.", param="response_id",
                    code="response_not_found")


def _query_int(value: str | None, name: str, default: int, low: int, high: int) -> int:
    """A query parameter's integer within [``low``, ``high``], ``default`` when absent;
    BadRequest naming it and what was sent else."""
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        number = None
    if number is None or not low <= number <= high:
        raise BadRequest(f"'{name}' must be an integer from {low} to {high}, got "
                         f"{shown(value)}", param=name)
    return number


def _items(turns: list[dict[str, Any]], response: str) -> list[dict[str, Any]]:
    """A stored response's input turns as the Responses API's input items, in order: a
    user or system message's text as ``input_text`` parts (an image as ``input_image``),
    an assistant message as its ``reasoning``, its ``message`` (``output_text``) and its
    ``function_call`` items, a tool message as a ``function_call_output``. Each item's id
    is the response's, numbered by its place (the same on every listing: a page's cursor)."""
    items: list[dict[str, Any]] = []
    tag = response.removeprefix("resp_")

    def add(prefix: str, item: dict[str, Any]) -> None:
        items.append({"id": f"{prefix}_{tag}_{len(items)}", **item})

    for turn in turns:
        role, content = turn.get("role"), turn.get("content")
        if role == "tool":
            add("fco", {"type": "function_call_output", "call_id": turn.get("tool_call_id"),
                        "output": content, "status": "completed"})
        elif role == "assistant":
            if turn.get("reasoning"):
                add("rs", {"type": "reasoning", "summary": [], "content": [
                    {"type": "reasoning_text", "text": turn["reasoning"]}]})
            if content:
                add("msg", {"type": "message", "role": "assistant", "status": "completed",
                            "content": [{"type": "output_text", "text": _text_of(content),
                                         "annotations": []}]})
            for call in turn.get("tool_calls") or ():
                function = call.get("function") or {}
                add("fc", {"type": "function_call", "call_id": call.get("id"),
                           "name": function.get("name"),
                           "arguments": function.get("arguments"), "status": "completed"})
        else:
            add("msg", {"type": "message", "role": role, "status": "completed",
                        "content": _input_parts(content)})
    return items


def _input_parts(content: Any) -> list[dict[str, Any]]:
    """A chat message's content as a Responses message's input parts."""
    if isinstance(content, str):
        return [{"type": "input_text", "text": content}]
    parts: list[dict[str, Any]] = []
    for part in content or ():
        image = part.get("image_url")
        if isinstance(image, dict):
            parts.append({"type": "input_image", "image_url": image.get("url"),
                          "detail": image.get("detail", "auto")})
        else:
            parts.append({"type": "input_text", "text": part.get("text", "")})
    return parts


def _text_of(content: Any) -> str:
    """A chat message's content as one text (its text parts joined)."""
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text", "") for part in content or () if "text" in part)
