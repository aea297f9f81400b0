"""A fleet of engine cores with the sim executor, for the offline simulator.

Each replica is the production ``EngineCore`` (scheduler, block pool, eviction queue)
over a ``SimExecutor`` whose step time comes from a roofline profile. Nothing here runs
the clock: ``loadtests.simulate`` drives the replicas in virtual time.

KV sizing: ``kv_pool_gib`` of KV per replica, of which running requests pin a part. The
reference scenario (40 GiB pools, ~15 GiB pinned by ~20 long answers, ~25 GiB idle) is
modeled with short answers, so few requests run at once: a 28 GiB pool leaves ~25 GiB
idle for cached prefixes (the simulator reports the measured mean, ``mean_idle_kv_blocks``).
``idle_kv_gib`` is used only for the static oracle (the fleet's total idle KV).

Replica views: by default a policy sees what the gateway would (``views="gateway"``):
the gateway's own ``Fleet`` accounting, fed by scrapes every ``scrape_interval_s`` of
virtual time in vLLM's dialect (running, waiting, KV usage and capacity, prefix-cache
counters; no queue gauge, so queued tokens are the prompt tokens sent and not yet answered
with a first token), or in kvgate's dialect (plus the engine's queued-tokens gauge), or in
vLLM's without ``cache_config_info`` (``vllm-no-capacity``: the gateway then estimates each
replica's KV capacity from its usage, ``gateway.kv_capacity_estimate``, as it does over
HTTP).
``views="exact"`` shows each core's state at the instant of the decision instead.

KV events (``kv_events``): each core's block pool records its events, and the simulator
applies a step's to the policies' exact indexes (``Policy.kv_index``) when the step ends,
as an engine publishes them after each step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from engine.core import EngineConfig, EngineCore
from engine.cost_model import MAX_SLOWDOWN, CostModel, load_profile
from engine.eviction import check_eviction_name
from engine.kv_sizing import blocks_in_gib
from engine.request import RequestOutput, SamplingParams
from engine.sim_executor import SimExecutor
from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.kv_capacity_estimate import CapacityEstimateConfig, CapacityEstimator
from gateway.replica_metrics import ScrapedMetrics
from loadtests.prefix_hashes import PrefixHashes
from loadtests.workloads import WorkloadRequest
from policies.base import ReplicaView

DIALECTS = ("vllm", "kvgate", "vllm-no-capacity")
# the most KV blocks a simulated fleet keeps, all its replicas' pools together: each
# block is a few records in its pool (about 50 bytes), 2^24 of them ~0.8 GiB
MAX_FLEET_BLOCKS = 1 << 24


@dataclass(frozen=True, slots=True)
class FleetSpec:
    replicas: int = 8
    profile: str = "llama3-8b-h100"
    kv_pool_gib: float = 28.0
    idle_kv_gib: float = 25.0
    max_num_seqs: int = 20
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    eviction: Literal["lru", "frequency"] = "lru"
    views: Literal["gateway", "exact"] = "gateway"
    dialect: Literal["vllm", "kvgate", "vllm-no-capacity"] = "vllm"
    scrape_interval_s: float = 1.0
    capacity_estimate: bool = True  # the gateway's online estimate, when none is scraped
    kv_events: bool = False  # the engines publish KV events (to policies with an index)
    # each server's data-parallel ranks, spread over by its own balancer (vLLM's internal
    # one: the rank with the fewest waiting x 4 + running), the gateway seeing the servers
    # only: 1, every replica its own server (or ranks the gateway routes to, as with
    # ``data_parallel_size``)
    ranks_hidden: int = 1
    # the replicas' usage tells their cached tokens (vLLM's does only with
    # --enable-prompt-tokens-details, SGLang's with --enable-cache-report): else 0 is read
    cached_report: bool = True
    # how many times slower than the profile's device each replica's is, by position
    # (r0, r1, ...; 1 for those past the end): a fleet of mixed or throttled devices
    slowdown: tuple[float, ...] = ()
    # virtual seconds at which ``slowdown`` takes effect (None: from the start): devices
    # that turn slow mid-run (throttled, degraded); before it every replica runs at the
    # profile's speed
    slowdown_at_s: float | None = None

    def validate(self) -> None:
        for key in ("replicas", "kv_pool_gib", "idle_kv_gib", "max_num_seqs",
                    "max_num_batched_tokens", "block_size", "scrape_interval_s"):
            if not 0 < getattr(self, key) < math.inf:  # NaN too
                raise ValueError(f"{key} must be a positive number, got "
                                 f"{getattr(self, key)!r}")
        if self.idle_kv_gib > self.kv_pool_gib:
            raise ValueError(f"idle_kv_gib ({self.idle_kv_gib}) exceeds kv_pool_gib "
                             f"({self.kv_pool_gib})")
        check_eviction_name(self.eviction)
        if self.views not in ("gateway", "exact"):
            raise ValueError(f"views must be 'gateway' or 'exact', got {self.views!r}")
        if self.dialect not in DIALECTS:
            raise ValueError(f"dialect must be one of {', '.join(DIALECTS)}, got "
                             f"{self.dialect!r}")
        if self.ranks_hidden < 1 or self.replicas % self.ranks_hidden:
            raise ValueError(f"ranks_hidden must divide replicas ({self.replicas}), got "
                             f"{self.ranks_hidden!r}")
        if len(self.slowdown) > self.replicas:
            raise ValueError(f"slowdown names {len(self.slowdown)} replicas, the fleet has "
                             f"{self.replicas}")
        for i, factor in enumerate(self.slowdown):
            if not 0 < factor <= MAX_SLOWDOWN:  # NaN too
                raise ValueError(f"slowdown of r{i} must be in (0, {MAX_SLOWDOWN:g}], got "
                                 f"{factor!r}")
        if self.slowdown_at_s is not None and not (
                self.slowdown and 0 <= self.slowdown_at_s < math.inf):
            raise ValueError(f"slowdown_at_s must be a time >= 0 with a slowdown to take "
                             f"effect, got {self.slowdown_at_s!r} with slowdown "
                             f"{self.slowdown!r}")
        if self.ranks_hidden > 1 and (self.views != "gateway" or self.kv_events):
            raise ValueError("ranks_hidden needs the gateway's views and no KV events (a "
                             "server's ranks publish apart)")

    def kv_bytes_per_token(self) -> int:
        return load_profile(self.profile).model.kv_bytes_per_token

    def blocks(self, gib: float) -> int:
        return blocks_in_gib(gib, self.kv_bytes_per_token(), self.block_size)

    def check_size(self) -> None:
        """``ValueError`` where the replicas' pools together are more than
        ``MAX_FLEET_BLOCKS`` blocks, before any is built."""
        per_replica = self.blocks(self.kv_pool_gib)
        if self.replicas * per_replica > MAX_FLEET_BLOCKS:
            raise ValueError(f"{self.replicas:,} replicas x {per_replica:,} KV blocks "
                             f"({self.kv_pool_gib:g} GiB) is more than the "
                             f"{MAX_FLEET_BLOCKS:,} blocks a simulated fleet keeps")


@dataclass(slots=True)
class SimReplica:
    """One replica: its core, the outputs of the step in progress and when it ends."""

    id: str
    core: EngineCore
    busy_until: float | None = None
    pending: list[RequestOutput] = field(default_factory=list)
    routed: int = 0
    routed_prompt_tokens: int = 0
    kv_seq: int = 0  # sequence number of the next KV event message

    def view(self) -> ReplicaView:
        core = self.core
        sched = core.scheduler
        running, waiting = len(sched.running), len(sched.waiting)
        return ReplicaView(
            id=self.id,
            queued_tokens=sched.stats.prompt_tokens_waiting,
            running=running,
            waiting=waiting,
            in_flight=running + waiting,
            kv_usage=core.kv.usage(),
            kv_capacity_tokens=core.config.num_blocks * core.config.block_size,
        )

    def scraped(self, dialect: str) -> ScrapedMetrics:
        """What a scrape of this replica's ``/metrics`` would read now."""
        core = self.core
        sched, stats = core.scheduler, core.scheduler.stats
        return ScrapedMetrics(
            dialect="vllm", running=len(sched.running), waiting=len(sched.waiting),
            kv_usage=core.kv.usage(),
            kv_capacity_tokens=None if dialect == "vllm-no-capacity"
            else core.config.num_blocks * core.config.block_size,
            queued_tokens=stats.prompt_tokens_waiting if dialect == "kvgate" else None,
            hit_tokens=float(stats.prefix_cache_hits),
            query_tokens=float(stats.prefix_cache_queries),
            ran_seconds=stats.ran_seconds, ran_requests=float(stats.ran_requests),
        )


class SimFleet:
    """The replicas of one simulated fleet, plus request construction for them.
    ``gateways`` copies of the gateway's accounting: each copy counts only what it sent,
    and every copy reads the same scrapes."""

    def __init__(self, spec: FleetSpec, hashes: PrefixHashes | None = None,
                 gateways: int = 1) -> None:
        if gateways < 1:
            raise ValueError(f"gateways must be >= 1, got {gateways!r}")
        spec.validate()
        spec.check_size()
        self.spec = spec
        profile = load_profile(spec.profile)
        self.model_id = profile.model.name
        self.max_model_len = profile.model.max_model_len
        cost = CostModel.from_profile(profile)
        config = EngineConfig(
            model_id=self.model_id,
            num_blocks=spec.blocks(spec.kv_pool_gib),
            block_size=spec.block_size,
            eviction=spec.eviction,
            max_num_seqs=spec.max_num_seqs,
            max_num_batched_tokens=spec.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            emit_every_token=False,
        )
        # each replica's device from the start, or until ``slowdown_at_s`` (``devices_at``)
        self._profile = profile
        self._slowed = spec.slowdown_at_s is None
        self.replicas = [
            SimReplica(f"r{i}", EngineCore(SimExecutor(
                self._device(i) if self._slowed else cost,
                block_size=spec.block_size, token_range=(3, 4096)), config))
            for i in range(spec.replicas)
        ]
        self.index = {r.id: i for i, r in enumerate(self.replicas)}
        # what the gateway routes to: the replicas, or servers of ``ranks_hidden`` of them
        ranks = spec.ranks_hidden
        self.servers: dict[str, list[int]] = {
            (self.replicas[k].id if ranks == 1 else f"s{k // ranks}"): list(range(k, k + ranks))
            for k in range(0, len(self.replicas), ranks)}
        # the gateway's own accounting of this fleet (see the module docstring)
        self.states: list[Fleet] = []
        self.capacity: list[CapacityEstimator] = []
        for _ in range(gateways):
            self.add_gateway()
        self._next_scrape = 0.0
        if hashes is not None and (hashes.block_size, hashes.model_id) != (
                spec.block_size, self.model_id):
            raise ValueError("hashes were memoized for another block size or model")
        self.hashes = hashes or PrefixHashes(spec.block_size, self.model_id)

    def add_gateway(self) -> int:
        """One more gateway copy's accounting, fresh (one that starts, or restarts, in
        front of the fleet as it is); its index."""
        configs = [ReplicaConfig(sid, f"http://sim.invalid/{sid}") for sid in self.servers]
        state = Fleet(configs)
        self.states.append(state)
        self.capacity.append(CapacityEstimator(
            state, CapacityEstimateConfig(enabled=self.spec.capacity_estimate)))
        return len(self.states) - 1

    def views(self, now: float, gateway: int = 0) -> list[ReplicaView]:
        """The replica views gateway copy ``gateway`` decides on at ``now`` (see the
        module docstring)."""
        if self.spec.views == "exact":
            return [r.view() for r in self.replicas]
        self.scrape_until(now)
        return self.states[gateway].views(now=now)

    def _device(self, i: int) -> CostModel:
        """Replica ``i``'s device as slow as ``spec.slowdown`` says."""
        slowdown = self.spec.slowdown
        return CostModel.from_profile(self._profile, slowdown[i] if i < len(slowdown) else 1.0)

    def devices_at(self, now: float) -> None:
        """The replicas' devices turn as slow as ``spec.slowdown`` says once ``now`` reaches
        ``spec.slowdown_at_s`` (the simulator calls it before each event: a step begun
        before then ends at the old speed)."""
        if self._slowed or now < self.spec.slowdown_at_s:  # type: ignore[operator]
            return
        self._slowed = True
        for i, replica in enumerate(self.replicas):
            executor = replica.core.executor
            assert isinstance(executor, SimExecutor)
            executor.cost_model = self._device(i)

    def scrape_until(self, now: float) -> None:
        """Take the scrapes due at or before ``now``, each of the replicas as they are now:
        the simulator calls it before each event, so a scrape reads the replicas as they
        were at its own time, not at the next decision's (steps that ended between the
        two would have been in it: less lag than the gateway's)."""
        if self.spec.views == "exact":
            return
        while self._next_scrape <= now:
            self._scrape(range(len(self.states)), self._next_scrape)
            self._next_scrape += self.spec.scrape_interval_s

    def scrape_into(self, gateway: int, now: float) -> None:
        """A scrape of every replica now, for gateway copy ``gateway`` alone: the round a
        gateway takes as it starts, before it serves (``Monitor.start``)."""
        if self.spec.views != "exact":
            self._scrape((gateway,), now)

    def _scrape(self, gateways: Iterable[int], at: float) -> None:
        pages = {sid: summed([self.replicas[k].scraped(self.spec.dialect) for k in ranks])
                 for sid, ranks in self.servers.items()}
        for g in gateways:
            state, capacity = self.states[g], self.capacity[g]
            for sid, scraped in pages.items():
                mark = capacity.mark(sid)
                state.record_scrape(sid, scraped, at)
                capacity.observe(sid, scraped, mark)

    def rank_for(self, server: str) -> int:
        """The replica (index) a request the gateway sent to ``server`` runs on: its own,
        or the rank its server's balancer picks (fewest waiting x 4 + running, as vLLM's
        internal balancer scores them; its exact counts, which vLLM's sees a little late)."""
        ranks = self.servers[server]
        if len(ranks) == 1:
            return ranks[0]

        def score(k: int) -> int:
            sched = self.replicas[k].core.scheduler
            return len(sched.waiting) * 4 + len(sched.running)

        return min(ranks, key=score)

    def add(self, replica: SimReplica, req: WorkloadRequest, token_ids: list[int],
            now: float, shared_len: int | None = None) -> None:
        """Queue ``req`` (prompt ``token_ids``, of which its shared segments take
        ``shared_len``; default: the segments' lengths) on ``replica``."""
        core = replica.core
        # ignore_eos: every answer has exactly ``max_tokens`` tokens, as in the HTTP runs.
        params = SamplingParams(max_tokens=req.max_tokens, ignore_eos=True, seed=req.index)
        request = core.make_request(f"req{req.index}", token_ids, params,
                                    block_hashes=self.hashes.hashes(req, token_ids,
                                                                    shared_len))
        core.add_request(request, now=now)
        replica.routed += 1
        replica.routed_prompt_tokens += len(token_ids)


def summed(pages: list[ScrapedMetrics]) -> ScrapedMetrics:
    """One server's page of its ranks' figures, as ``parse_metrics`` reads a page of several
    engines: counts and capacity add up, KV usage is their mean."""
    if len(pages) == 1:
        return pages[0]

    def total(values: list[float | None]) -> float | None:
        return None if any(v is None for v in values) else sum(v or 0.0 for v in values)

    capacity = total([p.kv_capacity_tokens for p in pages])
    queued = total([p.queued_tokens for p in pages])
    return ScrapedMetrics(
        dialect=pages[0].dialect, running=sum(p.running for p in pages),
        waiting=sum(p.waiting for p in pages),
        kv_usage=sum(p.kv_usage for p in pages) / len(pages),
        kv_capacity_tokens=None if capacity is None else int(capacity),
        queued_tokens=None if queued is None else int(queued),
        hit_tokens=total([p.hit_tokens for p in pages]),
        query_tokens=total([p.query_tokens for p in pages]),
        ran_seconds=total([p.ran_seconds for p in pages]),
        ran_requests=total([p.ran_requests for p in pages]))
