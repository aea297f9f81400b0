"""The gateway's HTTP server: uvicorn with its limits set from ``LimitsConfig``.

uvicorn's httptools protocol buffers a request head of any size for as long as the client
takes to send it, so a few slow clients with endless headers hold memory and connections.
``BoundedHttpProtocol`` adds two bounds to it: a head larger than ``max_header_bytes`` is
answered 431 and the connection closed (measured up to its blank line before each read
is parsed, so a head that arrives whole in one read is bounded too; pipelined heads that
share a read with the request before them are bounded by the read); a head not complete
``header_timeout_s`` after its connection opened (or after its first byte, on a kept-alive
connection) is answered 408. A connection closed with bytes still to send (a close
waits for them) is dropped once its client has read none of them for ``header_timeout_s``.
Websockets are off: the gateway serves none, and a request that asks to switch protocols
(``Connection: Upgrade``) is served as the HTTP/1.1 request it also is (``_PlainParser``).
An answer of no length to an HTTP/1.0 request is written as it is and ended by closing
the connection, where uvicorn chunked it (``kvwire.http10.Http10Cycle``).

Idle kept-alive connections count under ``max_connections`` but do not lock new clients
out: a connection that comes past the limit closes the oldest idle ones to make room, as
nginx does (``IdlePool``), and is refused only when every connection is busy.

Each ``transport.write`` is a system call, and on loopback one costs more than the rest of
a streamed chunk's relay. uvicorn writes a response's head on its own, then its body;
``HeadWithBody`` holds a head for the rest of the loop's turn so that the body's first
bytes, when they follow in that turn (a whole answer; a stream's first chunk, which the
gateway has in hand before it starts the response), go out in the same write. A head
with nothing after it goes out at the end of the turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import gc
import logging
import resource
import signal
import socket
import sys
import threading
import uuid
import weakref
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, cast

import httptools
import orjson
import uvicorn
import uvloop
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from gateway.config import GatewayConfig, LimitsConfig, TimeoutConfig
from kvwire.http10 import Http10Protocol
from kvwire.openai_schema import BadRequest, ServiceUnavailable, TooManyRequests

# the OpenAI error type of each status the server answers itself, as the app's errors
# have it (any other is the client's request's fault: 400, 408, 431)
_ERROR_TYPES = {429: TooManyRequests.type, 503: ServiceUnavailable.type}


def _close_with(transport: asyncio.Transport, status: bytes, reason: str, code: str,
                extra: bytes = b"") -> None:
    """Answers ``status`` with an OpenAI-shaped error (and a new request id: the head was
    never read; ``extra``: more header lines) and closes."""
    kind = _ERROR_TYPES.get(int(status[:3]), BadRequest.type)
    body = orjson.dumps({"error": {"message": reason, "type": kind, "param": None,
                                   "code": code}})
    transport.write(b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
                    b"x-request-id: gw-" + uuid.uuid4().hex.encode() + b"\r\n" + extra +
                    b"content-length: " + str(len(body)).encode() +
                    b"\r\nconnection: close\r\n\r\n" + body)
    transport.close()


# a body up to this size is joined to its head (cheaper than a gathered write); a larger
# one goes out with it in one gathered write (``writelines``), not copied
_JOIN_BYTES = 64 * 1024


class HeadWithBody:
    """A connection's transport whose response heads wait for the rest of the loop's turn
    for the bytes after them, to go out in one write (see the module docstring). What is
    held is written before anything else the transport is asked to do with the stream.

    With ``unread_s``, a close that leaves bytes to send (a close waits for them to go
    out) aborts the connection once its client has read none of them for that long: a
    client that reads nothing held it, and the bytes, for as long as its machine
    acknowledged TCP's probes."""

    __slots__ = ("_held", "_loop", "_transport", "_unread_s", "_watched")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop,
                 unread_s: float | None = None) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._unread_s = unread_s
        self._watched = False  # a closed connection's unsent bytes are watched

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if len(data) <= _JOIN_BYTES:
                self._transport.write(held + data)
            else:  # one gathered write, without copying a large body
                self._transport.writelines((held, data))
        elif isinstance(data, bytes) and data.startswith(b"HTTP/1.1 ") \
                and data.endswith(b"\r\n\r\n"):  # a response head
            self._held = data
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def writelines(self, lines: Any) -> None:
        self.flush()
        self._transport.writelines(lines)

    def flush(self) -> None:
        """Write what is held, if anything (and the connection still takes it)."""
        held = self._held
        if held is not None:
            self._held = None
            if not self._transport.is_closing():
                self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()
        if self._unread_s is not None and not self._watched:
            left = self._transport.get_write_buffer_size()
            if left:
                self._watched = True
                self._loop.call_later(self._unread_s, self._drop_if_unread, left,
                                      self._unread_s)

    def _drop_if_unread(self, left: int, unread_s: float) -> None:
        """Abort unless the client read some of the ``left`` bytes since the last look."""
        now = self._transport.get_write_buffer_size()
        if not now:  # all sent (or the connection gone)
            return
        if now >= left:
            self._transport.abort()
            return
        self._loop.call_later(unread_s, self._drop_if_unread, now, unread_s)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held or b"")

    def __getattr__(self, name: str) -> Any:  # the rest, as the transport has it
        return getattr(self._transport, name)


MAX_PIPELINED = 64  # requests queued behind the one being answered, on one connection


class _Leaving:
    """A connection's ``leaving_hooks`` (``kvwire.request_edge.ClientWatch``): callbacks
    called once when it is lost. Adding one reads on (a handler may start watching with
    reading paused: a body past uvicorn's high-water mark), so that a close is seen."""

    __slots__ = ("_callbacks", "_protocol")

    def __init__(self, protocol: HttpToolsProtocol) -> None:
        self._protocol = protocol
        self._callbacks: dict[Callable[[], None], None] = {}

    def add(self, callback: Callable[[], None]) -> None:
        protocol = self._protocol
        if protocol.parser is None:  # already lost
            callback()
            return
        self._callbacks[callback] = None
        protocol.flow.resume_reading()

    def discard(self, callback: Callable[[], None]) -> None:
        self._callbacks.pop(callback, None)

    def fire(self) -> None:
        callbacks, self._callbacks = self._callbacks, {}
        for callback in callbacks:
            callback()


# idle connections closed at once, at most, to make room for a new one (nginx's batch): a
# flood of new connections closes them a batch a time, not one per accepted connection
_IDLE_BATCH = 32


class IdlePool:
    """One server's idle kept-alive connections, oldest first: each answered all it was
    asked, holds no byte of a next request and has nothing left to send (uvicorn's
    keep-alive wait is running). A connection is added when it falls idle and taken out
    by its next bytes or its loss, each O(1): an accepted connection scans nothing.
    ``closing``: connections this pool closed that the server still counts (their loss
    comes a loop turn later)."""

    __slots__ = ("_idle", "closing")

    def __init__(self) -> None:
        self._idle: OrderedDict[BoundedHttpProtocol, None] = OrderedDict()
        self.closing = 0

    def add(self, protocol: BoundedHttpProtocol) -> None:
        self._idle[protocol] = None

    def discard(self, protocol: BoundedHttpProtocol) -> None:
        self._idle.pop(protocol, None)

    def close_oldest(self) -> int:
        """Close the oldest idle connections, an eighth of them (at least one, at most
        ``_IDLE_BATCH``): how many were closed (0: none is idle). A connection with bytes
        still unsent (a slow client reading its last answer) is not idle yet: it goes to
        the back."""
        wanted = max(1, min(_IDLE_BATCH, len(self._idle) // 8))
        closed = 0
        for _ in range(min(len(self._idle), 2 * wanted)):  # a bounded look
            protocol, _none = self._idle.popitem(last=False)
            transport = protocol.transport
            if transport.is_closing():
                protocol.idle = False
                continue
            if transport.get_write_buffer_size():
                self._idle[protocol] = None
                continue
            protocol.idle, protocol.closed_idle = False, True
            self.closing += 1
            transport.close()
            closed += 1
            if closed == wanted:
                break
        return closed


# each server's pool, by its state (one per uvicorn server: the main one and the admin's)
_POOLS: weakref.WeakKeyDictionary[ServerState, IdlePool] = weakref.WeakKeyDictionary()


def _pool_of(state: ServerState) -> IdlePool:
    pool = _POOLS.get(state)
    if pool is None:
        pool = _POOLS[state] = IdlePool()
    return pool


class _PlainParser(httptools.HttpRequestParser):
    """llhttp's request parser for a server that switches to no other protocol. llhttp
    ends a request that asks to (``Connection: Upgrade``; curl's ``--http2`` sends
    ``Upgrade: h2c`` with every request to an http:// URL) at its head and stops there:
    its body went unread (a completion's JSON reached the handler empty) and the next
    bytes were dropped. Such a request is read as the plain HTTP/1.1 request it also is
    (RFC 9110 7.8: a server may ignore ``Upgrade``): its head again without the upgrade
    (``BoundedHttpProtocol.take_upgrade``), then the bytes after it."""

    def __init__(self, protocol: BoundedHttpProtocol) -> None:
        super().__init__(protocol)
        self._protocol = protocol

    def feed_data(self, data: bytes | bytearray | memoryview | array[int]) -> None:
        while True:
            try:
                super().feed_data(data)
                return
            except httptools.HttpParserUpgrade as upgrade:
                head = self._protocol.take_upgrade()
                if head is None:
                    raise
                super().feed_data(head)
                # [0, offset): the head just read again; [offset, len): its body and on
                data = memoryview(data)[upgrade.args[0]:]


class BoundedHttpProtocol(Http10Protocol):
    """uvicorn's httptools protocol with a bounded request head (see the module), and
    bounded in what a connection holds:

    - pipelined requests: uvicorn parses every request a read brings and reads on after
      each answer, however many wait; a client that pipelines without reading the answers
      grew the process by hundreds of MB. Reading now waits until the requests queued are
      answered, and a connection with more than ``MAX_PIPELINED`` queued gets 429 and is
      closed;
    - a request answered before its body came whole (408 for a body too slow, 413, 401, a
      path with no handler): uvicorn read and dropped the rest of the body for as long as
      the client sent it, keeping the connection (and a place under ``max_connections``);
      the rest is now read and dropped for ``header_timeout_s`` at most (a client that
      sends its head, then its body, keeps its connection, which then waits
      ``keep_alive_s`` for its next request, idle, as after any answer), then the
      connection closed;
    - idle kept-alive connections: counted under ``max_connections`` as busy ones are,
      they let a client holding thousands of them (one ``/health`` each, no key needed)
      lock every other out until ``keep_alive_s`` ran out. A connection past the limit
      now closes the oldest idle ones (``IdlePool``) and is refused only when none is
      idle; a connection with a request in progress, in its head, body or answer, or
      with bytes of an answer still unsent, is never closed so. An idle connection may be
      closed at any time in HTTP/1.1: its client opens another and sends its request
      there (a request that crossed the close on the wire is retried by the clients that
      retry, as the openai clients do);
    - an answer the client reads nothing of: once the connection's buffer is full, each
      write of an answer waits for the client (uvicorn's flow control), and the answer's
      task with it. A relayed answer bounds its own waits (``timeouts.idle_s``), but any
      other (one pipelined behind an answer that filled the connection, a large
      ``/metrics``) waited for as long as the client stayed. A connection whose client
      has read nothing of what waits for ``unread_s`` (``timeouts.idle_s``) is dropped.

    Malformed HTTP gets an OpenAI-shaped 400, as every other error."""

    limits = LimitsConfig()  # replaced per server by ``bounded_protocol``
    unread_s = TimeoutConfig().idle_s  # ... as this is

    @staticmethod
    def on_refused(status: str) -> None:
        """An answer the server wrote itself (``status``: 400 for malformed HTTP, 408,
        429, 431, 501 for a transfer coding it does not decode, 503): ``bounded_protocol``
        gives the gateway's, which counts it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parser = _PlainParser(self)
        # as uvicorn sets it: a request after one that asks to close is still answered
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self._upgrade: bytes | None = None  # the head of a request that asked to upgrade
        self._in_head = True
        self._head_bytes = 0
        self._head_carry = b""  # the last bytes of the head so far
        self._next = False  # a request ended: the next one's head starts its timer
        self._ended_in_read = False  # ... during the read being parsed
        self._head_timer: asyncio.TimerHandle | None = None
        self._drain_timer: asyncio.TimerHandle | None = None  # an answered body's rest
        self._unread_timer: asyncio.TimerHandle | None = None  # writes wait on the client
        # an error for a request behind ones still being answered: (status, reason, code,
        # extra header lines), written after their answers (``_refuse``)
        self._refusal: tuple[bytes, str, str, bytes] | None = None
        self._leaving = _Leaving(self)
        self._pool = _pool_of(self.server_state)
        self.idle = False  # in the pool: answered all, awaiting the next request
        self.closed_idle = False  # closed by the pool to make room

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(HeadWithBody(  # type: ignore[arg-type]
            transport, self.loop, self.limits.header_timeout_s))
        pool = self._pool
        if len(self.server_state.connections) - pool.closing > self.limits.max_connections \
                and not pool.close_oldest():
            # one connection too many is refused, not every request on the others (which
            # is what uvicorn's limit_concurrency does, with a plain-text 503)
            self.on_refused("503")
            _close_with(self.transport, b"503 Service Unavailable",
                        f"the gateway holds its limit of {self.limits.max_connections} "
                        "connections; retry after 1 s", "too_many_connections",
                        b"retry-after: 1\r\n")
            return
        self._start_head_timer()

    def _fall_idle(self) -> None:
        """Into the pool, when nothing is left to do on the connection but wait for its
        next request: its answers all written, no byte of another request read, uvicorn's
        keep-alive wait running."""
        if self._next and not self.idle and self.timeout_keep_alive_task is not None \
                and self._refusal is None and not self.pipeline \
                and not self.transport.is_closing():
            self.idle = True
            self._pool.add(self)

    def _wake(self) -> None:
        if self.idle:
            self.idle = False
            self._pool.discard(self)

    def data_received(self, data: bytes) -> None:
        if self.idle:  # bytes of a next request (or blank lines): no longer idle
            self._wake()
        if self._next and self.timeout_keep_alive_task is not None:
            # the first bytes on an idle kept-alive connection end uvicorn's keep-alive
            # wait: the next head's timer starts with them, whether or not they begin a
            # request (blank lines, skipped before one, held the connection for ever)
            self._next = False
            self._start_head_timer()
        if self._in_head and self._head_size(data) > self.limits.max_header_bytes:
            # measured before parsing: a head that ends in this read is as bounded as one
            # that does not
            if not self.transport.is_closing():
                self._stop_head_timer()
                self._refuse(b"431 Request Header Fields Too Large",
                             f"request head exceeds {self.limits.max_header_bytes} bytes",
                             "header_too_large")
            return
        super().data_received(data)
        if len(self.pipeline) > MAX_PIPELINED and not self.transport.is_closing():
            while len(self.pipeline) > MAX_PIPELINED:  # the newest, never started
                self.pipeline.popleft()
            # (whatever came of the newest one's body: it was dropped, not served)
            if self._refusal is None:
                self.on_refused("429")
            self._refuse_after_answers((
                b"429 Too Many Requests", f"more than {MAX_PIPELINED} pipelined requests "
                "wait on this connection; read the answers before sending more",
                "too_many_pipelined_requests", b"retry-after: 1\r\n"))
            return
        if self._ended_in_read:  # a request ended in this read: the next head may have
            self._ended_in_read = False  # begun in it, its blank line still to come
            if self._in_head:
                self._head_carry = data[-3:]
        if self._in_head and self._head_bytes > self.limits.max_header_bytes \
                and not self.transport.is_closing():  # a pipelined request's head
            self._stop_head_timer()
            self._refuse(b"431 Request Header Fields Too Large",
                         f"request head exceeds {self.limits.max_header_bytes} bytes",
                         "header_too_large")

    def _head_size(self, data: bytes) -> int:
        """The request head's size so far with ``data``: up to its blank line when that is
        in ``data``, else all of it."""
        before, carried = self._head_bytes, self._head_carry
        window = carried + data if carried else data
        self._head_bytes = before + len(data)
        # a bare blank line counts where it comes before the first CRLF one: searched only
        # up to that (a body that follows a head in the same read is not scanned twice)
        crlf = window.find(b"\r\n\r\n")
        bare = window.find(b"\n\n", 0, crlf) if crlf >= 0 else window.find(b"\n\n")
        if bare >= 0:
            return before - len(carried) + bare + 2
        if crlf < 0:
            self._head_carry = window[-3:]  # a blank line may straddle two reads
            return self._head_bytes
        return before - len(carried) + crlf + 4

    def on_message_begin(self) -> None:
        self._wake()
        # (a keep-alive wait armed for a drained body, ``on_message_complete``, ends with
        # the next request, begun in the read that ended the body)
        self._unset_keepalive_if_required()
        super().on_message_begin()
        if self._next:  # a kept-alive connection's next request
            self._next = False
            self._start_head_timer()

    def on_message_complete(self) -> None:
        if self._upgrade is not None:  # the request read again, without its upgrade
            return
        drain_timer = self._drain_timer
        if drain_timer is not None:  # the answered body's rest came: kept alive
            drain_timer.cancel()
            self._drain_timer = None
        super().on_message_complete()
        # the next bytes are the next request's head: counted from its first byte
        self._in_head, self._next = True, True
        self._head_bytes, self._head_carry = 0, b""
        self._ended_in_read = True
        if drain_timer is not None and not self.transport.is_closing():
            # its answer ended before the body: uvicorn's keep-alive wait, armed then, was
            # ended by the body's bytes and not armed again, and the connection waited for
            # a next request with no deadline, never idle. It now waits ``keep_alive_s``
            # from here, idle, as after any answer
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler)
            self._fall_idle()

    def on_response_complete(self) -> None:
        waiting = len(self.pipeline)
        super().on_response_complete()
        if self.transport.is_closing():
            return
        if self._refusal is not None:  # answered once the answers before it are
            if waiting:
                self.flow.pause_reading()
            else:
                _close_with(self.transport, *self._refusal)
            return
        if self.pipeline:  # read on only once the queued requests are answered
            self.flow.pause_reading()
        elif self.cycle is not None and self.cycle.more_body:
            # answered before its body came whole: the rest is read and dropped for a
            # while (it may be on its way), not for as long as the client sends it
            self._drain_timer = self.loop.call_later(self.limits.header_timeout_s,
                                                     self._undrained)
        else:
            self._fall_idle()

    def _undrained(self) -> None:
        self._drain_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        error = sys.exception()
        refused = error.__context__ if error is not None else None
        if isinstance(refused, _HeadRefused):
            self._refuse(refused.status, str(refused), refused.code)
            return
        self._refuse(b"400 Bad Request", _what_is_invalid(msg), "invalid_http")

    def _refuse(self, status: bytes, reason: str, code: str, extra: bytes = b"") -> None:
        """Answer ``status`` (``_close_with``) and close: at once, or, while the requests
        before this one on the connection are still being answered (pipelined), after
        their answers, with nothing more read meanwhile (written at once, the error went
        into the middle of an answer being streamed, corrupting it). Where the bad bytes
        are the body of a request whose answer has begun, that answer is cut instead,
        visibly (its last chunk never comes)."""
        if self._refusal is not None or self.transport.is_closing():
            return
        refusal = (status, reason, code, extra)
        cycle, queued = self.cycle, self.pipeline
        if cycle is not None and cycle.more_body and not cycle.response_complete \
                and cycle.response_started and not (queued and queued[0][0] is cycle):
            self.transport.close()  # its answer, begun, is cut: the request counts itself
            return
        if status != b"408 Request Timeout" or self._head_bytes:  # (a request began)
            self.on_refused(status[:3].decode())
        if cycle is not None and cycle.more_body and not cycle.response_complete:
            # the bad bytes are this request's body: it is not served
            if queued and queued[0][0] is cycle:  # waiting behind others: dropped
                queued.popleft()
            else:
                _close_with(self.transport, *refusal)
                return
        elif not queued and (cycle is None or cycle.response_complete):
            _close_with(self.transport, *refusal)
            return
        self._refuse_after_answers(refusal)

    def _refuse_after_answers(self, refusal: tuple[bytes, str, str, bytes]) -> None:
        """``refusal`` written once the requests queued and the one being answered are
        (``on_response_complete``); nothing more is read meanwhile."""
        if self._refusal is None:
            self._refusal = refusal
            self.flow.pause_reading()

    def take_upgrade(self) -> bytes | None:
        """The head of the request just read that asked to switch protocols, without
        asking (None: no such request; a CONNECT is no HTTP request to serve)."""
        head, self._upgrade = self._upgrade, None
        return head

    def _without_upgrade(self) -> bytes:
        lines = [b"%s %s HTTP/%s\r\n" % (self.parser.get_method(), self.url,
                                         self.parser.get_http_version().encode())]
        for name, value in self.headers:
            if name == b"upgrade":
                continue
            if name == b"connection":
                value = b",".join(token for token in value.split(b",")
                                  if token.strip().lower() != b"upgrade")
                if not value.strip():
                    continue
            lines.append(name + b": " + value + b"\r\n")
        lines.append(b"\r\n")
        return b"".join(lines)

    def on_headers_complete(self) -> None:
        coding = _transfer_coding_refused(self.headers)
        if coding is not None:  # (the parser stops: ``send_400_response`` answers 501)
            raise _HeadRefused(b"501 Not Implemented", coding, "unsupported_transfer_encoding")
        host = _host_refused(self.headers, self.parser.get_http_version())
        if host is not None:  # (as above: 400)
            raise _HeadRefused(b"400 Bad Request", host, "invalid_host")
        if self.parser.should_upgrade() and self.parser.get_method() != b"CONNECT":
            # read again without the upgrade (``_PlainParser``); nothing starts now
            self._upgrade = self._without_upgrade()
            return
        self._in_head = False
        self._stop_head_timer()
        super().on_headers_complete()  # (an HTTP/1.0 request's cycle: ``Http10Cycle``)
        # a request's handler watches for its client leaving through these (ClientWatch)
        self.cycle.leaving_hooks = self._leaving  # type: ignore[attr-defined]

    def eof_received(self) -> None:
        # the client shut its half: the loop closes the connection when this returns (as
        # uvicorn asks), so a head held for a body that will not come (HEAD) goes now
        cast(HeadWithBody, self.transport).flush()
        super().eof_received()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._unread_timer is None:
            self._watch_unread(self.transport.get_write_buffer_size())

    def resume_writing(self) -> None:
        super().resume_writing()
        self._stop_unread_timer()

    def _watch_unread(self, left: int) -> None:
        self._unread_timer = self.loop.call_later(self.unread_s, self._unread, left)

    def _unread(self, left: int) -> None:
        """Drop the connection unless its client read some of the ``left`` bytes since
        the last look (a closing one is watched by ``HeadWithBody.close``)."""
        self._unread_timer = None
        if self.transport.is_closing():
            return
        now = self.transport.get_write_buffer_size()
        if now >= left:
            self.transport.abort()
        else:
            self._watch_unread(now)

    def _stop_unread_timer(self) -> None:
        if self._unread_timer is not None:
            self._unread_timer.cancel()
            self._unread_timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._wake()
        if self.closed_idle:
            self.closed_idle = False
            self._pool.closing -= 1
        self._stop_head_timer()
        self._stop_unread_timer()
        if self._drain_timer is not None:
            self._drain_timer.cancel()
        super().connection_lost(exc)
        self._leaving.fire()

    def _start_head_timer(self) -> None:
        self._stop_head_timer()
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_late)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            self._refuse(b"408 Request Timeout",
                         f"request head not received within {self.limits.header_timeout_s} s",
                         "header_timeout")


_SHOWN_CHARS = 200  # of a parser's message: an invalid URL's is the whole URL


class _HeadRefused(Exception):
    """A request head the server answers itself (``send_400_response``): ``status`` and
    the error's ``code``; the message says why."""

    def __init__(self, status: bytes, reason: str, code: str) -> None:
        super().__init__(reason)
        self.status, self.code = status, code


def _host_refused(headers: list[tuple[bytes, bytes]], version: str) -> str | None:
    """Why an HTTP/1.1 request's ``Host`` is refused, or None: RFC 9112 3.2 answers 400
    to one without a ``Host`` header or with more than one (two could be read as two
    hosts by two hops: the request-smuggling kind). HTTP/1.0 need not send one."""
    if version == "1.0":
        return None
    count = sum(1 for name, _ in headers if name == b"host")
    if count == 1:
        return None
    said = "no Host header" if count == 0 else f"{count} Host headers"
    return f"an HTTP/{version} request must carry exactly one Host header; it had {said}"


def _transfer_coding_refused(headers: list[tuple[bytes, bytes]]) -> str | None:
    """Why a request's ``Transfer-Encoding`` is refused, or None: any coding but
    ``chunked`` alone (``gzip, chunked``, ``identity``), which RFC 9112 answers 501, as
    nginx does. The parser only checks that ``chunked`` comes last, and the body's
    compressed bytes reached the JSON decoder, whose "not UTF-8" named nothing of the
    cause."""
    said = [value for name, value in headers if name == b"transfer-encoding"]
    if not said:
        return None
    codings = [c.strip().lower() for value in said for c in value.split(b",") if c.strip()]
    if codings == [b"chunked"]:
        return None
    shown = ", ".join(value.decode("latin-1") for value in said)
    if len(shown) > _SHOWN_CHARS:
        shown = shown[:_SHOWN_CHARS] + "..."
    return f"Transfer-Encoding {shown!r} is not supported: send the body with " \
           f"Content-Length, or with Transfer-Encoding: chunked alone (uncompressed)"


def _what_is_invalid(said: str) -> str:
    """What llhttp found wrong with the request whose error is being handled (uvicorn
    answers its parser's errors from within its ``except``), else ``said``: uvicorn's
    "Invalid HTTP request received." named nothing (a duplicate Content-Length, a bad
    chunk size, a control character in a header all read the same)."""
    error = sys.exception()
    if isinstance(error, httptools.HttpParserCallbackError):
        # raised in a callback: the URL parser's (any other is no fault of the request)
        cause = error.__context__
        error = cause if isinstance(cause, httptools.HttpParserError) else None
    if not isinstance(error, httptools.HttpParserError):
        return said
    what = str(error)
    if len(what) > _SHOWN_CHARS:
        what = what[:_SHOWN_CHARS] + "..."
    return f"invalid HTTP request: {what}"


def bounded_protocol(config: GatewayConfig,
                     on_refused: Callable[[str], None] | None = None
                     ) -> type[BoundedHttpProtocol]:
    """The protocol under ``config``'s limits, dropping unread answers after its
    ``timeouts.idle_s``; ``on_refused(status)`` for each answer it writes itself."""
    attrs: dict[str, Any] = {"limits": config.limits, "unread_s": config.timeouts.idle_s}
    if on_refused is not None:
        attrs["on_refused"] = staticmethod(on_refused)
    return type("BoundedHttpProtocol", (BoundedHttpProtocol,), attrs)


def server_config(app: Any, config: GatewayConfig,
                  on_refused: Callable[[str], None] | None = None,
                  **overrides: Any) -> uvicorn.Config:
    """uvicorn's config for ``app`` under ``config.limits`` (``on_refused``: see
    ``bounded_protocol``; ``overrides`` for the rest)."""
    limits = config.limits
    options: dict[str, Any] = {
        "host": config.host, "port": config.port,
        "http": bounded_protocol(config, on_refused),
        # the peer address is what trust decisions read: never taken from headers here
        "proxy_headers": False,
        "ws": "none",
        "timeout_keep_alive": limits.keep_alive_s, "log_level": "warning",
        "access_log": False, **overrides}
    return uvicorn.Config(app, **options)


class _Companion(uvicorn.Server):
    """A server run beside the main one, which alone takes the signals and stops it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def companion(config: uvicorn.Config) -> uvicorn.Server:
    """A server to run beside the main one with ``serve_together``."""
    return _Companion(config)


class _Draining(uvicorn.Server):
    """On the first SIGTERM/SIGINT: ``on_drain`` (readiness goes down) at once, uvicorn's
    graceful shutdown ``grace_s`` later (no new connections; those in flight finish within
    the config's ``timeout_graceful_shutdown``), and ``on_cutoff`` a second before that
    runs out (the answers still being relayed are ended, each visibly cut, rather than
    dropped mid-body by uvicorn's cancel). A second signal stops at once: the answers in
    flight are cut the same way, and the process ends with a log line, no traceback."""

    def __init__(self, config: uvicorn.Config, grace_s: float,
                 on_drain: Callable[[], None],
                 on_cutoff: Callable[[], object] = lambda: None) -> None:
        super().__init__(config)
        self.grace_s = grace_s
        self.on_drain = on_drain
        self.on_cutoff = on_cutoff
        self._draining = False
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's signals (SIGINT, SIGTERM) and SIGHUP (a closed terminal, a hangup
        from whatever started the gateway), unless SIGHUP is ignored (``nohup``; a worker
        process, whose supervisor acts on it): by default it ended the process at once,
        its answers dropped without the error that marks them cut. As uvicorn does, the
        handlers in place before are put back afterwards, and the signals taken are then
        raised again for them; a SIGINT that was ignored before ends the process as a
        Ctrl-C (``KeyboardInterrupt``)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        taken = [signal.SIGINT, signal.SIGTERM]
        if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
            taken.append(signal.SIGHUP)
        before = {sig: signal.signal(sig, self.handle_exit) for sig in taken}
        try:
            yield
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)
        for captured in reversed(self._captured_signals):
            if captured == signal.SIGINT and before[signal.SIGINT] is signal.SIG_IGN:
                # started with SIGINT ignored (a shell script's background job): it stopped
                # the server all the same, and ends it as a Ctrl-C does, not silently with 0
                raise KeyboardInterrupt
            signal.raise_signal(captured)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._draining:  # a second signal: no more waiting for answers in flight
            self.should_exit = self.force_exit = True
            if self._loop is not None:  # ... which end now, each visibly cut
                self._loop.call_soon_threadsafe(self.on_cutoff)
            return
        graceful = self.config.timeout_graceful_shutdown or 0
        if self._loop is not None and graceful:
            cutoff = max(0.0, self.grace_s) + max(graceful / 2, graceful - 1.0)
            self._loop.call_soon_threadsafe(self._loop.call_later, cutoff, self.on_cutoff)
        if self.grace_s <= 0 or self._loop is None:
            self._draining = True
            super().handle_exit(sig, frame)
            return
        self._draining = True
        self.on_drain()
        later = functools.partial(super().handle_exit, sig, frame)
        self._loop.call_soon_threadsafe(self._loop.call_later, self.grace_s, later)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        if self.force_exit:
            await self._stop_at_once()

    async def _stop_at_once(self) -> None:
        """After a second signal uvicorn waits for nothing and skips the app's shutdown;
        the requests still running and the app's lifespan, still waiting for its shutdown,
        would then be cancelled with the event loop, each logging a traceback. Here the
        requests (their answers cut at the signal) get a moment to end, the rest are
        cancelled, and the app's shutdown runs (stopping its tasks, closing its clients),
        within ``_FORCED_STOP_S`` in all."""
        log = logging.getLogger("kvgate")
        tasks = set(self.server_state.tasks)
        log.warning("a second signal: stopping at once, %d request(s) cut", len(tasks))
        if tasks:
            await asyncio.wait(tasks, timeout=_FORCED_STOP_S / 2)
        quiet = _QuietCancel()
        errors = logging.getLogger("uvicorn.error")
        errors.addFilter(quiet)  # a cancelled request is no error at this point
        try:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_FORCED_STOP_S / 2):
                    await self.lifespan.shutdown()
        finally:
            errors.removeFilter(quiet)


_FORCED_STOP_S = 2.0  # what a second signal leaves for requests to end and the app to stop


class _QuietCancel(logging.Filter):
    """Drops the records of requests cancelled by a forced stop."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1],
                                                   asyncio.CancelledError))


_FILES_PER_CONNECTION = 2  # a client's connection, and about one to a replica for it
_FILES_SPARE = 256  # the process's own: listeners, scrapes, logs, the tokenizer's


def fit_open_files(config: GatewayConfig) -> GatewayConfig:
    """``config`` with ``limits.max_connections`` the process can hold open: its soft
    limit on open files is raised to the hard one as far as the connections need; where
    even that is too few, ``max_connections`` is cut to fit (with a warning), so that the
    connection past it still gets its 503 rather than a reset (an accept that fails for
    want of a file descriptor answers nothing)."""
    wanted = config.limits.max_connections * _FILES_PER_CONNECTION + _FILES_SPARE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return config
    fits = max(1, (soft - _FILES_SPARE) // _FILES_PER_CONNECTION)
    logging.getLogger("kvgate").warning(
        "limits.max_connections %d needs about %d open files; the process may hold %d "
        "(ulimit -n): serving at most %d connections", config.limits.max_connections,
        wanted, soft, fits)
    return dataclasses.replace(config, limits=dataclasses.replace(config.limits,
                                                                   max_connections=fits))


def run_server(app: Any, config: GatewayConfig, admin_app: Any | None = None,
               on_drain: Callable[[], None] = lambda: None,
               sockets: list[socket.socket] | None = None,
               on_cutoff: Callable[[], object] = lambda: None,
               on_refused: Callable[[str], None] | None = None) -> None:
    """Serve ``app`` until SIGINT or SIGTERM (draining first, see ``ShutdownConfig``), and
    ``admin_app`` (when given) on the admin listener, in the same event loop. ``sockets``:
    listen there rather than on the config's host and port (a worker's own socket)."""
    config = fit_open_files(config)
    grace = config.shutdown.grace_s
    # what start-up built (tokenizer, policy, ring) lives as long as the process: out of
    # the collector's sight, so full collections stop walking it again and again
    gc.freeze()
    main = _Draining(server_config(
        app, config, on_refused, loop="uvloop",
        timeout_graceful_shutdown=max(1, int(config.shutdown.timeout_s - grace))),
        grace, on_drain, on_cutoff)
    if admin_app is None:
        main.run(sockets)
        return
    admin = companion(uvicorn.Config(
        admin_app, host=config.admin.host, port=config.admin.port, lifespan="off",
        proxy_headers=False,
        http=bounded_protocol(config), ws="none", log_level="warning",
        access_log=False))

    uvloop.run(serve_together(main, admin, sockets))


async def serve_together(main: uvicorn.Server, side: uvicorn.Server,
                         main_sockets: list[socket.socket] | None = None,
                         side_sockets: list[socket.socket] | None = None) -> None:
    """Run ``side`` for as long as ``main`` runs, in this event loop (each on its config's
    host and port, or on the sockets given)."""
    task = asyncio.create_task(side.serve(side_sockets))
    try:
        await main.serve(main_sockets)
    finally:
        side.should_exit = True
        await task
