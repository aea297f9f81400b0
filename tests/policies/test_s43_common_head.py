"""A system prompt every conversation shares (the learned common prefix) counts as held on
every replica when ``cost`` weighs a new conversation's prefill: the replicas that did not
take the first conversations get new ones too, where charging the prompt's prefill to the
one request that brings it kept every new conversation on the first holders."""

import random

from policies.base import ReplicaView, Routed, RouteRequest
from policies.cost import Cost
from policies.cost_config import CostConfig

SYSTEM = [random.Random(1).randrange(50_000) for _ in range(600)]


def _first_turn(conversation: int) -> RouteRequest:
    rng = random.Random(1000 + conversation)
    tokens = SYSTEM + [rng.randrange(50_000) for _ in range(rng.randrange(40, 200))]
    return RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model="m",
                        arrival_s=conversation * 0.01)


def _homes_of_new_conversations(common_head: bool) -> tuple[list[str], set[str]]:
    """Where new conversations went once the system prompt was learned, and the replicas
    outside the scratch set (where one-off prefixes go once the caches are full)."""
    policy = Cost(CostConfig(common_min_samples=8, common_head=common_head))
    fleet = [ReplicaView(f"r{i}", kv_capacity_tokens=1_000_000) for i in range(4)]
    chosen = []
    for conversation in range(60):
        request = _first_turn(conversation)
        decision = policy.choose(request, fleet)
        policy.observe(Routed(request, decision.chosen, fleet))
        chosen.append(decision.chosen)
    homes = {r.id for r in fleet} - set(policy.scratch_set(fleet))
    return chosen[20:], homes  # once the system prompt is learned as the common prefix


def test_new_conversations_spread_over_replicas_without_the_shared_prompt() -> None:
    spread, homes = _homes_of_new_conversations(common_head=True)
    assert len(homes) >= 3 and set(spread) >= homes, (spread, homes)
    # charged to the request: the replica holding the system prompt takes them all
    held, _ = _homes_of_new_conversations(common_head=False)
    assert len(set(held)) == 1, held
