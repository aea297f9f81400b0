from hypothesis import given, settings
from hypothesis import strategies as st

from policies.cache_model import ChainEntry, PromptChain, ReplicaCacheModel, match_models
from policies.ring import token_bytes

# prompts over a small alphabet of units, so that they share prefixes of every length
prompts_st = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=24), min_size=1,
                      max_size=60)


class BruteLRU:
    """The obvious LRU: a list of [key, tokens, owner], least recently used first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: list[list[int]] = []

    def find(self, key: int) -> list[int] | None:
        return next((it for it in self.items if it[0] == key), None)

    def match(self, chain: list[ChainEntry]) -> int:
        got = 0
        for key, tokens in chain:
            held = self.find(key)
            if held is None:
                break
            got += min(tokens, held[1])
            if held[1] < tokens:
                break
        return got

    def admit(self, chain: list[ChainEntry], owner: int) -> list[int]:
        for key, tokens in reversed(chain):
            held = self.find(key)
            if held is None:
                held = [key, tokens, owner]
            else:
                self.items.remove(held)
                held[1], held[2] = max(held[1], tokens), owner
            self.items.append(held)
        evicted = []
        while sum(it[1] for it in self.items) > self.capacity and self.items:
            evicted.append(self.items.pop(0)[0])
        return evicted


@settings(max_examples=200, deadline=None)
@given(prompts_st, st.integers(1, 120), st.sampled_from([1, 2, 3]))
def test_model_is_an_lru_of_token_sizes(prompts: list[list[int]], capacity: int,
                                        block: int) -> None:
    model, brute = ReplicaCacheModel(capacity), BruteLRU(capacity)
    for owner, units in enumerate(prompts):
        chain = PromptChain(token_bytes(units), block, 2.5, root=1)  # keys hashed lazily
        assert model.match(chain) == brute.match(chain)
        held = model.held(chain)
        # a hint (another model's answer) never changes the answer, right or wrong
        assert all(model.held(chain, hint) == held for hint in range(len(chain) + 2))
        keys = frozenset(e.key for e in chain)
        doc = owner % 3  # prompts of one document share an owner, as the cost policy's do
        predicted = [v for v in model.victims(
            sum(e.tokens for e in chain if e.key not in model), doc)]
        assert all(v.owner != doc for v in predicted)  # the admission's own are passed over
        assert model.evicted_tokens(sum(e.tokens for e in chain if e.key not in model), doc,
                                    lambda o: o % 2 == 0) == sum(
            v.tokens for v in predicted if v.owner % 2 == 0)
        # ... which is exact while the document's entries held are all in this chain
        exact = not any(it[2] == doc and it[0] not in keys for it in brute.items)
        evicted = model.admit(chain, doc)
        assert evicted == brute.admit(chain, doc)
        # victims() named what admit() evicted, in order (when nothing of the chain itself
        # was among them or had to go)
        if exact and not (set(evicted) | {v.key for v in predicted}) & keys:
            assert evicted[: len(predicted)] == [v.key for v in predicted][: len(evicted)]
        assert model.keys_lru() == [it[0] for it in brute.items]
        model.check_integrity()


@settings(max_examples=300, deadline=None)
@given(st.lists(prompts_st, min_size=1, max_size=5), st.integers(0, 1 << 16),
       st.lists(st.integers(0, 3), max_size=6), st.integers(1, 120), st.integers(0, 26),
       st.sampled_from([1, 2, 3]))
def test_matching_several_models_at_once_is_each_ones_match(
        fleet: list[list[list[int]]], pick: int, question: list[int], capacity: int,
        hint: int, block: int) -> None:
    # one chain against the models of several replicas, each holding what its own prompts
    # left (some holding the chain's document whole, some part of it or nothing): the
    # chain is one of those prompts (the document) with a question of its own after it
    models = []
    for prompts in fleet:
        model = ReplicaCacheModel(capacity)
        for owner, units in enumerate(prompts):
            model.admit(PromptChain(token_bytes(units), block, 2.5, root=1), owner)
        models.append(model)
    documents = [units for prompts in fleet for units in prompts]
    chain = PromptChain(token_bytes(documents[pick % len(documents)] + question), block, 2.5,
                        root=1)
    tokens, last = match_models(models, chain, hint)  # a hint right or wrong
    assert tokens == [model.match(chain) for model in models]
    assert last == models[-1].held(chain)


def test_a_prompt_is_admitted_tail_first() -> None:
    model = ReplicaCacheModel(100)
    model.admit([ChainEntry(1, 40), ChainEntry(2, 40), ChainEntry(3, 20)], owner=7)
    assert model.keys_lru() == [3, 2, 1]  # the head is the most recently used
    # the tail goes first, the head stays: as victims() foretells, with their owner
    assert [(v.key, v.owner) for v in model.victims(30, keep_owner=8)] == [(3, 7), (2, 7)]
    assert model.admit([ChainEntry(9, 30)], owner=8) == [3, 2]
    assert model.match([ChainEntry(1, 40), ChainEntry(2, 40)]) == 40


def test_prompt_chain_shares_leading_blocks() -> None:
    def chain(units: list[int], root: int = 5) -> list[ChainEntry]:
        return list(PromptChain(token_bytes(units), 4, 2.5, root))

    doc = list(range(30))
    a, b = chain([*doc, 1, 2]), chain([*doc, 3])
    assert [e.tokens for e in a] == [10] * 8  # 32 units in blocks of 4, 2.5 tokens each
    assert [e.tokens for e in b] == [10] * 7 + [8]  # a last block of 3 units
    assert a[:7] == b[:7] and a[7] != b[7]  # the blocks before the difference agree
    assert chain(doc, root=6)[0].key != a[0].key  # model and cache salt separate chains
    for units in ([*doc, 3], doc[:4], doc[:1], []):  # admitted tail first: the same entries
        lazy = PromptChain(token_bytes(units), 4, 2.5, 5)
        assert list(reversed(lazy)) == chain(units)[::-1]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=90), st.lists(st.integers(0, 3), max_size=20),
       st.randoms(use_true_random=False), st.sampled_from([1, 2, 3]))
def test_chain_keys_name_whole_prefixes_in_any_order(units: list[int], more: list[int],
                                                     rng, block: int) -> None:
    # keys past a stretch of entries hash from the stretch before's last key: asked in
    # any order (as a bisection does) they are the keys asked in order, and two prompts
    # share exactly the keys of the blocks they share whole
    chain = PromptChain(token_bytes(units), block, 2.5, root=1)
    ordered = chain.keys()
    lazy = PromptChain(token_bytes(units), block, 2.5, root=1)
    order = list(range(len(lazy)))
    rng.shuffle(order)
    asked = {i: lazy.key(i) for i in order}
    assert [asked[i] for i in range(len(lazy))] == ordered
    other = PromptChain(token_bytes(units + more), block, 2.5, root=1).keys()
    shared = len(units) // block
    assert other[:shared] == ordered[:shared]
    if units:  # a unit changed: the keys of its block and every block after it change
        for at in (0, len(units) - 1):
            changed = [*units[:at], units[at] + 1, *units[at + 1:], *more]
            keys = PromptChain(token_bytes(changed), block, 2.5, root=1).keys()
            assert not set(keys) & set(ordered[at // block:])


ops_st = st.lists(st.one_of(
    st.tuples(st.just("admit"), st.lists(st.integers(0, 3), max_size=24)),
    st.tuples(st.just("resize"), st.integers(0, 120)),
    st.tuples(st.just("clear"), st.just(0)),
), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(ops_st, st.integers(0, 120), st.sampled_from([1, 2, 3]))
def test_capacity_changes_and_resets_keep_the_model_an_lru(ops: list, capacity: int,
                                                            block: int) -> None:
    # a replica's capacity learned or changed (``resize``) and a replica restarted
    # (``clear``) between admissions: evictions, order and matches stay the obvious LRU's
    model, brute = ReplicaCacheModel(capacity), BruteLRU(capacity)
    for owner, (op, arg) in enumerate(ops):
        if op == "admit":
            chain = PromptChain(token_bytes(arg), block, 2.5, root=1)
            assert model.match(chain) == brute.match(chain)
            assert model.admit(chain, owner % 3) == brute.admit(chain, owner % 3)
        elif op == "resize":
            brute.capacity = arg
            assert model.resize(arg) == brute.admit([], 0)  # what no longer fits, oldest 1st
        else:
            model.clear()
            brute.items.clear()
        assert model.keys_lru() == [it[0] for it in brute.items]
        assert model.used == sum(it[1] for it in brute.items) and len(model) == len(brute.items)
        model.check_integrity()
