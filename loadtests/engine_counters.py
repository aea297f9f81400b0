"""The engines' own counters, scraped from ``/metrics`` before and after a load run.

The token hit rate of a run is ``delta(prefix_cache_hits) / delta(prefix_cache_queries)``
summed over the fleet's engines: what the replicas really served from their caches,
independent of the gateway's beliefs; None (not measured) where they counted no lookup.
An engine restarted between the scrapes is told by its process's start time (or by a
counter that went back).
"""

from __future__ import annotations

import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from kvwire import metric_names as names

COUNTERS = {
    "queries": names.PREFIX_CACHE_QUERIES,
    "hits": names.PREFIX_CACHE_HITS,
    "prompt_tokens": names.PROMPT_TOKENS,
    "generation_tokens": names.GENERATION_TOKENS,
    "preemptions": names.NUM_PREEMPTIONS,
    "requests": names.REQUEST_SUCCESS,  # finished requests (any finish reason)
    "step_modeled_s": names.STEP_MODELED_SECONDS,  # sim executors only (else 0)
    "step_late_s": names.STEP_LATE_SECONDS,
}
# prometheus-client's process collector (on the engine's registry, and vLLM's): the unix
# time its process started, one value per process
PROCESS_START_METRIC = "process_start_time_seconds"
STARTED = "process_start_time_s"  # its key in a scrape, beside the counters


def parse_counters(text: str) -> dict[str, float]:
    """Totals of the counters in ``COUNTERS`` (summed over label sets) in exposition text,
    and under ``STARTED`` the process's start time where the page has it."""
    wanted = {f"{metric}_total": key for key, metric in COUNTERS.items()}
    out = dict.fromkeys(COUNTERS, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = wanted.get(sample.name)
            if key is not None:
                out[key] += sample.value
            elif sample.name == PROCESS_START_METRIC:
                out[STARTED] = sample.value
    return out


def scrape(url: str, timeout: float = 5.0) -> dict[str, float]:
    with urllib.request.urlopen(f"{url.rstrip('/')}/metrics", timeout=timeout) as resp:
        return parse_counters(resp.read().decode())


@dataclass(frozen=True, slots=True)
class FleetCounters:
    """Per-replica counter deltas over a run, and their fleet totals. ``restarted``: the
    indexes of the replicas restarted during the run (a restarted engine counts from 0):
    their deltas are what they counted since."""

    per_replica: tuple[Mapping[str, float], ...]
    restarted: tuple[int, ...] = ()

    def total(self, key: str) -> float:
        return sum(r[key] for r in self.per_replica)

    @property
    def token_hit_rate(self) -> float | None:
        """Hits / lookups over the fleet; None where no lookup was counted (no request
        reached an engine, or its engines do not expose these counters): not measured,
        not a rate of 0."""
        queries = self.total("queries")
        return self.total("hits") / queries if queries else None

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens the fleet computed (looked up and missed)."""
        return int(self.total("queries") - self.total("hits"))


def deltas(before: Sequence[Mapping[str, float]],
           after: Sequence[Mapping[str, float]]) -> FleetCounters:
    """Each replica's counts between its scrapes ``before`` and ``after``. A replica whose
    process start time (``STARTED``) differs between them, or whose counters went back,
    restarted meanwhile, and counts what it counted since (its counts before the restart
    are lost; taken as ``after - before``, they came out negative). The start time tells
    a restart the counters cannot: one from counters of 0, as a fresh fleet's are."""
    if len(before) != len(after):
        raise ValueError(f"{len(before)} scrapes before but {len(after)} after")
    per_replica: list[Mapping[str, float]] = []
    restarted: list[int] = []
    for i, (b, a) in enumerate(zip(before, after, strict=True)):
        started_before, started_after = b.get(STARTED), a.get(STARTED)
        new_process = started_before is not None and started_after is not None \
            and started_after != started_before
        if new_process or any(a[k] < b[k] for k in COUNTERS):
            restarted.append(i)
            per_replica.append({k: a[k] for k in COUNTERS})
        else:
            per_replica.append({k: a[k] - b[k] for k in COUNTERS})
    return FleetCounters(tuple(per_replica), tuple(restarted))
