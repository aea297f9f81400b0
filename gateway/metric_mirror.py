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
files, and ``GET /metrics`` on any worker sums them. Counts every worker keeps of the same
events (each reads every replica's KV event stream) are the box's already, and workers
that started apart differ a little: summed they would count each event once per worker,
served as they are they went back between scrapes. Those counters are copied by value
into series the files combine by maximum, served as counters again (``retyped``).

The copy runs in one task per worker, owned by the app's lifespan (``start``, ``stop``).

``MetricFiles``: a worker's own files of that mode, whose series can be taken out.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import warnings
from collections.abc import Collection
from typing import Any, ClassVar

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, values
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.registry import Collector

from gateway.periodic import every, stop_tasks


class MetricFiles:
    """This process's files of prometheus-client's multiprocess mode
    (``<kind>_<pid>.db``: ``counter``, ``histogram``, ``gauge_livesum`` ...), written as
    prometheus-client's own ``MmapedValue`` writes them, with a way out: prometheus-client
    never takes a series out of a file (its ``remove`` warns and leaves it), so a worker's
    files held every replica that ever joined, a few dozen series each, and a fleet whose
    replicas churn (pods named anew on each rollout) grew the files, the work of every
    scrape that reads them and the worker's value objects without end. ``drop`` rewrites
    the files without the series it is given."""

    def __init__(self, directory: str, process: int) -> None:
        self.directory = directory
        self.process = process
        self.lock = threading.Lock()  # one for every value, as prometheus-client's
        self._files: dict[str, MmapedDict] = {}

    def _path(self, kind: str) -> str:
        return os.path.join(self.directory, f"{kind}_{self.process}.db")

    def file(self, kind: str) -> MmapedDict:
        """The open file of ``kind`` (caller holds ``lock``)."""
        opened = self._files.get(kind)
        if opened is None:
            opened = self._files[kind] = MmapedDict(self._path(kind))
        return opened

    def drop(self, label: str, dropped: Collection[str]) -> int:
        """Rewrite the files without the series whose ``label`` is one of ``dropped``; how
        many went. A process reading a file meanwhile reads the old one or the new one,
        each whole (the new one is renamed over the old)."""
        gone = 0
        with self.lock:
            for kind, old in list(self._files.items()):
                series = list(old.read_all_values())
                # a key is mmap_key's JSON: [metric, sample, labels, help]
                kept = [s for s in series if orjson.loads(s[0])[2].get(label) not in dropped]
                if len(kept) == len(series):
                    continue
                gone += len(series) - len(kept)
                path = self._path(kind)
                fresh = f"{path}.new"  # not *.db: no reader globs it
                with contextlib.suppress(FileNotFoundError):
                    os.remove(fresh)  # left by a process that stopped while writing it
                new = MmapedDict(fresh)
                for key, value, timestamp in kept:
                    new.write_value(key, value, timestamp)
                new.close()
                os.replace(fresh, path)
                old.close()
                self._files[kind] = MmapedDict(path)
        return gone

    def close(self) -> None:
        with self.lock:
            for opened in self._files.values():
                opened.close()
            self._files.clear()


class FileValue:
    """``prometheus_client.values.ValueClass`` in a worker process (``worker_files``): one
    series' float in ``files``. A value whose series was dropped and is written again
    comes back in the file. (Workers are spawned: no fork to follow.)"""

    _multiprocess = True
    files: ClassVar[MetricFiles]
    __slots__ = ("_key", "_kind", "_timestamp", "_value")

    def __init__(self, typ: str, metric_name: str, name: str, labelnames: Any,
                 labelvalues: Any, help_text: str, multiprocess_mode: str = "",
                 **kwargs: Any) -> None:
        self._kind = f"{typ}_{multiprocess_mode}" if typ == "gauge" else typ
        self._key = mmap_key(metric_name, name, labelnames, labelvalues, help_text)
        with self.files.lock:
            self._value, self._timestamp = self.files.file(self._kind).read_value(self._key)

    def inc(self, amount: float) -> None:
        with self.files.lock:
            self._value += amount
            self._timestamp = 0.0
            self.files.file(self._kind).write_value(self._key, self._value, 0.0)

    def set(self, value: float, timestamp: float | None = None) -> None:
        with self.files.lock:
            self._value = value
            self._timestamp = timestamp or 0.0
            self.files.file(self._kind).write_value(self._key, value, self._timestamp)

    def set_exemplar(self, exemplar: object) -> None:
        return  # none in multiprocess mode, as prometheus-client's

    def get(self) -> float:
        with self.files.lock:
            return self._value

    def get_exemplar(self) -> None:
        return None


def worker_files(directory: str) -> MetricFiles:
    """This process's ``MetricFiles`` in ``directory``: every metric made from now on
    writes there (installed once, before the process makes any)."""
    if values.ValueClass is not FileValue:
        FileValue.files = MetricFiles(directory, os.getpid())
        values.ValueClass = FileValue  # type: ignore[misc,assignment]
        # ``remove`` is implemented here: drop a child, then ``drop`` its series
        warnings.filterwarnings("ignore", "Removal of labels has not been implemented",
                                UserWarning, "prometheus_client")
    return FileValue.files


class MetricMirror:
    """Copies ``collectors`` into multiprocess-summed metrics; see the module docstring."""

    def __init__(self, registry: CollectorRegistry, interval_s: float = 1.0) -> None:
        self.registry = registry
        self.interval_s = interval_s
        self._collectors: list[tuple[Collector, bool]] = []  # (collector, same_events)
        self._counters: dict[str, Counter] = {}
        self._most: dict[str, Gauge] = {}  # counters of the same events, by value
        self._gauges: dict[str, Gauge] = {}
        self._last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        # gauge -> the label values of each series copied into it by value at the last copy
        self._copied: dict[Gauge, set[tuple[str, ...]]] = {}
        self._task: asyncio.Task[None] | None = None

    def add(self, collector: Collector, same_events: bool = False) -> None:
        """Copy ``collector`` from now on; ``same_events``: its counters count what every
        worker counts alike (the box's figure is the largest worker's, not their sum)."""
        self._collectors.append((collector, same_events))
        self.copy()  # the metrics exist (at zero) from the start

    def copy(self) -> None:
        """One copy of every collector's figures. A series copied by value that its
        collector no longer yields (a replica's, once it left) is taken out of its metric:
        else each replica that ever joined kept a few series in every worker's memory
        (``GatewayMetrics`` takes them out of the files)."""
        copied, self._copied = self._copied, {}
        for collector, same_events in self._collectors:
            for family in collector.collect():
                for sample in family.samples:
                    if family.type == "counter" and sample.name.endswith("_total") \
                            and same_events:
                        self._largest(family.name, family.documentation, sample.labels,
                                      sample.value)
                    elif family.type == "counter" and sample.name.endswith("_total"):
                        self._count(family.name, family.documentation, sample.labels,
                                    sample.value)
                    elif family.type == "gauge":
                        self._gauge(family.name, family.documentation, sample.labels,
                                    sample.value)
        for gauge, series in copied.items():
            for gone in series - self._copied.get(gauge, set()):
                gauge.remove(*gone)

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
        self._set(gauge, labels, value)

    def _largest(self, name: str, text: str, labels: dict[str, str], value: float) -> None:
        gauge = self._most.get(name)
        if gauge is None:
            gauge = self._most[name] = Gauge(name, text, sorted(labels),
                                             registry=self.registry, multiprocess_mode="max")
        self._set(gauge, labels, value)

    def _set(self, gauge: Gauge, labels: dict[str, str], value: float) -> None:
        """Copy ``value`` into ``gauge``'s series of ``labels``, noted as copied."""
        if not labels:
            gauge.set(value)
            return
        gauge.labels(**labels).set(value)
        # in the order of its label names (sorted, as the gauge was made)
        self._copied.setdefault(gauge, set()).add(tuple(labels[k] for k in sorted(labels)))

    def retyped(self, family: Metric) -> Metric:
        """``family`` as the files' reader gives it, as ``GET /metrics`` serves it: a
        counter of the same events (``add``), read as the gauge it was copied into, is
        a counter again."""
        if family.type != "gauge" or family.name not in self._most:
            return family
        counter = CounterMetricFamily(family.name, family.documentation)
        counter.samples = [sample._replace(name=f"{family.name}_total")
                           for sample in family.samples]
        return counter

    async def start(self) -> None:
        self._task = asyncio.create_task(
            every(self.interval_s, self.copy, "copying per-worker counts"),
            name="kvgate-metric-mirror")

    async def stop(self) -> None:
        await stop_tasks([self._task])
        self._task = None
        self.copy()  # the last figures, for a scrape after this worker is gone
