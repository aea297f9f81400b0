"""Fixtures shared by every suite: real servers on loopback, in a thread or a process (see
``tests.support``)."""

from __future__ import annotations

import os

# Triton kernels run on CPU only under its interpreter, which must be chosen before triton
# is first imported (transformers imports it too).
os.environ.setdefault("TRITON_INTERPRET", "1")

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.processes import Processes
from tests.support.servers import ThreadServer


@pytest.fixture
def serve() -> Iterator[Callable[..., ThreadServer]]:
    """``serve(app)`` starts ``app`` on a free loopback port (``side=`` a second app on
    another, in the same event loop; ``http=`` uvicorn's protocol, as the gateway's
    ``bounded_protocol``); all stop after the test."""
    started: list[ThreadServer] = []

    def start(app: Any, port: int | None = None, side: Any | None = None,
              http: Any = "auto") -> ThreadServer:
        server = ThreadServer(app, port, side, http).start()
        started.append(server)
        return server

    yield start
    for server in reversed(started):
        server.stop()


@pytest.fixture
def spawn() -> Iterator[Processes]:
    """``spawn(*args, ready_url=...)`` runs ``python -m kvgate ARGS`` until the test ends."""
    processes = Processes()
    yield processes
    processes.stop_all()
