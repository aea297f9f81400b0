"""Read a replica's Prometheus ``/metrics`` text in the vLLM or SGLang dialect.

``parse_metrics`` turns the exposition text into a ``ScrapedMetrics`` snapshot;
``HitRateWindow`` turns successive snapshots of the prefix-cache counters into a token hit
rate over a sliding window, noticing counter resets (a restarted replica).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import NamedTuple

from prometheus_client.parser import text_string_to_metric_families

from gateway.data_parallel import RANK_LABELS
from kvwire import metric_names as m

# the labels that tell one data-parallel group's SGLang schedulers apart: its pipeline
# stage, its TP rank and (MoE expert parallelism) its expert-parallel rank
_RANK_LABELS = frozenset({"tp_rank", "pp_rank", "moe_ep_rank"})
# vLLM's gauge naming the LoRA adapters running and waiting: registered only by a server
# started with --enable-lora (the engine exposes none)
_LORA_REQUESTS_INFO = "vllm:lora_requests_info"


@dataclass(frozen=True, slots=True)
class ScrapedMetrics:
    dialect: str  # "vllm", "sglang" or "unknown"
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    kv_capacity_tokens: int | None = None
    queued_tokens: int | None = None  # the engine's own gauge, when it exposes one
    hit_tokens: float | None = None  # counters (vLLM); None when not exposed
    query_tokens: float | None = None
    hit_rate_gauge: float | None = None  # SGLang exposes a ratio instead of counters
    # prompt plus generated tokens counted so far (a counter's total); None when not exposed
    work_tokens: float | None = None
    # the seconds finished requests ran, from first scheduled to finished, in all, and how
    # many (vLLM's request_inference_time_seconds histogram: its sum and count); None
    # when not exposed (SGLang has no such histogram)
    ran_seconds: float | None = None
    ran_requests: float | None = None
    stale: bool = False  # its replica's scrapes failed since: load figures dropped
    # the ``model_name`` labels of its samples, sorted: the served model (vLLM's first
    # served name, SGLang's served_model_name), told without a key; never its adapters
    model_names: tuple[str, ...] = ()
    serves_adapters: bool = False  # vLLM's LoRA gauge is there: adapters go unnamed

    def __post_init__(self) -> None:
        if type(self.model_names) is not tuple:  # a follower's copy, read back from JSON
            object.__setattr__(self, "model_names", tuple(self.model_names))


def stale_copy(metrics: ScrapedMetrics) -> ScrapedMetrics:
    """What is still believed of ``metrics`` once its replica's scrapes keep failing: its
    KV capacity (a property of the replica), none of its load or counters."""
    return ScrapedMetrics(metrics.dialect, kv_capacity_tokens=metrics.kv_capacity_tokens,
                          stale=True)


def parse_metrics(text: str) -> ScrapedMetrics:
    """One snapshot of a replica. A replica running several engines (vLLM with data
    parallelism labels each sample ``engine="0"``, ``engine="1"`` ...) is one replica of
    their sum: counters, queue lengths and KV capacity add up; ratios (KV usage, SGLang's
    token usage and hit rate) are averaged over the samples. SGLang's scheduler samples
    labelled ``tp_rank``/``pp_rank``/``moe_ep_rank`` are several reports of one group (its
    pipeline stages, or every TP and expert-parallel rank with
    ``--enable-metrics-for-all-schedulers``): each group counts once
    (its busiest rank's load, its smallest stage's ``max_total_num_tokens``), and groups
    (``dp_rank``) add up."""
    return _snapshot(_samples(text))


Sample = tuple[str, dict[str, str], float]  # a sample's name, labels and value


class RankPages(NamedTuple):
    snapshots: list[ScrapedMetrics]  # one per rank, in rank order
    named: frozenset[str]  # the ranks the page's samples name


def parse_rank_metrics(text: str, ranks: int) -> RankPages:
    """Each data-parallel rank's snapshot (``gateway.data_parallel``) of one read of a
    replica's page: a rank's samples are those labelled with it (vLLM's ``engine``,
    SGLang's ``dp_rank``) and those that name no rank; where no sample names one, the
    replica's counts are shared evenly by its ``ranks``."""
    common: list[Sample] = []  # the samples that name no rank
    by_rank: dict[str, list[Sample]] = {}
    for sample in _samples(text):
        labels = sample[1]
        rank = next((labels[k] for k in RANK_LABELS if k in labels), None)
        (common if rank is None else by_rank.setdefault(rank, [])).append(sample)
    named = frozenset(by_rank)
    if not named:
        return RankPages([_shared(_snapshot(common), ranks)] * ranks, named)
    return RankPages([_snapshot(common + by_rank.get(str(k), [])) for k in range(ranks)],
                     named)


def _samples(text: str) -> Iterator[Sample]:
    """The page's samples with a finite value (NaN or +-Inf: no figure routing can use)."""
    return ((sample.name, sample.labels, value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples if math.isfinite(value := float(sample.value)))


def _snapshot(samples: Iterable[Sample]) -> ScrapedMetrics:
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    capacity: int | None = None
    # SGLang's schedulers of one data-parallel group (its pipeline stages, and with
    # --enable-metrics-for-all-schedulers its TP and EP ranks) each report the group's requests
    # and KV pool: one figure per group, the samples told apart by these labels alone
    groups: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    names: set[str] = set()
    adapters = False
    for name, labels, value in samples:
        served = labels.get(m.MODEL_NAME_LABEL)
        if served:
            names.add(served)
        if name == _LORA_REQUESTS_INFO:
            adapters = True
        if _RANK_LABELS & labels.keys():
            group = (name, frozenset((k, v) for k, v in labels.items()
                                     if k not in _RANK_LABELS))
            seen = groups.get(group)
            # the busiest rank's load; the smallest stage's pool bounds the group's
            groups[group] = value if seen is None else \
                min(seen, value) if name == m.SGLANG_MAX_TOTAL_TOKENS else max(seen, value)
            continue
        sums[name] = sums.get(name, 0.0) + value
        counts[name] = counts.get(name, 0) + 1
        if name.startswith(m.CACHE_CONFIG_INFO):
            try:
                blocks = int(labels["block_size"]) * int(labels["num_gpu_blocks"])
            except (KeyError, ValueError):
                continue
            if blocks > 0:  # a pool of no block (or a negative one) tells nothing
                capacity = blocks + (capacity or 0)
    for (name, _), value in groups.items():
        sums[name] = sums.get(name, 0.0) + value
        counts[name] = counts.get(name, 0) + 1

    def get(*names: str) -> float | None:
        for name in names:
            if name in sums:
                return sums[name]
        return None

    def mean(*names: str) -> float | None:
        for name in names:
            if name in sums:
                return sums[name] / counts[name]
        return None

    # counts and a usage fraction below 0 (or a fraction past 1) are no state a replica can
    # be in: taken as their bound, so a page of negative queues draws no traffic
    queued = _count(get(m.PROMPT_TOKENS_WAITING))
    served_names = tuple(sorted(names))
    if get(m.NUM_REQUESTS_RUNNING) is not None:
        return ScrapedMetrics(
            dialect="vllm",
            running=_count(get(m.NUM_REQUESTS_RUNNING)) or 0,
            waiting=_count(get(m.NUM_REQUESTS_WAITING)) or 0,
            kv_usage=_fraction(mean(m.KV_CACHE_USAGE, m.GPU_CACHE_USAGE)),
            kv_capacity_tokens=capacity,
            queued_tokens=queued,
            hit_tokens=get(m.PREFIX_CACHE_HITS + m.TOTAL, m.GPU_PREFIX_CACHE_HITS + m.TOTAL),
            query_tokens=get(m.PREFIX_CACHE_QUERIES + m.TOTAL,
                             m.GPU_PREFIX_CACHE_QUERIES + m.TOTAL),
            work_tokens=_work(get(m.PROMPT_TOKENS + m.TOTAL),
                              get(m.GENERATION_TOKENS + m.TOTAL)),
            ran_seconds=get(m.REQUEST_INFERENCE_TIME + "_sum"),
            ran_requests=get(m.REQUEST_INFERENCE_TIME + "_count"),
            model_names=served_names, serves_adapters=adapters,
        )
    if get(m.SGLANG_RUNNING) is not None:
        total = get(m.SGLANG_MAX_TOTAL_TOKENS)
        return ScrapedMetrics(
            dialect="sglang",
            running=_count(get(m.SGLANG_RUNNING)) or 0,
            waiting=_count(get(m.SGLANG_WAITING)) or 0,
            kv_usage=_fraction(mean(m.SGLANG_TOKEN_USAGE)),
            kv_capacity_tokens=None if total is None or total <= 0 else int(total),
            queued_tokens=queued,
            hit_rate_gauge=_fraction(hit) if (hit := mean(m.SGLANG_CACHE_HIT_RATE))
            is not None else None,
            work_tokens=_work(get(m.SGLANG_PROMPT_TOKENS + m.TOTAL),
                              get(m.SGLANG_GENERATION_TOKENS + m.TOTAL)),
            model_names=served_names, serves_adapters=adapters,
        )
    return ScrapedMetrics(dialect="unknown", queued_tokens=queued,
                          model_names=served_names, serves_adapters=adapters)


def _count(value: float | None) -> int | None:
    """A scraped count (requests, tokens), at least 0."""
    return None if value is None else max(0, int(value))


def _fraction(value: float | None) -> float:
    """A scraped usage fraction, within [0, 1] (0 when not scraped)."""
    return 0.0 if value is None else min(1.0, max(0.0, value))


def _shared(whole: ScrapedMetrics, ranks: int) -> ScrapedMetrics:
    """One rank's even share of a whole replica's counts (its ratios are every rank's)."""
    def part(value: float | None) -> float | None:
        return None if value is None else value / ranks

    def count(value: int | None) -> int | None:
        return None if value is None else value // ranks

    return replace(whole, running=whole.running // ranks, waiting=whole.waiting // ranks,
                   kv_capacity_tokens=count(whole.kv_capacity_tokens),
                   queued_tokens=count(whole.queued_tokens), hit_tokens=part(whole.hit_tokens),
                   query_tokens=part(whole.query_tokens), work_tokens=part(whole.work_tokens),
                   ran_seconds=part(whole.ran_seconds), ran_requests=part(whole.ran_requests))


def _work(prompt: float | None, generated: float | None) -> float | None:
    return None if prompt is None and generated is None else (prompt or 0.0) + (generated or 0.0)


def moved(before: ScrapedMetrics | None, after: ScrapedMetrics) -> bool:
    """Whether a replica did work between two fresh scrapes: its token counters grew, or
    its KV usage or request counts changed (a long prefill fills KV before any counter
    moves). A hung replica's stand still."""
    if before is None or before.stale or after.stale:
        return False
    return (before.work_tokens != after.work_tokens or before.kv_usage != after.kv_usage
            or before.running != after.running or before.waiting != after.waiting)


@dataclass(frozen=True, slots=True)
class HitRates:
    """Token rates over the window, in tokens per second, and their ratio."""

    hit_rate: float | None
    hits_per_s: float
    queries_per_s: float


class HitRateWindow:
    """Token hit rate over the last ``window_s`` seconds from cumulative counters."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, float, float]] = deque()
        self._last: tuple[float, float] | None = None  # the newest counters (hits, queries)

    def add(self, now: float, hits: float, queries: float) -> bool:
        """Record a sample; returns True when the counters went backwards (a restart)."""
        last = self._last
        reset = last is not None and (hits < last[0] or queries < last[1])
        if reset:
            self._samples.clear()
        self._last = (hits, queries)
        self._samples.append((now, hits, queries))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()
        return reset

    def clear(self) -> None:
        """Forget the samples: the replica's scrapes stopped, so its rates are unknown
        (None) until two fresh samples come. The newest counters are kept: a restart
        meanwhile is still told by the next sample."""
        self._samples.clear()

    def prefill_per_s(self) -> float | None:
        """Prompt tokens computed (queried, not hit) per second; None before two samples."""
        if len(self._samples) < 2:
            return None
        rates = self.rates()
        return max(0.0, rates.queries_per_s - rates.hits_per_s)

    def rates(self) -> HitRates:
        if len(self._samples) < 2:
            return HitRates(None, 0.0, 0.0)
        t0, h0, q0 = self._samples[0]
        t1, h1, q1 = self._samples[-1]
        span = max(t1 - t0, 1e-9)
        dq = q1 - q0
        return HitRates((h1 - h0) / dq if dq > 0 else None, (h1 - h0) / span, dq / span)
