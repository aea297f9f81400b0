"""The radix tree against a brute-force model: per replica, the list of inserted sequences."""

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.radix_tree import RadixTree
from policies.ring import token_bytes

REPLICAS = ["a", "b", "c"]
seqs = st.lists(st.integers(0, 3), min_size=1, max_size=12)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), seqs, st.sampled_from(REPLICAS)),
        st.tuples(st.just("match"), seqs, st.just("")),
        st.tuples(st.just("drop"), st.just([]), st.sampled_from(REPLICAS)),
    ),
    max_size=40,
)


def enc(seq: list[int]) -> bytes:
    return bytes(token_bytes(seq))


def lcp(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def model_match(model: dict[str, list[list[int]]], query: list[int]) -> dict[str, int]:
    out = {rid: max((lcp(s, query) for s in held), default=0) for rid, held in model.items()}
    return {rid: m for rid, m in out.items() if m}


def prefixes(held: list[list[int]]) -> int:
    return len({tuple(s[:i]) for s in held for i in range(1, len(s) + 1)})


@settings(max_examples=300, deadline=None)
@given(ops)
def test_matches_model_without_eviction(program: list) -> None:
    tree = RadixTree()
    model: dict[str, list[list[int]]] = {}
    for op, seq, rid in program:
        if op == "insert":
            tree.insert("ns", enc(seq), rid, budget=None)
            model.setdefault(rid, []).append(seq)
        elif op == "drop":
            tree.drop(rid)
            model.pop(rid, None)
        else:
            assert tree.match("ns", enc(seq)) == model_match(model, seq)
        tree.check_integrity()
        assert tree.tokens == {rid: prefixes(h) for rid, h in model.items() if h}
    for held in model.values():
        for seq in held:
            assert tree.match("ns", enc(seq)) == model_match(model, seq)
    assert tree.match("other", enc([0, 1])) == {}


@settings(max_examples=300, deadline=None)
@given(ops, st.integers(1, 10))
def test_budget_evicts_lru_leaves(program: list, budget: int) -> None:
    tree = RadixTree()
    model: dict[str, list[list[int]]] = {}
    for op, seq, rid in program:
        if op == "insert":
            tree.insert("ns", enc(seq), rid, budget=budget)
            model.setdefault(rid, []).append(seq)
            # the newest sequence is evicted last: kept whole when it fits
            held = tree.match("ns", enc(seq)).get(rid, 0)
            assert held == len(seq) if len(seq) <= budget else held <= budget
        elif op == "drop":
            tree.drop(rid)
            model.pop(rid, None)
        else:
            got = tree.match("ns", enc(seq))
            bound = model_match(model, seq)
            assert all(m <= bound.get(r, 0) for r, m in got.items()), (got, bound)
        tree.check_integrity()
        assert all(held <= budget for held in tree.tokens.values()), tree.tokens


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(seqs, st.sampled_from(REPLICAS)), max_size=30), st.integers(0, 3000))
def test_whole_tree_bound(program: list, max_bytes: int) -> None:
    tree = RadixTree(max_bytes=max_bytes)
    for seq, rid in program:
        tree.insert("ns", enc(seq), rid, budget=None)
        tree.check_integrity()
        assert tree.estimated_bytes() <= max_bytes or tree.nodes == 0


def test_lru_order_across_documents() -> None:
    tree = RadixTree()
    docs = {name: enc([i] * 5 + [9, i]) for i, name in enumerate("xyz")}
    for name in "xyz":
        tree.insert("ns", docs[name], "r", budget=None)
    tree.insert("ns", docs["x"], "r", budget=None)  # x is now the most recent
    tree.evict_replica("r", budget=14)  # room for two documents of 7 tokens
    tree.check_integrity()
    assert tree.match("ns", docs["y"]) == {}
    assert tree.match("ns", docs["x"]) == {"r": 7} and tree.match("ns", docs["z"]) == {"r": 7}


def test_split_shares_the_prefix() -> None:
    tree = RadixTree()
    tree.insert("ns", enc([1, 2, 3, 4]), "a", budget=None)
    tree.insert("ns", enc([1, 2, 7]), "b", budget=None)
    tree.check_integrity()
    assert tree.total_tokens == 5 and tree.nodes == 3
    assert tree.match("ns", enc([1, 2, 3, 9])) == {"a": 3, "b": 2}
    assert tree.tokens == {"a": 4, "b": 3}
    tree.drop("a")
    tree.check_integrity()
    assert tree.total_tokens == 3 and tree.match("ns", enc([1, 2, 3])) == {"b": 2}
