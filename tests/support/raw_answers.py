"""Reading a server's answers off a raw socket, for tests of kept-alive connections."""

from __future__ import annotations

import socket


def read_answer(sock: socket.socket) -> bytes:
    """One whole answer with a length (head and body), from a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        body += chunk
    return head + b"\r\n\r\n" + body
