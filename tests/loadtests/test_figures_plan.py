"""What ``kvgate plan`` simulates is the fleet it reports."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvwire.tokenizer import load_tokenizer
from loadtests import plan
from loadtests.plan_workload import read_capture


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


def test_a_capture_line_whose_prompt_is_empty_is_counted_as_skipped(tmp_path: Path) -> None:
    capture = tmp_path / "capture.jsonl"
    lines = [{"model": "m", "body": {"model": "m", "prompt": [5, 6, 7]}},
             {"model": "m", "body": {"model": "m", "prompt": ""}},
             {"model": "m", "body": {"model": "m", "prompt": ["", ""]}}]
    capture.write_text("".join(json.dumps(line) + "\n" for line in lines))
    prompts, skipped = read_capture(capture, load_tokenizer(None))
    assert (prompts, skipped) == ([[5, 6, 7]], 2)
