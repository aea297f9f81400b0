import hashlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvwire.block_hashing import (
    block_hashes,
    chain_seed,
    hash_to_u64,
    model_identity,
)

GOLDEN_SEED = "b773c6707e3f49f029b850945af8d9b97ba11a664960c2a43cde0bcf194ed1ac"
GOLDEN_PLAIN = [
    "6ef2e481e3632b8cc503df633b770751e986bff9ded792f2a4b2a70a2c46d295",
    "a8a3d6b15c9ae36b06555133d587fd9837530d6314e7b89cc0672c44ff999ad1",
]
GOLDEN_SALTED_ADAPTER = "119a09fcf39fce54809534454b26becafe77b3c212f6bfcf20f9e371606da6ad"


def test_golden_vectors() -> None:
    assert chain_seed("llama3-8b").hex() == GOLDEN_SEED
    got = block_hashes(list(range(32)), 16, model_id="llama3-8b")
    assert [h.hex() for h in got] == GOLDEN_PLAIN
    salted = block_hashes(list(range(16)), 16, model_id="llama3-8b", cache_salt="tenant-a",
                          adapter="lora1")
    assert [h.hex() for h in salted] == [GOLDEN_SALTED_ADAPTER]


def test_canonical_encoding_matches_the_documented_layout() -> None:
    seed = hashlib.sha256(b"kvgate/kv-block-chain/v1\x00llama3-8b").digest()
    toks = list(range(16))
    body = b"T" + struct.pack("<I", 16) + struct.pack("<16I", *toks)
    extra = b"A" + struct.pack("<I", 5) + b"lora1" + b"S" + struct.pack("<I", 8) + b"tenant-a"
    h0 = hashlib.sha256(seed + body + extra).digest()
    assert h0.hex() == GOLDEN_SALTED_ADAPTER
    plain0 = hashlib.sha256(seed + body).digest()
    assert plain0.hex() == GOLDEN_PLAIN[0]


def test_partial_block_not_hashed_and_u64() -> None:
    assert block_hashes([1, 2, 3], 4, model_id="m") == []
    assert len(block_hashes(list(range(11)), 4, model_id="m")) == 2
    h = bytes(range(32))
    assert hash_to_u64(h) == int.from_bytes(bytes(range(24, 32)), "big")
    assert hash_to_u64(b"\xff" * 32) == 2**64 - 1


def test_salt_isolates_the_whole_chain() -> None:
    toks = list(range(64))
    a = block_hashes(toks, 16, model_id="m", cache_salt="a")
    b = block_hashes(toks, 16, model_id="m", cache_salt="b")
    none = block_hashes(toks, 16, model_id="m")
    assert not set(a) & set(b)
    assert not set(a) & set(none)


def test_model_and_adapter_identity_in_every_block() -> None:
    toks = list(range(64))
    base = block_hashes(toks, 16, model_id=model_identity("llama", "r1"))
    other_rev = block_hashes(toks, 16, model_id=model_identity("llama", "r2"))
    adapter = block_hashes(toks, 16, model_id=model_identity("llama", "r1"), adapter="x")
    assert not set(base) & set(other_rev)
    assert not set(base) & set(adapter)
    # The adapter enters each block's own keys, not only through the parent: the same
    # parent digest with and without the adapter gives different children.
    p = base[0]
    assert block_hashes(toks[16:32], 16, model_id="m", parent=p) != block_hashes(
        toks[16:32], 16, model_id="m", parent=p, adapter="x")
    assert model_identity("llama") == "llama"
    with pytest.raises(ValueError, match="model name"):
        model_identity("")


@given(st.lists(st.integers(0, 2**32 - 1), max_size=80), st.integers(1, 8),
       st.lists(st.integers(1, 20), max_size=8))
def test_a_chain_continued_in_pieces_equals_one_shot(toks: list[int], bs: int,
                                                     cuts: list[int]) -> None:
    full = block_hashes(toks, bs, model_id="m", cache_salt="s")
    pieced: list[bytes] = []
    pos = 0
    for c in [*cuts, len(toks)]:  # pieces of whole blocks, the last one takes the rest
        end = min(len(toks), pos + c * bs)
        pieced += block_hashes(toks[pos:end], bs, model_id="m", cache_salt="s",
                               parent=pieced[-1] if pieced else None)
        pos = end
    assert pieced == full
    # Continuing a chain from a parent equals hashing the concatenation.
    k = (len(toks) // bs // 2) * bs
    if k:
        head = block_hashes(toks[:k], bs, model_id="m", cache_salt="s")
        tail = block_hashes(toks[k:], bs, model_id="m", cache_salt="s", parent=head[-1])
        assert head + tail == full
