"""The bounded simulation behind ``kvgate plan``: each policy over the same requests.

The fleet: ``replicas`` LRU engines of the given profile whose KV pool is the idle KV
plus room for the requests running at once (a scenario's own margin, else four of the
workload's prompts: the short answers of these workloads keep few running); arrivals
Poisson at ``rate`` unless the workload times its own.

Token hit rate and hot prefill are counted in the steady state: over the requests after the first
``WARMUP_SHARE`` of the run, once every policy has filled its caches (the first touch of
each hot document costs a prefill under any policy, and a short run would be mostly that).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from engine.cost_model import load_profile
from engine.kv_sizing import GIB
from kvwire.tokenizer import load_tokenizer
from loadtests.plan_workload import PlanWorkload
from loadtests.prefix_hashes import PrefixHashes
from loadtests.sim_fleet import FleetSpec
from loadtests.simulate import build_policy, poisson_arrivals, simulate

RUNNING_PROMPTS = 4  # prompts' worth of KV pinned by running requests, beyond the idle KV
WARMUP_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class PolicyFigures:
    token_hit_rate: float  # cached / prompt tokens of the requests after the warm-up
    token_hit_rate_whole_run: float  # the replicas' counters, warm-up included
    # prompt tokens of hot requests computed, not served from cache, after the warm-up
    hot_prefill_tokens: int
    hot_requests: int  # hot requests after the warm-up
    prefill_tokens: int
    request_hit_rate: float
    ttft_p50_s: float
    ttft_p95_s: float
    requests: int
    cpu_seconds: float

    def summary(self) -> dict[str, Any]:
        return asdict(self)


def fleet_spec(work: PlanWorkload, profile: str, replicas: int, idle_kv_gib: float,
               bytes_per_request: int) -> FleetSpec:
    scenario = work.scenario
    margin = (scenario.kv_pool_gib - scenario.idle_kv_gib) if scenario else \
        RUNNING_PROMPTS * bytes_per_request / GIB
    spec = FleetSpec(replicas=replicas, profile=profile, kv_pool_gib=idle_kv_gib + margin,
                     idle_kv_gib=idle_kv_gib,
                     max_num_seqs=scenario.max_num_seqs if scenario else 20)
    spec.validate()
    return spec


def simulate_policies(work: PlanWorkload, policies: Sequence[str], profile: str,
                      replicas: int, idle_kv_gib: float, bytes_per_request: int,
                      rate: float, seed: int = 0) -> dict[str, PolicyFigures]:
    """Each of ``policies`` (preset names) over ``work.requests`` on the same fleet."""
    if not policies:
        return {}
    spec = fleet_spec(work, profile, replicas, idle_kv_gib, bytes_per_request)
    requests = list(work.requests)
    if all(r.arrival_s is not None for r in requests):
        arrivals = np.array([r.arrival_s for r in requests])
    else:
        arrivals = poisson_arrivals(len(requests), rate, seed)
    prompts = work.scenario.prompts if work.scenario else "ids"
    tokenizer = load_tokenizer(None, memo_size=4096) if prompts == "text" else None
    hashes = PrefixHashes(spec.block_size, load_profile(profile).model.name)
    out: dict[str, PolicyFigures] = {}
    for name in policies:
        res = simulate(requests, arrivals, build_policy(name), spec, hashes, prompts,
                       tokenizer, seed)
        steady = range(int(len(requests) * WARMUP_SHARE), len(requests))
        hot = [i for i in steady if requests[i].label == "hot"]
        prompt = sum(requests[i].prompt_tokens for i in steady)
        cached = sum(res.cached_tokens[i] for i in steady)
        out[name] = PolicyFigures(
            token_hit_rate=cached / prompt if prompt else 0.0,
            token_hit_rate_whole_run=res.token_hit_rate,
            hot_prefill_tokens=sum(requests[i].prompt_tokens - res.cached_tokens[i]
                                   for i in hot),
            hot_requests=len(hot),
            prefill_tokens=res.prefill_tokens, request_hit_rate=res.request_hit_rate,
            ttft_p50_s=res.ttft_p50_s, ttft_p95_s=res.ttft_p95_s, requests=res.requests,
            cpu_seconds=res.cpu_seconds)
    return out
