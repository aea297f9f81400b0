"""A request the HTTP parser refuses is answered 400 in OpenAI's shape with what is wrong
with it: a duplicate Content-Length, a Content-Length beside chunked framing, a bad chunk
size, a control character in a header, a URL that is none."""

from __future__ import annotations

import json

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway
from tests.support.raw_http import raw_answer

BODY = b'{"model":"sim-model","prompt":"hi"}'
POST = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"

CASES = [
    (POST + b"Content-Length: %d\r\nContent-Length: 5\r\n\r\n" % len(BODY) + BODY,
     "duplicate content-length"),
    (POST + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
     "transfer-encoding can't be present with content-length"),
    (POST + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + BODY + b"\r\n0\r\n\r\n",
     "chunk size"),
    (POST + b"X-Request-Id: a\x01b\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY,
     "header value"),
    (b"GET http://[::1/health HTTP/1.1\r\nHost: x\r\n\r\n", "invalid url"),
]


def test_malformed_requests_are_answered_with_what_is_wrong(serve: Serve) -> None:
    rec = Behaviour("rec")
    gw = start_gateway(serve, [("r0", serve(fake_replica(rec)).url)],
                       scrape={"enabled": False})
    for data, named in CASES:
        answer = raw_answer(gw.port, data)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400"), (data, answer[:300])
        error = json.loads(body)["error"]
        assert error["code"] == "invalid_http" and error["type"] == "invalid_request_error"
        assert named in error["message"].lower(), (data, error)
    assert rec.received == []  # none reached a replica
