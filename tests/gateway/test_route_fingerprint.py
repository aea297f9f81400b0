"""A routed request carries the prompt's fingerprint only for a policy that reads it
(``Policy.wants_fingerprint``: the common-prefix learner tells repeats apart by it);
hashing a long prompt for every request of another policy is CPU spent for nothing."""

from __future__ import annotations

import json

import pytest

from gateway.fleet import Fleet
from gateway.request_parse import parse_body
from gateway.routing import Router
from kvwire.tokenizer import load_tokenizer
from policies.registry import build_policy

BODY = json.dumps({"model": "m", "prompt": "a contract clause " * 400}).encode()


@pytest.mark.parametrize(("policy", "wanted"), [
    ({"name": "round_robin"}, False), ({"name": "least_load"}, False),
    ({"name": "prefix_affinity"}, True), ({"name": "cost"}, True),
    ({"name": "prefix_affinity", "chunk_chars": 0}, True)])
def test_the_fingerprint_is_made_for_policies_that_read_it(policy: dict[str, object],
                                                          wanted: bool) -> None:
    router = Router(build_policy(policy), load_tokenizer(), Fleet([]), 1)
    try:
        first = router.build(parse_body(BODY, "completions"))
        again = router.build(parse_body(BODY, "completions"))
    finally:
        router.close()
    assert router.policy.wants_fingerprint is wanted
    if wanted:  # equal prompts, equal fingerprints
        assert first.fingerprint is not None and first.fingerprint == again.fingerprint
    else:
        assert first.fingerprint is None and again.fingerprint is None
