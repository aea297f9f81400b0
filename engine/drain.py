"""The engine's HTTP server and how it stops: on SIGTERM (or SIGINT) it takes no new
connection and lets the requests in flight finish (uvicorn's drain). With a drain
timeout, requests still running when it passes are ended by stopping the engine: each
answers with an error (a stream with its error event, never a clean end), and a client
that reads nothing more is cut a few seconds later. A second SIGTERM, as a second
SIGINT, stops it at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import socket
from types import FrameType

import uvicorn

from engine.async_engine import AsyncEngine

log = logging.getLogger(__name__)

# how long connections still open after the drain timeout (their requests ended by it)
# get to send their last bytes before they are cut
CUT_AFTER_S = 5


class DrainingServer(uvicorn.Server):
    """uvicorn's server of ``engine``'s app whose drain lasts at most ``drain_timeout_s``
    (None: until the requests in flight finish)."""

    def __init__(self, config: uvicorn.Config, engine: AsyncEngine,
                 drain_timeout_s: float | None) -> None:
        if drain_timeout_s is not None:
            # uvicorn's bound on the whole drain, in whole seconds
            config.timeout_graceful_shutdown = math.ceil(drain_timeout_s) + CUT_AFTER_S
        super().__init__(config)
        self.engine = engine
        self.drain_timeout_s = drain_timeout_s

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig == signal.SIGTERM:  # the second: no more draining
            self.force_exit = True
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        timeout = self.drain_timeout_s
        if timeout is None:
            await super().shutdown(sockets)
            return

        async def end_in_flight() -> None:
            await asyncio.sleep(timeout)
            running = len(self.engine.in_flight())
            if running:
                log.warning("drain timeout (%g s) passed: ending the %d requests still "
                            "running", timeout, running)
            await self.engine.stop(f"the engine is shutting down: the request was still "
                                   f"running at the end of its {timeout:g} s drain")

        deadline = asyncio.create_task(end_in_flight(), name="drain-timeout")
        try:
            await super().shutdown(sockets)
        finally:
            deadline.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await deadline
