"""The ``cost`` policy asks the request builder for the prompt pieces it reads, no more:
its key and chain read at most ``max_chunks`` of them, and hashing a long prompt's others
cost the event loop for nothing (a 16 MB completion: ~70 ms, every request)."""

from __future__ import annotations

from dataclasses import replace

from gateway.fleet import Fleet
from gateway.request_parse import ParsedRequest
from gateway.routing import Router
from kvwire.tokenizer import load_tokenizer
from policies.cost import Cost
from policies.per_model import PerModel
from policies.prompt_chunks import text_chunks
from policies.registry import build_policy

TEXT = "The parties agree that the term of this agreement is five years. " * 200  # 13 KB


def completion(text: str) -> ParsedRequest:
    return ParsedRequest("completions", {}, "m", True, text, None, None, None, None)


def test_a_long_prompt_is_hashed_only_as_far_as_cost_reads_it() -> None:
    config = {"name": "cost", "max_chunks": 16}
    policy = PerModel(build_policy(config), lambda: build_policy(config))  # as served
    router = Router(policy, load_tokenizer(), Fleet([]), 1)
    try:
        assert policy.chunks_needed == 16
        request = router.build(completion(TEXT))
        assert list(request.chunks) == text_chunks(TEXT, 64)[:16]
        assert request.prompt_tokens > 2000  # the whole prompt's length, still
        # what the policy derives from the prompt is what it derived from every piece
        cost = policy.first
        assert isinstance(cost, Cost)
        whole = replace(request, chunks=text_chunks(TEXT, 64))
        mine, theirs = cost._keys.prefix(request), cost._keys.prefix(whole)
        assert mine.key == theirs.key
        assert mine.chain.keys() == theirs.chain.keys()
    finally:
        router.close()
