"""Real servers on loopback: an ASGI app served by uvicorn in a background thread."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn
from aiohttp import web

from tests.support.waiting import wait_until


def _ephemeral_floor() -> int:
    """The lowest port the kernel hands to outgoing connections (and to a bind to port 0)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_EPHEMERAL_FLOOR = _ephemeral_floor()
_LEAST_PORT = 10_000
_handed: set[int] = set()  # ports this process handed out, never handed out again


def free_port() -> int:
    """A loopback port free now, for a server the caller starts later: below the kernel's
    ephemeral range where there is room, so no client connection the suite opens in the
    meantime takes it (a port a bind to 0 gives is one any outgoing connection may take
    before the server binds it), and never one handed out before in this process (two
    calls in a row could give the same port)."""
    rng = random.Random()
    for _ in range(64):
        port = rng.randrange(_LEAST_PORT, _EPHEMERAL_FLOOR) \
            if _EPHEMERAL_FLOOR > _LEAST_PORT + 1000 else 0
        if port in _handed:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            port = int(s.getsockname()[1])
        if port not in _handed:
            _handed.add(port)
            return port
    raise RuntimeError("no free loopback port found in 64 tries")


async def aiohttp_site(app: web.Application, **runner: Any) -> tuple[web.AppRunner, int]:
    """``app`` served by aiohttp on a free loopback port, in this event loop (``runner``:
    ``web.AppRunner``'s options): its runner, for ``cleanup()``, and its port."""
    started = web.AppRunner(app, **runner)
    await started.setup()
    await web.TCPSite(started, "127.0.0.1", 0).start()  # bound at once: no port to lose
    return started, started.addresses[0][1]


def _bound(port: int | None) -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", port or 0))
    return sock


class _PromptServer(uvicorn.Server):
    """uvicorn's server, which looks whether it was told to stop every 0.1 s, woken at
    once when ``stop_now`` tells it, and whose shutdown looks whether its connections have
    closed every few milliseconds where uvicorn's sleeps 0.1 s first and then polls every
    0.1 s (a test's teardown stops several servers, hundreds of times a run)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._told: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    async def main_loop(self) -> None:
        told = asyncio.Event()
        self._told = (asyncio.get_running_loop(), told)
        counter = 0
        while not await self.on_tick(counter):  # True once should_exit is set
            counter = (counter + 1) % 864_000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(told.wait(), 0.1)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown, step for step: no new connections; each open one told to
        close once its answer is sent; what still runs when the config's
        ``timeout_graceful_shutdown`` is up, cancelled, and the connections still open
        closed; then the app's lifespan shutdown."""
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        state = self.server_state
        for connection in list(state.connections):
            connection.shutdown()
        try:
            async with asyncio.timeout(self.config.timeout_graceful_shutdown):
                # polled: uvicorn's sets of connections and tasks have no event to wait on
                while (state.connections or state.tasks) and not self.force_exit:  # noqa: ASYNC110
                    await asyncio.sleep(0.005)
                for server in self.servers:
                    await server.wait_closed()
        except TimeoutError:
            for task in state.tasks:
                task.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
        # a connection still open now (its answer cancelled, or a request that came in as
        # the server closed) is closed here, while the loop still runs to close its socket:
        # uvicorn leaves it to the garbage collector, which warns of it in a later test
        left = [c.transport for c in list(state.connections)
                if getattr(c, "transport", None) is not None]
        for transport in left:
            transport.abort()
        if left:
            await asyncio.sleep(0)  # the transports' connection_lost callbacks run
        if not self.force_exit:
            await self.lifespan.shutdown()

    def stop_now(self) -> None:
        self.should_exit = True
        if self._told is not None:
            loop, told = self._told
            with contextlib.suppress(RuntimeError):  # its loop has ended already
                loop.call_soon_threadsafe(told.set)


class ThreadServer:
    """An ASGI app served by uvicorn on 127.0.0.1 in a background thread, on ``port`` or on
    a socket bound here to a free port (no other process can take it in between). With
    ``side``, a second app (a gateway's admin API) is served on another free port
    (``side_url``) in the same event loop, as ``kvgate serve`` does. Like the gateway's
    server, it never takes client addresses from forwarding headers."""

    def __init__(self, app: Any, port: int | None = None, side: Any | None = None,
                 http: Any = "auto") -> None:
        self.sock = _bound(port)
        self.port = int(self.sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        # stop() cancels what still runs a second after it asks (a replica told to stall)
        config = uvicorn.Config(app, log_level="warning", loop="asyncio", ws="none",
                                http=http, lifespan="on", proxy_headers=False,
                                timeout_graceful_shutdown=1)
        self.server = _PromptServer(config)
        self.side_url = ""
        self.side_sock: socket.socket | None = None
        self.side_server: _PromptServer | None = None
        run: Callable[[], None] = lambda: self.server.run(sockets=[self.sock])  # noqa: E731
        if side is not None:
            from gateway.http_server import serve_together

            self.side_sock = side_sock = _bound(None)
            self.side_url = f"http://127.0.0.1:{side_sock.getsockname()[1]}"
            # (not ``companion``'s server: in a thread, uvicorn takes no signals either way)
            self.side_server = other = _PromptServer(uvicorn.Config(
                side, log_level="warning", lifespan="off", proxy_headers=False,
                timeout_graceful_shutdown=1))
            run = lambda: asyncio.run(serve_together(  # noqa: E731
                self.server, other, [self.sock], [side_sock]))
        self.thread = threading.Thread(target=run, daemon=True)

    def start(self) -> ThreadServer:
        self.thread.start()

        def started() -> bool:
            if not self.thread.is_alive():
                raise RuntimeError(f"server on port {self.port} exited while starting")
            return bool(self.server.started)

        wait_until(started, 20, f"the server on port {self.port} to start")
        return self

    def ask_to_stop(self, grace_s: float | None = None) -> None:
        """Tell the server (and its side server, at the same time rather than after it) to
        stop, without waiting for it (``stop`` waits). ``grace_s``: how long the requests
        still running may take before they are cancelled, in place of the second given at
        start."""
        if grace_s is not None:  # read as each shuts down
            self.server.config.timeout_graceful_shutdown = grace_s
            if self.side_server is not None:
                self.side_server.config.timeout_graceful_shutdown = grace_s
        self.server.stop_now()
        if self.side_server is not None:
            self.side_server.stop_now()

    def stop(self) -> None:
        self.ask_to_stop()
        self.thread.join(timeout=10)
        self.sock.close()
        if self.side_sock is not None:
            self.side_sock.close()


async def answer_ok(scope: Any, receive: Any, send: Any) -> None:
    """An ASGI app answering every request ``ok`` (with its length)."""
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


@contextlib.contextmanager
def gateway_server(app: Any, limits: dict[str, Any] | None = None,
                   timeouts: dict[str, Any] | None = None
                   ) -> Iterator[tuple[uvicorn.Server, int]]:
    """``app`` behind the gateway's own server (``gateway.http_server.server_config``,
    with ``limits`` and ``timeouts``) on a free port, in a background thread: the server
    and its port."""
    from gateway.config import parse_config
    from gateway.http_server import server_config

    config = parse_config({"port": free_port(), "limits": limits or {},
                           "timeouts": timeouts or {}})
    server = uvicorn.Server(server_config(app, config, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 10, "the server to start")
        yield server, config.port
    finally:
        server.should_exit = True
        thread.join(5)
