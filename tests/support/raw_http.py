"""One request over a raw loopback connection, in the HTTP version asked, read until the
server closes it: what a client without an HTTP library sees (chunk framing included)."""

from __future__ import annotations

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
