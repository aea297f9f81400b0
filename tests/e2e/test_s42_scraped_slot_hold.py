"""The gateway reads how long the engines' requests hold a decode slot from their
``vllm:request_inference_time_seconds``, other senders' requests included: a gateway whose
own requests have not finished (one just started, or restarted in front of a busy fleet)
knows it within a scrape."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.fleets import start_fleet
from tests.support.processes import Processes

pytestmark = pytest.mark.slow


def test_a_gateway_learns_the_slot_hold_from_other_senders_requests(
        spawn: Processes, tmp_path: Path) -> None:
    fleet = start_fleet(spawn, tmp_path, {"name": "cost"})
    durations: list[float] = []
    stop = threading.Event()

    def other_sender() -> None:  # straight to the engines, past the gateway
        with httpx.Client(timeout=30) as client:
            i = 0
            while not stop.is_set():
                url = fleet.urls[i % len(fleet.urls)]
                started = time.monotonic()
                r = client.post(f"{url}/v1/completions", json={
                    "model": "sim-llama", "prompt": f"request {i} " * 30, "max_tokens": 24,
                    "ignore_eos": True})
                r.raise_for_status()
                durations.append(time.monotonic() - started)
                i += 1

    sender = threading.Thread(target=other_sender)
    sender.start()
    body = {"model": "sim-llama", "prompt": "what the gateway would do", "max_tokens": 4}
    state: dict[str, object] = {}
    seen: list[float] = []
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            replicas = httpx.get(f"{fleet.admin}/admin/replicas",
                                 headers=fleet.admin_headers).json()["replicas"]
            seen += [r["slot_hold_s"] for r in replicas if r["slot_hold_s"] is not None]
            # a decision (not sent) reads the views, and with them the scraped hold
            state = httpx.post(f"{fleet.admin}/admin/explain", json=body,
                               headers=fleet.admin_headers).json()["policy_state"]
            if state["slot_hold_s"] and seen:
                break
            time.sleep(0.1)
    finally:
        stop.set()
        sender.join()
    hold = state["slot_hold_s"]
    assert isinstance(hold, float) and hold > 0, state
    # the engines' own figure: from first scheduled to finished, within what the sender saw
    assert max(seen) <= max(durations) and hold <= max(durations)
    assert state["pace_samples"] == 0  # none of the gateway's own requests answered
