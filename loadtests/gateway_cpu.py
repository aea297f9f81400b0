"""The gateway's CPU time per request, at a fixed offered rate.

``cpu_ms_per_request`` sends requests open-loop (one every ``1 / rate`` seconds, whatever
the answers take) and divides the CPU time the gateway's processes used meanwhile (user +
system, its worker processes included, read from ``/proc``) by the requests served. The
load generator and the backend run in processes of their own, so only the gateway's work
is counted: parsing, tokenizing, routing, relaying, metrics and logging.

Three request kinds (``SCENARIOS``):

- ``stream_repeated``: streamed answers (~10 SSE chunks) for a pool of documents seen
  again and again (the tokenizer's memo answers after the first);
- ``stream_fresh``: streamed, each request a new ~6,000-token document (no memo hit);
- ``plain_repeated``: whole (non-streamed) answers, the repeated pool.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import aiohttp

SCENARIOS = ("stream_repeated", "stream_fresh", "plain_repeated")
_TICKS = os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            kids += [int(k) for k in task.read_text().split()]
        except OSError:
            continue  # the thread ended meanwhile
    return kids


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live descendants."""
    total = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue  # exited meanwhile
        # the fields after the command name, which may hold spaces: ") S ppid ..."
        fields = stat[stat.rindex(")") + 2:].split()
        total += (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime
        todo += _children(p)
    return total


def documents(n: int, words: int = 3000, seed: int = 5) -> list[str]:
    """``n`` distinct documents of ``words`` words (~2 gateway tokens a word)."""
    from kvwire.tokenizer_build import sample_text

    rng = random.Random(seed)
    return [sample_text(rng, words) for _ in range(n)]


def bodies(prompts: Sequence[str], stream: bool) -> list[bytes]:
    return [json.dumps({"model": "bench", "prompt": p, "max_tokens": 10,
                        "stream": stream}).encode() for p in prompts]


def scenario_bodies(scenario: str, repeated: Sequence[str], fresh_count: int
                    ) -> Iterator[bytes]:
    """The request bodies of ``scenario``, in order (fresh documents made as needed)."""
    if scenario == "stream_fresh":
        # a seed of its own per call: documents never seen by any gateway before
        yield from bodies(documents(fresh_count, seed=random.randrange(1 << 30)), True)
        return
    pool = bodies(repeated, scenario.startswith("stream"))
    i = 0
    while True:
        yield pool[i % len(pool)]
        i += 1


async def offered_load(url: str, payloads: Sequence[bytes], rate: float,
                       fresh_connections: bool = False) -> int:
    """Send ``payloads`` open-loop at ``rate`` per second; the number answered 200 (any
    other answer raises). ``fresh_connections``: each request on a connection of its own
    (with worker processes, the kernel hands each to a worker anew)."""
    connector = aiohttp.TCPConnector(limit=0, force_close=fresh_connections)
    ok = 0
    async with aiohttp.ClientSession(connector=connector) as session:
        async def one(body: bytes) -> None:
            nonlocal ok
            async with session.post(url, data=body,
                                    headers={"content-type": "application/json"}) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{url} answered {r.status}")
            ok += 1

        start = time.perf_counter()
        tasks = []
        for i, body in enumerate(payloads):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(body)))
        await asyncio.gather(*tasks)
    return ok


async def cover_workers(url: str, payloads: Sequence[bytes], workers: int,
                        max_tries: int = 64) -> list[int]:
    """Send each payload, each time on a connection of its own (the kernel hands each to
    a worker anew), until ``workers`` worker processes have answered it (the
    ``x-kvgate-worker`` header); a few payloads at a time. Returns the requests sent per
    payload; raises when one has not reached every worker after ``max_tries``."""
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def cover(body: bytes) -> int:
            seen: set[str] = set()
            for tries in range(1, max_tries + 1):
                async with session.post(url, data=body,
                                        headers={"content-type": "application/json"}) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{url} answered {r.status}")
                    seen.add(r.headers.get("x-kvgate-worker", "-"))
                if len(seen) >= workers:
                    return tries
            raise RuntimeError(f"a document reached workers {sorted(seen)} of {workers} in "
                               f"{max_tries} requests, each on a new connection")

        out: list[int] = []
        for start in range(0, len(payloads), 8):
            out += await asyncio.gather(*(cover(b) for b in payloads[start : start + 8]))
    return out


def warm_up(url: str, scenario: str, repeated: Sequence[str], rate: float,
            workers: int = 1) -> None:
    """Requests of ``scenario``'s kind before a measurement (connections open, memo
    filled). With ``workers`` processes each keeps its own tokenizer memo, and a
    connection stays with one of them: each repeated document is first sent on new
    connections until every worker has answered it (``cover_workers``; with one pass
    alone, 31 of the 800 decisions of a two-worker run took over 1 ms: the second worker's
    first encodings; with a fixed 8 passes over 16 documents a worker still missed one in
    some runs)."""
    if workers > 1 and scenario != "stream_fresh":
        pool = list(_take(scenario_bodies(scenario, repeated, 0), len(repeated)))
        asyncio.run(cover_workers(url, pool, workers))
    warm = list(_take(scenario_bodies(scenario, repeated, len(repeated)), len(repeated)))
    asyncio.run(offered_load(url, warm, rate))


def cpu_ms_per_request(pid: int, url: str, scenario: str, repeated: Sequence[str],
                       rate: float, seconds: float, workers: int = 1) -> float:
    """The gateway's CPU milliseconds per request served for ``scenario``, after
    ``warm_up``."""
    count = max(1, int(rate * seconds))
    warm_up(url, scenario, repeated, rate, workers)
    payloads = list(_take(scenario_bodies(scenario, repeated, count), count))
    before = process_cpu_s(pid)
    served = asyncio.run(offered_load(url, payloads, rate))
    used = process_cpu_s(pid) - before
    return round(1000 * used / served, 3)


def _take(it: Iterator[bytes], n: int) -> Iterator[bytes]:
    for _ in range(n):
        yield next(it)
