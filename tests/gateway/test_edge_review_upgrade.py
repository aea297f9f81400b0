"""A request that asks to switch protocols (curl's ``--http2`` on an http:// URL sends
``Connection: Upgrade, HTTP2-Settings`` and ``Upgrade: h2c`` with every request) is served
as the HTTP/1.1 request it also is: its body reaches the replica whole, and the requests
after it on the connection are answered."""

from __future__ import annotations

import socket
import time

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway

BODY = b'{"model":"sim-model","prompt":"hello there","max_tokens":3}'
# as curl 7.88 sends ``curl --http2 -d @body http://.../v1/completions``
H2C = (b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
       b"HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n")


def _post(extra: bytes, body: bytes = BODY, framing: bytes | None = None) -> bytes:
    framing = b"Content-Length: %d\r\n" % len(body) if framing is None else framing
    return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + extra + framing + b"\r\n" + body)


def _answers(port: int, reads: list[bytes], count: int) -> list[bytes]:
    """The first ``count`` answers' heads and bodies (each answer has a Content-Length),
    to ``reads`` sent apart (so that the server reads each on its own)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(5)
        for i, data in enumerate(reads):
            if i:
                time.sleep(0.1)
            sock.sendall(data)
        got = b""
        answers: list[bytes] = []
        while len(answers) < count:
            head, sep, rest = got.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), None)
            if sep and length is not None and len(rest) >= length:
                answers.append(head + sep + rest[:length])
                got = rest[length:]
                continue
            chunk = sock.recv(65536)
            assert chunk, f"connection closed after {len(answers)} answers: {got[:300]!r}"
            got += chunk
        return answers


def test_an_h2c_upgrade_request_is_served_with_its_body(serve: Serve) -> None:
    rec = Behaviour("rec")
    gw = start_gateway(serve, [("r0", serve(fake_replica(rec)).url)],
                       scrape={"enabled": False})
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
    cases = [
        [_post(H2C)],  # in one read
        [_post(H2C)[:-len(BODY) - 2], b"\r\n" + BODY],  # the head's end, body: next read
        [_post(H2C, chunked, b"Transfer-Encoding: chunked\r\n")],
        # pipelined: the upgrade request, then a plain one, in one read
        [_post(H2C) + _post(b"")],
    ]
    for reads in cases:
        rec.received.clear()
        rec.headers.clear()
        count = 2 if reads[0].count(b"POST ") == 2 else 1
        answers = _answers(gw.port, reads, count)
        assert all(a.startswith(b"HTTP/1.1 200") for a in answers), (reads, answers)
        assert rec.received == [BODY] * count, reads
        assert all("upgrade" not in h and "http2-settings" not in h for h in rec.headers)


def test_a_get_that_asks_to_upgrade_leaves_its_connection_usable(serve: Serve) -> None:
    rec = Behaviour("rec")
    gw = start_gateway(serve, [("r0", serve(fake_replica(rec)).url)],
                       scrape={"enabled": False})
    get = b"GET /health HTTP/1.1\r\nHost: x\r\n"
    answers = _answers(gw.port, [get + H2C + b"\r\n" + _post(b"")], 2)
    assert answers[0].startswith(b"HTTP/1.1 200") and answers[0].endswith(b'"ok"}')
    assert answers[1].startswith(b"HTTP/1.1 200") and rec.received == [BODY]
