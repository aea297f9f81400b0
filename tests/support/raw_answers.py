"""Raw client connections to a server, and reading its answers off them, for tests of
kept-alive connections."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


@contextlib.contextmanager
def connections(port: int, count: int) -> Iterator[list[socket.socket]]:
    """``count`` connections to ``port`` on loopback (5 s timeouts), closed after."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.settimeout(5)
            socks.append(sock)
        yield socks
    finally:
        for sock in socks:
            sock.close()


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
