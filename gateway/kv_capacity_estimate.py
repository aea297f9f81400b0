"""A replica's KV capacity estimated online, for replicas whose ``/metrics`` tell none.

vLLM's ``kv_cache_usage_perc`` is ``1 - free / total`` blocks, where blocks holding only
the cached prefixes of finished requests count as free (SGLang's ``token_usage`` is the
same in tokens): usage measures the blocks of running requests. When this gateway knows
everything a replica runs (``ResidentRequests``), each scrape pairs::

    resident (replica tokens)  ~=  usage x capacity (replica tokens)

A sample is taken only when it is clean (``observe`` returns why not otherwise):

- the replica runs requests, none waits, and it runs exactly this gateway's requests in
  flight there, each past its first streamed byte (whole prompt held, output counted);
- none started or ended while the scrape was on the wire (``mark`` before, ``observe``
  after);
- no two of them start alike (they might share blocks, counted once by the replica);
- usage is above ``usage_floor`` (block rounding dominates below).

Prompts are counted in gateway tokens and outputs in the replica's (one chunk a token), so a
sample keeps both apart and the estimate converts prompts with the token calibration's
current ratio: a sample taken before the ratio was learned is as good as any (until then
the ratio is 1, as everywhere in the gateway, and the figure is right in gateway tokens).

The estimate over a replica's last ``window`` samples, newest weighted most
(``decay`` per newer sample)::

    resident_i = prompt_gateway_i x ratio + output_i
    ratios   c_i = resident_i / usage_i ;  m = median(c_i)
    kept     samples with |c_i / m - 1| <= outlier        (a stale gauge, a stray client)
    capacity = sum(w_i resident_i) / sum(w_i usage_i)     over kept  (ratio of sums:
               large samples, whose rounding error is smallest, weigh most)

published once ``min_samples`` were kept. Each running request holds on average half a
block more than its tokens, so the estimate runs low by ``block_size / 2`` per request
over the resident tokens (well under 1% for prompts of a thousand tokens).

The estimate lives on ``ReplicaState.estimated_kv_replica_tokens``;
``ReplicaState.kv_capacity`` prefers a scraped figure, then a configured one, and only then
the estimate. A replica's samples go when it leaves or restarts. Everything here is
synchronous and O(window) per scrape (~35 us with a full window).
"""

from __future__ import annotations

import statistics
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.fleet_events import FleetEvent
from gateway.replica_metrics import ScrapedMetrics
from gateway.resident_requests import ResidentRequests
from policies.base import ReplicaRemoved, ReplicaReset

if TYPE_CHECKING:
    from gateway.fleet import Fleet


@dataclass(frozen=True, slots=True)
class CapacityEstimateConfig:
    """``scrape.kv_capacity_estimate`` in the gateway's YAML."""

    enabled: bool = True
    # few: policies place prefixes by capacity from the start (samples are good to within
    # block rounding; an outlier among the first few holds the figure back until more agree)
    min_samples: int = 3
    window: int = 64
    decay: float = 0.97
    usage_floor: float = 0.02
    outlier: float = 0.35

    def validate(self) -> None:
        if self.min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, got {self.min_samples!r}")
        if self.window < self.min_samples:
            raise ValueError(f"window must be >= min_samples ({self.min_samples}), got "
                             f"{self.window!r}")
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {self.decay!r}")
        if not 0.0 <= self.usage_floor < 1.0:
            raise ValueError(f"usage_floor must be in [0, 1), got {self.usage_floor!r}")
        if self.outlier <= 0.0:
            raise ValueError(f"outlier must be > 0, got {self.outlier!r}")


class CapacityWindow:
    """One replica's recent samples and the estimate they give."""

    def __init__(self, config: CapacityEstimateConfig) -> None:
        self.config = config
        # (prompt gateway tokens, output replica tokens, usage) per sample
        self._samples: deque[tuple[float, float, float]] = deque(maxlen=config.window)
        self.skipped: Counter[str] = Counter()  # scrapes not taken, by reason
        self.ratio = 1.0  # the token ratio the last estimate was made with
        self.ratio_learned = False  # ... and whether it was learned then

    def __len__(self) -> int:
        return len(self._samples)

    def add(self, prompt_gateway_tokens: float, output_replica_tokens: float,
            usage: float) -> None:
        """The running requests' prompts and outputs so far, and the replica's usage."""
        if min(prompt_gateway_tokens, output_replica_tokens) < 0 or usage <= 0 \
                or prompt_gateway_tokens + output_replica_tokens <= 0:
            raise ValueError(f"a sample needs tokens and usage above 0, got "
                             f"{prompt_gateway_tokens!r}, {output_replica_tokens!r} output "
                             f"tokens and usage {usage!r}")
        self._samples.append((prompt_gateway_tokens, output_replica_tokens, usage))

    def estimate(self, ratio: float = 1.0) -> int | None:
        """Capacity in replica tokens (``ratio``: replica tokens per gateway token); None
        before ``min_samples`` samples agree."""
        cfg = self.config
        if len(self._samples) < cfg.min_samples:
            return None
        samples = [(p * ratio + o, u) for p, o, u in self._samples]
        median = statistics.median(r / u for r, u in samples)
        weight = 1.0
        resident = usage = 0.0
        kept = 0
        for r, u in reversed(samples):  # newest first
            if abs(r / u / median - 1.0) <= cfg.outlier:
                resident += weight * r
                usage += weight * u
                kept += 1
            weight *= cfg.decay
        if kept < cfg.min_samples:
            return None
        return round(resident / usage)


class Mark(NamedTuple):
    """A replica's accounting when its scrape was sent."""

    changes: int
    in_flight: int


class CapacityEstimator:
    """Samples every replica's scrapes against what this gateway holds running there."""

    def __init__(self, fleet: Fleet, config: CapacityEstimateConfig | None = None) -> None:
        self.fleet = fleet
        self.config = config or CapacityEstimateConfig()
        self.resident = ResidentRequests(lambda replica: fleet.get(replica) is not None)
        # off with worker processes (a fleet whose load is shared): a scrape sees every
        # worker's requests running, a worker only its own, so no sample would be clean
        self.on = self.config.enabled and fleet.shared is None
        self._windows: dict[str, CapacityWindow] = {}
        fleet.listen(self._on_fleet_event)

    def _on_fleet_event(self, event: FleetEvent) -> None:
        if isinstance(event, ReplicaRemoved):
            self.resident.forget(event.replica)
            self._windows.pop(event.replica, None)
        elif isinstance(event, ReplicaReset):  # perhaps restarted with another pool
            self._windows.pop(event.replica, None)
            state = self.fleet.get(event.replica)
            if state is not None:
                state.estimated_kv_replica_tokens = None

    def window(self, replica: str) -> CapacityWindow | None:
        return self._windows.get(replica)

    def mark(self, replica: str) -> Mark | None:
        """Call as the scrape of ``replica`` is sent."""
        state = self.fleet.get(replica)
        if state is None:
            return None
        return Mark(self.resident.changes(replica), state.in_flight)

    def observe(self, replica: str, metrics: ScrapedMetrics, mark: Mark | None) -> str:
        """A scrape of ``replica`` came back (and was recorded): take it as a sample when
        it is clean. Returns ``"sampled"`` or why it was not."""
        state = self.fleet.get(replica)
        if state is None or mark is None or not self.on:
            return "off"
        window = self._windows.get(replica)
        if window is None:
            window = self._windows[replica] = CapacityWindow(self.config)
        why = self._skip_reason(replica, metrics, mark)
        if why is None:
            running = self.resident.running(replica)
            window.add(sum(entry.prompt_gateway_tokens for entry in running),
                       sum(entry.output_tokens() or 0 for entry in running), metrics.kv_usage)
        else:
            window.skipped[why] += 1
        # every scrape: the token calibration may have moved since the last sample
        model = self._model(replica)
        window.ratio = self.fleet.calibration.ratio(model)
        window.ratio_learned = self.fleet.calibration.learned(model)
        state.estimated_kv_replica_tokens = window.estimate(window.ratio)
        return why or "sampled"

    def _model(self, replica: str) -> str | None:
        """The replica's model when it serves one (else the fleet's mean ratio serves)."""
        state = self.fleet.get(replica)
        return state.models[0] if state is not None and len(state.models) == 1 else None

    def _skip_reason(self, replica: str, metrics: ScrapedMetrics, mark: Mark) -> str | None:
        state = self.fleet.get(replica)
        assert state is not None
        running = self.resident.running(replica)
        if metrics.dialect == "unknown":
            return "no_usage_gauge"
        if not running:
            return "idle"
        if metrics.waiting > 0:
            return "waiting"
        if self.resident.changes(replica) != mark.changes or state.in_flight != mark.in_flight:
            return "moved"
        if state.in_flight != len(running):
            return "unsettled"  # some of ours await a first byte, or are not streamed
        if metrics.running != len(running):
            return "other_load"
        if len({entry.head_key for entry in running}) < len(running):
            return "shared_prefix"
        if metrics.kv_usage < self.config.usage_floor or metrics.kv_usage <= 0:
            return "low_usage"
        return None

    def describe(self, replica: str) -> dict[str, object]:
        """For ``/admin/replicas``: the estimate, its samples and the skipped scrapes."""
        state = self.fleet.get(replica)
        window = self._windows.get(replica)
        return {
            "replica_tokens": state.estimated_kv_replica_tokens if state is not None else None,
            # the token ratio the figure was made with (at the last scrape), and whether it
            # was learned then: until it is, the figure is right in gateway tokens only
            "replica_tokens_per_gateway_token": window.ratio if window is not None else None,
            "ratio_learned": window.ratio_learned if window is not None else False,
            "samples": len(window) if window is not None else 0,
            "skipped": dict(window.skipped) if window is not None else {},
        }


class CapacityCollector(Collector):
    """``kvgate_replica_kv_capacity_replica_tokens{replica, source}``: the capacity
    routing uses, in the replica's tokens, and where it came from."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "kvgate_replica_kv_capacity_replica_tokens",
            "KV capacity routing uses for the replica, in its own tokens; source: scraped "
            "(its cache_config_info or max_total_num_tokens), configured "
            "(kv_capacity_tokens) or estimated (from kv_cache_usage_perc)",
            labels=["replica", "source"])
        for state in self.fleet:
            capacity = state.kv_capacity()
            if capacity.source is not None and capacity.replica_tokens is not None:
                gauge.add_metric([state.id, capacity.source], capacity.replica_tokens)
        yield gauge
