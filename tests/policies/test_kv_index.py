"""The KV event index: against a real engine core, against a brute-force model, and the
wire format in both of its encodings."""

from __future__ import annotations

import random

import msgpack
import pytest

from engine.request import SamplingParams
from kvwire.block_hashing import hash_to_u64
from kvwire.kv_event_format import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVWireError,
    decode_payload,
    encode_payload,
)
from policies.kv_index import KVIndex, chain_key, root_key
from tests.support.engine_cores import make_core

BS = 4


def stored(hashes: list[int], parent: int | None, tokens: list[int]) -> BlockStored:
    return BlockStored(tuple(hashes), parent, tuple(tokens), BS)


# -- the index mirrors what an engine can hit --------------------------------------------


def test_index_matches_the_engines_own_lookup() -> None:
    """Drive a small sim engine (evictions, a reset) and feed its events through the wire
    encoding; after every step, the index's match equals the engine's prefix lookup."""
    rng = random.Random(5)
    core = make_core(num_blocks=40, block_size=BS, vocab=(300, 400))
    core.kv.pool.events = []
    index = KVIndex(BS)
    docs = [[rng.randrange(1000) for _ in range(rng.randrange(8, 40))] for _ in range(6)]
    probes: list[list[int]] = []
    seq = n_req = 0
    checked = hits = 0
    for step in range(400):
        if step == 200:
            core.reset_prefix_cache()
        while len(core.requests) < 3 and n_req < 150:
            doc = rng.choice(docs)
            prompt = doc + [rng.randrange(1000) for _ in range(rng.randrange(1, 9))]
            probes.append(prompt)
            params = SamplingParams(max_tokens=rng.randrange(1, 6), ignore_eos=True)
            # a salted request's blocks are its tenant's alone: an unsalted probe of the
            # same tokens hits none of them in the engine, and must match none here
            salt = "tenant-a" if rng.random() < 0.3 else None
            core.add_request(core.make_request(f"q{n_req}", prompt, params, cache_salt=salt))
            n_req += 1
        if core.has_unfinished():
            core.step()
        events = core.kv.pool.events
        if events:
            batch = decode_payload(encode_payload(KVEventBatch(0.0, tuple(events), 0)))
            events.clear()
            index.apply("r0", seq, batch.events)
            seq += 1
        index.check_integrity()
        core.check_integrity()
        for prompt in probes[-6:] + docs:
            probe = core.make_request("probe", prompt)
            engine_blocks = len(core.kv.lookup(probe))
            got = index.match(prompt, ["r0"], (len(prompt) - 1) // BS)["r0"]
            assert got == engine_blocks, (step, prompt)
            checked += 1
            hits += engine_blocks > 0
    assert core.kv.pool.num_evictions > 0 and index.stats.restarts == 0
    assert hits > checked // 4  # the workload did exercise hits
    assert index.stats.keyed_elsewhere > 0  # ... and salted chains


def test_a_block_hashed_over_more_than_its_tokens_is_not_indexed() -> None:
    """vLLM's extra keys: a salted chain's first block, or an image's, is named by no
    prompt's tokens, and neither is the rest of its event; an adapter's name alone (vLLM
    puts it in every block of an adapter's chain) is what the index keys by anyway."""
    index = KVIndex(BS)
    toks = list(range(100, 112))
    salted = BlockStored((1, 2, 3), None, tuple(toks), BS, extra_keys=(("tenant-a",), None,
                                                                       None))
    image = BlockStored((4, 5, 6), None, tuple(toks), BS,
                        extra_keys=(None, (("mm", "sha256:ab"),), None))
    index.apply("r", 0, [salted, image])
    assert index.num_blocks("r") == 1 and index.stats.keyed_elsewhere == 5
    assert index.match(toks, ["r"])["r"] == 1  # the image's block 0, before the image
    index.apply("r", 1, [BlockStored((7,), 3, tuple(range(4)), BS)])  # after the salted
    assert index.stats.orphans == 1
    adapter = BlockStored((8, 9), None, tuple(toks[:8]), BS, lora_name="sql-lora",
                          extra_keys=(("sql-lora",), ("sql-lora",)))
    index.apply("q", 0, [adapter])
    assert index.match(toks, ["q"], model="sql-lora")["q"] == 2


def test_index_against_brute_force_prefix_sets() -> None:
    """Random stored/removed events, with duplicate contents under distinct engine hashes
    (a salted copy); the model: each live hash holds its whole token prefix."""
    rng = random.Random(11)
    index = KVIndex(BS)
    live: dict[int, tuple[int, ...]] = {}  # engine hash -> token prefix it completes
    prefixes: list[tuple[int, ...]] = []  # every prefix ever stored, to build prompts
    alphabet = range(3)  # few tokens: many shared prefixes
    next_hash = deepest = 0
    for _ in range(1500):
        if live and rng.random() < 0.45:
            gone = rng.sample(sorted(live), k=min(len(live), rng.randrange(1, 4)))
            index.apply_event("r", BlockRemoved(tuple(gone)))
            for h in gone:
                del live[h]
        else:
            parent = rng.choice([None, *sorted(live)]) if live else None
            prefix = () if parent is None else live[parent]
            n = rng.randrange(1, 4)
            tokens = [rng.choice(alphabet) for _ in range(n * BS)]
            hashes = list(range(next_hash, next_hash + n))
            next_hash += n
            index.apply_event("r", stored(hashes, parent, tokens))
            for i, h in enumerate(hashes):
                live[h] = prefix + tuple(tokens[: (i + 1) * BS])
                prefixes.append(live[h])
        index.check_integrity()
        held = set(live.values())
        for _ in range(3):
            prompt = [*rng.choice(prefixes), *[rng.choice(alphabet)] * rng.randrange(9)]
            want = 0
            while (want + 1) * BS <= len(prompt) and tuple(prompt[: (want + 1) * BS]) in held:
                want += 1
            assert index.match(prompt, ["r"])["r"] == want
            deepest = max(deepest, want)
    assert deepest >= 4  # long chains were exercised


# -- removal, clear, restart, and what cannot be applied -----------------------------------


def test_removal_clear_and_restart() -> None:
    index = KVIndex(BS)
    toks = list(range(12))
    index.apply("a", 0, [stored([10, 11, 12], None, toks)])
    index.apply("b", 0, [stored([20], None, toks[:4])])
    assert index.match([*toks, 99], ["a", "b", "c"]) == {"a": 3, "b": 1, "c": 0}
    index.apply("a", 1, [BlockRemoved((11,))])  # a middle block: the chain breaks there
    index.check_integrity()
    assert index.match(toks, ["a"])["a"] == 1 and index.num_blocks("a") == 2
    index.apply("a", 2, [AllBlocksCleared()])
    assert index.num_blocks("a") == 0 and index.match(toks, ["a", "b"]) == {"a": 0, "b": 1}
    index.apply("a", 3, [stored([30, 31], None, toks[:8])])
    index.apply("a", 7, [])  # messages 4-6 lost
    assert index.stats.gaps == 3 and index.num_blocks("a") == 2
    index.apply("a", 0, [stored([40], None, toks[:4])])  # seq back to 0: a new process
    index.check_integrity()
    assert index.stats.restarts == 1 and index.num_blocks("a") == 1
    assert index.match(toks, ["a"])["a"] == 1
    index.remove_replica("b")
    assert index.replicas() == ["a"]


def test_orphans_wrong_block_size_and_duplicates() -> None:
    index = KVIndex(BS)
    toks = list(range(8))
    index.apply_event("r", stored([2], 999, toks[4:8]))  # parent never seen
    index.apply_event("r", BlockStored((3,), None, tuple(toks), 8))  # another block size
    assert index.num_blocks("r") == 0
    assert index.stats.orphans == 1 and index.stats.wrong_block_size == 1
    # the same tokens under two engine hashes (a salted copy): one key, two references
    index.apply_event("r", stored([5, 6], None, toks))
    index.apply_event("r", stored([7], None, toks[:4]))
    index.check_integrity()
    index.apply_event("r", BlockRemoved((6,)))
    index.apply_event("r", BlockRemoved((5,)))
    assert index.match(toks, ["r"])["r"] == 1  # block 0 still held through hash 7
    index.apply_event("r", BlockRemoved((7, 12345)))  # an unknown hash is ignored
    index.check_integrity()
    assert index.match(toks, ["r"])["r"] == 0 and index.num_blocks("r") == 0


def test_a_block_stored_twice_stays_until_both_copies_are_removed() -> None:
    # vLLM keeps one physical block per request that computed it: two requests filling
    # the same prefix in one step store its hashes twice, and each copy's eviction
    # removes them once
    index = KVIndex(BS)
    toks = list(range(8))
    index.apply_event("r", stored([5, 6], None, toks))
    index.apply_event("r", stored([5, 6], None, toks))
    index.check_integrity()
    assert index.num_blocks("r") == 2
    index.apply_event("r", BlockRemoved((5, 6)))  # one copy evicted
    assert index.match(toks, ["r"])["r"] == 2
    index.apply_event("r", stored([9], 6, list(range(8, 12))))  # a child of the copy held
    assert index.match([*toks, *range(8, 12)], ["r"])["r"] == 3
    assert index.stats.orphans == 0
    index.apply_event("r", BlockRemoved((5, 6)))  # the other copy
    index.check_integrity()
    assert index.match(toks, ["r"])["r"] == 0
    # a hash stored again with other tokens (another engine's meaning) replaces every copy
    index.apply_event("r", stored([9], None, toks[:4]))
    index.check_integrity()
    assert index.num_blocks("r") == 1 and index.match(toks, ["r"])["r"] == 1


def test_keys_are_chained_and_adapters_separate() -> None:
    toks = list(range(16))
    keys = [root_key()]
    for lo in range(0, 16, BS):
        keys.append(chain_key(keys[-1], toks[lo : lo + BS]))
    assert len(set(keys)) == 5
    changed = chain_key(chain_key(root_key(), [9, *toks[1:BS]]), toks[BS : 2 * BS])
    assert changed != keys[2]  # a change early changes every later key
    assert root_key("sql-lora") != root_key(None) == root_key("")
    index = KVIndex(BS)
    index.apply_event("r", BlockStored((1,), None, tuple(toks[:4]), BS, lora_name="sql-lora"))
    assert index.match(toks, ["r"])["r"] == 0 and index.num_blocks("r") == 1
    # a request for the adapter (its name as the model) finds the adapter's blocks; the
    # base model's, or another name, does not
    assert index.match(toks, ["r"], model="sql-lora")["r"] == 1
    assert index.match(toks, ["r"], model="llama-3-8b")["r"] == 0
    # an engine that names the adapter only by id (no lora_name): never the base model's
    index.apply_event("q", BlockStored((2,), None, tuple(toks[:4]), BS, lora_id=3))
    assert index.num_blocks("q") == 1
    assert index.match(toks, ["q"])["q"] == index.match(toks, ["q"], model="3")["q"] == 0
    index.apply_event("q", BlockStored((5,), None, tuple(toks[:4]), BS, lora_id=0))
    assert index.match(toks, ["q"])["q"] == 1  # lora_id 0: no adapter
    # an adapter the index has seen no block of by name (an engine naming it by id, or
    # none computed yet) finds nothing: the base model's blocks are no hit for it
    assert index.match(toks, ["q"], model="sql-lora-2", adapter=True)["q"] == 0
    assert index.match(toks, ["q"], model="llama-3-8b", adapter=False)["q"] == 1
    assert index.match(toks, ["r"], model="sql-lora", adapter=True)["r"] == 1


# -- the wire format -----------------------------------------------------------------------


def test_array_encoding_round_trip() -> None:
    events = (stored([1, (1 << 64) - 1], None, list(range(8))),
              BlockStored((3,), 1, tuple(range(4)), BS, 7, "GPU", "x"),
              BlockRemoved((1,)), AllBlocksCleared())
    raw = encode_payload(KVEventBatch(12.5, events, 0))
    assert msgpack.unpackb(raw)[1][2] == ["BlockRemoved", [1], "GPU"]
    assert decode_payload(raw) == KVEventBatch(12.5, events, 0)


def test_map_encoding_unknown_fields_and_hash_forms() -> None:
    digest = bytes(range(32))
    payload = msgpack.packb({
        "ts": 3, "data_parallel_rank": None, "future_field": [1, 2],
        "events": [
            {"type": "BlockStored", "block_hashes": [-1, digest], "parent_block_hash": digest,
             "token_ids": list(range(8)), "block_size": 4, "lora_id": None,
             "medium": "GPU", "lora_name": None, "extra_keys": [["salt"]]},
            {"type": "BlockRemoved", "block_hashes": [(1 << 63) + 5]},
            {"type": "SomethingNew", "x": 1},
            ["BlockRemoved", [9], "GPU", "later-field"],
            ["AllBlocksCleared"],
            ["FutureEvent", 1, 2],
        ],
    })
    batch = decode_payload(payload)
    low = hash_to_u64(digest)
    assert batch.ts == 3.0 and batch.data_parallel_rank is None
    assert batch.events == (
        BlockStored(((1 << 64) - 1, low), low, tuple(range(8)), 4, None, "GPU", None,
                    (("salt",),)),
        BlockRemoved(((1 << 63) + 5,), None),
        BlockRemoved((9,), "GPU"),
        AllBlocksCleared(),
    )
    short = decode_payload(msgpack.packb([1.0, [["BlockStored", [4], None, [1, 2, 3, 4], 4]]]))
    assert short.events == (BlockStored((4,), None, (1, 2, 3, 4), 4, None, None, None),)


@pytest.mark.parametrize("payload", [
    b"\xc1",  # not msgpack
    msgpack.packb("hello"),
    msgpack.packb([1.0, "not a list", 0]),
])
def test_malformed_payloads_raise_wire_errors(payload: bytes) -> None:
    with pytest.raises(KVWireError):
        decode_payload(payload)


@pytest.mark.parametrize("bad", [
    ["BlockStored", "nope", None, [1], 4],
    ["BlockStored", [1], None, [1, 2, 3, 4], 0],
    ["BlockRemoved", [1.5]],
    {"kind": "BlockStored"},
    42,
])
def test_a_malformed_event_is_skipped_and_counted_and_its_batch_kept(bad: object) -> None:
    good = ["BlockStored", [7], None, [1, 2, 3, 4], 4]
    batch = decode_payload(msgpack.packb([1.0, [good, bad, ["AllBlocksCleared"]], 0]))
    assert batch.malformed == 1
    assert batch.events == (BlockStored((7,), None, (1, 2, 3, 4), 4, None, None, None),
                            AllBlocksCleared())
