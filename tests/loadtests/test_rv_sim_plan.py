"""``kvgate plan``'s simulated figures say only what the simulation measured."""

from __future__ import annotations

import argparse

from loadtests.plan import add_arguments, build_plan
from loadtests.plan_report import render


def test_no_hot_request_simulated_gives_no_simulated_hot_prefill_reduction() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--docs", "100", "--doc-tokens", "500", "--hot", "10",
                              "--hot-share", "0", "--replicas", "2", "--idle-kv-gib", "0.5",
                              "--sim-requests", "120",
                              "--policies", "round_robin,prefix_affinity"])
    plan = build_plan(args)
    assert all(f["hot_requests"] == 0 for f in plan["policies"].values())
    # None there reads "nothing left to prefill": an infinite reduction, never measured
    assert plan["hot_prefill_reduction_simulated"] is None
    assert plan["hot_prefill_reduction_best_policy"] is None
    assert plan["hot_prefill_reduction"] == plan["hot_prefill_reduction_arithmetic"]
    assert "simulated all of it" not in render(plan)
