"""Where an HTTP request meets a server: the body read under a size limit, the handler
cancelled when its client leaves, every exception mapped to one OpenAI error body, and a
large JSON answer written out off the event loop.

Both servers (the gateway and the engine) build their Starlette apps with
:meth:`ErrorBoundary.handlers` and read bodies with :func:`read_body`, so a client sees the
same limits and the same ``{"error": {...}}`` shape from either. ``ErrorBoundary`` counts
every error it answers through the ``count`` callback, by the error's ``kind``, and adds
the headers ``tag`` gives (the gateway's ``X-Request-Id``) to every error answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, Protocol, TypeVar

import numpy as np
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from kvwire.media_parts import shown
from kvwire.openai_schema import (
    BadRequest,
    ClientDisconnected,
    MethodNotAllowed,
    NotFound,
    OpenAIError,
    PayloadTooLarge,
    RequestTimeout,
    TooManyRequests,
    decode_json,
)

log = logging.getLogger("kvgate.http")

# A request body past this many bytes is decoded and checked in a worker thread, by both
# servers: a 20 MiB prompt of token ids held the event loop (every stream, and an engine's
# loop stepping them) 1.5 s ...
PARSE_ON_THREAD_BYTES = 1 << 20
# ... and one of more items than this: checking an item (a message, a content part, a
# tool) costs up to ~2.5 us, and 1 MiB holds 350,000 of them ('{},' each: 0.8 s of the
# loop). Every item the checks visit but a container's first follows a comma, so a body's
# commas bound them (this many: a few ms), whatever its size
PARSE_ON_THREAD_COMMAS = 2048


# An answer (or a streamed event, or a chunk of one) naming more items than this (token
# ids, their texts, log probability entries and their alternatives, prompt tokens decoded)
# is built and written out in a worker thread (``off_loop_past``): the 13 million ids of a
# 64 MiB text held the loop about a second, a long answer with 20 alternatives per token
# milliseconds, an echoed prompt of 8,000 tokens with its log probabilities a tenth of a
# second; one of fewer (most) costs less than a thread's hop (~90 us)
INLINE_ANSWER_ITEMS = 2000
T = TypeVar("T")


async def off_loop_past(num_items: int, fn: Callable[[], T]) -> T:
    """``fn()``, work naming about ``num_items`` items: on the event loop when they are few
    (``INLINE_ANSWER_ITEMS``), else in a worker thread (``fn`` must then touch nothing
    the loop changes meanwhile)."""
    if num_items <= INLINE_ANSWER_ITEMS:
        return fn()
    return await asyncio.to_thread(fn)


async def json_answer(build: Callable[[], object], num_items: int) -> JSONResponse:
    """``build()``, an answer naming about ``num_items`` items, as a JSON response: built
    and written out at once, on the event loop or in one worker thread
    (:func:`off_loop_past`)."""
    return await off_loop_past(num_items, lambda: JSONResponse(build()))


# past this many bytes a body's commas are counted by numpy: bytes.count of one byte walks
# it a byte at a time (12 us for a 27 KB prompt, more than decoding it), numpy's compare
# and count run vectorised (3 us); under it numpy's call costs more than the walk
_VECTOR_COUNT_BYTES = 4096
_COMMA = np.uint8(ord(","))


def parses_on_loop(raw: bytes) -> bool:
    """Whether a request body is small enough, in bytes and in items, to decode and check
    on the event loop (a thread's hop costs more than that)."""
    if len(raw) > PARSE_ON_THREAD_BYTES:
        return False
    if len(raw) <= _VECTOR_COUNT_BYTES:
        return raw.count(b",") <= PARSE_ON_THREAD_COMMAS
    return int(np.count_nonzero(np.frombuffer(raw, np.uint8) == _COMMA)) \
        <= PARSE_ON_THREAD_COMMAS


# A request body may nest arrays and objects this many levels deep, its own object the
# first (JSON allows 1,024): orjson, which writes the engine's answers and events, stops at
# 254 levels, and some answers echo a field a few levels deeper than the body held it (a
# Responses event's ``response.tools``: three). Real tool schemas nest a few dozen at most
MAX_NESTING = 128
# what each bracket does to the nesting (``_nesting_past``): opens or closes. ``byte &
# _BRACKET_MASK == _BRACKETS`` picks the four brackets in one vectorised pass (and "Y",
# "_", "y" and DEL, which step 0); ``byte & _OPEN_MASK == ord("[")`` picks "[" and "{"
_STEPS = np.zeros(256, np.int8)
_STEPS[[ord("["), ord("{")]] = 1
_STEPS[[ord("]"), ord("}")]] = -1
_BRACKET_MASK, _BRACKETS, _OPEN_MASK = np.uint8(0xD9), np.uint8(0x59), np.uint8(0xDF)
_QUOTE_BYTE, _BACKSLASH = np.uint8(ord('"')), np.uint8(ord("\\"))
_OPENS = (np.uint8(ord("[")), np.uint8(ord("{")))
_COLON = np.uint8(ord(":"))
_SCAN_BYTES = 1 << 20  # bytes measured at a time (their arrays: a few times this)


def check_nesting(raw: bytes, body: T) -> T:
    """``body``, the JSON value decoded from ``raw``, unless it nests arrays and objects
    more than ``MAX_NESTING`` levels deep: then a BadRequest naming the top-level field
    that does (``nesting_too_deep``). Measured on ``raw``'s bytes, not by walking the
    decoded values: a body of ``MAX_NESTING`` brackets at most is shallow by their count
    alone (most are), another is measured vectorised; only a body refused is walked, to
    name its field."""
    depth = _nesting_past(raw, MAX_NESTING)
    if depth <= MAX_NESTING:
        return body
    deep = next(((k, v) for k, v in body.items() if _nests_past(v, MAX_NESTING - 1)),
                None) if isinstance(body, dict) else None
    where = "" if deep is None else f", in {deep[0]!r} ({shown(deep[1])})"
    raise BadRequest(f"request body nests arrays and objects {depth} levels deep{where}; "
                     f"the most accepted is {MAX_NESTING}",
                     param=None if deep is None else deep[0], code="nesting_too_deep")


# A request body may hold this many arrays and objects (its own object one of them), and
# this many object members (keys, a key sent twice counted twice). Decoding a body builds
# them all while the decoding thread holds the interpreter (orjson does not let it go,
# nor does the full garbage collection that millions of new containers set off), so every
# other request waits: 4 million (16 MiB of ``[[1],[1],...]``) held the gateway's event
# loop 1.2-1.7 s, a ``logit_bias`` of 1.1 million keys 0.4 s; these bounds hold it some
# tens of milliseconds at most. Real requests stay far below: a chat's message is one to
# four containers and two to eight keys (a tool call's), so a session of 10,000 tool-call
# rounds fits, as do the 128 tools OpenAI allows with schemas of a hundred properties
# each, a completions batch of 65,000 prompts of token ids, and a ``logit_bias`` over a
# 128,000-token vocabulary
MAX_JSON_CONTAINERS = 1 << 16
MAX_JSON_KEYS = 1 << 17


def check_json_counts(raw: bytes) -> None:
    """BadRequest (``too_many_json_containers``, ``too_many_json_keys``) when request
    body ``raw`` holds more arrays and objects than ``MAX_JSON_CONTAINERS`` or more
    object members than ``MAX_JSON_KEYS``: to be asked before decoding it. Counted on its
    bytes (brackets and colons inside strings are text): a body too short to hold that
    many passes at once (most do), one with few enough ``[``, ``{`` and ``:`` anywhere by
    their counts, another is measured vectorised."""
    if len(raw) <= 2 * MAX_JSON_CONTAINERS and len(raw) <= 4 * MAX_JSON_KEYS:
        return  # "[]" is two bytes, a member '"":0' four
    if _opening_brackets_at_most(raw, MAX_JSON_CONTAINERS) \
            and _count(raw, _COLON) <= MAX_JSON_KEYS:
        return
    containers = keys = 0
    for marks in _outside_strings(raw, _opens_and_colons, _SCAN_BYTES):
        keys += int(np.count_nonzero(marks == _COLON))
        containers += sum(int(np.count_nonzero(marks == c)) for c in _OPENS)
    if containers > MAX_JSON_CONTAINERS:
        raise BadRequest(f"request body holds {containers:,} JSON arrays and objects; the "
                         f"most accepted is {MAX_JSON_CONTAINERS:,}",
                         code="too_many_json_containers")
    if keys > MAX_JSON_KEYS:
        raise BadRequest(f"request body holds {keys:,} JSON object members (keys); the "
                         f"most accepted is {MAX_JSON_KEYS:,}", code="too_many_json_keys")


def decoded_body(raw: bytes) -> Any:
    """Request body ``raw`` decoded: refused first when it holds more containers or keys
    than a request may (``check_json_counts``: decoding them holds the interpreter, and so
    the event loop, for seconds), and after when it nests past ``MAX_NESTING``
    (``check_nesting``)."""
    check_json_counts(raw)
    return check_nesting(raw, decode_json(raw))


def _count(raw: bytes, byte: np.uint8) -> int:
    """How many times ``byte`` occurs in ``raw`` (vectorised past a few KB)."""
    if len(raw) <= _VECTOR_COUNT_BYTES:
        return raw.count(bytes((int(byte),)))
    return int(np.count_nonzero(np.frombuffer(raw, np.uint8) == byte))


def _nesting_past(raw: bytes, bound: int, piece_bytes: int = _SCAN_BYTES) -> int:
    """How deep valid JSON ``raw`` nests arrays and objects, or 0 when it holds ``bound``
    opening brackets at most (it nests no deeper than that); measured ``piece_bytes`` at
    a time."""
    if _opening_brackets_at_most(raw, bound):
        return 0
    deepest = depth = 0
    for marks in _outside_strings(raw, _brackets, piece_bytes):
        levels = np.cumsum(_STEPS[marks], dtype=np.int32)
        deepest = max(deepest, depth + int(levels.max()))
        depth += int(levels[-1])
    return deepest


def _opening_brackets_at_most(raw: bytes, bound: int) -> bool:
    """Whether ``raw`` holds ``bound`` bytes ``[`` and ``{`` at most, in strings or not
    (then it opens no more arrays and objects than that)."""
    return sum(_count(raw, c) for c in _OPENS) <= bound


def _brackets(piece: np.ndarray) -> np.ndarray:
    return (piece & _BRACKET_MASK) == _BRACKETS  # (and "Y", "_", "y", DEL: step 0)


def _opens_and_colons(piece: np.ndarray) -> np.ndarray:
    return ((piece & _OPEN_MASK) == _OPENS[0]) | (piece == _COLON)


def _outside_strings(raw: bytes, picks: Callable[[np.ndarray], np.ndarray],
                     piece_bytes: int) -> Iterator[np.ndarray]:
    """The bytes of valid JSON ``raw`` that ``picks`` (a vectorised test of a piece's
    bytes) selects and that stand outside its strings, in order, ``piece_bytes`` of
    ``raw`` at a time (a piece with none yields nothing)."""
    escapes = raw.find(b"\\") >= 0
    if escapes and b"\\\\" in raw:
        # without its escaped backslashes (left to right, as JSON reads them): a quote
        # after a backslash is then an escaped one, text
        raw = raw.replace(b"\\\\", b"")
    a = np.frombuffer(raw, np.uint8)
    quoted = False  # [0, start) ends inside a string
    for start in range(0, len(a), piece_bytes):
        piece = a[start:start + piece_bytes]
        hits = piece == _QUOTE_BYTE
        if escapes:  # a quote after a backslash is text
            escaped = np.empty_like(hits)
            escaped[0] = start > 0 and a[start - 1] == _BACKSLASH
            np.equal(piece[:-1], _BACKSLASH, out=escaped[1:])
            hits &= ~escaped
        hits |= picks(piece)
        marks = piece[np.flatnonzero(hits)]  # the bytes picked and the quotes, in order
        if not len(marks):
            continue
        quotes = marks == _QUOTE_BYTE
        inside = (np.cumsum(quotes, dtype=np.uint8) & 1).astype(bool)  # after an opening
        if quoted:  # quote (each quote toggles; a uint8 sum wraps, its parity holds)
            np.logical_not(inside, out=inside)
        quoted = bool(inside[-1])
        outside = marks[~(inside | quotes)]  # not quotes, nor bytes inside strings (text)
        if len(outside):
            yield outside


def _nests_past(value: object, bound: int) -> bool:
    """Whether ``value`` nests arrays and objects more than ``bound`` levels deep (itself
    the first when it is one)."""
    stack = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        item, depth = stack.pop()
        if depth > bound:
            return True
        stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict)
                                               else item) if isinstance(v, dict | list))
    return False


def header_value(request: Request, name: str) -> str | None:
    """The first value of header ``name`` (lower case), read off the ASGI scope's raw
    lines, whose names ASGI servers give in lower case; None when absent. Starlette's
    ``request.headers.get`` answers a missing name by raising and catching KeyError, which
    cost the gateway ~4% of a proxied request's CPU for one header it looks up on
    every request and few clients send (``Content-Encoding``)."""
    key = name.encode("latin-1")
    for k, v in request.scope["headers"]:
        if k == key:
            return v.decode("latin-1")
    return None



class ByteBudget(Protocol):
    """Bytes shared by the bodies being received: ``take`` raises when there is no room."""

    def take(self, n: int) -> None: ...
    def give(self, n: int) -> None: ...


class HeldBodyBytes:
    """A :class:`ByteBudget`: the bytes of request bodies a server holds at once (received,
    or being decoded), at most ``limit``. ``take`` past it is a 429 with ``Retry-After``
    naming ``server``, what it holds, the limit and ``setting`` (what sets it), as the
    gateway refuses a body past its ``limits.max_receiving_bytes``; ``give`` returns
    bytes taken. One event loop's: not thread-safe."""

    __slots__ = ("held", "limit", "server", "setting")

    def __init__(self, limit: int, *, server: str, setting: str) -> None:
        if limit < 1:
            raise ValueError(f"{setting} must be at least 1 byte, got {limit}")
        self.limit = limit
        self.server = server
        self.setting = setting
        self.held = 0

    def take(self, n: int) -> None:
        if self.held + n > self.limit:
            raise TooManyRequests(
                f"the {self.server} holds {self.held} bytes of request bodies, and "
                f"{n} more would pass its limit of {self.limit} ({self.setting}); retry "
                f"after 1 s", code=f"{self.server}_overloaded", headers={"Retry-After": "1"})
        self.held += n

    def give(self, n: int) -> None:
        self.held -= n


async def read_body(request: Request, limit: int, budget: ByteBudget | None = None, *,
                    keep: bool = False, timeout_s: float | None = None) -> bytes:
    """The whole body; PayloadTooLarge as soon as it is known to exceed ``limit`` bytes
    (from the declared length, or counted as it arrives when none is declared);
    ClientDisconnected when the client leaves before sending it all; RequestTimeout
    (408, ``body_timeout``) when it has not come whole within ``timeout_s`` seconds (None:
    no limit), so that a client that stops mid-body holds nothing for good. With a
    ``budget``, the bytes received are taken from it as they arrive and given back at the
    end; with ``keep`` too, a whole body's stay taken (its decoded form costs more than
    its bytes): the caller gives ``len(body)`` back once done with it. Bytes of a body not
    read whole (too large, over the budget, the client gone, too late) are always given
    back here."""
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_body(request, limit, budget, keep)
    except ClientDisconnect:
        raise ClientDisconnected("client disconnected while sending the body") from None
    except TimeoutError:
        if timeout_s is None:
            raise
        raise RequestTimeout(f"request body not received within {timeout_s:g} s",
                             code="body_timeout") from None


async def _read_body(request: Request, limit: int, budget: ByteBudget | None,
                     keep: bool) -> bytes:
    declared = header_value(request, "content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds the limit of "
                              f"{limit} bytes", code="body_too_large")
    if budget is None and declared is not None and declared.isdigit():
        return await request.body()  # within the limit: uvicorn enforces the length
    # the first chunk as it came; from a second one on, all in one buffer: a body trickled
    # in small reads (one a few bytes) held an object per read, dozens of times its
    # bytes, while the budget counted its bytes
    body = b""
    grown: bytearray | None = None
    size = 0
    try:
        async for chunk in request.stream():
            if not chunk:
                continue
            if size + len(chunk) > limit:
                raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes",
                                      code="body_too_large")
            if budget is not None:
                budget.take(len(chunk))
            if not size:
                body = chunk
            else:
                if grown is None:
                    grown = bytearray(body)
                grown += chunk
            size += len(chunk)
        if grown is not None:
            body = bytes(grown)
    except BaseException:
        if budget is not None and keep:
            budget.give(size)
        raise
    finally:
        if budget is not None and not keep:
            budget.give(size)
    request._body = body  # Starlette's own: a later ``request.body()`` reads it
    return body


class LeavingHooks(Protocol):
    """What a server may offer beside ``receive`` (as its ``leaving_hooks`` attribute)
    so that a ``ClientWatch`` needs no task: ``add`` a callback, called once when the
    connection is lost (the server reads on meanwhile, so that a close is seen);
    ``discard`` it."""

    def add(self, callback: Callable[[], None]) -> None: ...
    def discard(self, callback: Callable[[], None]) -> None: ...


class ClientWatch:
    """Cancels the calling task when the client leaves (uvicorn does not cancel a handler
    whose client left). Start it once the body is read, hand it on from waiting for an
    answer to relaying it, and ``close`` it as soon as the answer is sent.

    Where the server offers ``leaving_hooks`` (the gateway's ``BoundedHttpProtocol``) the
    watch is a callback on its connection's loss; elsewhere a task reads what the server
    receives next (and a finished response reads as a disconnect too: close it first).
    A task costs a step of the loop, and its cancel at the end a traceback whose frames
    only the garbage collector frees: a measurable share of a proxied request's CPU.

    In the task's ``except CancelledError``, ``client_left()`` tells the client's cancel
    (and takes it back, so the task may go on to clean up) from one from outside."""

    __slots__ = ("_fired", "_hooks", "_taken", "_task", "_watcher")

    def __init__(self, receive: Callable[[], Awaitable[Mapping[str, object]]]) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._fired = False  # the client left
        self._taken = False  # ... and its cancel was taken back
        hooks: LeavingHooks | None = getattr(getattr(receive, "__self__", None),
                                             "leaving_hooks", None)
        self._hooks = hooks
        self._watcher: asyncio.Task[None] | None = None
        if hooks is not None:
            hooks.add(self._leave)  # (bound methods of one object compare equal)
        else:
            self._watcher = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Callable[[], Awaitable[Mapping[str, object]]]) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._leave()

    def _leave(self) -> None:
        self._fired = True
        self._task.cancel()

    @property
    def fired(self) -> bool:
        """The client left (its cancel may have been absorbed by a cancel of the task's
        own: a replica ejected in the same turn makes one CancelledError of both)."""
        return self._fired

    def client_left(self) -> bool:
        """True (once) when the client's leaving cancelled the task; the cancel is taken
        back so the task can finish its clean-up."""
        if not self._fired or self._taken:
            return False
        self._taken = True
        self._task.uncancel()
        return True

    async def guard(self, work: Awaitable[T]) -> T:
        """Await ``work``; ClientDisconnected if the client leaves first (``work`` sees
        the CancelledError where it waits)."""
        try:
            return await work
        except asyncio.CancelledError:
            if not self.client_left():
                raise  # cancelled from outside
            raise ClientDisconnected("client disconnected") from None

    def close(self) -> None:
        if self._hooks is not None:
            self._hooks.discard(self._leave)
        elif self._watcher is not None:
            self._watcher.cancel()


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` in the calling task; ClientDisconnected if the client leaves first."""
    watch = ClientWatch(request.receive)
    try:
        return await watch.guard(work)
    finally:
        watch.close()


class ErrorBoundary:
    """Maps any exception raised by a handler to an OpenAI error response, and counts it.
    An exception that is no :class:`OpenAIError` is a bug: logged with its traceback and
    answered as ``internal_error``."""

    def __init__(self, count: Callable[[str], None] | None = None,
                 tag: Callable[[Request], Mapping[str, str]] | None = None) -> None:
        self.count = count
        self.tag = tag  # headers every error answer gets (the gateway's request id)

    def error(self, request: Request, exc: BaseException) -> OpenAIError:
        if isinstance(exc, OpenAIError):
            return exc
        if isinstance(exc, HTTPException) and exc.status_code == 404:
            return NotFound(f"no route {request.method} {request.url.path}", code="not_found")
        if isinstance(exc, HTTPException) and exc.status_code == 405:
            refused = MethodNotAllowed(f"method {request.method} not allowed on "
                                       f"{request.url.path}", code="method_not_allowed")
            allow = (exc.headers or {}).get("Allow")  # RFC 9110: a 405 names what is
            if allow:
                refused.headers = {**refused.headers, "allow": allow}
            return refused
        if isinstance(exc, HTTPException):
            err = OpenAIError(exc.detail)
            err.status, err.type, err.kind = exc.status_code, "invalid_request_error", "http"
            return err
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return OpenAIError(f"internal error: {exc.__class__.__name__}", code="internal_error")

    def response(self, request: Request, exc: BaseException) -> Response:
        err = self.error(request, exc)
        if self.count is not None:
            self.count(err.kind)
        headers = err.headers if self.tag is None else {**err.headers, **self.tag(request)}
        return JSONResponse(err.body(), status_code=err.status, headers=headers)

    async def handle(self, request: Request, exc: Exception) -> Response:
        return self.response(request, exc)

    def handlers(self) -> dict[int | type[Exception], Callable[..., Awaitable[Response]]]:
        """Starlette ``exception_handlers`` sending every error through :meth:`handle`."""
        return {OpenAIError: self.handle, HTTPException: self.handle, Exception: self.handle}
