"""What ``kvgate plan`` simulates is the fleet it reports."""

from __future__ import annotations

import argparse

from loadtests import plan


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    plan.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_a_workload_timing_its_own_turns_arrives_at_the_planned_rate() -> None:
    def span_s(*argv: str) -> float:
        requests = plan._workload(_args("--scenario", "chat-apps", "--sim-requests", "300",
                                        *argv)).requests
        return requests[-1].arrival_s - requests[0].arrival_s

    eight = span_s()  # the scenario's rate, 8 requests/s on 8 replicas
    assert span_s("--replicas", "32") < eight / 2  # 32 requests/s
    assert span_s("--rate", "32") < eight / 2
