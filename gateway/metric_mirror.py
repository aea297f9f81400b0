"""Counts a worker process keeps in its own state, summed over the box's workers.

Some of the gateway's figures are read from live objects at scrape time (``Collector``s).
Where those objects are a worker's own (each worker's peer links, and what they sent),
with worker processes (``serve --workers N``) the worker that answers ``GET /metrics``
would serve its own counts only, so successive scrapes answered by different workers
read a counter going up and down (each drop a reset to Prometheus). ``MetricMirror``
copies what such a collector yields into prometheus-client metrics of the same names
every ``interval_s``:
counters by their increase since the last copy, gauges by their value (``livesum``: the
live workers' sum). prometheus-client's multiprocess mode writes those to each process's
files, and ``GET /metrics`` on any worker sums them.

The copy runs in one task per worker, owned by the app's lifespan (``start``, ``stop``).
"""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.registry import Collector

from gateway.periodic import every, stop_tasks


class MetricMirror:
    """Copies ``collectors`` into multiprocess-summed metrics; see the module docstring."""

    def __init__(self, registry: CollectorRegistry, interval_s: float = 1.0) -> None:
        self.registry = registry
        self.interval_s = interval_s
        self._collectors: list[Collector] = []
        self._counters: dict[str, Counter] = {}
        self._gauges: dict[str, Gauge] = {}
        self._last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._task: asyncio.Task[None] | None = None

    def add(self, collector: Collector) -> None:
        self._collectors.append(collector)
        self.copy()  # the metrics exist (at zero) from the start

    def copy(self) -> None:
        """One copy of every collector's figures."""
        for collector in self._collectors:
            for family in collector.collect():
                for sample in family.samples:
                    if family.type == "counter" and sample.name.endswith("_total"):
                        self._count(family.name, family.documentation, sample.labels,
                                    sample.value)
                    elif family.type == "gauge":
                        self._gauge(family.name, family.documentation, sample.labels,
                                    sample.value)

    def _count(self, name: str, text: str, labels: dict[str, str], value: float) -> None:
        counter = self._counters.get(name)
        if counter is None:
            counter = self._counters[name] = Counter(name, text, sorted(labels),
                                                     registry=self.registry)
        key = (name, tuple(sorted(labels.items())))
        grown = value - self._last.get(key, 0.0)
        self._last[key] = value
        child = counter.labels(**labels) if labels else counter
        if grown > 0:  # a count that went back (its source was replaced) starts again
            child.inc(grown)

    def _gauge(self, name: str, text: str, labels: dict[str, str], value: float) -> None:
        gauge = self._gauges.get(name)
        if gauge is None:
            gauge = self._gauges[name] = Gauge(name, text, sorted(labels),
                                               registry=self.registry,
                                               multiprocess_mode="livesum")
        (gauge.labels(**labels) if labels else gauge).set(value)

    async def start(self) -> None:
        self._task = asyncio.create_task(
            every(self.interval_s, self.copy, "copying per-worker counts"),
            name="kvgate-metric-mirror")

    async def stop(self) -> None:
        await stop_tasks([self._task])
        self._task = None
        self.copy()  # the last figures, for a scrape after this worker is gone
