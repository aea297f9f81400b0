"""Real servers on loopback: an ASGI app served by uvicorn in a background thread."""

from __future__ import annotations

import socket
import threading
from typing import Any

import uvicorn

from tests.support.waiting import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ThreadServer:
    """An ASGI app served by uvicorn on 127.0.0.1 in a background thread, on ``port`` or on
    a socket bound here to a free port (no other process can take it in between)."""

    def __init__(self, app: Any, port: int | None = None) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", port or 0))
        self.port = int(self.sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", loop="asyncio", ws="none",
                                lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def start(self) -> ThreadServer:
        self.thread.start()

        def started() -> bool:
            if not self.thread.is_alive():
                raise RuntimeError(f"server on port {self.port} exited while starting")
            return bool(self.server.started)

        wait_until(started, 20, f"the server on port {self.port} to start")
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()
