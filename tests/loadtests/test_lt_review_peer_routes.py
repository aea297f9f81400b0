"""The simulator's gateway copies learn each other's routes as the peers' wire carries
them (``gateway.peer_wire``): piece hashes, never token ids."""

from loadtests.sim_fleet import FleetSpec
from loadtests.simulate import build_policy, poisson_arrivals, simulate
from loadtests.workloads import ContractsSpec, generate
from policies.base import Routed
from policies.prefix_affinity import PrefixAffinity

FLEET = FleetSpec(replicas=2, kv_pool_gib=0.125, idle_kv_gib=0.1, max_num_seqs=8,
                  max_num_batched_tokens=512)
WORKLOAD = ContractsSpec(num_docs=6, hot_docs=2, doc_tokens=200, question_tokens=(5, 30),
                         output_tokens=(1, 8), seed=3)


def _copies(chunk_chars: int) -> list[PrefixAffinity]:
    """Two prefix_affinity copies, each keeping the routes it observed."""
    copies = []
    for _ in range(2):
        policy = build_policy("prefix_affinity", chunk_chars=chunk_chars)
        assert isinstance(policy, PrefixAffinity)
        seen: list[Routed] = []
        observe = policy.observe

        def keep(event, seen=seen, observe=observe):
            if isinstance(event, Routed):
                seen.append(event)
            observe(event)

        policy.observe = keep  # type: ignore[method-assign]
        policy.seen = seen  # type: ignore[attr-defined]
        copies.append(policy)
    return copies


def _run(chunk_chars: int) -> list[PrefixAffinity]:
    requests = generate(WORKLOAD, 60)
    copies = _copies(chunk_chars)
    result = simulate(requests, poisson_arrivals(len(requests), 20.0, 1), copies, FLEET,
                      seed=5, peers=True)
    assert result.requests == 60
    return copies


def test_peers_learn_nothing_of_a_route_keyed_by_token_ids_alone():
    copies = _run(chunk_chars=0)
    for policy in copies:
        # its own routes only (with the views it decided on): the wire has none to carry
        assert policy.seen and all(e.replicas and len(e.request.tokens) for e in policy.seen)
    assert sum(len(p.seen) for p in copies) == 60


def test_peers_learn_a_routes_piece_hashes_without_its_token_ids():
    copies = _run(chunk_chars=64)
    for policy in copies:
        own = [e for e in policy.seen if e.replicas]
        told = [e for e in policy.seen if not e.replicas]
        assert own and told
        assert all(len(e.request.tokens) == 0 and len(e.request.chunks) for e in told)
    # each request once with its copy's decision, once as the other copy heard it
    assert sum(len(p.seen) for p in copies) == 120
    heard = {tuple(e.request.chunks) for p in copies for e in p.seen if not e.replicas}
    routed = {tuple(e.request.chunks) for p in copies for e in p.seen if e.replicas}
    assert heard == routed
