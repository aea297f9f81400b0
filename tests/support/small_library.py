"""The small contract library the simulator's tests share: 60 documents of 400 tokens, 24
of them hot, on 4 replicas whose idle KV (0.24 GiB = 1966 tokens) holds three replicas'
worth of the hot set, at 20 requests per second."""

from __future__ import annotations

import numpy as np

from loadtests.sim_fleet import FleetSpec
from loadtests.simulate import poisson_arrivals
from loadtests.workloads import ContractsSpec, WorkloadRequest, generate

SMALL_FLEET = FleetSpec(replicas=4, kv_pool_gib=0.4, idle_kv_gib=0.24, max_num_seqs=4)


def small_library(n: int) -> tuple[list[WorkloadRequest], np.ndarray]:
    """``n`` requests on the small library and their arrival times."""
    requests = generate(ContractsSpec(num_docs=60, hot_docs=24, doc_tokens=400, seed=2), n)
    return requests, poisson_arrivals(len(requests), 20.0, 1)
