"""The radix tree on a "comb" (prompts branching off one long base at every depth): an
insert's heap work stays constant however deep its path, and eviction stays the exact
LRU-leaf order (smallest ``(tick, -end)`` first) that a brute-force sort gives."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.radix_tree import _HOLD_BYTES, _NODE_BYTES, Node, RadixTree
from policies.ring import token_bytes

REPLICAS = ["a", "b", "c"]


def enc(seq: list[int]) -> bytes:
    return bytes(token_bytes(seq))


def test_an_insert_on_a_deep_comb_pushes_two_heap_entries() -> None:
    rng = random.Random(7)
    base = [rng.randrange(1 << 20) for _ in range(600)]
    depths = list(range(1, len(base)))
    rng.shuffle(depths)
    tree = RadixTree()
    pushes = []
    for i, k in enumerate(depths):
        before = tree.heap_pushes
        tree.insert("ns", enc([*base[:k], 1_000_000 + i]), REPLICAS[i % 3], budget=None)
        pushes.append(tree.heap_pushes - before)
    tree.check_integrity()
    # the last inserts' paths run through hundreds of nodes (the base split at each depth)
    deepest = max(node.end for node in tree.walk())
    assert tree.nodes > 1000 and deepest >= 599, (tree.nodes, deepest)
    assert max(pushes) == 2, f"heap pushes per insert: max {max(pushes)}"


def held_by(tree: RadixTree, rid: str) -> set[int]:
    return {id(node) for node in tree.walk() if rid in node.holders}


def lru_victims(tree: RadixTree, rid: str, budget: int) -> tuple[set[int], list[Node]]:
    """What ``rid`` should let go of to get down to ``budget``, by brute force: all its
    holdings in ``(tick, -end)`` order (a parent sorts after its children)."""
    order = sorted(
        (node for node in tree.walk() if rid in node.holders),
        key=lambda node: (node.holders[rid], -node.end),
    )
    tokens, victims = tree.tokens.get(rid, 0), set()
    for node in order:
        if tokens <= budget:
            break
        tokens -= len(node.edge) // 4
        victims.add(id(node))
    return victims, order  # (the nodes kept referenced: their ids stay theirs)


seqs = st.lists(st.integers(0, 2), min_size=1, max_size=10)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), seqs, st.sampled_from(REPLICAS), st.just(0)),
        st.tuples(st.just("evict"), st.just([]), st.sampled_from(REPLICAS), st.integers(0, 12)),
        st.tuples(st.just("drop"), st.just([]), st.sampled_from(REPLICAS), st.just(0)),
    ),
    max_size=50,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_eviction_takes_the_least_recently_used_leaves_first(program: list) -> None:
    tree = RadixTree()
    for op, seq, rid, budget in program:
        if op == "insert":
            tree.insert("ns", enc(seq), rid, budget=None)
        elif op == "evict":
            victims, _order = lru_victims(tree, rid, budget)
            before = held_by(tree, rid)
            tree.evict_replica(rid, budget)
            assert held_by(tree, rid) == before - victims
            assert tree.tokens.get(rid, 0) <= budget
        else:
            tree.drop(rid)
            assert not held_by(tree, rid) and rid not in tree.tokens
        tree.check_integrity()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(seqs, st.sampled_from(REPLICAS)), min_size=1, max_size=30),
       st.integers(1, 20))
def test_the_whole_tree_bound_drops_its_least_recently_used_leaves_first(
    inserts: list, cut_nodes: int
) -> None:
    tree = RadixTree()
    for seq, rid in inserts:
        tree.insert("ns", enc(seq), rid, budget=None)
    # by brute force: every node in (touched, -end) order (a parent sorts after its
    # children), dropped whole while the estimate, with the next insert's 1-token node
    # counted, is over the bound
    order = sorted(tree.walk(), key=lambda node: (node.touched, -node.end))
    limit = tree.estimated_bytes() - cut_nodes * _NODE_BYTES
    size = tree.estimated_bytes() + 4 + _NODE_BYTES + _HOLD_BYTES
    victims = set()
    for node in order:
        if size <= limit:
            break
        size -= len(node.edge) + _NODE_BYTES + _HOLD_BYTES * len(node.holders)
        victims.add(id(node))
    kept = {id(node) for node in tree.walk()} - victims
    tree.max_bytes = limit
    tree.insert("other", enc([5]), "a", budget=None)
    after = {id(node) for node in tree.walk() if node.end != 1 or node.edge != enc([5])}
    assert after == kept
    tree.check_integrity()
