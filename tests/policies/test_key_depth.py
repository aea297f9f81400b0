import random
from hashlib import blake2b

import pytest

from policies.key_depth import KeyDepth, Window, rung_ends
from policies.ring import token_bytes

NS = blake2b(b"model", digest_size=8)


def units(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1 << 32) for _ in range(n)]


def window_of(depth: KeyDepth, prompt: list[int], start: int = 0) -> Window:
    return depth.window(NS, token_bytes(prompt), start, min(len(prompt), start + 64))


def route(depth: KeyDepth, prompt: list[int]) -> int:
    """The key ``prompt`` gets, then counted as routed."""
    window = window_of(depth, prompt)
    key = depth.pick(window)
    depth.observe(window, key)
    return key


def test_rungs_halve_the_window_down_to_one_unit() -> None:
    assert rung_ends(64, 4) == (8, 16, 32, 64)
    assert rung_ends(3, 4) == (1, 3)
    assert rung_ends(64, 1) == (64,)
    for deepest, rungs in ((0, 2), (8, 0)):
        with pytest.raises(ValueError, match=r"must be >= 1"):
            rung_ends(deepest, rungs)


def test_the_rungs_are_prefixes_of_the_window_and_the_last_is_all_of_it() -> None:
    prompt = units(1, 100)
    data = token_bytes(prompt)
    depth = KeyDepth(64, 4)
    window = depth.window(NS, data, 5, 100)
    assert len(window.rungs) == 4 and window.full and len(window.prefixes) == 64
    # a rung is the same whatever follows it; the last covers [5, 69)
    assert depth.window(NS, data, 5, 5 + 16).rungs == window.rungs[:2]
    assert depth.window(NS, data, 5, 69).rungs == window.rungs
    assert depth.window(NS, data, 5, 5 + 40).rungs[:3] == window.rungs[:3]
    assert depth.window(NS, token_bytes([*prompt[:68], 7]), 5, 69).rungs[-1] != \
        window.rungs[-1]
    assert depth.window(blake2b(b"other", digest_size=8), data, 5, 100).rungs[0] != \
        window.rungs[0]
    plain = NS.copy()
    plain.update(data[4 * 5 : 4 * 69])
    assert window.rungs[-1] == int.from_bytes(plain.digest(), "little")
    short = depth.window(NS, data, 0, 20)
    assert len(short.rungs) == 3 and not short.full  # rungs 8, 16 and the end
    single = KeyDepth(64, 1)
    assert single.window(NS, data, 5, 100).rungs == [window.rungs[-1]]


def test_a_document_shorter_than_the_window_is_keyed_by_itself() -> None:
    """Documents of 20 units, each followed by a question of its own: with one rung every
    request gets a key of its own; with rungs, each document one key from its second
    request on, and documents different keys."""
    docs = [units(s, 20) for s in range(30)]
    questions = iter(units(1000 + i, 30) for i in range(10_000))
    fixed, laddered = KeyDepth(64, 1), KeyDepth(64, 4)
    for policy in (fixed, laddered):
        for d in docs:
            route(policy, d + next(questions))  # first requests
    keys = {i: {route(laddered, d + next(questions)) for _ in range(5)}
            for i, d in enumerate(docs)}
    assert all(len(k) == 1 for k in keys.values()), "a document's key changed"
    assert len({next(iter(k)) for k in keys.values()}) == len(docs)
    assert len({route(fixed, docs[0] + next(questions)) for _ in range(5)}) == 5


def test_documents_after_a_shared_preamble_are_keyed_apart_once_they_return() -> None:
    """A 10-unit preamble before 100-unit documents: the preamble's branches come back, so
    a new document is a new branch, not the preamble's key."""
    preamble = units(7, 10)
    depth = KeyDepth(64, 4)
    docs = [preamble + units(s, 100) for s in range(40)]
    for _ in range(3):
        for d in docs:
            route(depth, d + units(random.random(), 5))
    preamble_key = depth.window(NS, token_bytes(docs[0]), 0, 64).rungs[1]  # rung of 16
    fresh = {route(depth, preamble + units(500 + s, 100)) for s in range(20)}
    assert len(fresh) == 20 and preamble_key not in fresh


def test_a_conversation_keeps_its_first_turns_key() -> None:
    """Each turn repeats the ones before it (no chat head ends the window): every turn
    takes the first one's key; another conversation gets another key."""
    depth = KeyDepth(64, 4)
    firsts = []
    for c in range(10):
        prompt = units(c, 12)
        keys = {route(depth, prompt)}
        for turn in range(6):
            prompt = prompt + units(100 * c + turn, 9)
            keys.add(route(depth, prompt))
        assert len(keys) == 1, f"conversation {c} changed key"
        firsts.append(keys.pop())
    assert len(set(firsts)) == 10


def test_one_rung_keeps_no_counts_and_passes_no_key_on() -> None:
    depth = KeyDepth(64, 1)
    first = window_of(depth, units(3, 30))
    depth.observe(first, depth.pick(first))  # nothing to count
    later = window_of(depth, [*units(3, 30), 1, 2, 3])
    assert depth.pick(later) == later.rungs[0] != first.rungs[0]
