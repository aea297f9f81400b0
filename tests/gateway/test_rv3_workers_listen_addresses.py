"""A worker listens on every address its host names, as one gateway does (asyncio's
``create_server``: an empty host is every interface, IPv4 and IPv6; a name each of its
addresses), each with ``SO_REUSEPORT`` so the box's workers share them."""

from __future__ import annotations

import asyncio
import socket

from gateway.workers import reuse_port_sockets
from tests.support.servers import free_port


async def _asyncio_binds(host: str, port: int) -> set[tuple[int, str]]:
    server = await asyncio.get_running_loop().create_server(asyncio.Protocol, host, port)
    try:
        return {(s.family, s.getsockname()[0]) for s in server.sockets}
    finally:
        server.close()
        await server.wait_closed()


async def test_a_worker_listens_where_one_gateway_would() -> None:
    for host in ("", "localhost", "127.0.0.1"):
        port = free_port()
        one_gateway = await _asyncio_binds(host, port)
        socks = reuse_port_sockets(host, port)
        try:
            assert {(s.family, s.getsockname()[0]) for s in socks} == one_gateway, host
            for sock in socks:
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)
                assert sock.getsockname()[1] == port
                sock.listen()
                # a second worker binds the same address
                again = reuse_port_sockets(sock.getsockname()[0], port)
                for other in again:
                    other.close()
                with socket.create_connection(sock.getsockname()[:2], timeout=5):
                    pass
        finally:
            for sock in socks:
                sock.close()
