"""A request body trickled in many small reads costs about its own size to hold while
it arrives, as the gateway's budget of bytes being received counts it."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import Iterator

from starlette.requests import Request

from kvwire.request_edge import HeldBodyBytes, read_body

READS = 40_000
READ_BYTES = 3


def test_a_body_sent_in_thousands_of_tiny_reads_is_held_at_about_its_size() -> None:
    def messages() -> Iterator[dict[str, object]]:
        for i in range(READS):  # a new bytes object per read, as a server makes one
            yield {"type": "http.request", "body": (i % 1000).to_bytes(READ_BYTES, "big"),
                   "more_body": i < READS - 1}

    pending = messages()

    async def receive() -> dict[str, object]:
        return next(pending)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions",
             "headers": [(b"transfer-encoding", b"chunked")]}
    budget = HeldBodyBytes(1 << 20, server="gateway", setting="limits.max_receiving_bytes")

    async def read() -> tuple[bytes, int]:
        request = Request(scope, receive)
        tracemalloc.start()  # in the loop: its own start-up is not counted
        try:
            body = await read_body(request, 1 << 20, budget)
            return body, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    body, peak = asyncio.run(read())
    size = READS * READ_BYTES
    assert len(body) == size and body[:6] == bytes([0, 0, 0, 0, 0, 1]) and budget.held == 0
    # the body and one buffer of it; a list of the reads held ~40 bytes for each 3
    assert peak < 3 * size, (peak, size)
