"""A worker that decides nothing reads its inbox again within ``FLUSH_S`` while its reads
find ``BUSY_BYTES`` of routes or more, and every ``DRAIN_S`` otherwise: read only every
``DRAIN_S``, an inbox of ~200 KB dropped the others' routes past ~2 MB/s of them; read
every ``FLUSH_S`` after any route, an idle worker was woken per message again; counted in
messages, a few large ones filled the inbox unnoticed."""

from __future__ import annotations

import asyncio

from gateway.worker_routes import BUSY_BYTES, DRAIN_S, FLUSH_S
from tests.support.route_documents import document, paired_workers


def test_an_idle_worker_reads_again_soon_after_a_read_that_found_many_routes() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        a, b = paired_workers()

        def idle_read() -> asyncio.TimerHandle:
            """b's idle read, now (its timer's own turn, without waiting for it): the
            handle of the next one."""
            assert b._drain is not None
            b._drain.cancel()
            b._drain_tick()
            assert b._drain is not None
            return b._drain

        try:
            sent = 0
            for seed in range(1_000):  # large routes, a message each: BUSY_BYTES of them
                a.routed(document(seed, pieces=2048), "r1")
                a.send_waiting()  # in b's inbox when it returns (a Unix socket)
                sent += 1
                if sent * 2048 * 4 >= BUSY_BYTES:
                    break
            # b decides nothing: its idle read takes them, and the next is due within
            # FLUSH_S (more may be coming)
            found = idle_read()
            assert b.received == sent
            assert found.when() <= loop.time() + FLUSH_S
            # that read finds nothing: the one after it is DRAIN_S later
            read_at = loop.time()
            empty = idle_read()
            assert empty.when() >= read_at + DRAIN_S
            # a few bytes (routes at a low rate) leave the reads DRAIN_S apart
            a.routed(document(99), "r1")
            a.send_waiting()
            sent_at = loop.time()
            few = idle_read()
            assert b.received == sent + 1
            assert few.when() >= sent_at + DRAIN_S
            assert (a.sent, b.received, b.dropped, b.malformed) == (
                sent + 1, sent + 1, 0, 0)
        finally:
            a.stop()
            b.stop()

    asyncio.run(run())
