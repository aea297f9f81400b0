"""Routing requests for documents of random pieces, and a fleet to choose among, for tests
of what a policy learns from routes told to it."""

from __future__ import annotations

import random

from policies.base import ReplicaView, RouteRequest

FLEET = [ReplicaView(f"r{i}", kv_capacity_tokens=40_000) for i in range(4)]


def document(seed: int, pieces: int = 64) -> RouteRequest:
    rng = random.Random(seed)
    chunks = [rng.randrange(1 << 32) for _ in range(pieces)]
    return RouteRequest(tokens=(), prompt_tokens=pieces * 16, model="m", arrival_s=0.0,
                        chunks=chunks, chunk_tokens=16.0)
