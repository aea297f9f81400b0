import random
from collections import Counter, deque

import pytest

from policies.base import Finished, ReplicaView, Routed, RouteRequest
from policies.prefix_affinity import PrefixAffinity, PrefixAffinityConfig
from policies.prompt_chunks import id_chunks, text_chunks
from tests.support.policy_state import snapshot

RNG_VOCAB = 50_000


def doc(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(RNG_VOCAB) for _ in range(n)]


def token_keyed(**settings: object) -> PrefixAffinity:
    """The policy keying on token ids (``chunk_chars: 0``): its caller tokenizes."""
    return PrefixAffinity(PrefixAffinityConfig(chunk_chars=0, **settings))  # type: ignore[arg-type]


def views(loads: dict[str, int]) -> list[ReplicaView]:
    return [ReplicaView(rid, queued_tokens=q) for rid, q in loads.items()]


def test_same_prefix_same_replica_and_choose_is_pure() -> None:
    policy = PrefixAffinity()
    fleet = views({f"r{i}": 0 for i in range(8)})
    body = doc(1, 2000)
    before = snapshot(policy)
    a = policy.choose(RouteRequest([*body, 1, 2, 3], 2003), fleet)
    b = policy.choose(RouteRequest([*body, 9, 9], 2002), fleet)
    assert snapshot(policy) == before
    assert a.reason == b.reason == "affinity" and a.ranked == b.ranked
    assert len(a.ranked) == 3 and len(set(a.ranked)) == 3
    others = {policy.choose(RouteRequest(doc(s, 1100), 1100), fleet).chosen for s in range(40)}
    assert len(others) >= 6, "different prefixes should spread"


def test_affinity_key_overrides_tokens_and_salt_separates() -> None:
    policy = PrefixAffinity()
    fleet = views({f"r{i}": 0 for i in range(16)})
    chosen = {
        policy.choose(RouteRequest(doc(s, 1024), 1024, affinity_key="contract-7"), fleet).chosen
        for s in range(20)
    }
    assert len(chosen) == 1
    salted = {
        policy.choose(RouteRequest(doc(1, 1024), 1024, cache_salt=f"t{s}"), fleet).chosen
        for s in range(40)
    }
    assert len(salted) > 4


@pytest.mark.parametrize("slack", [0, 3000])
def test_bounded_load_under_a_hot_key(slack: int) -> None:
    """30% of requests share one key; queues hold the last 64 routed requests. A replica
    takes a request while its queue, counting the request, is within overload x the mean,
    or while its queue is at most ``slack`` tokens (min_queue_tokens)."""
    n, overload, size = 8, 1.25, 1000
    policy = PrefixAffinity(PrefixAffinityConfig(overload=overload, min_queue_tokens=slack))
    rng = random.Random(5)
    loads = {f"r{i}": 0 for i in range(n)}
    recent: deque[tuple[str, int]] = deque()
    hot_to: Counter[str] = Counter()
    hot_body = doc(0, 1024)
    for step in range(6000):
        hot = rng.random() < 0.3
        body = hot_body if hot else doc(1 + rng.randrange(500), 1024)
        p = size + rng.randrange(200)
        d = policy.choose(RouteRequest(body, p), views(loads))
        bound = max(overload * (sum(loads.values()) + p) / n, slack + p)
        assert loads[d.chosen] + p <= bound + p, (step, loads, d)
        if d.reason == "affinity":
            assert loads[d.chosen] == 0 or loads[d.chosen] + p <= bound
        loads[d.chosen] += p
        recent.append((d.chosen, p))
        if len(recent) > 64:
            old, q = recent.popleft()
            loads[old] -= q
        if hot and step > 500:
            hot_to[d.chosen] += 1
    # the hot key carries ~0.3 of the load; one replica may carry overload / n of it
    needed = 0.3 / (overload / n)
    top = [c for _, c in hot_to.most_common()]
    assert len(hot_to) >= 2 and len(hot_to) >= int(needed)
    covering = next(i for i in range(len(top)) if sum(top[: i + 1]) >= 0.9 * sum(top)) + 1
    assert covering <= int(needed) + 3, hot_to  # concentrated on its ring successors


def test_spill_goes_to_least_loaded() -> None:
    policy = PrefixAffinity()
    body = doc(3, 1024)
    fleet = {f"r{i}": 0 for i in range(4)}
    home = policy.choose(RouteRequest(body, 1000), views(fleet)).chosen
    for rid in fleet:
        fleet[rid] = 10_000
    fleet[home] = 100_000
    quiet = next(r for r in fleet if r != home)
    fleet[quiet] = 5_000
    d = policy.choose(RouteRequest(body, 1000), views(fleet))
    assert d.reason == "affinity" and d.chosen != home  # next on the ring within the bound
    for rid in fleet:
        fleet[rid] = 100_000
    fleet[quiet] = 90_000
    d = policy.choose(RouteRequest(body, 200_000), views(fleet))
    assert d.reason == "spill" and d.chosen == quiet
    assert next(s.replica for s in d.scores) == home


def test_shared_system_prompt_is_learned_and_skipped() -> None:
    """A 1,500-token system prompt before each contract must not collapse the key."""
    policy = token_keyed()
    fleet = views({f"r{i}": 0 for i in range(8)})
    system = doc(999, 1500)
    contracts = [doc(s, 6000) for s in range(60)]

    def route(i: int) -> str:
        prompt = system + contracts[i % 60] + doc(10_000 + i, 80)
        req = RouteRequest(prompt[: policy.tokens_needed], len(prompt))
        d = policy.choose(req, fleet)
        policy.observe(Routed(req, d.chosen))
        return d.chosen

    assert policy.tokens_needed == 1024
    early = {route(i) for i in range(60)}
    assert len(early) == 1, "before learning, every prompt hashes inside the system prompt"
    for i in range(60, 400):
        route(i)
    learned = policy.common_prefix_tokens
    assert 1024 < learned <= 1500 and learned % 256 == 0, learned
    assert policy.tokens_needed == learned + 1024
    by_contract: dict[int, set[str]] = {}
    for i in range(400, 640):
        by_contract.setdefault(i % 60, set()).add(route(i))
    assert all(len(s) == 1 for s in by_contract.values()), "a contract moved"
    spread = Counter(next(iter(s)) for s in by_contract.values())
    assert len(spread) >= 6, spread


def test_two_system_prompts_under_half_the_traffic_each_are_not_skipped() -> None:
    policy = token_keyed(common_share=0.6, common_min_samples=16)
    fleet = views({f"r{i}": 0 for i in range(8)})
    systems = [doc(1, 600), doc(2, 600)]
    for i in range(200):
        prompt = systems[i % 2] + doc(100 + i, 3000)
        req = RouteRequest(prompt[: policy.tokens_needed], len(prompt))
        policy.observe(Routed(req, policy.choose(req, fleet).chosen))
    assert policy.common_prefix_tokens == 0


def test_ring_is_cached_per_membership() -> None:
    policy = PrefixAffinity(PrefixAffinityConfig(vnodes=64))
    a = views({"x": 0, "y": 0, "z": 0})
    ring = policy.ring(a)
    assert policy.ring(views({"x": 5, "y": 1, "z": 9})) is ring  # loads do not matter
    assert policy.ring(a[::-1]) is ring  # nor the order
    assert policy.ring(a[:2]) is not ring
    weighted = [ReplicaView("x", weight=2.0), *a[1:]]
    assert policy.ring(weighted) is not ring


def test_health_flip_moves_only_that_replicas_keys_without_a_rebuild() -> None:
    policy = PrefixAffinity(PrefixAffinityConfig(vnodes=128, learn_common_prefix=False))
    fleet = [ReplicaView(f"r{i}") for i in range(8)]
    requests = [RouteRequest(doc(s, 64), 64) for s in range(400)]
    before = [policy.choose(r, fleet).chosen for r in requests]
    ring = policy.ring(fleet)
    down = [ReplicaView(v.id, healthy=v.id != "r3") for v in fleet]
    after = [policy.choose(r, down).chosen for r in requests]
    assert policy.ring(down) is ring  # same membership: no rebuild on a health flip
    moved = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    assert moved and all(b == "r3" for b, _ in moved)
    assert "r3" not in after
    assert [policy.choose(r, fleet).chosen for r in requests] == before



def test_anchor_bounds_the_hashed_window() -> None:
    policy = token_keyed(prefix_tokens=512, learn_common_prefix=False)
    head = doc(7, 300)
    turn1, turn2 = head + doc(8, 40), head + doc(8, 40) + doc(9, 400)
    k1 = policy.key(RouteRequest(turn1, len(turn1), anchor_tokens=300))
    k2 = policy.key(RouteRequest(turn2, len(turn2), anchor_tokens=300))
    assert k1 == k2  # only the anchor is hashed while it is shorter than K
    assert policy.key(RouteRequest(turn1, len(turn1))) != policy.key(
        RouteRequest(turn2, len(turn2)))  # without it, the window runs into the new turns
    long_head = doc(10, 900)
    a = policy.key(RouteRequest([*long_head, 1], 901, anchor_tokens=900))
    assert a == policy.key(RouteRequest([*long_head, 2], 901))  # K caps a long anchor


def test_a_burst_of_one_prompt_is_not_learned_as_a_shared_prefix() -> None:
    def burst(with_fingerprint: bool) -> int:
        policy = token_keyed(common_min_samples=16)
        same = doc(5, 3000)
        for i in range(200):
            others = doc(100 + i, 3000)
            for prompt in (same, same, same, others):  # one prompt is 3/4 of the traffic
                req = RouteRequest(prompt[: policy.tokens_needed], len(prompt),
                                   fingerprint=hash(tuple(prompt)) if with_fingerprint else None)
                policy.observe(Routed(req, "r0"))
        return policy.common_prefix_tokens

    assert burst(with_fingerprint=False) > 0  # without identities it looks shared
    assert burst(with_fingerprint=True) == 0  # repeats of one prompt count once


def test_distinct_prompts_with_fingerprints_still_learn_a_system_prompt() -> None:
    policy = token_keyed(common_min_samples=16)
    system = doc(999, 600)
    for i in range(100):
        prompt = system + doc(i, 2000)
        policy.observe(Routed(RouteRequest(prompt[: policy.tokens_needed], len(prompt),
                                           fingerprint=i), "r0"))
    assert policy.common_prefix_tokens == 512


def text_request(text: str, **fields: object) -> RouteRequest:
    """A completion as the gateway's builder hands it to a pieces-keyed policy."""
    return RouteRequest((), len(text) // 4, chunks=text_chunks(text, 64), chunk_tokens=16.0,
                        **fields)  # type: ignore[arg-type]


def words(seed: int, n: int) -> str:
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(RNG_VOCAB)}" for _ in range(n))


def test_pieces_key_documents_and_skip_a_learned_system_prompt() -> None:
    """By default the key hashes 64-character pieces: K = 1,024 tokens is 64 pieces, and
    a shared system prompt longer than that is learned (in steps of 16 pieces) and skipped."""
    policy = PrefixAffinity()
    assert policy.tokens_needed == 0 and policy.chunk_chars == 64
    fleet = views({f"r{i}": 0 for i in range(8)})
    system = words(999, 1200)  # ~8,000 characters: past the 64 pieces K reads
    contracts = [words(s, 1500) for s in range(60)]

    def route(i: int) -> str:
        req = text_request(system + contracts[i % 60] + words(10_000 + i, 20), fingerprint=i)
        d = policy.choose(req, fleet)
        policy.observe(Routed(req, d.chosen))
        return d.chosen

    assert len({route(i) for i in range(60)}) == 1, "every key inside the system prompt"
    for i in range(60, 400):
        route(i)
    learned = policy.common_prefix_tokens  # pieces x 16
    assert 64 * 16 < learned <= len(system) // 64 * 16 and learned % 256 == 0, learned
    by_contract: dict[int, set[str]] = {}
    for i in range(400, 640):
        by_contract.setdefault(i % 60, set()).add(route(i))
    assert all(len(s) == 1 for s in by_contract.values()), "a contract moved"
    assert len(Counter(next(iter(s)) for s in by_contract.values())) >= 6


def test_documents_shorter_than_k_are_keyed_by_themselves_not_their_questions() -> None:
    """Documents of ~2,000 characters (about half of K) each followed by a question: from
    a document's second request on, it keeps one replica (the key's rungs), and documents
    spread over the fleet."""
    policy = PrefixAffinity(PrefixAffinityConfig(learn_common_prefix=False))
    fleet = views({f"r{i}": 0 for i in range(8)})
    contracts = [words(s, 300) for s in range(40)]
    questions = iter(words(10_000 + i, 20) for i in range(10_000))

    def route(i: int) -> str:
        req = text_request(contracts[i] + next(questions))
        chosen = policy.choose(req, fleet).chosen
        policy.observe(Routed(req, chosen))
        return chosen

    for i in range(40):
        route(i)
    by_contract = {i: {route(i) for _ in range(6)} for i in range(40)}
    assert all(len(s) == 1 for s in by_contract.values()), "a contract moved"
    assert len(Counter(next(iter(s)) for s in by_contract.values())) >= 6
    fixed = PrefixAffinity(PrefixAffinityConfig(learn_common_prefix=False, key_rungs=1))
    assert len({fixed.choose(text_request(contracts[0] + next(questions)), fleet).chosen
                for _ in range(12)}) > 1, "with one rung the question is in the key"


def test_a_chats_anchor_in_pieces_bounds_the_window() -> None:
    policy = PrefixAffinity(PrefixAffinityConfig(learn_common_prefix=False))
    head = words(7, 300)  # ~2,000 characters: shorter than the 64 pieces K reads
    turn1, turn2 = head + words(8, 40), head + words(8, 40) + words(9, 600)
    anchor = len(head) // 64
    k1 = policy.key(text_request(turn1, anchor_chunks=anchor))
    assert k1 == policy.key(text_request(turn2, anchor_chunks=anchor))
    assert policy.key(text_request(turn1)) != policy.key(text_request(turn2))


def test_a_request_of_token_ids_alone_is_keyed_by_its_id_pieces() -> None:
    """A caller that hands over token ids and no pieces (the policy benchmark, a test)
    gets the key the gateway's builder gives those ids: their 16-id pieces."""
    policy = PrefixAffinity()
    ids = doc(3, 3000)
    assert policy.key(RouteRequest(ids, len(ids))) == policy.key(
        RouteRequest((), len(ids), chunks=id_chunks(ids), chunk_tokens=16.0))
    assert policy.key(RouteRequest(ids, len(ids))) != policy.key(
        RouteRequest(doc(4, 3000), 3000))


def test_chunk_chars_below_zero_or_a_block_under_one_piece_is_refused() -> None:
    with pytest.raises(ValueError, match="chunk_chars must be >= 0, got -1"):
        PrefixAffinityConfig(chunk_chars=-1).validate()
    with pytest.raises(ValueError, match="common_block must be >= 16 tokens"):
        PrefixAffinityConfig(common_block=8).validate()
    PrefixAffinityConfig(common_block=8, chunk_chars=0).validate()


def test_observe_after_choose_counts_what_a_fresh_derivation_counts() -> None:
    """``observe(Routed)`` reads the key that ``choose`` derived for the same request;
    the policy then learns exactly what it learns when observe derives the key itself
    (prompts sharing a system prompt, documents coming back, one-off questions)."""
    system = doc(900, 300)
    docs = [doc(s, 1500) for s in range(12)]
    rng = random.Random(4)
    reused, fresh = PrefixAffinity(), PrefixAffinity()
    fleet = views({f"r{i}": 0 for i in range(6)})
    for i in range(400):
        tokens = [*system, *docs[rng.randrange(12)], *doc(1000 + i, 60)]
        text = " ".join(map(str, tokens))
        for policy, keep in ((reused, True), (fresh, False)):
            req = text_request(text)
            chosen = policy.choose(req, fleet).chosen
            if not keep:
                policy._keyed.clear()  # observe derives it again
            policy.observe(Routed(req, chosen, fleet))
            policy.observe(Finished(req, chosen, ok=True))
        if i % 100 == 99:
            assert snapshot(reused) == snapshot(fresh)
    assert reused.common_prefix_tokens > 0  # the learner moved on meanwhile
