"""``header_value``: a request header read off the ASGI scope's raw lines, as Starlette's
``Headers.get`` reads it (first line wins, names in lower case), None when absent."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.requests import Request

from kvwire.request_edge import header_value


def _request(lines: list[tuple[bytes, bytes]]) -> Request:
    return Request({"type": "http", "method": "POST", "path": "/", "headers": lines})


def test_header_value_reads_as_starlettes_headers() -> None:
    lines = [(b"content-type", b"application/json"), (b"x-session", b"a\xe9"),
             (b"x-session", b"second"), (b"content-length", b"12")]
    request = _request(lines)
    headers = Headers(scope=request.scope)
    for name in ("content-type", "x-session", "content-length", "content-encoding",
                 "x-absent"):
        assert header_value(request, name) == headers.get(name), name
    assert header_value(request, "x-session") == "a\xe9"  # latin-1, the first line
    assert header_value(request, "content-encoding") is None
    assert header_value(_request([]), "content-length") is None
