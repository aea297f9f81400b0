"""A gateway copy of the simulator counts what a peer told it of a route once and keeps
nothing of it, as ``gateway.peers`` does (``Routed(revocable=False)``: no end of it comes
to this copy): its policy holds no counted requests once the run's requests have ended,
where it kept every route its peers made (up to 16,384, with their tokens)."""

import pytest

from loadtests.sim_fleet import FleetSpec
from loadtests.simulate import build_policy, poisson_arrivals, simulate
from loadtests.workloads import ContractsSpec, generate

FLEET = FleetSpec(replicas=2, kv_pool_gib=0.125, idle_kv_gib=0.1, max_num_seqs=8,
                  max_num_batched_tokens=512)
WORKLOAD = ContractsSpec(num_docs=6, hot_docs=2, doc_tokens=200, question_tokens=(5, 30),
                         output_tokens=(1, 8), seed=3)


@pytest.mark.parametrize("name", ["cost", "prefix_affinity"])
def test_a_peered_copy_keeps_no_request_once_the_run_ends(name: str) -> None:
    requests = generate(WORKLOAD, 60)
    copies = [build_policy(name, chunk_chars=64) for _ in range(2)]
    result = simulate(requests, poisson_arrivals(len(requests), 20.0, 1), copies, FLEET,
                      seed=5, peers=True)
    assert result.requests == 60
    for policy in copies:
        assert len(policy._counted) == 0  # type: ignore[attr-defined]
