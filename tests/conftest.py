"""Fixtures shared by every suite: real servers on loopback, in a thread or a process (see
``tests.support``)."""

from __future__ import annotations

import os

# Triton kernels run on CPU only under its interpreter, which must be chosen before triton
# is first imported (transformers imports it too).
os.environ.setdefault("TRITON_INTERPRET", "1")

import atexit
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.processes import Processes
from tests.support.servers import ThreadServer

# The tests speak plain HTTP on loopback (the one TLS test brings its own CA). Each httpx or
# openai client, and each default SSL context, loads the whole trust store when it is made
# (20-40 ms of CPU for the system's bundle) and the suite makes thousands: they get an empty
# directory of CAs instead, in this process and the processes it starts.
_NO_CAS = tempfile.mkdtemp(prefix="kvgate-tests-no-cas-")
atexit.register(shutil.rmtree, _NO_CAS, ignore_errors=True)
os.environ.pop("SSL_CERT_FILE", None)
# an engine key exported for compose would make every engine the tests start refuse them
os.environ.pop("KVGATE_ENGINE_API_KEY", None)
os.environ["SSL_CERT_DIR"] = _NO_CAS


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
    # all are told at once, so their shutdowns (each up to a tick of uvicorn's loop) overlap
    # instead of adding up; the test is over, so a request still held (a replica told to
    # stall) is cancelled after a tenth of a second, not the second a stop mid-test gives
    for server in started:
        server.ask_to_stop(grace_s=0.1)
    for server in reversed(started):
        server.stop()


@pytest.fixture
def spawn() -> Iterator[Processes]:
    """``spawn(*args, ready_url=...)`` runs ``python -m kvgate ARGS`` until the test ends."""
    processes = Processes()
    yield processes
    processes.stop_all()
