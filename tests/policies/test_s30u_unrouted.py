"""A try its replica refused before taking the prompt (``Unrouted``) is taken back: the
policy no longer predicts that replica holds the prompt, while what it held before, and
what another try still bound there brings, stays."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.base import Finished, ReplicaView, Routed, RouteRequest, Unrouted
from policies.cache_model import PromptChain, ReplicaCacheModel
from policies.cost import Cost
from policies.per_model import PerModel
from policies.radix import Radix
from policies.ring import token_bytes

DOC = 1000  # tokens of a document


def views() -> list[ReplicaView]:
    return [ReplicaView(rid, kv_capacity_tokens=8000) for rid in ("a", "b", "c")]


def doc(seed: int, n: int = DOC) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(n)]


def request(tokens: list[int], at: float = 0.0) -> RouteRequest:
    return RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model="m", arrival_s=at)


def matched(policy: Cost | PerModel, tokens: list[int]) -> dict[str, int]:
    """Each replica's predicted cached tokens of ``tokens`` (those predicted to hold some),
    each asked alone (a candidate far behind the best is ranked unscored)."""
    out = {}
    for view in views():
        d = policy.explain(request(tokens), [view])
        if d.matched_tokens:
            out[view.id] = d.matched_tokens
    return out


def model_tokens(cost: Cost) -> dict[str, int]:
    """The tokens each replica's cache model holds."""
    held = cost.describe()["model_tokens"]
    assert isinstance(held, dict)
    return held


def test_cost_takes_back_a_refused_try_and_keeps_what_was_held_before() -> None:
    cost = Cost()
    policy = PerModel(cost, Cost)  # as the gateway holds it: one instance per model
    fleet = views()
    body = doc(1)
    policy.observe(Routed(request([*body, 1]), "a", fleet))  # answered: a holds the doc
    held = model_tokens(cost)
    before = matched(policy, [*body, *doc(2, 600)])
    assert before.get("a", 0) >= DOC - 128
    # a longer prompt over the document, refused by "a" and answered by "b"
    longer = request([*body, *doc(2, 600)], at=1.0)
    policy.observe(Routed(longer, "a", fleet))
    assert matched(policy, longer.tokens)["a"] > before["a"] + 400  # the bug: credited
    policy.observe(Unrouted(longer, "a"))
    policy.observe(Routed(longer, "b", fleet))
    policy.observe(Finished(longer, "b", ok=True))
    after = matched(policy, longer.tokens)
    assert after["a"] == before["a"]  # the document it held, no more
    assert after["b"] > before["a"] + 400
    cost.check_integrity()
    assert model_tokens(cost)["a"] == held["a"]


def test_cost_keeps_what_another_try_still_bound_there_brings() -> None:
    policy = Cost()
    fleet = views()
    body = doc(3)
    first, second = request([*body, 1]), request([*body, 2])
    policy.observe(Routed(first, "a", fleet))
    policy.observe(Routed(second, "a", fleet))  # the same document, before the refusal
    policy.observe(Unrouted(first, "a"))
    assert matched(policy, [*body, 3]).get("a", 0) >= DOC - 128  # second brings it
    policy.observe(Unrouted(second, "a"))  # refused too: nothing of either is left
    assert "a" not in matched(policy, [*body, 3])
    assert model_tokens(policy) == {"a": 0}
    policy.check_integrity()


def test_cost_refusal_of_a_try_after_one_that_stands_takes_back_only_its_own() -> None:
    policy = Cost()
    fleet = views()
    body = doc(4)
    req = request([*body, 1])
    policy.observe(Routed(req, "a", fleet))  # timed out there: it may have queued it
    policy.observe(Routed(req, "b", fleet))  # the retry, refused
    policy.observe(Unrouted(req, "b"))
    got = matched(policy, [*body, 2])
    assert got.get("a", 0) >= DOC - 128 and "b" not in got
    policy.check_integrity()


def test_radix_takes_back_a_refused_try_and_keeps_what_was_held_before() -> None:
    policy = Radix()
    fleet = views()
    body = doc(5, 3000)
    policy.observe(Routed(request(body), "a", fleet))
    tree = policy.tree
    assert tree.match(("m", None), bytes(token_bytes(body))) == {"a": 3000}
    longer = request([*body, *doc(6, 500)])
    data = bytes(token_bytes(longer.tokens))
    policy.observe(Routed(longer, "a", fleet))
    assert tree.match(("m", None), data) == {"a": 3500}  # the bug: credited
    policy.observe(Unrouted(longer, "a"))
    policy.observe(Routed(longer, "b", fleet))
    assert tree.match(("m", None), data) == {"a": 3000, "b": 3500}
    assert tree.tokens == {"a": 3000, "b": 3500}
    policy.check_integrity()
    # a try another insert touched since is kept for it
    again = request([*body, *doc(7, 200)])
    policy.observe(Routed(again, "c", fleet))
    policy.observe(Routed(request([*body, *doc(7, 200), 9]), "c", fleet))
    policy.observe(Unrouted(again, "c"))
    assert tree.match(("m", None), bytes(token_bytes(again.tokens)))["c"] == 3200
    policy.check_integrity()


# prompts over a small alphabet of units, so that they share prefixes of every length
prompts_st = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=24), max_size=30)


def _held(model: ReplicaCacheModel) -> dict[int, int]:
    return {key: model.tokens_held(key, 1 << 30) for key in model.keys_lru()}


@settings(max_examples=200, deadline=None)
@given(prompts_st, st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=24),
                            min_size=1, max_size=4), st.sampled_from([1, 2, 3]),
       st.randoms(use_true_random=False))
def test_admissions_taken_back_leave_the_model_never_admitted(
        before: list[list[int]], sent: list[list[int]], block: int, rng: random.Random
        ) -> None:
    # a model with a history, and one that also admitted ``sent`` pending (in room, so
    # nothing is evicted) and took them all back in any order: the same entries, sizes,
    # matches and order of what they did not touch
    capacity = 1 << 20
    never, model = ReplicaCacheModel(capacity), ReplicaCacheModel(capacity)
    for owner, units in enumerate(before):
        for m in (never, model):
            m.admit(PromptChain(token_bytes(units), block, 2.5, root=1), owner)
    chains = [PromptChain(token_bytes(units), block, 2.5, root=1) for units in sent]
    pending: list[list[Any]] = []
    for chain in chains:
        pending.append([])
        model.admit(chain, 7, pending[-1])
        model.check_integrity()
    rng.shuffle(pending)
    for keys in pending:
        model.forget(keys)
        model.check_integrity()
    assert _held(model) == _held(never) and model.used == never.used
    for units in before + sent:
        chain = PromptChain(token_bytes(units), block, 2.5, root=1)
        assert model.match(chain) == never.match(chain)
        assert model.held(chain) == never.held(chain)
    touched = {e.key for chain in chains for e in chain}
    assert [k for k in model.keys_lru() if k not in touched] == \
        [k for k in never.keys_lru() if k not in touched]


@settings(max_examples=200, deadline=None)
@given(prompts_st, st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=24),
                                      st.booleans()), min_size=1, max_size=4),
       st.sampled_from([1, 2, 3]), st.randoms(use_true_random=False))
def test_admissions_that_stand_are_kept_and_the_others_taken_back(
        before: list[list[int]], sent: list[tuple[list[int], bool]], block: int,
        rng: random.Random) -> None:
    # pending admissions, some let stand and some taken back, settled in any order: the
    # model holds what one that admitted only those that stand holds
    capacity = 1 << 20
    stood, model = ReplicaCacheModel(capacity), ReplicaCacheModel(capacity)
    for owner, units in enumerate(before):
        for m in (stood, model):
            m.admit(PromptChain(token_bytes(units), block, 2.5, root=1), owner)
    settled: list[tuple[list[Any], bool]] = []
    for units, stands in sent:
        chain = PromptChain(token_bytes(units), block, 2.5, root=1)
        settled.append(([], stands))
        model.admit(chain, 7, settled[-1][0])
        if stands:
            stood.admit(chain, 7)
    rng.shuffle(settled)
    for keys, stands in settled:
        if stands:
            model.confirm(keys)
        else:
            model.forget(keys)
        model.check_integrity()
    assert _held(model) == _held(stood) and model.used == stood.used
    for units, _ in sent:
        chain = PromptChain(token_bytes(units), block, 2.5, root=1)
        assert model.held(chain) == stood.held(chain)


def _chain(units: list[int], block: int = 1) -> PromptChain:
    return PromptChain(token_bytes(units), block, 2.5, root=1)


def test_an_admission_settles_only_the_entries_it_brought_not_their_keys() -> None:
    # A brings a chain's entries, they are evicted, and B brings the same keys back: A's
    # end leaves B's entries as they are
    for settle in ("forget", "confirm"):
        model = ReplicaCacheModel(16)  # 8 entries of 2 tokens
        first: list[Any] = []
        second: list[Any] = []
        sent, other = _chain([1, 2, 3]), _chain([4, 5, 6, 7, 8, 9, 0, 1])
        model.admit(sent, 1, first)
        model.admit(other, 2)  # evicts what A brought
        assert not any(e.key in model for e in sent)
        model.admit(sent, 3, second)
        held = _held(model)
        getattr(model, settle)(first)
        assert _held(model) == held, settle  # the bug: B's entries removed, or made to stand
        model.forget(second)  # B is refused in turn: they go
        assert not any(e.key in model for e in sent), settle
        model.check_integrity()


class _Oracle:
    """What a model holds, told the slow way: each entry knows which pending admissions
    brought it (an entry evicted and inserted again is a new one)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        # key -> [tokens, the pending admissions bringing it (None: held for good)]
        self.entries: dict[int, list] = {}  # type: ignore[type-arg]

    def admit(self, chain: PromptChain, name: int | None) -> None:
        for entry in reversed(chain):
            held = self.entries.pop(entry.key, None)  # re-inserted: the most recent
            if held is None:
                held = [entry.tokens, None if name is None else {name}]
            else:
                held[0] = max(held[0], entry.tokens)
                if held[1] is not None:
                    if name is None:
                        held[1] = None
                    else:
                        held[1].add(name)
            self.entries[entry.key] = held
        while sum(t for t, _ in self.entries.values()) > self.capacity and self.entries:
            del self.entries[next(iter(self.entries))]

    def settle(self, name: int, stands: bool) -> None:
        for key, (_, names) in list(self.entries.items()):
            if names is not None and name in names:
                if stands:
                    self.entries[key][1] = None
                else:
                    names.discard(name)
                    if not names:
                        del self.entries[key]

    def held(self) -> dict[int, int]:
        return {key: tokens for key, (tokens, _) in self.entries.items()}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=12),
                          st.sampled_from(["stands", "pending"])), min_size=1, max_size=16),
       st.sampled_from([1, 2]), st.integers(3, 30), st.randoms(use_true_random=False))
def test_pending_admissions_in_a_model_that_evicts_settle_what_they_brought(
        sent: list[tuple[list[int], str]], block: int, capacity: int,
        rng: random.Random) -> None:
    # a model small enough to evict (entries of 2-5 tokens), admissions standing and
    # pending, each pending one let stand or taken back at a random time later: after
    # every step the model holds what the oracle holds, in its order, and what it holds of
    # any chain is a prefix of it (``held`` bisects)
    model, oracle = ReplicaCacheModel(capacity), _Oracle(capacity)
    chains = [_chain(units, block) for units, _ in sent]
    open_: dict[int, list[Any]] = {}

    def check() -> None:
        model.check_integrity()
        assert _held(model) == oracle.held()
        assert model.keys_lru() == list(oracle.entries)
        for chain in chains:
            keys = [e.key in model for e in chain]
            n = keys.count(True)
            assert keys == [True] * n + [False] * (len(keys) - n)
            assert model.held(chain) == n

    def settle_one() -> None:
        name = rng.choice(sorted(open_))
        stands = rng.random() < 0.5
        (model.confirm if stands else model.forget)(open_.pop(name))
        oracle.settle(name, stands)
        check()

    for name, (chain, (_, how)) in enumerate(zip(chains, sent, strict=True)):
        if how == "pending":
            open_[name] = []
            model.admit(chain, name, open_[name])
            oracle.admit(chain, name)
        else:
            model.admit(chain, name)
            oracle.admit(chain, None)
        check()
        while open_ and rng.random() < 0.4:
            settle_one()
    while open_:
        settle_one()
