"""Prometheus metrics under vLLM's names, read from the core's counters at scrape time.

Counters and gauges come from :class:`engine.scheduler.EngineStats` and the KV pool when
``/metrics`` is scraped (the core itself never touches prometheus), all read at one moment
(:meth:`engine.core.EngineCore.read_gauges`: while a step runs in the engine's worker
thread, as they were before it, not half-way through it); histograms are observed
by the server's engine loop from each step and the per-request times in its outputs. As in
vLLM, every series is labelled ``model_name`` and ``engine`` (the data-parallel rank: one
engine here, ``"0"``), exists from start-up, and ``process_*`` describe the process.
``cache_config_info=False`` leaves out ``vllm:cache_config_info``, as a replica that tells
its KV usage but not its capacity.

Per-request phases, in the engine's clock::

    arrival --queue--> first scheduled --prefill--> first token --decode--> finish
            |<------------------------- e2e ------------------------------------>|
                       |<----------------------- inference ------------------->|

A pooling request (an embedding) finishes with its prefill and no output token: it counts
in the request counters and the queue, prefill, inference and e2e times, not in TTFT,
decode, inter-token or generation-token series.

Inter-token latency is observed per output after the first: the time since the request's
previous output over the tokens it added (one per step unless the core skips outputs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.core import EngineCore, StepOutput
from engine.request import RequestOutput
from kvwire import metric_names as m

# the engine's own: KV event batches its publisher lost before they reached the socket
KV_EVENTS_DROPPED = "kvgate:engine_kv_events_dropped"

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
# vLLM's queue-time buckets start at 0.3 s, where a healthy replica's whole queue time
# falls into the first bucket; the finer ones below it make its p95 mean something
_QUEUE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, *_LATENCY_BUCKETS)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def buckets_1_2_5(limit: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``limit`` (vLLM's token-count buckets)."""
    out: list[int] = []
    scale = 1
    while True:
        for step in (1, 2, 5):
            if step * scale > limit:
                return tuple(out)
            out.append(step * scale)
        scale *= 10


class _CoreCollector(Collector):
    def __init__(self, core: EngineCore, model_name: str, engine: str,
                 cache_config_info: bool = True,
                 pace: Callable[[], tuple[float, float]] | None = None,
                 kv_events_dropped: Callable[[], int] | None = None) -> None:
        self._core = core
        self._values = [model_name, engine]
        self._cache_config_info = cache_config_info
        self._pace = pace
        self._kv_events_dropped = kv_events_dropped

    def collect(self) -> Iterator[Metric]:
        core, labels, values = self._core, [m.MODEL_NAME_LABEL, m.ENGINE_LABEL], self._values
        # read at one moment: not half-way through a step that runs in another thread
        now = core.read_gauges()
        stats = now.stats

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(values, value)
            return c

        yield gauge(m.NUM_REQUESTS_RUNNING, "Requests in the running batch.", now.num_running)
        yield gauge(m.NUM_REQUESTS_WAITING, "Requests waiting to be scheduled.",
                    now.num_waiting)
        yield gauge(m.KV_CACHE_USAGE, "Fraction of KV blocks in use (0-1).", now.kv_usage)
        yield gauge(m.PROMPT_TOKENS_WAITING, "Prompt tokens queued and still to prefill "
                    "(less the prefix-cache hits found when they were queued).",
                    stats.prompt_tokens_waiting)
        yield counter(m.PREFIX_CACHE_QUERIES, "Prompt tokens looked up in the prefix cache.",
                      stats.prefix_cache_queries)
        yield counter(m.PREFIX_CACHE_HITS, "Prompt tokens found in the prefix cache.",
                      stats.prefix_cache_hits)
        yield counter(m.PROMPT_TOKENS, "Prompt tokens of requests whose prefill "
                      "completed (counted at their first token).",
                      stats.prompt_tokens)
        yield counter(m.GENERATION_TOKENS, "Generated tokens.", stats.generation_tokens)
        yield counter(m.NUM_PREEMPTIONS, "Preempted requests (recomputed later).",
                      stats.num_preemptions)
        if self._pace is not None:
            modeled, late = self._pace()
            yield counter(m.STEP_MODELED_SECONDS, "Seconds the sim executor's steps were "
                          "modeled to take.", modeled)
            yield counter(m.STEP_LATE_SECONDS, "Seconds those steps ended after their "
                          "modeled end (a host too busy for its fleet).", late)
        if self._kv_events_dropped is not None:
            yield counter(KV_EVENTS_DROPPED, "KV event batches lost before the PUB socket "
                          "(its queue full, unencodable, or the sender stopped); "
                          "subscribers see the gap in the sequence numbers.",
                          self._kv_events_dropped())
        if not self._cache_config_info:
            return
        info = GaugeMetricFamily(m.CACHE_CONFIG_INFO, "KV cache configuration.",
                                 labels=["block_size", "num_gpu_blocks", m.ENGINE_LABEL])
        info.add_metric([str(core.block_size), str(core.kv.num_blocks), values[1]], 1.0)
        yield info


class _Live:
    """What the metrics keep of a request between its outputs."""

    __slots__ = ("last_time", "num_output")

    def __init__(self) -> None:
        self.last_time = 0.0
        self.num_output = 0


class EngineMetrics:
    """A registry per engine server (so several can live in one process).

    ``started``, ``observe_step`` and ``ended_early`` run on the event loop's thread."""

    def __init__(self, core: EngineCore, model_name: str, engine: str = "0",
                 cache_config_info: bool = True,
                 pace: Callable[[], tuple[float, float]] | None = None,
                 kv_events_dropped: Callable[[], int] | None = None) -> None:
        """``pace``: the sim executor's modeled step seconds and how late those steps
        ended (both totals, read at each scrape); None for an executor with no model.
        ``kv_events_dropped``: the KV event batches the publisher lost (read at each
        scrape); None when the engine publishes none."""
        self.registry = r = CollectorRegistry(auto_describe=False)
        r.register(_CoreCollector(core, model_name, engine, cache_config_info, pace,
                                  kv_events_dropped))
        ProcessCollector(registry=r)
        labels, values = [m.MODEL_NAME_LABEL, m.ENGINE_LABEL], (model_name, engine)
        token_buckets = buckets_1_2_5(core.config.max_model_len)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(*values)

        self.ttft = histogram(m.TTFT, "Time to first token.", _TTFT_BUCKETS)
        self.e2e = histogram(m.E2E_LATENCY, "Arrival to finish.", _LATENCY_BUCKETS)
        self.queue_time = histogram(m.QUEUE_TIME, "Arrival to first scheduling (time "
                                    "spent waiting).", _QUEUE_BUCKETS)
        self.prefill_time = histogram(m.REQUEST_PREFILL_TIME, "First scheduling to first "
                                      "token (prefill).", _LATENCY_BUCKETS)
        self.decode_time = histogram(m.REQUEST_DECODE_TIME, "First token to finish "
                                     "(decode).", _LATENCY_BUCKETS)
        self.inference_time = histogram(m.REQUEST_INFERENCE_TIME, "First scheduling to "
                                        "finish (running).", _LATENCY_BUCKETS)
        self.inter_token = histogram(m.INTER_TOKEN_LATENCY, "Time between a request's "
                                     "successive tokens.", _ITL_BUCKETS)
        self.prompt_tokens = histogram(m.REQUEST_PROMPT_TOKENS, "Prompt tokens per finished "
                                       "request.", token_buckets)
        self.generation_tokens = histogram(m.REQUEST_GENERATION_TOKENS, "Generated tokens "
                                           "per finished request.", token_buckets)
        self.iteration_tokens = histogram(m.ITERATION_TOKENS, "Tokens per engine step "
                                          "(prefill and decode).", _ITERATION_BUCKETS)
        self._success = Counter(m.REQUEST_SUCCESS, "Finished requests by finish reason.",
                                [*labels, "finished_reason"], registry=r)
        self._values = values
        self.success = {reason: self._success.labels(*values, reason)
                        for reason in m.FINISHED_REASONS}
        self._live: dict[str, _Live] = {}

    def started(self, request_id: str) -> None:
        """A request went to the engine; it ends in a finished output or ``ended_early``."""
        self._live[request_id] = _Live()

    def observe_step(self, step: StepOutput, now: float) -> None:
        """One engine step's outputs, the step ending at ``now`` (the engine's clock)."""
        if step.num_tokens:
            self.iteration_tokens.observe(step.num_tokens)
        for out in step.outputs:
            self._observe(out, now)

    def _observe(self, out: RequestOutput, now: float) -> None:
        live = self._live.get(out.request_id)
        if out.num_output_tokens == 1 and out.first_token_time is not None:
            self.ttft.observe(out.first_token_time - out.arrival_time)
            if out.first_scheduled_time is not None:
                self.queue_time.observe(out.first_scheduled_time - out.arrival_time)
            if live is not None:
                live.last_time, live.num_output = out.first_token_time, 1
        elif live is not None and out.num_output_tokens > live.num_output:
            at = out.finish_time if out.finish_time is not None else now
            added = out.num_output_tokens - live.num_output
            self.inter_token.observe(max(0.0, at - live.last_time) / added)
            live.last_time, live.num_output = at, out.num_output_tokens
        if out.finish_reason is not None and out.finish_time is not None \
                and self._live.pop(out.request_id, None) is not None:
            # counted once: not when the server ended it early (``ended_early``) while the
            # step that finished it was running, before its abort reached the engine
            self._finished(out, out.finish_reason, out.finish_time)

    def ended_early(self, request_id: str, reason: str, last: RequestOutput | None,
                    now: float) -> None:
        """The server stopped a request before the engine finished it: ``stop`` (a stop
        string matched in its text) or ``abort`` (the client left, or an error);
        ``last``: its last output, if any. No-op for a request already counted."""
        if self._live.pop(request_id, None) is None:
            return
        if reason == "stop" and last is not None:
            self._finished(last, reason, now)
        else:
            self._succeeded(reason)

    def _succeeded(self, reason: str) -> None:
        child = self.success.get(reason)
        if child is None:  # a reason vLLM does not have: counted all the same
            child = self.success[reason] = self._success.labels(*self._values, reason)
        child.inc()

    def _finished(self, out: RequestOutput, reason: str, finish: float) -> None:
        self._succeeded(reason)
        self.e2e.observe(finish - out.arrival_time)
        self.prompt_tokens.observe(out.num_prompt_tokens)
        scheduled, first = out.first_scheduled_time, out.first_token_time
        if out.num_output_tokens == 0:  # a pooling request (embedding): all prefill
            if scheduled is not None:
                self.queue_time.observe(scheduled - out.arrival_time)
                self.prefill_time.observe(finish - scheduled)
                self.inference_time.observe(finish - scheduled)
            return
        self.generation_tokens.observe(out.num_output_tokens)
        if scheduled is not None:
            self.inference_time.observe(finish - scheduled)
            if first is not None:
                self.prefill_time.observe(first - scheduled)
        if first is not None:
            self.decode_time.observe(finish - first)
