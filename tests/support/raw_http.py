"""One request over a raw loopback connection, in the HTTP version asked, read until the
server closes it: what a client without an HTTP library sees (chunk framing included)."""

from __future__ import annotations

import contextlib
import json
import socket
from typing import Any


def raw_post(port: int, path: str, body: dict[str, Any], version: bytes = b"1.1"
             ) -> tuple[bytes, bytes]:
    """The answer's head (lower-cased) and its body bytes as they came."""
    data = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(b"POST " + path.encode() + b" HTTP/" + version + b"\r\nHost: x\r\n"
                     b"Connection: close\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head, _, rest = received.partition(b"\r\n\r\n")
    return head.lower(), rest


def raw_answer(port: int, data: bytes) -> bytes:
    """What the server wrote back to ``data`` (a request's bytes as they are, however
    malformed) until it closed the connection; a server that closes mid-send is read too."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(5)
        with contextlib.suppress(OSError):  # closed on us mid-send: read what it said
            sock.sendall(data)
        got = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                got += chunk
        return got
