"""A replica that sheds a request (429) before taking its prompt is not believed to hold it
afterwards: the cost policy's model of its cache takes the try back, while the replica
that answered the retry is credited with the prompt."""

from __future__ import annotations

import random

import httpx

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import AUTH, Serve, start_gateway


def _prompt(seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(100_000)}" for _ in range(800))  # some 1.5k tokens


def test_a_shedding_replica_is_not_credited_with_the_prompt_it_refused(serve: Serve) -> None:
    a, b = Behaviour("a", status=429), Behaviour("b")
    gw = start_gateway(serve, [("a", serve(fake_replica(a)).url),
                               ("b", serve(fake_replica(b)).url)], policy={"name": "cost"})
    # the policy ranks by the prompt's hashes: a few prompts until one is tried on "a" first
    for seed in range(24):
        prompt = _prompt(seed)
        r = httpx.post(f"{gw.url}/v1/completions", timeout=10,
                       json={"model": "sim-model", "prompt": prompt})
        assert r.status_code == 200, r.text
        if a.received:
            break
    assert len(a.received) == 1, "no prompt was tried on the shedding replica first"
    assert b.received[-1] == a.received[0]  # the retry carried the same prompt
    shown = httpx.post(f"{gw.admin}/admin/explain", headers=AUTH, timeout=10,
                       json={"model": "sim-model", "prompt": prompt}).json()
    held = shown["policy_state"]["model_tokens"]
    assert held.get("a", 0) == 0, held  # it never took the prompt
    assert held["b"] > 1000, held
    assert all(s["matched_tokens"] == 0 for s in shown["scores"] if s["replica"] == "a")
    assert shown["chosen"] == "b" and shown["matched_tokens"] > 1000, shown
