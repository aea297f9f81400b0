"""The gateway's listening sockets, bound as its server binds them."""

from __future__ import annotations

import socket
from typing import Any


def listen_socket(info: tuple[Any, ...], reuse_port: bool = False) -> socket.socket:
    """A socket bound to the address of ``info`` (one ``socket.getaddrinfo`` entry) as
    asyncio's ``create_server`` binds it: ``SO_REUSEADDR``, and an IPv6 socket takes IPv6
    only; ``SO_REUSEPORT`` too with ``reuse_port`` (worker processes share the port).
    OSError, the socket closed, when it cannot be bound."""
    family, kind, proto, _, address = info
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock


def passive_addresses(host: str, port: int) -> list[tuple[Any, ...]]:
    """The ``socket.getaddrinfo`` entries a server listening on ``host`` binds, each once:
    an empty host is every interface (IPv4 and IPv6), as asyncio's ``create_server`` reads
    it. OSError (or UnicodeError) when ``host`` names none."""
    return list(dict.fromkeys(socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                 flags=socket.AI_PASSIVE)))
