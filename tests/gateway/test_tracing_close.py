"""A stopping gateway waits a bounded time for its last spans, off the event loop."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping

import pytest

from gateway.app import close_tracing
from gateway.tracing import NO_TRACE, RequestTrace
from tests.support.loop_turns import counted_turns


class _HungExport:
    """A tracing whose close waits on an exporter that never answers (until released)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.closing = threading.Event()

    def start(self, headers: Mapping[str, str], path: str) -> RequestTrace:
        return NO_TRACE

    def open(self) -> None:
        pass

    def close(self) -> None:
        self.closing.set()
        self.release.wait(60)


def test_a_hung_exporter_holds_neither_the_loop_nor_the_stop(
        caplog: pytest.LogCaptureFixture) -> None:
    hung = _HungExport()
    ticks = 0

    async def run() -> None:
        nonlocal ticks
        async with counted_turns(0.01) as turns:
            await close_tracing(hung, wait_s=0.3)  # returns though the export never ends
        ticks = turns.count

    try:
        with caplog.at_level(logging.WARNING, "kvgate.gateway"):
            asyncio.run(run())
        assert hung.closing.is_set() and not hung.release.is_set()
        assert ticks > 5  # the loop ran meanwhile
        assert "not exported" in caplog.text
    finally:
        hung.release.set()
