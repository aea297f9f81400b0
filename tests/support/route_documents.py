"""Routing requests for documents of random pieces, a fleet to choose among, and two workers
that tell each other their routes, for tests of what a policy learns from routes told to it."""

from __future__ import annotations

import random

from gateway.fleet import Fleet
from gateway.worker_routes import WorkerRoutes, route_pair
from policies.base import Policy, ReplicaView, RouteRequest
from policies.cost import Cost

FLEET = [ReplicaView(f"r{i}", kv_capacity_tokens=40_000) for i in range(4)]


def document(seed: int, pieces: int = 64) -> RouteRequest:
    rng = random.Random(seed)
    chunks = [rng.randrange(1 << 32) for _ in range(pieces)]
    return RouteRequest(tokens=(), prompt_tokens=pieces * 16, model="m", arrival_s=0.0,
                        chunks=chunks, chunk_tokens=16.0)


def paired_workers(b_policy: Policy | None = None, b_fleet: Fleet | None = None,
                   start_b: bool = True) -> tuple[WorkerRoutes, WorkerRoutes]:
    """Two workers of one box, ``a`` and ``b`` (``cost`` each, unless ``b_policy``), that
    tell each other their routes, started on the running loop (``b`` only if
    ``start_b``: unstarted, it reads nothing)."""
    (inbox_a, to_a), (inbox_b, to_b) = route_pair(), route_pair()
    a = WorkerRoutes(inbox_a, [to_b], Cost())
    b = WorkerRoutes(inbox_b, [to_a], Cost() if b_policy is None else b_policy, b_fleet)
    a.start()
    if start_b:
        b.start()
    return a, b
