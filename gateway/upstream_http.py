"""The gateway's HTTP/1.1 client toward its replicas: what a proxied request costs most of
its CPU in, kept to what a pass-through needs.

A general client builds a request object, a writer, a response object, timers and a stream
reader per request, and wakes a task per chunk through several layers: about 0.9 ms of CPU
for a streamed answer of ten chunks on loopback, where this client takes about 0.35 ms
(``loadtests.bench_proxy`` shows the gateway's whole figures). It speaks only what the
gateway sends and its replicas answer:

- ``POST`` with a body in memory (its ``content-length`` set here), on a keep-alive
  connection per replica origin (``http`` or ``https``), at most ``limit_per_origin`` at
  once (more wait for one to free); a connection idle for ``idle_s`` is closed, as is one
  the replica closed or that answered ``connection: close``;
- answers with a ``content-length``, chunked, or read until the connection closes, parsed
  by ``httptools`` (llhttp): the body is handed over as it arrives, without decompressing
  it; reading pauses while 256 KB wait unread. A body read until the connection closes
  ends whole only as far as anything tells: one encoded ``gzip`` or ``deflate`` is
  inflated as it comes (the output dropped) to see its compressed stream end, and a close
  before that end is a broken connection (``EncodedEnd``); ``encoded_cut`` asks the
  same of a whole body held with a length or chunks, and the proxy follows a longer one
  relayed under them with an ``EncodedEnd`` of its own.

Errors: ``UpstreamUnreachable`` when no connection could be made (refused, unresolvable,
or TLS failed: the replica is unreachable); ``UpstreamBroken`` when the connection broke or
the answer was malformed; a connect that takes over ``connect_s`` is ``UpstreamBroken``
too. Each one's message is the detail, for the log; its ``cause``, a few words without
addresses, is what a client is told. An ``https`` replica's certificate is checked against
the system's CAs and ``tls.ca_file``'s (``replica_tls``), always. A request that finds a
kept-alive connection closed under it before any byte of the answer came is sent again
once on a new connection (the replica closed it idle as the request was sent), when the
close came within ``STALE_WINDOW_S`` of the send, plus two of the connection's round trips
(the time its connect took, ``STALE_DISTANCE_MAX_S`` at most: a replica farther than
``STALE_WINDOW_S`` away closed it idle as surely, its close later on the wire): a replica
that held the request longer may have worked on it, and its close is a broken connection.
So is a request answered 408 on a kept-alive connection (a server that says so as it
closes an idle one: HAProxy's, some of Node's): 408 says the request never came whole.
The answer to a request sent again says so (``resent``).
"""

from __future__ import annotations

import asyncio
import ssl
import time
import zlib
from collections import deque
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

import httptools

from gateway.config import GatewayConfig, TlsConfig

_HIGH_WATER = 256 * 1024  # bytes of answer waiting unread before reading pauses
# bytes a replica may send before its answer's head is complete (status line, headers,
# interim answers): the parser keeps what it reads of a header, so an endless one is cut
_MAX_HEAD_BYTES = 1 << 20
_DEFAULT_PORTS = {"http": 80, "https": 443}
# the content-encodings whose compressed stream tells its own end, and zlib's wbits for them
_ENDS_TOLD = {"gzip": 31, "x-gzip": 31, "deflate": 15}
# bytes inflated per byte read (and a chunk's slack) past which a body's end is not
# followed: a body that inflates further (a bomb) would hold the event loop
_INFLATE_RATIO, _INFLATE_SLACK = 64, 1 << 16
_FEED_BYTES = 1 << 16  # a body is inflated this much at a time (``EncodedEnd.feed``)
# what a certificate the gateway does not trust is told with (log, admin API)
CA_FILE_HINT = ("a replica signed by a private CA is trusted once the gateway's config "
                "names that CA's certificate: tls: {ca_file: PATH}")


def replica_tls(tls: TlsConfig) -> ssl.SSLContext | None:
    """The TLS context that checks ``https`` replicas' certificates against the system's
    CAs and ``tls.ca_file``'s; None without a ``ca_file`` (a client's default context
    does the same with the system's alone). Reads the file: made once, at start-up."""
    if tls.ca_file is None:
        return None
    context = ssl.create_default_context()
    context.load_verify_locations(cafile=tls.ca_file)
    return context


class UpstreamFailure(Exception):
    """The request to a replica failed (the base of the two below). Its message is the
    detail, for the gateway's log and the admin API (addresses, the OS's or TLS's words);
    ``cause`` what happened in a few words, for the client ("replica 'r0' <cause>")."""

    cause = "failed"

    def __init__(self, detail: str, cause: str | None = None) -> None:
        super().__init__(detail)
        if cause is not None:
            self.cause = cause


class UpstreamUnreachable(UpstreamFailure):
    """No connection to the replica could be made."""

    cause = "is unreachable"


class UpstreamBroken(UpstreamFailure):
    """The connection broke, or the answer was not HTTP the client understands."""

    cause = "broke the connection"


class _Stale(UpstreamBroken):
    """A reused connection closed before any byte of the answer came."""


STALE_WINDOW_S = 0.1  # a kept-alive connection closed within this of a send: closed idle
# ... plus two of its round trips (its connect's time: a resolve, a TLS handshake and the
# loop's lag count too), this at most: a replica closing after longer may have worked on it
STALE_DISTANCE_MAX_S = 1.0


class EncodedEnd:
    """Follows a body's compressed stream (``gzip``, several members allowed, or
    ``deflate``'s zlib stream), inflating what arrives and dropping the output, to tell
    whether it reached its end: a replica that dies mid-body ends a close-delimited body
    with its connection too, and a replica that cuts its answer may end it under a clean
    length or chunked end; only the encoding can tell those from a whole one. Stops
    judging (``judged`` False) where the bytes are not that encoding (a raw deflate
    stream, say: the client will find out) or inflate past ``_INFLATE_RATIO``."""

    __slots__ = ("_inflate", "_wbits", "ended", "judged")

    def __init__(self, wbits: int) -> None:
        self._wbits = wbits
        self._inflate = zlib.decompressobj(wbits)
        self.ended = False  # at the end of a compressed stream (more may begin)
        self.judged = True

    @classmethod
    def of(cls, headers: Mapping[str, str]) -> EncodedEnd | None:
        """One for a body encoded as ``headers`` say, when its encoding tells its end."""
        wbits = _ENDS_TOLD.get(headers.get("content-encoding", "").strip().lower())
        return None if wbits is None else cls(wbits)

    @property
    def cut(self) -> bool:
        """The bytes so far end inside a compressed stream: a body ending here is cut."""
        return self.judged and not self.ended

    def feed(self, data: bytes) -> None:
        """Inflate ``data``, the body's next bytes, ``_FEED_BYTES`` at a time (what one
        piece may inflate to is bounded by its size)."""
        for at in range(0, len(data), _FEED_BYTES):
            self._feed(data[at:at + _FEED_BYTES])

    def _feed(self, data: bytes) -> None:
        while data and self.judged:
            if self.ended:  # another gzip member follows (RFC 1952 allows several)
                self._inflate = zlib.decompressobj(self._wbits)
                self.ended = False
            inflate = self._inflate
            try:
                inflate.decompress(data, _INFLATE_RATIO * len(data) + _INFLATE_SLACK)
            except zlib.error:
                self.judged = False
                return
            if inflate.unconsumed_tail:  # it inflates further than is followed
                self.judged = False
                return
            self.ended = inflate.eof
            data = inflate.unused_data if inflate.eof else b""


def encoded_cut(body: bytes, headers: Mapping[str, str]) -> bool:
    """Whether ``body``, all of an answer encoded as ``headers`` say, ends inside its
    compressed stream (``gzip`` or ``deflate``, which tell their end): a replica's cut
    body, whatever its length or chunks said. False where the encoding tells no end (none,
    ``br``), or the bytes are not that encoding or inflate past ``_INFLATE_RATIO``
    (``EncodedEnd``). Inflates the body, the output dropped, a piece at a time: asked
    only of a body sent encoded though the gateway asks for none."""
    end = EncodedEnd.of(headers)
    if end is None:
        return False
    end.feed(body)
    return end.cut


class UpstreamResponse:
    """One request's answer: ``status``, ``headers`` (lower-case names; a repeated one's
    values joined by ", ", as RFC 9110 lets a recipient combine them, except
    ``set-cookie``, whose first value is there and the others in ``more_cookies``: a
    cookie's own commas would run into the joins) and the body through ``readany`` /
    ``read``; ``release`` or ``close`` it when done. ``resent``: the request went out
    twice (a kept-alive connection closed as it was sent)."""

    def __init__(self, conn: _Connection) -> None:
        self.resent = False
        self._conn: _Connection | None = conn
        self.status = 0
        self.headers: dict[str, str] = {}
        self.more_cookies: list[str] = []
        self._head: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiter: asyncio.Future[None] | None = None
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._complete = False  # the whole answer was parsed
        self._keep = False  # ... and the connection may carry another request
        self._error: UpstreamFailure | None = None
        self._until_close = False  # neither a length nor chunked: ends with the connection
        self._encoded: EncodedEnd | None = None  # ... and tells its end by its encoding

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: UpstreamFailure) -> None:
        if self._error is None:
            self._error = error
        if not self._head.done():
            self._head.set_exception(error)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    async def readany(self) -> bytes:
        """The body bytes arrived since the last call (waiting for some); ``b""`` at the
        end of the body."""
        while not self._chunks:
            if self._error is not None:  # also after the end: bytes past it were malformed
                raise self._error
            if self._complete:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunks = self._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._conn is not None:
            self._conn.drained()
        return data

    async def read(self, limit: int) -> bytes:
        """Up to ``limit`` bytes of the body (fewer at its end)."""
        out = bytearray()
        while len(out) < limit:
            chunk = await self.readany()
            if not chunk:
                break
            out += chunk
        return bytes(out[:limit])

    def is_eof(self) -> bool:
        """The whole body was read (and nothing malformed came after it: a replica that
        sends bytes past the end of its answer got its length wrong)."""
        return self._complete and not self._chunks and self._error is None

    @property
    def until_close(self) -> bool:
        """The answer has neither a length nor chunks: the connection's end is its end,
        and a replica that died mid-answer ends it the same way."""
        return self._until_close

    def release(self) -> None:
        """Done with the answer: the connection goes back for the next request when the
        answer was read whole and may be kept; else it is closed."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self.is_eof() and self._error is None and self._keep and not self._until_close:
            conn.finished()
        else:
            conn.close()

    def close(self) -> None:
        """Done with the answer, read or not: the connection is closed (the replica sees
        the request go)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


class _Overrun(ValueError):
    """Raised by a parser callback: the answer passed a bound."""


class _Connection(asyncio.Protocol):
    """One connection to a replica, parsing the answer of the request it carries."""

    def __init__(self, origin: _Origin) -> None:
        self._origin = origin
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self._answer: UpstreamResponse | None = None
        self._got_bytes = False
        self._sent_at = 0.0  # monotonic: when the request it carries was written
        self._head_bytes = 0  # of the answer now awaited: its head, then its trailers
        self._interim = False  # parsing a 1xx answer's head
        self._paused = False
        self.reused = False
        self.held = False  # counts against the origin's limit
        self.idle_since = 0.0
        self.connect_s = 0.0  # how long its connect took: a round trip, or more (TLS)

    # -- asyncio.Protocol -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._answer is None:  # unasked bytes on an idle connection
            self.close()
            return
        self._got_bytes = True
        if not self._answer._head.done():
            self._head_bytes += len(data)
            if self._head_bytes > _MAX_HEAD_BYTES:
                self._broken(UpstreamBroken(f"the answer's head passed {_MAX_HEAD_BYTES} "
                                            "bytes"))
                return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._broken(UpstreamBroken("the replica asked for a protocol upgrade"))
        except httptools.HttpParserError as exc:
            # a callback's own refusal (trailers past the bound) is the error's context
            cause = exc.__context__
            if isinstance(cause, _Stale):  # (``on_headers_complete``)
                self._broken(cause)
                return
            self._broken(UpstreamBroken(str(cause) if isinstance(cause, _Overrun)
                                        else f"malformed answer ({exc})"))

    def eof_received(self) -> bool | None:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        answer, self._answer = self._answer, None
        self._origin.forget(self)
        if answer is None or answer._complete:
            return
        if answer._encoded is not None and answer._encoded.cut and answer._error is None \
                and exc is None:
            answer._fail(UpstreamBroken("the body ended with its connection inside its "
                                        f"{answer.headers['content-encoding']} stream"))
        elif answer._head.done() and answer._until_close and answer._error is None \
                and exc is None:
            answer._complete = True  # the body ran to the end of the connection (a reset
            answer._wake()  # connection is not an end: the answer broke)
        elif not self._got_bytes and self.reused \
                and time.monotonic() - self._sent_at <= STALE_WINDOW_S + min(
                    2 * self.connect_s, STALE_DISTANCE_MAX_S):
            answer._fail(_Stale("the replica closed a kept-alive connection"))
        else:
            what = exc.__class__.__name__ if exc is not None else "closed"
            answer._fail(UpstreamBroken(f"the connection broke ({what})"))

    # -- httptools callbacks --------------------------------------------------------------
    def on_message_begin(self) -> None:
        answer = self._answer
        if answer is not None and answer._complete:
            # another answer after the one asked for: its length was wrong (the bytes
            # would have been read as the answer's status, headers and body)
            raise _Overrun("the replica sent bytes past the end of its answer")

    def on_header(self, name: bytes, value: bytes) -> None:
        answer = self._answer
        if answer is not None and answer._head.done():
            # a chunked body's trailer, after the head: never relayed, so not kept; bounded
            # with the head (a replica sending trailer lines without end grew the gateway's
            # memory by gigabytes, its bytes keeping the idle timeout away)
            self._head_bytes += len(name) + len(value)
            if self._head_bytes > _MAX_HEAD_BYTES:
                raise _Overrun(f"the answer's head and trailers passed {_MAX_HEAD_BYTES} "
                               "bytes")
        elif answer is not None:
            key = name.decode("latin-1").lower()
            text = value.decode("latin-1")
            had = answer.headers.get(key)
            if had is None:
                answer.headers[key] = text
            elif key == "set-cookie":
                answer.more_cookies.append(text)
            else:
                answer.headers[key] = f"{had}, {text}"

    def on_headers_complete(self) -> None:
        answer = self._answer
        if answer is None:
            return
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # an interim answer (100 Continue, 103 Early Hints): the
            self._interim = True  # final one follows on this connection
            answer.headers.clear()
            answer.more_cookies.clear()
            return
        if status == 408 and self.reused and not answer._head.done():
            # the request never came whole: the replica closed the connection idle as it
            # was sent (see the module); the rest of this answer is not read
            raise _Stale("the replica answered 408 on a kept-alive connection")
        answer.status = status
        headers = answer.headers
        answer._until_close = "content-length" not in headers \
            and "chunked" not in headers.get("transfer-encoding", "").lower() \
            and status not in (204, 304) and status >= 200
        if answer._until_close:
            answer._encoded = EncodedEnd.of(headers)
        if not answer._head.done():
            answer._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        answer = self._answer
        if answer is None:
            return
        answer._chunks.append(body)
        answer._buffered += len(body)
        if answer._encoded is not None:
            answer._encoded.feed(body)
        if answer._buffered > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        answer._wake()

    def on_message_complete(self) -> None:
        answer = self._answer
        if answer is None:
            return
        if self._interim:  # the end of an interim answer, not of the request's
            self._interim = False
            return
        answer._complete = True
        answer._keep = self._parser.should_keep_alive()  # the parser resets on return
        if not answer._head.done():
            answer._head.set_result(None)
        answer._wake()

    # -- the request ----------------------------------------------------------------------
    async def send(self, data: bytes) -> UpstreamResponse:
        """Writes a request; its answer once the head arrived."""
        if self.transport is None:
            error = _Stale if self.reused else UpstreamBroken
            raise error("the connection closed before the request was sent")
        answer = self._answer = UpstreamResponse(self)
        self._got_bytes = False
        self._head_bytes = 0
        self._sent_at = time.monotonic()
        self.transport.write(data)
        await answer._head
        return answer

    def drained(self) -> None:
        """The answer's buffered bytes were read: reading goes on."""
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    def _broken(self, error: UpstreamFailure) -> None:
        if self._answer is not None:
            self._answer._fail(error)
        self.close()

    def finished(self) -> None:
        """The answer was read whole: kept for the next request."""
        self._answer = None
        self._parser = httptools.HttpResponseParser(self)
        self.reused = True
        self.drained()
        if self.transport is None:
            self._origin.forget(self)
        else:
            self._origin.put_back(self)

    def close(self) -> None:
        transport = self.transport
        if transport is not None:
            self.transport = None
            transport.close()
        self._origin.forget(self)


class _Origin:
    """The connections to one scheme, host and port: at most ``limit`` in use at once
    (so at most that many open: a new one is made only when none is idle). An idle one is
    closed ``idle_s`` after its last answer, by a timer, whether or not another request
    comes (a replica that left keeps none open); once none is left or in use,
    ``on_unused`` is told (the client forgets the origin)."""

    def __init__(self, scheme: str, host: str, port: int, limit: int, idle_s: float,
                 connect_s: float, ssl_context: ssl.SSLContext | None,
                 on_unused: Callable[[_Origin], None] | None = None) -> None:
        self.host, self.port = host, port
        self.key = (scheme, host, port)
        named = f"[{host}]" if ":" in host else host  # an IPv6 literal goes in brackets
        self.host_header = named if port == _DEFAULT_PORTS[scheme] else f"{named}:{port}"
        self._slots = asyncio.Semaphore(limit)
        self.in_use = 0  # slots taken
        self.waiting = 0  # requests waiting for a slot
        self._idle: deque[_Connection] = deque()  # the most recently used last
        self._idle_s = idle_s
        self._connect_s = connect_s
        self._ssl = ssl_context if scheme == "https" else None
        self._on_unused = on_unused
        self._timer: asyncio.TimerHandle | None = None  # the next expiry of an idle one

    async def take(self, fresh: bool = False) -> _Connection:
        """A connection for one request: a kept-alive one (unless ``fresh``), else a new
        one."""
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.in_use += 1
        try:
            now = time.monotonic()
            while self._idle and not fresh:
                conn = self._idle.pop()
                if conn.transport is not None and now - conn.idle_since < self._idle_s:
                    conn.held = True
                    return conn
                conn.close()  # expired: the replica may close it any moment
            return await self.connect()
        except BaseException:
            self._release()
            self._maybe_unused()  # (a replica that left: unreachable)
            raise

    def _release(self) -> None:
        self.in_use -= 1
        self._slots.release()

    async def connect(self) -> _Connection:
        """A new connection (its slot already taken)."""
        loop = asyncio.get_running_loop()
        began = time.monotonic()
        try:
            async with asyncio.timeout(self._connect_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self), self.host, self.port, ssl=self._ssl,
                    server_hostname=self.host if self._ssl is not None else None)
        except TimeoutError:
            raise UpstreamBroken(f"no connection to {self.host}:{self.port} within "
                                 f"{self._connect_s} s", "timed out connecting") from None
        except ssl.SSLCertVerificationError as exc:
            raise UpstreamUnreachable(f"TLS with {self.host}:{self.port} failed: {exc}; "
                                      f"{CA_FILE_HINT}", "is unreachable (TLS failed)") from None
        except ssl.SSLError as exc:
            raise UpstreamUnreachable(f"TLS with {self.host}:{self.port} failed: "
                                       f"{exc}", "is unreachable (TLS failed)") from None
        except OSError as exc:  # refused, unreachable, unresolvable
            raise UpstreamUnreachable(f"cannot connect to {self.host}:{self.port}: "
                                       f"{exc}") from None
        conn.connect_s = time.monotonic() - began
        conn.held = True
        return conn

    def put_back(self, conn: _Connection) -> None:
        conn.held = False
        conn.idle_since = time.monotonic()
        self._idle.append(conn)
        self._release()
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._idle_s, self._expire)

    def _expire(self) -> None:
        """Close the connections idle for ``idle_s`` (the oldest first in the deque); wake
        again for the next, or tell ``on_unused`` when none is left or in use."""
        self._timer = None
        idle, now = self._idle, time.monotonic()
        while idle and now - idle[0].idle_since >= self._idle_s:
            idle.popleft().close()
        if idle:
            self._timer = asyncio.get_running_loop().call_later(
                self._idle_s - (now - idle[0].idle_since), self._expire)
        else:
            self._maybe_unused()

    def forget(self, conn: _Connection) -> None:
        """``conn`` closed: its slot is free (once), and it is no longer kept."""
        if conn.held:
            conn.held = False
            self._release()
        elif conn in self._idle:
            self._idle.remove(conn)
        self._maybe_unused()

    def _maybe_unused(self) -> None:
        """Tell ``on_unused`` when no connection is left, in use or waited for: the last
        one closed in use (a broken answer, a client that left, ``connection: close``),
        or the last try failed to connect, left the origin to no timer, kept for good
        (replicas that come and go, each a new address)."""
        if not self.in_use and not self.waiting and not self._idle and self._timer is None \
                and self._on_unused is not None:
            self._on_unused(self)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._idle:
            self._idle.pop().close()


class UpstreamClient:
    """Keep-alive connections to the replicas and the requests sent over them (see the
    module docstring)."""

    def __init__(self, limit_per_origin: int = 256, connect_s: float = 5.0,
                 idle_s: float = 4.0, ssl_context: ssl.SSLContext | None = None) -> None:
        if limit_per_origin < 1:
            raise ValueError(f"limit_per_origin must be >= 1, got {limit_per_origin!r}")
        self._limit = limit_per_origin
        self._connect_s = connect_s
        self._idle_s = idle_s
        self._ssl = ssl_context
        self.tls = ssl_context  # the context given, for the gateway's other clients
        self._origins: dict[tuple[str, str, int], _Origin] = {}
        self._targets: dict[str, tuple[_Origin, str]] = {}  # url -> origin, request path

    def _target(self, url: str) -> tuple[_Origin, str]:
        # a client's query string rides on the request, never in the kept targets: one per
        # client-made string would fill them (each up to a header's size)
        base, mark, query = url.partition("?")
        found = self._targets.get(base)
        if found is None:
            found = self._base_target(base)
        return (found[0], f"{found[1]}?{query}") if mark else found

    def _base_target(self, url: str) -> tuple[_Origin, str]:
        """The origin and request path of ``url`` (no query string), kept for the next."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        port = parts.port or _DEFAULT_PORTS[parts.scheme]
        key = (parts.scheme, parts.hostname, port)
        origin = self._origins.get(key)
        if origin is None:
            context = self._ssl
            if parts.scheme == "https" and context is None:
                context = self._ssl = ssl.create_default_context()
            origin = self._origins[key] = _Origin(parts.scheme, parts.hostname, port,
                                                  self._limit, self._idle_s,
                                                  self._connect_s, context, self._unused)
        path = parts.path or "/"
        if len(self._targets) < 4096:  # a fleet's endpoints: bounded whatever the URLs
            self._targets[url] = (origin, path)
        return origin, path

    def _unused(self, origin: _Origin) -> None:
        """``origin`` holds no connection, idle or in use: forgotten (with the URLs that
        led to it), so replicas that come and go leave no origins behind; the next
        request to it makes it again."""
        if self._origins.get(origin.key) is origin:
            del self._origins[origin.key]
            self._targets = {url: target for url, target in self._targets.items()
                             if target[0] is not origin}

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]
                   ) -> UpstreamResponse:
        """Sends ``body`` to ``url`` and returns once the answer's head arrived (the body
        is read from the response, which must then be ``release``d or ``close``d)."""
        origin, path = self._target(url)
        lines = [f"POST {path} HTTP/1.1\r\nhost: {origin.host_header}\r\n"
                 f"content-length: {len(body)}\r\n"]
        for name, value in headers.items():
            if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
                raise ValueError(f"header {name!r} holds a line break")
            lines.append(f"{name}: {value}\r\n")
        lines.append("\r\n")
        head = "".join(lines)
        try:  # header bytes as the client sent them (the server decoded them as latin-1)
            data = head.encode("latin-1") + body
        except UnicodeEncodeError:  # a configured value beyond latin-1: its UTF-8
            data = head.encode("utf-8") + body
        for fresh in (False, True):
            conn = await origin.take(fresh)
            try:
                answer = await conn.send(data)
                answer.resent = fresh
                return answer
            except _Stale:
                conn.close()
                continue  # once more, on a new connection
            except BaseException:
                conn.close()
                raise
        raise UpstreamBroken("unreachable: a new connection is never stale")

    async def close(self) -> None:
        for origin in list(self._origins.values()):  # (each may forget itself)
            origin.close()
        self._origins.clear()
        self._targets.clear()


def client_for(config: GatewayConfig) -> UpstreamClient:
    """The client a gateway configured by ``config`` uses."""
    return UpstreamClient(limit_per_origin=config.limits.connections_per_replica,
                          connect_s=config.timeouts.connect_s,
                          ssl_context=replica_tls(config.tls))
