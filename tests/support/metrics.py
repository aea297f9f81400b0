"""Prometheus exposition text as a dict the tests can index."""

from __future__ import annotations

from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.waiting import wait_until

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    """Every sample of ``text``, keyed by (name, its labels sorted)."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def per_worker(url: str, wanted: Callable[[Samples], bool], what: str, workers: int = 2,
               timeout_s: float = 20) -> dict[str, Samples]:
    """/metrics of each of a gateway's ``workers`` processes (a new connection each time,
    which the kernel hands to any of them), once every one satisfies ``wanted``; keyed by
    the ``x-kvgate-worker`` header ("0" for a gateway of one process)."""
    seen: dict[str, Samples] = {}

    def every() -> bool:
        r = httpx.get(f"{url}/metrics", headers={"connection": "close"})
        seen[r.headers.get("x-kvgate-worker", "0")] = samples(r.text)
        return len(seen) == workers and all(wanted(s) for s in seen.values())

    wait_until(every, timeout_s, what)
    return seen


def client_on_worker(url: str, worker: str, timeout_s: float = 30) -> httpx.Client:
    """A client whose one kept connection the kernel gave to ``worker`` (by the
    ``x-kvgate-worker`` header of its ``/metrics``); the caller closes it."""
    found: list[httpx.Client] = []

    def connected() -> bool:
        client = httpx.Client(base_url=url, timeout=timeout_s,
                              limits=httpx.Limits(max_connections=1))
        if client.get("/metrics").headers.get("x-kvgate-worker") == worker:
            found.append(client)
            return True
        client.close()
        return False

    wait_until(connected, 20, f"a connection to worker {worker}")
    return found[0]
