"""Fixtures shared by every suite: real servers on loopback, in a thread or a process."""

from __future__ import annotations

import os

# Triton kernels run on CPU only under its interpreter, which must be chosen before triton
# is first imported (transformers imports it too).
os.environ.setdefault("TRITON_INTERPRET", "1")

import asyncio
import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ThreadServer:
    """An ASGI app served by uvicorn on 127.0.0.1 in a background thread; with ``side``,
    a second app (a gateway's admin API) on another port in the same event loop."""

    def __init__(self, app: Any, port: int | None = None, side: Any | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                loop="asyncio", lifespan="on", proxy_headers=False)
        self.server = uvicorn.Server(config)
        self.side_url = ""
        run = self.server.run
        if side is not None:
            from gateway.http_server import companion, serve_together

            side_port = free_port()
            self.side_url = f"http://127.0.0.1:{side_port}"
            other = companion(uvicorn.Config(side, host="127.0.0.1", port=side_port,
                                             log_level="warning", lifespan="off"))
            run = lambda: asyncio.run(serve_together(self.server, other))  # noqa: E731
        self.thread = threading.Thread(target=run, daemon=True)

    def start(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server on port {self.port} did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def serve() -> Iterator[Callable[..., ThreadServer]]:
    """``serve(app)`` starts ``app`` on a free loopback port; all stop after the test."""
    started: list[ThreadServer] = []

    def start(app: Any, port: int | None = None, side: Any | None = None) -> ThreadServer:
        server = ThreadServer(app, port, side).start()
        started.append(server)
        return server

    yield start
    for server in reversed(started):
        server.stop()


def wait_http(url: str, timeout: float = 30.0, proc: subprocess.Popen[bytes] | None = None
              ) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer 200 within {timeout} s")


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """``spawn(*args, ready_url=...)`` runs ``python -m kvgate ARGS`` until the test ends."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str, ready_url: str | None = None, timeout: float = 60.0
              ) -> subprocess.Popen[bytes]:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = subprocess.Popen([sys.executable, "-m", "kvgate", *args], cwd=REPO,
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        procs.append(proc)
        if ready_url is not None:
            try:
                wait_http(ready_url, timeout, proc)
            except RuntimeError:
                proc.kill()
                _, err = proc.communicate(timeout=10)
                raise RuntimeError(f"kvgate {' '.join(args)} failed:\n{err.decode()[-3000:]}")\
                    from None
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        if proc.poll() is None:
            proc.kill()
        if proc.stderr is not None:
            proc.stderr.close()
