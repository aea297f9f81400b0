"""A fleet of views for ``cost``'s balance bound, and a document one replica holds."""

from __future__ import annotations

import random

from policies.base import ReplicaView, Routed, RouteRequest
from policies.cost import Cost


def views(n: int = 8) -> list[ReplicaView]:
    return [ReplicaView(f"r{i}", kv_capacity_tokens=4000) for i in range(n)]


def doc(seed: int, tokens: int = 1020) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(tokens)]


def request(tokens: list[int], at: float = 0.0) -> RouteRequest:
    return RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model="m", arrival_s=at)


def loaded(fleet: list[ReplicaView], counts: dict[str, tuple[int, int]]
            ) -> list[ReplicaView]:
    return [r._replace(in_flight=counts.get(r.id, (0, 0))[0],
                       others_in_flight=counts.get(r.id, (0, 0))[1]) for r in fleet]


def held(policy: Cost) -> tuple[list[int], str]:
    tokens = doc(7)
    req = request(tokens)
    first = policy.choose(req, views()).chosen
    policy.observe(Routed(req, first))
    return tokens, first
