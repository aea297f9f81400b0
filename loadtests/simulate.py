"""Offline fleet simulator: workload -> policy -> replicas, in virtual time, no HTTP.

Events are request arrivals (Poisson, or given times) and step completions. A replica
with work runs one ``EngineCore.step(now)`` at a time; its outputs are stamped
``now + seconds`` and delivered when virtual time reaches that instant, which is also
when the replica starts its next step. An arrival is routed with the replica views of
that instant, added to the chosen core, and starts a step there if the core was idle.
The policy sees ``Routed`` at arrival and ``Finished`` at the finishing step's end.

Usage::

    python -m loadtests.simulate --scenario contracts --replicas 8 --requests 40000 \
        --policies round_robin,least_load,prefix_affinity,radix --json out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import numpy as np

from engine.cost_model import load_profile
from engine.eviction import EVICTION_POLICIES
from gateway.fleet import Pending
from gateway.peer_wire import (
    HEAD_BYTES,
    RoutedElsewhere,
    WireError,
    frame_length,
    parse_frame,
    routed_frame,
    told_to_peers,
)
from gateway.request_parse import ParsedRequest
from gateway.resident_requests import Resident, prompt_head_key
from gateway.routing import Router, work_tokens
from kvwire.arg_types import non_negative_int, positive_float
from kvwire.tokenizer import PromptTokenizer, load_tokenizer
from loadtests.fleet_flags import add_fleet_flags
from loadtests.hot_misses import hot_misses
from loadtests.label_stats import label_token_hit_rates, ttft_tail
from loadtests.oracle import static_oracle, upper_bound
from loadtests.pause import figures_after, pause, paused
from loadtests.placement_oracle import PlacementOracle, oracle_replicas
from loadtests.prefix_hashes import PrefixHashes
from loadtests.replica_prompts import (
    RenderedPrompts,
    ReplicaPrompts,
    WorkloadIds,
    replica_tokens_per_word,
)
from loadtests.scenarios import SCENARIOS
from loadtests.sim_fleet import DIALECTS, FleetSpec, SimFleet, SimReplica
from loadtests.workloads import SegmentContent, WorkloadRequest, build_spec, generate
from policies.base import Finished, Policy, Routed, RouteRequest


@dataclass(slots=True)
class PolicyResult:
    token_hit_rate: float
    request_hit_rate: float
    prefill_tokens: int
    hot_prefill_tokens: int
    # contracts: the hot requests' recomputed shared tokens by cause (``hot_misses``)
    hot_misses: dict[str, dict[str, int]]
    # token hit rate per workload label; the requests at or above the p95 time to first
    # token by label and replica (``label_stats``)
    label_token_hit_rates: dict[str, float]
    ttft_tail: dict[str, Any]
    ttft_p50_s: float
    ttft_p95_s: float
    ttft_p99_s: float
    spills: int
    prompt_tokens: int
    requests: int
    preemptions: int
    reasons: dict[str, int]
    replica_requests: list[int]
    replica_prefill_tokens: list[int]
    load_spread: float  # max / mean of per-replica prefill tokens computed
    # of the requests whose affinity key (document, conversation) came before, the share
    # sent to the replica its previous request went to (chats: later turns kept home)
    same_replica_repeats: float
    mean_idle_kv_blocks: float  # per replica, sampled at arrivals: free + cached-unused
    virtual_seconds: float
    wall_seconds: float
    cpu_seconds: float  # this process's CPU time: the speed figure on a shared machine
    ttft_s: list[float] = field(repr=False)
    cached_tokens: list[int] = field(repr=False, default_factory=list)

    def summary(self) -> dict[str, Any]:
        out = asdict(self)
        del out["ttft_s"], out["cached_tokens"]
        return out


def poisson_arrivals(n: int, rate: float, seed: int) -> np.ndarray:
    """``n`` arrival times of a Poisson process of ``rate`` requests/s, from t=0."""
    if not 0 < rate < math.inf:  # NaN too
        raise ValueError(f"arrival rate must be a positive number, got {rate!r}")
    gaps = np.random.default_rng([seed, 7]).exponential(1.0 / rate, n)
    return np.cumsum(gaps)


def peer_route(route: RouteRequest, replica: str, now: float) -> RouteRequest | None:
    """``route`` as the other gateway copies' policies learn it (``gateway.peers``): through
    the wire's own frame (``peer_wire.routed_frame``), which carries the prompt's piece
    hashes and never its token ids; None where a copy tells nothing: a route keyed by its
    token ids alone (``peer_wire.told_to_peers``) or one the wire refuses (a long affinity
    key)."""
    if not told_to_peers(route):
        return None
    try:
        frame = routed_frame(route, replica)
    except WireError:
        return None
    _, kind = frame_length(frame[:HEAD_BYTES])
    told = parse_frame(kind, frame[HEAD_BYTES:], now)
    assert isinstance(told, RoutedElsewhere)  # a routed frame reads back as one
    return told.request


class _InFlight(NamedTuple):
    request: WorkloadRequest
    route: RouteRequest
    replica: str
    pending: Pending
    gateway: int
    head_key: int  # the prompt's head (gateway.resident_requests)
    # with peers: the request as the other copies count it (copy, its pending)
    peers: tuple[tuple[int, Pending], ...] = ()


def _output_tokens(replica: SimReplica, request_id: str) -> Callable[[], int | None]:
    """What the gateway counts of a streamed answer so far: its tokens generated."""
    requests = replica.core.requests

    def count() -> int | None:
        req = requests.get(request_id)
        return None if req is None else req.num_output_tokens

    return count


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else math.nan


class Simulation:
    """One policy (one per gateway copy) over one fleet; ``run`` consumes the request
    stream once.

    Requests go through the gateway's own path: ``Router.build`` makes each
    ``RouteRequest`` (from token ids, or from chat messages and tools rendered and
    tokenized by the gateway's tokenizer when ``prompts`` is ``"text"``), views come from the
    gateway's ``Fleet`` accounting (see ``sim_fleet``), a replica's answer teaches the
    token calibration. With several gateway copies each request goes to one at random,
    as behind a Kubernetes Service; with ``peers`` each copy is told of the others'
    routes and pending prefill at once (``gateway.peers``: a LAN's round trip is far
    below a step), each route as the peers' wire carries it (``peer_route``: piece
    hashes, no token ids).

    ``restart``: from the ``restart[0]``th request on, the policies ``restart[1]`` (one per
    copy), with fresh accounting, take every request, as a gateway's new pod in a rolling
    update in front of the warm fleet; the old copies see to the requests they sent until
    these finish, and the new ones count them as other senders' (scraped).

    What the replicas compute is ``replica_prompts``: by default the workload's own ids, a
    tokenizer unlike the gateway's; ``RenderedPrompts`` renders and tokenizes each chat as
    a real engine does (``loadtests.run``'s engines: with the gateway's tokenizer, their
    figures are comparable to these).
    """

    def __init__(self, fleet: SimFleet, policy: Policy | Sequence[Policy],
                 tokenizer: PromptTokenizer | None = None, prompts: str = "ids",
                 seed: int = 0, peers: bool = False,
                 replica_prompts: ReplicaPrompts | None = None,
                 restart: tuple[int, Sequence[Policy]] | None = None) -> None:
        if prompts not in ("ids", "text"):
            raise ValueError(f"prompts must be 'ids' or 'text', got {prompts!r}")
        policies = [policy] if isinstance(policy, Policy) else list(policy)
        if len(policies) != len(fleet.states):
            raise ValueError(f"{len(policies)} policies for {len(fleet.states)} gateway copies")
        self.fleet = fleet
        self.policies = policies
        self.policy = policies[0]
        self.prompts = prompts
        self.replica_prompts = replica_prompts or WorkloadIds()
        self.peers = peers and len(policies) > 1
        if restart is not None and len(restart[1]) != len(policies):
            raise ValueError(f"{len(restart[1])} policies after the restart for "
                             f"{len(policies)} gateway copies")
        self._restart = restart
        self._tokenizer = tokenizer = tokenizer or load_tokenizer(None, memo_size=4096)
        self.routers = [Router(p, tokenizer, state, 1)
                        for p, state in zip(policies, fleet.states, strict=True)]
        self._live = range(len(self.routers))  # the copies new requests go to
        self._pick = np.random.default_rng([seed, 11])
        self._heap: list[tuple[float, int, int]] = []  # (step end, tie break, replica)
        self._seq = 0
        self._inflight: dict[str, _InFlight] = {}
        self._resident: dict[str, Resident] = {}  # streaming: first token out, not finished
        self.ttft: dict[int, float] = {}
        self.cached: dict[int, int] = {}
        self.reasons: Counter[str] = Counter()
        self.chosen: dict[int, str] = {}
        self.now = 0.0
        self._idle_blocks = 0  # summed over arrivals and replicas
        # the exact indexes the engines' KV events feed (none unless the fleet publishes)
        self._kv_indexes = [p.kv_index for p in policies if p.kv_index is not None] \
            if fleet.spec.kv_events else []
        for rep in fleet.replicas if self._kv_indexes else ():
            rep.core.kv.pool.events = []

    def close(self) -> None:
        for router in self.routers:
            router.close()

    def _restarted(self) -> None:
        """The restart's copies take over (see the class docstring)."""
        assert self._restart is not None
        first = len(self.routers)
        for policy in self._restart[1]:
            copy = self.fleet.add_gateway()
            self.fleet.scrape_into(copy, self.now)  # its first round, before it serves
            state = self.fleet.states[copy]
            self.policies.append(policy)
            self.routers.append(Router(policy, self._tokenizer, state, 1))
            if self.fleet.spec.kv_events and policy.kv_index is not None:
                # events from now on only: a gateway given kv_events_replay asks each
                # engine to replay the events it still buffers, which this leaves out
                self._kv_indexes.append(policy.kv_index)
        self._live = range(first, len(self.routers))
        self.policy = self.policies[first]

    def _start_step(self, index: int, now: float) -> None:
        rep = self.fleet.replicas[index]
        out = rep.core.step(now)
        if out.num_seqs == 0:
            raise RuntimeError(f"replica {rep.id} has requests but scheduled none at t={now}")
        rep.pending = out.outputs
        rep.busy_until = now + out.seconds
        self._seq += 1
        heapq.heappush(self._heap, (rep.busy_until, self._seq, index))

    def _publish(self, rep: SimReplica) -> None:
        """Apply ``rep``'s KV events since its last step to the policies' indexes."""
        events = rep.core.kv.pool.events
        if events:
            for kv in self._kv_indexes:
                kv.apply(rep.id, rep.kv_seq, events)
            rep.kv_seq += 1
            events.clear()

    def _end_step(self, index: int, now: float) -> None:
        rep = self.fleet.replicas[index]
        outputs, rep.pending, rep.busy_until = rep.pending, [], None
        if self._kv_indexes:
            self._publish(rep)
        for o in outputs:
            f = self._inflight[o.request_id]
            state = self.fleet.states[f.gateway]
            req = f.request
            if req.index not in self.ttft and o.first_token_time is not None:
                self.ttft[req.index] = o.first_token_time - o.arrival_time
                self.cached[req.index] = o.num_cached_tokens
                state.first_byte(f.pending)
                for copy, pending in f.peers:
                    self.fleet.states[copy].first_byte(pending)
                capacity = self.fleet.capacity[f.gateway]
                if not o.finished and capacity.on:  # as the gateway: only for the estimate
                    self._resident[o.request_id] = capacity.resident.started(
                        f.replica, f.route.prompt_tokens, f.head_key,
                        _output_tokens(rep, o.request_id))
            if o.finished:
                del self._inflight[o.request_id]
                resident = self._resident.pop(o.request_id, None)
                if resident is not None:
                    self.fleet.capacity[f.gateway].resident.ended(resident)
                state.done(f.pending)
                for copy, pending in f.peers:
                    self.fleet.states[copy].done(pending)
                told = self.fleet.spec.cached_report  # (else the usage counts 0 cached)
                cached = state.answered(f.replica, f.route.model, f.route.prompt_tokens,
                                        o.num_prompt_tokens,
                                        o.num_cached_tokens if told else 0)
                self.policies[f.gateway].observe(Finished(
                    f.route, f.replica, True, cached, self.ttft.get(req.index),
                    now - f.pending.sent_at, cached_told=told))
        if rep.core.has_unfinished():
            self._start_step(index, now)

    def _parsed(self, req: WorkloadRequest, ids: list[int]) -> ParsedRequest:
        model = self.fleet.model_id
        if self.prompts == "text":
            return ParsedRequest("chat", {}, model, True, None, None, req.messages(), None,
                                 None, req.tools())
        return ParsedRequest("completions", {}, model, True, None, ids, None, None, None)

    def _arrive(self, req: WorkloadRequest, now: float) -> None:
        ids = self.replica_prompts.ids(req)
        live = self._live
        gateway = live[int(self._pick.integers(len(live)))] if len(live) > 1 else live[0]
        router = self.routers[gateway]
        parsed = self._parsed(req, ids)
        route = router.build(parsed, now=now)
        replicas = self.fleet.replicas
        self._idle_blocks += sum(r.core.kv.pool.num_free_blocks for r in replicas)
        views = self.fleet.views(now, gateway)
        decision = router.policy.choose(route, views)
        self.reasons[decision.reason] += 1
        target = decision.chosen  # a replica, or a server whose balancer picks the rank
        index = self.fleet.rank_for(target)
        rep: SimReplica = replicas[index]
        self.chosen[req.index] = rep.id
        self.fleet.add(rep, req, ids, now, self.replica_prompts.shared_len(req))
        work = work_tokens(route, decision, target)
        pending = self.fleet.states[gateway].sent(target, work, now)
        head = prompt_head_key(parsed) if self.fleet.capacity[gateway].on else 0
        router.policy.observe(Routed(route, target, views))
        told: tuple[tuple[int, Pending], ...] = ()
        if self.peers:  # as gateway.peers: the others count it and learn what the wire
            # carries of it
            told = tuple((copy, self.fleet.states[copy].sent(target, work, now))
                         for copy in self._live if copy != gateway)
            heard = peer_route(route, target, now)
            if heard is not None:
                for copy, _ in told:  # told once: no Unrouted or Finished follows there
                    self.policies[copy].observe(Routed(heard, target, revocable=False))
        self._inflight[f"req{req.index}"] = _InFlight(req, route, target, pending, gateway,
                                                      head, told)
        if rep.busy_until is None:
            self._start_step(index, now)

    def run(self, requests: Sequence[WorkloadRequest],
            arrivals: Sequence[float] | np.ndarray) -> None:
        times = np.asarray(arrivals, dtype=np.float64)
        if not np.all(np.isfinite(times)):
            bad = float(times[~np.isfinite(times)][0])
            raise ValueError(f"arrival times must be finite, got {bad!r}")
        back = np.flatnonzero(np.diff(times) < 0)
        if back.size:  # virtual time would go back
            i = int(back[0]) + 1
            raise ValueError(f"arrival times must not decrease: request {i} at "
                             f"{float(times[i])!r} s after {float(times[i - 1])!r} s")
        heap = self._heap
        i, n = 0, len(requests)
        while i < n or heap:
            next_arrival = arrivals[i] if i < n else math.inf
            # the scrapes due before this event read the replicas as they are until it
            at = min(heap[0][0], next_arrival) if heap else next_arrival
            self.fleet.devices_at(at)
            self.fleet.scrape_until(at)
            if heap and heap[0][0] <= next_arrival:
                self.now, _, index = heapq.heappop(heap)
                self._end_step(index, self.now)
            else:
                self.now = float(next_arrival)
                if self._restart is not None and i == self._restart[0]:
                    self._restarted()
                self._arrive(requests[i], self.now)
                i += 1

    def _same_replica_repeats(self, requests: Sequence[WorkloadRequest]) -> float:
        last: dict[str, str] = {}
        repeats = same = 0
        for req in sorted(requests, key=lambda r: r.index):
            replica = self.chosen[req.index]
            before = last.get(req.affinity_key)
            if before is not None:
                repeats += 1
                same += before == replica
            last[req.affinity_key] = replica
        return same / repeats if repeats else 0.0

    def result(self, requests: Sequence[WorkloadRequest], wall: float,
               cpu: float) -> PolicyResult:
        stats = [r.core.stats for r in self.fleet.replicas]
        queries = sum(s.prefix_cache_queries for s in stats)
        hits = sum(s.prefix_cache_hits for s in stats)
        per_replica_prefill = [
            s.prefix_cache_queries - s.prefix_cache_hits + s.recompute_queries - s.recompute_hits
            for s in stats
        ]
        mean_prefill = sum(per_replica_prefill) / len(per_replica_prefill)
        prompts = self.replica_prompts
        hot = sum(prompts.prompt_len(r) - self.cached[r.index] for r in requests
                  if r.label == "hot")
        ttft = [self.ttft[r.index] for r in requests]
        return PolicyResult(
            token_hit_rate=hits / queries if queries else 0.0,
            request_hit_rate=sum(1 for c in self.cached.values() if c > 0) / len(requests),
            prefill_tokens=sum(per_replica_prefill),
            hot_prefill_tokens=hot,
            hot_misses=hot_misses(requests, self.chosen, self.cached,
                                  self.fleet.spec.block_size, prompts),
            label_token_hit_rates=label_token_hit_rates(
                (r.label, prompts.prompt_len(r), self.cached[r.index]) for r in requests),
            ttft_tail=ttft_tail([(r.label, self.chosen[r.index], self.ttft[r.index])
                                 for r in requests], [r.id for r in self.fleet.replicas]),
            ttft_p50_s=percentile(ttft, 50),
            ttft_p95_s=percentile(ttft, 95),
            ttft_p99_s=percentile(ttft, 99),
            spills=self.reasons.get("spill", 0),
            prompt_tokens=queries,
            requests=len(requests),
            preemptions=sum(s.num_preemptions for s in stats),
            reasons=dict(self.reasons),
            replica_requests=[r.routed for r in self.fleet.replicas],
            same_replica_repeats=self._same_replica_repeats(requests),
            replica_prefill_tokens=per_replica_prefill,
            load_spread=max(per_replica_prefill) / mean_prefill if mean_prefill else 1.0,
            mean_idle_kv_blocks=self._idle_blocks / len(requests) / len(self.fleet.replicas),
            virtual_seconds=self.now,
            wall_seconds=wall,
            cpu_seconds=cpu,
            ttft_s=ttft,
            cached_tokens=[self.cached[r.index] for r in requests],
        )


def simulate(requests: Sequence[WorkloadRequest], arrivals: Sequence[float] | np.ndarray,
             policy: Policy | Sequence[Policy], fleet_spec: FleetSpec,
             hashes: PrefixHashes | None = None, prompts: str = "ids",
             tokenizer: PromptTokenizer | None = None, seed: int = 0,
             peers: bool = False, replica_prompts: ReplicaPrompts | None = None,
             restart: tuple[int, Sequence[Policy]] | None = None) -> PolicyResult:
    """Run ``requests`` arriving at ``arrivals`` through a fresh fleet under ``policy``
    (a sequence: one policy per gateway copy; ``peers``: the copies tell each other what
    they route; ``restart``: see ``Simulation``).

    ``hashes`` may be shared between runs over the same requests (it only memoizes).
    """
    if len(arrivals) != len(requests):
        raise ValueError(f"{len(arrivals)} arrival times for {len(requests)} requests")
    copies = 1 if isinstance(policy, Policy) else len(policy)
    started, cpu = time.perf_counter(), time.process_time()
    sim = Simulation(SimFleet(fleet_spec, hashes, gateways=copies), policy, tokenizer,
                     prompts, seed, peers, replica_prompts, restart)
    try:
        sim.run(requests, arrivals)
    finally:
        sim.close()
    return sim.result(requests, time.perf_counter() - started, time.process_time() - cpu)


def build_policy(name: str, **overrides: Any) -> Policy:
    """A policy with its preset's parameters (``policies/presets/<name>.yaml``), some of
    them replaced by ``overrides``."""
    from policies.registry import build_policy as build
    from policies.registry import load_preset

    return build({**load_preset(name), **overrides}, where=f"policy {name}")


def _parse_params(items: Sequence[str]) -> dict[str, Any]:
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set expects KEY=VALUE, got {item!r}")
        if key == "seed":  # the run's own option, which every part of the run follows
            raise SystemExit("--set seed=...: the workload's seed is --seed")
        if key == "rate":  # replaced by --rate (default: the scenario's, scaled)
            raise SystemExit("--set rate=...: the arrival rate is --rate")
        out[key] = yaml.safe_load(value)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", default="contracts", choices=sorted(SCENARIOS))
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--requests", type=int, default=40_000)
    parser.add_argument("--policies", default="round_robin,least_load,prefix_affinity,radix",
                        help="comma-separated policy names; placement_oracle:H (contract "
                        "workloads) is a clairvoyant reference placement, hot documents on H "
                        "replicas, not a policy")
    parser.add_argument("--eviction", choices=EVICTION_POLICIES, default="lru")
    parser.add_argument("--views", choices=("gateway", "exact"), default="gateway",
                        help="what policies see: the gateway's accounting with lagging "
                             "scrapes (default) or each replica's exact state")
    parser.add_argument("--dialect", choices=DIALECTS, default="vllm",
                        help="the replicas' /metrics: vLLM's (no queue gauge), kvgate's, or "
                             "vLLM's without cache_config_info (capacity then estimated "
                             "from KV usage)")
    parser.add_argument("--no-capacity-estimate", dest="capacity_estimate",
                        action="store_false",
                        help="the gateway does not estimate KV capacity from KV usage "
                             "(with --dialect vllm-no-capacity: policies see none)")
    parser.add_argument("--kv-events", action="store_true",
                        help="the engines publish KV events to policies with an exact index "
                             "(kv_events, cost); with --prompts text the engines' token ids "
                             "are not the gateway's, so no prompt matches them")
    parser.add_argument("--scrape-interval", type=positive_float, default=1.0,
                        help="seconds of virtual time between scrapes")
    parser.add_argument("--ranks-hidden", type=int, default=1, metavar="N",
                        help="the replicas are servers of N data-parallel ranks each, whose "
                             "own balancer picks the rank by queue (vLLM's internal one); "
                             "the gateway routes to the servers (default 1: to each "
                             "replica, as with data_parallel_size)")
    add_fleet_flags(parser, "the replicas")
    parser.add_argument("--gateways", type=int, default=1,
                        help="gateway copies, each given a random share of the requests")
    parser.add_argument("--peers", action="store_true",
                        help="the gateway copies tell each other what they route and the "
                             "prefill they left pending (the gateway's peers); needs "
                             "--gateways 2 or more")
    parser.add_argument("--prompts", choices=("ids", "text"), default=None,
                        help="what the gateway gets: token ids, or chat text it tokenizes "
                             "itself (default: per scenario)")
    parser.add_argument("--engine-tokenizer", default="ids", metavar="ids|gateway|DIR",
                        help="what the replicas tokenize: 'ids' (default) gives them the "
                        "workload's own token ids, a tokenizer unlike the gateway's; "
                        "'gateway' or a tokenizer directory makes them render each chat "
                        "and tokenize it, as loadtests.run's engines do (needs --prompts "
                        "text; each prompt is encoded once, before the runs)")
    parser.add_argument("--rate", type=positive_float, default=None,
                        help="arrival rate in requests/s (default: per scenario, scaled "
                             "by replicas / 8)")
    parser.add_argument("--profile", default=None, help="default: per scenario")
    parser.add_argument("--kv-pool-gib", type=positive_float, default=None,
                        help="default: per scenario")
    parser.add_argument("--idle-kv-gib", type=positive_float, default=None,
                        help="default: per scenario")
    parser.add_argument("--max-num-seqs", type=int, default=None, help="default: per scenario")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slowdown-after", type=non_negative_int, default=None,
                        metavar="N", help="--slowdown's devices turn slow as the Nth request "
                        "arrives (before, every replica runs at the profile's speed: a "
                        "device that throttles or degrades mid-run); the JSON's "
                        "after_slowdown gives the token hit rate and p95 TTFT of the 1,000 "
                        "requests after it")
    parser.add_argument("--restart-after", type=non_negative_int, default=None,
                        metavar="N", help="a fresh gateway (new policy state and "
                        "accounting) takes every request from the Nth on, in front of the "
                        "warm fleet, as in a rolling update (the old one sees its requests "
                        "through); the JSON's after_restart gives the token hit rate and "
                        "p95 TTFT of the 1,000 requests after it (--pause N:0 gives the "
                        "same window's without a restart)")
    parser.add_argument("--pause", type=pause, default=None, metavar="N:S",
                        help="after the Nth request, S seconds without arrivals (a lull, "
                             "as a night's), then the rest; the JSON's after_pause gives "
                             "the token hit rate and p95 TTFT of the 1,000 requests after it "
                             "(N:0 for the same figures without a lull)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="workload parameter, e.g. --set popularity=zipf")
    parser.add_argument("--policy-set", action="append", default=[],
                        metavar="POLICY.KEY=VALUE",
                        help="policy parameter over its preset, e.g. prefix_affinity.overload=2")
    parser.add_argument("--json", dest="json_path", default=None)
    parser.add_argument("--plot", dest="plot_path", default=None)


def _replica_prompts(engine_tokenizer: str, prompts: str) -> tuple[ReplicaPrompts, float]:
    """``--engine-tokenizer``: what the replicas compute of each request, and the tokens
    per word to draw the text at (``replica_tokens_per_word``: each segment about its
    nominal length in the replicas' tokens, as ``loadtests.run``'s clients draw it)."""
    if engine_tokenizer == "ids":
        return WorkloadIds(), replica_tokens_per_word(None)
    if prompts != "text":
        raise SystemExit(f"--engine-tokenizer {engine_tokenizer} needs --prompts text (the "
                         "replicas tokenize the chat the gateway is sent)")
    path = None if engine_tokenizer == "gateway" else engine_tokenizer
    try:
        return RenderedPrompts(load_tokenizer(path)), replica_tokens_per_word(path)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--engine-tokenizer {engine_tokenizer}: {exc}") from None


def policy_names(names_csv: str, policy_set: Sequence[str] = ()
              ) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """``--policies`` and ``--policy-set``: the names, and each one's parameters over its
    preset, every one built once to check it (``ValueError`` naming a bad name, key or
    value, or a parameter for a policy not run) before any run."""
    names = [p.strip() for p in names_csv.split(",") if p.strip()]
    if not names:
        raise ValueError("no policy to run: --policies names none")
    overrides: dict[str, dict[str, Any]] = {}
    for key, value in _parse_params(policy_set).items():
        name, _, param = key.partition(".")
        if name not in names or not param:
            raise ValueError(f"--policy-set {key}={value!r}: expects POLICY.KEY=VALUE for a "
                             f"policy of --policies ({', '.join(names)})")
        overrides.setdefault(name, {})[param] = value
    for name in names:
        if oracle_replicas(name) is not None:  # built from the requests, in run
            if name in overrides:
                raise ValueError(f"--policy-set: {name} takes no parameters")
            continue
        build_policy(name, **overrides.get(name, {}))
    return names, overrides


def _copies(name: str, overrides: dict[str, dict[str, Any]], gateways: int) -> list[Policy]:
    """A fresh policy ``name`` (its preset and ``overrides``) per gateway copy."""
    return [build_policy(name, **overrides.get(name, {})) for _ in range(gateways)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.peers and args.gateways < 2:  # one copy has no peer: nothing would be told
        raise ValueError(f"--peers needs --gateways 2 or more (gateway copies to tell each "
                         f"other what they route), got --gateways {args.gateways}")
    scenario = SCENARIOS[args.scenario]
    names, overrides = policy_names(args.policies, args.policy_set)
    spec = build_spec(scenario.workload, seed=args.seed,
                      **{**scenario.params, **_parse_params(args.set)})
    pick = lambda value, default: default if value is None else value  # noqa: E731
    profile = pick(args.profile, scenario.profile)
    fleet = FleetSpec(replicas=args.replicas, profile=profile,
                      kv_pool_gib=pick(args.kv_pool_gib, scenario.kv_pool_gib),
                      idle_kv_gib=pick(args.idle_kv_gib, scenario.idle_kv_gib),
                      max_num_seqs=pick(args.max_num_seqs, scenario.max_num_seqs),
                      eviction=args.eviction, views=args.views, dialect=args.dialect,
                      scrape_interval_s=args.scrape_interval,
                      capacity_estimate=args.capacity_estimate, kv_events=args.kv_events,
                      ranks_hidden=args.ranks_hidden, slowdown=args.slowdown,
                      cached_report=args.cached_report)
    fleet.validate()
    rate = args.rate if args.rate is not None else scenario.rate * args.replicas / 8
    if hasattr(spec, "rate"):  # the workload times its own arrivals
        spec = dataclasses.replace(spec, rate=rate)
    prompts = args.prompts or scenario.prompts
    replica_prompts, tokens_per_word = _replica_prompts(args.engine_tokenizer, prompts)
    requests = generate(spec, args.requests, SegmentContent(spec.seed, tokens_per_word))
    if all(r.arrival_s is not None for r in requests):
        arrivals = np.array([r.arrival_s for r in requests])
    else:
        arrivals = poisson_arrivals(len(requests), rate, args.seed)
    arrivals = paused(arrivals, args.pause)
    if args.slowdown_after is not None:
        if not fleet.slowdown or args.slowdown_after >= len(requests):
            raise ValueError(f"--slowdown-after {args.slowdown_after} needs --slowdown and "
                             f"more requests than that, got {len(requests)}")
        fleet = dataclasses.replace(fleet, slowdown_at_s=float(arrivals[args.slowdown_after]))
    if args.restart_after is not None and not 0 < args.restart_after < len(requests):
        raise ValueError(f"--restart-after {args.restart_after} needs a request before it "
                         f"and one from it on, got {len(requests)} requests")
    tokenizer = load_tokenizer(None, memo_size=4096) if prompts == "text" else None
    hashes = PrefixHashes(fleet.block_size, load_profile(profile).model.name)
    # a true bound (an unlimited cache), and a fixed placement in the fleet's idle KV, which
    # a policy can beat where caches turn over (chat-apps): loadtests.oracle
    bound = upper_bound(requests, hashes, replica_prompts)
    static = static_oracle(requests, hashes, args.replicas * fleet.blocks(fleet.idle_kv_gib),
                           replica_prompts)
    report: dict[str, Any] = {
        "scenario": args.scenario,
        "eviction": args.eviction,
        "replicas": args.replicas,
        "requests": len(requests),
        "arrival_rate": rate,
        "gateways": args.gateways,
        "peers": args.peers,
        "prompts": prompts,
        "engine_tokenizer": args.engine_tokenizer,
        "pause": None if args.pause is None else args.pause._asdict(),
        "restart_after": args.restart_after,
        "views": args.views,
        "dialect": args.dialect,
        "kv_events": args.kv_events,
        "profile": profile,
        "fleet": asdict(fleet),
        "workload": asdict(spec),
        # no policy reaches more: every block's first computation the only miss
        "upper_bound_token_hit_rate": bound.token_hit_rate,
        # the best fixed set of blocks in the fleet's idle KV: a reference, not a bound
        "static_oracle_token_hit_rate": static.token_hit_rate,
        "policies": {},
    }
    results: dict[str, PolicyResult] = {}
    report["policy_overrides"] = overrides
    for name in names:
        hot_replicas = oracle_replicas(name)
        if hot_replicas is not None:  # a reference that reads the requests in order
            if args.gateways > 1:
                raise ValueError(f"{name} runs in one gateway copy, got --gateways "
                                 f"{args.gateways}")
            if args.restart_after is not None:
                raise ValueError(f"{name} reads the requests from the start: no restart")
            copies: list[Policy] = [PlacementOracle(requests, hot_replicas)]
        else:
            copies = _copies(name, overrides, args.gateways)
        restart = None if args.restart_after is None else (
            args.restart_after, _copies(name, overrides, args.gateways))
        res = simulate(requests, arrivals, copies, fleet, hashes, prompts, tokenizer,
                       args.seed, args.peers, replica_prompts, restart)
        results[name] = res
        report["policies"][name] = res.summary()
        print(f"{name:>16}: token hit {res.token_hit_rate:.3f}  request hit "
              f"{res.request_hit_rate:.3f}  ttft p50/p95/p99 {res.ttft_p50_s:.3f}/"
              f"{res.ttft_p95_s:.3f}/{res.ttft_p99_s:.3f} s  spills {res.spills}  "
              f"({len(requests) / res.cpu_seconds:,.0f} req per CPU second)", file=sys.stderr)
        for key, start, what in (("after_pause", args.pause and args.pause.after, "pause"),
                                 ("after_slowdown", args.slowdown_after, "slowdown"),
                                 ("after_restart", args.restart_after, "restart")):
            if start is None:
                continue
            after = report["policies"][name][key] = figures_after(
                start, [replica_prompts.prompt_len(r) for r in requests],
                res.cached_tokens, res.ttft_s)
            print(f"{'':>18}the {after['requests']:,} requests after the {what}: token hit "
                  f"{after['token_hit_rate']:.3f}, ttft p95 {after['ttft_p95_s']:.3f} s",
                  file=sys.stderr)
        if any(m["requests"] for m in res.hot_misses.values()):
            print(f"{'':>18}hot misses (requests / shared tokens): " + ", ".join(
                f"{cause} {m['requests']:,} / {m['tokens']:,}"
                for cause, m in res.hot_misses.items()), file=sys.stderr)
        if len(res.label_token_hit_rates) > 1:
            tail = res.ttft_tail
            print(f"{'':>18}token hit by label: " + ", ".join(
                f"{label} {rate:.3f}" for label, rate in res.label_token_hit_rates.items())
                + "; at or above p95: " + ", ".join(
                    f"{label} {n}" for label, n in tail["by_label"].items())
                + " (by replica: " + " ".join(map(str, tail["by_replica"])) + ")",
                file=sys.stderr)
    print(f"{'static oracle':>16}: token hit {static.token_hit_rate:.3f}  (the best fixed set "
          "of blocks in the fleet's idle KV; not a bound)", file=sys.stderr)
    print(f"{'upper bound':>16}: token hit {bound.token_hit_rate:.3f}  (an unlimited cache: "
          "each block's first computation the only miss)", file=sys.stderr)
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(report, f, indent=2)
    if args.plot_path:
        from loadtests.plots import plot_policies

        plot_policies(args.plot_path, {k: (v.token_hit_rate, v.ttft_s) for k, v in
                                       results.items()},
                      upper_bound=bound.token_hit_rate,
                      static_oracle=static.token_hit_rate,
                      title=f"{args.scenario}: {args.replicas} replicas, {rate:g} req/s, "
                            f"eviction {args.eviction}")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.simulate",
                                     description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.requests < 1:
        parser.error(f"--requests must be >= 1, got {args.requests}")
    try:
        run(args)
    except (ValueError, FileNotFoundError) as exc:  # a setting the run cannot take
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
