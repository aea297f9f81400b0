"""Prometheus metrics under vLLM's names, read from the core's counters at scrape time.

Counters and gauges come from :class:`engine.scheduler.EngineStats` and the KV pool when
``/metrics`` is scraped (the core itself never touches prometheus); latency histograms are
observed by the server's engine loop from the per-request times in the outputs.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.core import EngineCore
from engine.request import RequestOutput
from kvwire.metric_names import (
    CACHE_CONFIG_INFO,
    E2E_LATENCY,
    GENERATION_TOKENS,
    KV_CACHE_USAGE,
    NUM_PREEMPTIONS,
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
    PROMPT_TOKENS,
    PROMPT_TOKENS_WAITING,
    QUEUE_TIME,
    TTFT,
)

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class _CoreCollector(Collector):
    def __init__(self, core: EngineCore, model_name: str) -> None:
        self._core = core
        self._model = model_name

    def collect(self) -> Iterator[Metric]:
        core, labels = self._core, ["model_name"]
        values = [self._model]
        stats = core.stats

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(values, value)
            return c

        yield gauge(NUM_REQUESTS_RUNNING, "Requests in the running batch.", core.num_running)
        yield gauge(NUM_REQUESTS_WAITING, "Requests waiting to be scheduled.", core.num_waiting)
        yield gauge(KV_CACHE_USAGE, "Fraction of KV blocks in use (0-1).", core.kv.usage())
        yield gauge(PROMPT_TOKENS_WAITING, "Prompt tokens queued and still to prefill "
                    "(less the prefix-cache hits found when they were queued).",
                    stats.prompt_tokens_waiting)
        yield counter(PREFIX_CACHE_QUERIES, "Prompt tokens looked up in the prefix cache.",
                      stats.prefix_cache_queries)
        yield counter(PREFIX_CACHE_HITS, "Prompt tokens found in the prefix cache.",
                      stats.prefix_cache_hits)
        yield counter(PROMPT_TOKENS, "Prompt tokens of admitted requests.", stats.prompt_tokens)
        yield counter(GENERATION_TOKENS, "Generated tokens.", stats.generation_tokens)
        yield counter(NUM_PREEMPTIONS, "Preempted requests (recomputed later).",
                      stats.num_preemptions)
        info = GaugeMetricFamily(CACHE_CONFIG_INFO, "KV cache configuration.",
                                 labels=["block_size", "num_gpu_blocks"])
        info.add_metric([str(core.block_size), str(core.kv.num_blocks)], 1.0)
        yield info


class EngineMetrics:
    """A registry per engine server (so several can live in one process)."""

    def __init__(self, core: EngineCore, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_CoreCollector(core, model_name))
        self._model = model_name
        self.ttft = Histogram(TTFT, "Time to first token.", ["model_name"],
                              buckets=_TTFT_BUCKETS, registry=self.registry)
        self.e2e = Histogram(E2E_LATENCY, "Arrival to finish.", ["model_name"],
                             buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.queue_time = Histogram(QUEUE_TIME, "Arrival to first scheduling.", ["model_name"],
                                    buckets=_LATENCY_BUCKETS, registry=self.registry)

    def observe(self, out: RequestOutput) -> None:
        """Record the latencies an output completes (first token, finish)."""
        if out.num_output_tokens == 1 and out.first_token_time is not None:
            self.ttft.labels(self._model).observe(out.first_token_time - out.arrival_time)
            if out.first_scheduled_time is not None:
                self.queue_time.labels(self._model).observe(
                    out.first_scheduled_time - out.arrival_time)
        if out.finished and out.finish_time is not None:
            self.e2e.labels(self._model).observe(out.finish_time - out.arrival_time)
