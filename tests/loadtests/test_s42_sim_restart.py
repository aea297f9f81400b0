"""``simulate --restart-after N``: from the Nth request on, a fresh gateway (new policy
state, new accounting) routes in front of the warm fleet, as a new pod in a rolling update;
the old one sees its requests through, and the new one counts them as other senders'.
``after_restart`` tells how the 1,000 requests after it fared."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from loadtests.scenarios import L4_PROFILE
from loadtests.sim_fleet import FleetSpec, SimFleet
from loadtests.simulate import Simulation, main, poisson_arrivals
from loadtests.workloads import build_spec, generate
from policies.base import Decision, ReplicaView, RouteRequest
from policies.round_robin import RoundRobin


class Seeing(RoundRobin):
    """Round robin that keeps what each decision saw: per replica, (in flight, others')."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict[str, tuple[int, int]]] = []

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> Decision:
        self.seen.append({r.id: (r.in_flight, r.others_in_flight) for r in replicas})
        return super().choose(request, replicas)


def test_the_new_gateway_takes_every_request_from_the_restart_on() -> None:
    spec = build_spec("contracts", seed=0, num_docs=20, hot_docs=5, doc_tokens=400,
                      output_tokens=[40, 60])
    requests = generate(spec, 400)
    arrivals = poisson_arrivals(len(requests), 20.0, 0)
    old, new = Seeing(), Seeing()
    sim = Simulation(SimFleet(FleetSpec(replicas=4, profile=L4_PROFILE, kv_pool_gib=1.75,
                                        idle_kv_gib=1.46, max_num_seqs=8)),
                     old, restart=(250, [new]))
    try:
        sim.run(requests, arrivals)
    finally:
        sim.close()
    assert len(old.seen) == 250 and len(new.seen) == 150
    assert sum(n for n, _ in old.seen[-1].values()) > 0  # the old one had requests out
    # the new one starts knowing none of its own, and (scraped as it starts, before it
    # serves) the old one's as others'
    assert all(n == 0 for n, _ in new.seen[0].values())
    assert sum(others for _, others in new.seen[0].values()) > 0
    assert len(sim.ttft) == 400  # the old one saw its requests through


def test_a_restart_is_reported(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    assert main(["--scenario", "contracts-400", "--eviction", "lru", "--requests", "500",
                 "--policies", "cost", "--restart-after", "300", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["restart_after"] == 300
    after = report["policies"]["cost"]["after_restart"]
    assert after["requests"] == 200 and 0 < after["token_hit_rate"] < 1


@pytest.mark.parametrize("n", ["0", "40"])
def test_a_restart_no_run_can_take_is_refused(n: str, capsys: pytest.CaptureFixture[str]
                                              ) -> None:
    assert main(["--scenario", "contracts-400", "--requests", "40", "--policies",
                 "round_robin", "--restart-after", n]) == 2
    assert f"--restart-after {n} needs a request before it and one from it on, got 40 " \
        "requests" in capsys.readouterr().err


def test_a_clairvoyant_placement_is_not_restarted(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--scenario", "contracts-400", "--requests", "40", "--policies",
                 "placement_oracle:6", "--restart-after", "20"]) == 2
    assert "placement_oracle:6 reads the requests from the start: no restart" \
        in capsys.readouterr().err
