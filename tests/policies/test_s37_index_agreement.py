"""Whether the gateway's tokens are the engines' is judged on evidence: an index fed with
the blocks the engines store of what was routed to them (their own token ids), and prompts
the gateway tokenized its own way. A head both tokenizers happen to encode alike, or one
short prompt they encode alike whole, does not settle it; engines with the same tokenizer
that evicted some documents (the model still says they hold them) are not taken for
another tokenizer."""

from __future__ import annotations

import itertools
import logging
import random

import pytest

from kvwire.kv_event_format import BlockRemoved, BlockStored
from policies.base import ReplicaView, Routed, RouteRequest
from policies.cost import Cost
from policies.index_matches import UNMATCHED_LIMIT, IndexAgreement
from policies.kv_events import MIN_JUDGED, KVEvents
from policies.kv_index import KVIndex

HEADER = list(range(1, 23))  # a chat header: 22 tokens, alike under both tokenizers
DOC = 1000  # tokens per document after the header
REPLICAS = [ReplicaView(f"r{i}", kv_capacity_tokens=50_000) for i in range(4)]


def words(seed: int, n: int = DOC) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 50_000) for _ in range(n)]


def gateway_tokens(doc: int) -> list[int]:
    return HEADER + words(doc)


def engine_tokens(doc: int) -> list[int]:
    """The same text under another tokenizer: the header alike, the rest not."""
    return HEADER + words(doc + 77_777, DOC - 40)


class Engines:
    """What the replicas store of what they are sent (their own token ids), and evict."""

    def __init__(self, index: KVIndex) -> None:
        self.index = index
        self._hashes = itertools.count(1, 1000)
        self._seq: dict[str, int] = {}

    def store(self, replica: str, tokens: list[int], evict: bool = False) -> None:
        n = len(tokens) // 16
        first = next(self._hashes)
        hashes = tuple(range(first, first + n))
        events: list[BlockStored | BlockRemoved] = [
            BlockStored(hashes, None, tuple(tokens[: n * 16]), 16)]
        if evict:
            events.append(BlockRemoved(hashes))
        seq = self._seq.get(replica, 0)
        self._seq[replica] = seq + 1
        self.index.apply(replica, seq, events)


def request(tokens: list[int], at: float) -> RouteRequest:
    return RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model="m", arrival_s=at)


def route(policy: Cost | KVEvents, tokens: list[int], at: float) -> str:
    req = request(tokens, at)
    chosen = policy.choose(req, REPLICAS).chosen
    policy.observe(Routed(req, chosen))
    return chosen


def predicted(policy: Cost, tokens: list[int], at: float) -> dict[str, int]:
    d = policy.choose(request(tokens, at), REPLICAS)
    return {s.replica: s.matched_tokens for s in d.scores if s.matched_tokens}


def test_an_accidental_match_does_not_settle_that_the_engines_tokens_are_ours() -> None:
    policy = Cost()
    assert policy.kv_index is not None
    engines = Engines(policy.kv_index)
    # a short prompt both tokenizers encode alike whole, sent twice: it matches deep
    short = HEADER + list(range(200, 260))
    for at in (0.0, 10.0):
        engines.store(route(policy, short, at), short)
    # then documents, each again 8 s later: what the engines hold of them is their own ids
    routed = 0
    at = 20.0
    while policy.tokens_needed is None and routed < UNMATCHED_LIMIT + 100:
        doc = routed % 8
        home = route(policy, gateway_tokens(doc), at)
        engines.store(home, engine_tokens(doc))
        routed, at = routed + 1, at + 1.0
        if routed == 40:
            # still judging: a repeated document keeps the model's word, not the 16 tokens
            # of its header the index holds
            assert max(predicted(policy, gateway_tokens(1), at).values()) > 500
            assert policy.describe()["kv_events_unmatched"] is False
    # the short prompt's agreement and 1,023 repeats that found only a header
    assert routed == UNMATCHED_LIMIT - 1 + 8
    assert policy.tokens_needed == 0
    assert policy.describe()["kv_events_unmatched"] is True
    state = policy._exact.agreement.state()
    assert state == {"judged": UNMATCHED_LIMIT, "agreeing": 1}


def test_engines_that_evicted_most_repeats_still_agree_and_the_index_stays_read() -> None:
    policy = Cost()
    assert policy.kv_index is not None
    engines = Engines(policy.kv_index)
    for n in range(UNMATCHED_LIMIT + 200):
        doc = n % 8
        tokens = gateway_tokens(doc)
        # the same tokenizer; but 3 documents in 4 are evicted before they come again
        engines.store(route(policy, tokens, float(n)), tokens, evict=doc % 4 != 0)
    assert policy.tokens_needed is None
    assert policy.describe()["kv_events_unmatched"] is False
    state = policy._exact.agreement.state()
    assert state["judged"] == UNMATCHED_LIMIT and 0 < state["agreeing"] < state["judged"] / 2
    # the index is read as exact: an evicted document is cold but for the header the
    # documents kept share, whatever the model says
    assert set(predicted(policy, gateway_tokens(1), 5000.0).values()) == {16}


@pytest.mark.parametrize("same_tokenizer", [True, False])
def test_the_kv_events_policy_tells_of_engines_on_another_tokenizer(
        same_tokenizer: bool, caplog: pytest.LogCaptureFixture) -> None:
    policy = KVEvents()
    engines = Engines(policy.kv_index)
    caplog.set_level(logging.WARNING, logger="policies.kv_events")
    for n in range(4 * MIN_JUDGED):
        doc = n % 8
        tokens = gateway_tokens(doc)
        engines.store(route(policy, tokens, float(n)),
                      tokens if same_tokenizer else engine_tokens(doc))
    state = policy.describe()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    judged = policy.agreement.state()
    assert judged["judged"] == 4 * MIN_JUDGED - 8  # every repeat, past the grace
    if same_tokenizer:
        assert state["kv_events_unmatched"] is False and not warnings
        assert judged["agreeing"] == judged["judged"]
    else:
        assert state["kv_events_unmatched"] is True and judged["agreeing"] == 0
        assert len(warnings) == 1  # once an interval, not once a prompt
        assert "set tokenizer: to the engines' tokenizer" in warnings[0]


def test_agreement_is_a_share_of_the_recent_window_not_a_latch() -> None:
    agreement = IndexAgreement(min_judged=16)
    agreement.add(True)
    assert agreement.agrees and not agreement.mismatched
    for _ in range(7):
        agreement.add(False)
    assert agreement.agrees  # 1 in 8
    agreement.add(False)
    assert not agreement.agrees and not agreement.mismatched  # too few judged yet
    for _ in range(7):
        agreement.add(False)
    assert agreement.mismatched
    for _ in range(2):
        agreement.add(True)
    assert agreement.agrees and not agreement.mismatched  # 3 in 18
    with pytest.raises(ValueError, match="min_judged must be in"):
        IndexAgreement(min_judged=0)
