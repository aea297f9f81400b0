"""Answers to HTTP/1.0 clients on uvicorn's httptools server, for the gateway's and the
engine's servers: an answer of no length goes out as it is, ended by closing the
connection, never chunked (RFC 9112 6.1 forbids ``Transfer-Encoding`` in an answer to
HTTP/1.0: such a client reads the chunk-size lines as part of the event stream)."""

from __future__ import annotations

import sys
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle


class Http10Cycle(RequestResponseCycle):
    """uvicorn's request-response cycle for an HTTP/1.0 request: an answer with neither
    ``Content-Length`` nor ``Transfer-Encoding`` (a stream) goes out as it is, ended by
    closing the connection, not chunked:
    RFC 9112 6.1 forbids ``Transfer-Encoding`` in an answer to HTTP/1.0, whose client read
    the chunk-size lines as part of the event stream."""

    _unframed = False  # the answer started has no length: its body is written as it is

    async def send(self, message: Any) -> None:
        if self.response_started:
            if self._unframed and not message.get("more_body", False):
                # uvicorn writes an unchunked body against a length it counts down and
                # checks at the end: no bound until the last message, then its own
                self.expected_content_length = len(message.get("body", b""))
        elif message["type"] == "http.response.start" \
                and self.scope["method"] != "HEAD" and message["status"] not in (204, 304) \
                and not any(name.lower() in (b"content-length", b"transfer-encoding")
                            for name, _ in message.get("headers", ())):
            self._unframed = True
            self.chunked_encoding = False
            self.keep_alive = False  # its end is the connection's close, whatever uvicorn
            self.expected_content_length = sys.maxsize  # (no bound: see above)
        await super().send(message)


class Http10Protocol(HttpToolsProtocol):
    """uvicorn's httptools protocol whose HTTP/1.0 requests get ``Http10Cycle``'s answers
    (HTTP/1.1 pays one comparison a request)."""

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        if self.scope["http_version"] == "1.0":  # the cycle's task, made above, has not
            self.cycle.__class__ = Http10Cycle  # run yet: all its sends are this class's
            # no interim answer: RFC 9110 10.1.1 forbids a 100 Continue to HTTP/1.0, whose
            # client would read it as the answer (it waits a while, then sends the body)
            self.cycle.waiting_for_100_continue = False
