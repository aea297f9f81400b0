"""Benchmark of the routing policies' ``choose()`` latency and the memory of the ones that
model the fleet's caches.

    python -m loadtests.bench_policies --json bench.json [--replicas 8 64 512] [--quick]

Workload (the contract library): ``--documents`` synthetic documents of ``--doc-tokens``
random token ids; each prompt is one document plus a 60-100-token question; the 250 most
active documents get 80% of prompts. For each replica count, every policy first routes
``--warmup`` prompts (``choose``, ``observe(Routed)``, then ``observe(Finished)``, queues
kept as the prompt tokens of the last ``2 x replicas`` routed requests), then ``choose`` is
timed on ``--samples`` more prompts passed as plain lists of ints (what a tokenizer
returns). Tokenization (and, for a policy with ``chunk_chars``, chunk hashing) is not part
of the figures. Memory of ``radix`` and ``cost``: ``tracemalloc``'s count of the bytes
allocated while building and warming the policy and still live afterwards (the fleet's own
few KB included), next to the radix tree's own estimate; timing runs with tracing off.
``observe_p50_us``: the median of the ``observe(Routed)`` after each timed choice (a policy
that learns from what it routed pays it on every request too). ``full_collection_ms``: one
full garbage collection with the warmed-up policy alive (it walks every object the
collector tracks, on the gateway's event loop). ``gateway_views_us``: the
median time of the gateway's replica snapshots (``Fleet.views``) per replica count, which
every decision starts from. ``ring_join_ms``: building a ring of that many replicas from
nothing, and again when one joins (prefix_affinity's 1,024 points a replica, cost's 256).
``cost_long_prompt``: ``cost``'s median ``choose`` and ``observe`` on
``--long-tokens``-token prompts (a long-context request), 8 replicas.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
import tracemalloc
from array import array
from collections import deque
from collections.abc import Sequence
from typing import Any

from kvwire.arg_types import positive_int
from loadtests.json_out import print_json
from policies.base import Finished, Policy, ReplicaView, Routed, RouteRequest
from policies.prompt_chunks import IDS_PER_CHUNK, id_chunks
from policies.radix import Radix
from policies.registry import POLICY_NAMES, build_policy, load_preset

TRACED = ("radix", "cost")  # policies whose memory grows with traffic
HOT_DOCS = 250
HOT_SHARE = 0.8
VOCAB = 150_000


def make_library(n_docs: int, doc_tokens: int, rng: random.Random) -> list[array]:
    return [
        array("I", (rng.randrange(VOCAB) for _ in range(doc_tokens))) for _ in range(n_docs)
    ]


def prompts(library: Sequence[array], n: int, rng: random.Random) -> list[array]:
    hot = min(HOT_DOCS, len(library))
    out = []
    for _ in range(n):
        if rng.random() < HOT_SHARE or hot == len(library):
            doc = library[rng.randrange(hot)]
        else:
            doc = library[rng.randrange(hot, len(library))]
        question = array("I", (rng.randrange(VOCAB) for _ in range(rng.randint(60, 100))))
        out.append(doc + question)
    return out


class Fleet:
    """Replica views whose queues hold the prompt tokens of the last few routed requests."""

    def __init__(self, n: int, capacity: int) -> None:
        self.ids = [f"replica-{i:03d}" for i in range(n)]
        self.queued = dict.fromkeys(self.ids, 0)
        self.recent: deque[tuple[str, int]] = deque()
        self.depth = 2 * n
        self.capacity = capacity

    def views(self) -> list[ReplicaView]:
        return [
            ReplicaView(rid, queued_tokens=self.queued[rid], kv_capacity_tokens=self.capacity)
            for rid in self.ids
        ]

    def routed(self, rid: str, tokens: int) -> None:
        self.queued[rid] += tokens
        self.recent.append((rid, tokens))
        if len(self.recent) > self.depth:
            old, size = self.recent.popleft()
            self.queued[old] -= size


def run_one(
    name: str, replicas: int, warm: list[array], timed: list[array], capacity: int
) -> tuple[dict[str, float], Policy, int | None]:
    """Warm up (under tracemalloc for the policies that keep a model of the fleet's
    caches), then time ``choose`` untraced."""
    gc.collect()
    tracing = name in TRACED
    if tracing:
        tracemalloc.start()
    policy = build_policy(load_preset(name))
    fleet = Fleet(replicas, capacity)
    for i, tokens in enumerate(warm):
        req = _request(policy, tokens, f"w{i}", at=i * 0.02)
        views = fleet.views()
        rid = policy.choose(req, views).chosen
        policy.observe(Routed(req, rid, views))
        # ended, as the gateway tells it: what a policy keeps of a request until its end
        # (its tries, to count a retry once) is not counted in the memory of its traffic
        policy.observe(Finished(req, rid, ok=True))
        fleet.routed(rid, len(tokens))
    traced = None
    if tracing:
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
    # a full collection walks every object the collector tracks: the pause (on the
    # gateway's event loop) that the policy's warmed-up state adds to every one of them
    gc.collect()
    started = time.perf_counter()
    gc.collect()
    full_collection_ms = (time.perf_counter() - started) * 1e3
    samples, observed = [], []
    for i, tokens in enumerate(timed):
        req = _request(policy, tokens, f"t{i}", as_list=True, at=(len(warm) + i) * 0.02)
        choose_us, observe_us = _timed_route(policy, fleet, req, len(tokens))
        samples.append(choose_us)
        observed.append(observe_us)
    samples.sort()
    p99 = samples[min(len(samples) - 1, int(0.99 * len(samples)))]
    figures = {"p50_us": round(statistics.median(samples), 1), "p99_us": round(p99, 1),
               "observe_p50_us": round(statistics.median(observed), 1),
               "full_collection_ms": round(full_collection_ms, 1)}
    return figures, policy, traced


def _timed_route(policy: Policy, fleet: Fleet, req: RouteRequest, tokens: int
                 ) -> tuple[float, float]:
    """Route ``req`` over ``fleet``: microseconds of ``choose`` and of the
    ``observe(Routed)`` after it."""
    clock = time.perf_counter_ns
    views = fleet.views()
    start = clock()
    rid = policy.choose(req, views).chosen
    chosen = clock()
    policy.observe(Routed(req, rid, views))
    observed = clock()
    fleet.routed(rid, tokens)
    return (chosen - start) / 1000, (observed - chosen) / 1000


def _request(policy: Policy, tokens: array, rid: str, as_list: bool = False,
             at: float = 0.0) -> RouteRequest:
    need = policy.tokens_needed
    head: Any = tokens if need is None else tokens[:need]
    chunks = id_chunks(tokens) if policy.chunk_chars > 0 else ()
    return RouteRequest(head.tolist() if as_list else head, len(tokens), request_id=rid,
                        arrival_s=at, chunks=chunks, chunk_tokens=float(IDS_PER_CHUNK))


def long_prompt_us(tokens: int, replicas: int = 8, documents: int = 8, asks: int = 4,
                   seed: int = 3) -> dict[str, float]:
    """``cost``'s median ``choose`` and ``observe(Routed)`` on ``tokens``-token prompts
    (``documents`` documents asked ``asks`` times each, in turn, each time with another
    question): what one long-context request costs the event loop to route and to
    remember."""
    rng = random.Random(seed)
    library = make_library(documents, tokens, rng)
    policy = build_policy(load_preset("cost"))
    fleet = Fleet(replicas, 4 * tokens)
    chosen, observed = [], []
    for ask in range(asks):
        for d, doc in enumerate(library):
            prompt = doc + array("I", (rng.randrange(VOCAB) for _ in range(80)))
            req = _request(policy, prompt, f"l{ask}-{d}", as_list=True,
                           at=(ask * documents + d) * 0.02)
            choose_us, observe_us = _timed_route(policy, fleet, req, len(prompt))
            chosen.append(choose_us)
            observed.append(observe_us)
    return {"tokens": tokens, "choose_p50_us": round(statistics.median(chosen), 1),
            "observe_p50_us": round(statistics.median(observed), 1)}


def views_us(replicas: int, samples: int = 2000) -> float:
    """Median microseconds of the gateway's ``Fleet.views`` over ``replicas`` scraped
    replicas with requests in flight and a token ratio learned anew between calls (as
    every answer does): the snapshot every decision starts from."""
    from gateway.config import ReplicaConfig
    from gateway.fleet import Fleet
    from gateway.replica_metrics import ScrapedMetrics

    fleet = Fleet([ReplicaConfig(f"replica-{i:03d}", f"http://127.0.0.1:{10_000 + i}")
                   for i in range(replicas)])
    for i, state in enumerate(fleet):
        fleet.record_scrape(state.id, ScrapedMetrics("vllm", running=i % 4, waiting=1,
                                                     kv_capacity_tokens=200_000,
                                                     queued_tokens=1000, hit_tokens=5.0 * i,
                                                     query_tokens=10.0 * i), now=0.0)
        fleet.sent(state.id, 500 + i, now=1.0)
    clock = time.perf_counter_ns
    times = []
    for i in range(samples):
        fleet.calibration.observe(None, 900 + i % 7, 1000)  # the ratio moves every answer
        start = clock()
        fleet.views(None, now=2.0)
        times.append((clock() - start) / 1000)
    return round(statistics.median(times), 1)


def ring_join_ms(replicas: int, vnodes: int, rounds: int = 5) -> dict[str, float]:
    """Milliseconds to build the ring of ``replicas`` members of ``vnodes`` points each
    from nothing (a gateway's start; each member's points hashed), and the median to build
    it again when one member joins (every membership change: discovery, the admin API),
    on the event loop either way."""
    from policies import ring

    ring._points_kept.clear()
    members = [(f"replica-{i:03d}", 1.0) for i in range(replicas)]
    start = time.perf_counter()
    ring.Ring(members, vnodes)
    first = (time.perf_counter() - start) * 1000
    joins = []
    for k in range(rounds):
        start = time.perf_counter()
        ring.Ring([*members, (f"joining-{k}", 1.0)], vnodes)
        joins.append((time.perf_counter() - start) * 1000)
    return {"vnodes": vnodes, "first_build_ms": round(first, 2),
            "one_joins_ms": round(statistics.median(joins), 2)}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="PATH", help="also write the results here")
    ap.add_argument("--replicas", type=positive_int, nargs="+", default=[8, 64, 512])
    ap.add_argument("--policies", nargs="+", default=list(POLICY_NAMES), choices=POLICY_NAMES)
    ap.add_argument("--documents", type=positive_int, default=None, help="(default 2,000)")
    ap.add_argument("--doc-tokens", type=positive_int, default=6000)
    ap.add_argument("--warmup", type=positive_int, default=None, help="(default 20,000)")
    ap.add_argument("--samples", type=positive_int, default=None, help="(default 2,000)")
    ap.add_argument("--capacity", type=positive_int, default=200_000, help="KV capacity in tokens")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true",
                    help="small run: 200 docs, 2,000 warm-up, 500 samples (unless given)")
    ap.add_argument("--long-tokens", type=int, default=131_072,
                    help="cost's choose and observe on prompts this long, 8 replicas "
                    "(cost_long_prompt; 0: skip)")
    args = ap.parse_args(argv)
    sizes = (200, 2000, 500) if args.quick else (2000, 20_000, 2000)
    for name, size in zip(("documents", "warmup", "samples"), sizes, strict=True):
        if getattr(args, name) is None:  # what the command line gave stays
            setattr(args, name, size)
    rng = random.Random(args.seed)
    library = make_library(args.documents, args.doc_tokens, rng)
    warm = prompts(library, args.warmup, rng)
    timed = prompts(library, args.samples, rng)
    results: dict[str, Any] = {name: {} for name in args.policies}
    memory: dict[str, Any] = {}
    for n in args.replicas:
        for name in args.policies:
            figures, policy, traced = run_one(name, n, warm, timed, args.capacity)
            results[name][str(n)] = figures
            if traced is not None:
                entry: dict[str, Any] = {"tracemalloc_mb": round(traced / 2**20, 1)}
                if isinstance(policy, Radix):
                    tree = policy.tree
                    entry.update(estimate_mb=round(tree.estimated_bytes() / 2**20, 1),
                                 nodes=tree.nodes, tokens=tree.total_tokens)
                memory.setdefault(name, {})[str(n)] = entry
                policy.check_integrity()  # type: ignore[attr-defined]
            del policy
            print(f"{name:16s} {n:4d} replicas: {results[name][str(n)]}", flush=True)
    results["gateway_views_us"] = {str(n): views_us(n) for n in args.replicas}
    # prefix_affinity's ring (1,024 points a replica) and cost's (256)
    results["ring_join_ms"] = {str(n): {name: ring_join_ms(n, v) for name, v in (
        ("prefix_affinity", 1024), ("cost", 256))} for n in args.replicas}
    if "cost" in args.policies and args.long_tokens > 0:
        results["cost_long_prompt"] = long_prompt_us(args.long_tokens)
        print(f"cost, {args.long_tokens}-token prompts: {results['cost_long_prompt']}",
              flush=True)
    for name, by_count in memory.items():
        key = "64" if "64" in by_count else next(iter(by_count))
        results[f"{name}_memory_mb"] = by_count[key]["tracemalloc_mb"]
        results[f"{name}_memory"] = by_count
    results["workload"] = {
        "documents": args.documents,
        "doc_tokens": args.doc_tokens,
        "warmup": args.warmup,
        "samples": args.samples,
        "capacity_tokens": args.capacity,
        "memory_method": "tracemalloc (live bytes allocated by the policy), plus estimate",
    }
    print_json(results, args.json)
    return results


if __name__ == "__main__":
    main()
