"""The affinity header is configured in any case and read from a request as ASGI gives
its header names (lower case): the config holds it lower-cased once, at load."""

from __future__ import annotations

from starlette.requests import Request

from gateway.config import parse_config
from kvwire.request_edge import header_value


def test_an_affinity_header_written_with_capitals_is_read() -> None:
    cfg = parse_config({"affinity": {"header": "X-Document-Id"}})
    assert cfg.affinity.header == "x-document-id"
    request = Request({"type": "http", "method": "POST", "path": "/",
                       "headers": [(b"x-document-id", b"contract-7")]})
    assert header_value(request, cfg.affinity.header) == "contract-7"
