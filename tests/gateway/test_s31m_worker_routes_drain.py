"""A worker that decides nothing reads its inbox again within ``FLUSH_S`` while its reads
find ``BUSY_MESSAGES`` messages or more, and every ``DRAIN_S`` otherwise: read only every
``DRAIN_S``, an inbox of ~200 KB dropped the others' routes past ~2 MB/s of them; read
every ``FLUSH_S`` after any route, an idle worker was woken per message again."""

from __future__ import annotations

import asyncio

from gateway.worker_routes import BUSY_MESSAGES, DRAIN_S, FLUSH_S
from tests.support.route_documents import document, paired_workers
from tests.support.waiting import wait_until_async


def test_an_idle_worker_reads_again_soon_after_a_read_that_found_routes() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        a, b = paired_workers()
        try:
            for seed in range(BUSY_MESSAGES):  # a message each
                a.routed(document(seed), "r1")
                a.send_waiting()
            # b decides nothing: its idle read takes them ...
            await wait_until_async(lambda: b.received == BUSY_MESSAGES, timeout_s=5,
                                   what="b's idle read of a's routes")
            # ... and the next read is due within FLUSH_S (more may be coming)
            found = b._drain
            assert found is not None and found.when() <= loop.time() + FLUSH_S
            # that read finds nothing: the one after it is DRAIN_S later
            await wait_until_async(lambda: b._drain is not found, timeout_s=5,
                                   what="b's next idle read")
            empty = b._drain
            assert empty is not None and empty.when() >= found.when() + DRAIN_S
            # a few messages (routes at a low rate) leave the reads DRAIN_S apart
            a.routed(document(99), "r1")
            a.send_waiting()  # in b's inbox when it returns (a Unix socket)
            sent_at = loop.time()
            assert b._drain is not None
            b._drain.cancel()
            b._drain_tick()  # b's idle read, now
            few = b._drain
            assert b.received == BUSY_MESSAGES + 1
            assert few is not None and few.when() >= sent_at + DRAIN_S
            assert (a.sent, b.received, b.dropped, b.malformed) == (
                BUSY_MESSAGES + 1, BUSY_MESSAGES + 1, 0, 0)
        finally:
            a.stop()
            b.stop()

    asyncio.run(run())
