"""Block hash chain for prefix caching.

A full block of ``block_size`` token ids is identified by

    h_0 = H(seed(model_id), tokens[0:B],  extra(adapter, cache_salt))
    h_i = H(h_{i-1},        tokens[iB:(i+1)B], extra(adapter))

where H is SHA-256 over a canonical byte encoding (below). The seed carries the model
identity (name and revision), every block's extra keys carry the adapter id, and only
block 0's extra keys carry the cache salt; since every hash depends on its parent, the
salt and the model isolate the whole chain. Only full blocks are hashed.

Canonical encoding of one block (all integers little-endian)::

    parent digest (32 bytes)
    b"T" + u32 token count + u32 per token
    b"A" + u32 byte length + UTF-8 adapter id          (only when an adapter is set)
    b"S" + u32 byte length + UTF-8 cache salt          (block 0 only, when a salt is set)

Digests are 32 raw bytes. KV event consumers that want u64 ids take the low 64 bits with
:func:`hash_to_u64`. This module is pure Python (no torch) so the gateway and the offline
simulator can import it.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

BlockHash = bytes

_SEED_DOMAIN = b"kvgate/kv-block-chain/v1\x00"
_sha256 = hashlib.sha256


def model_identity(name: str, revision: str | None = None) -> str:
    """The identity string that seeds a chain: ``name`` or ``name@revision``."""
    if not name:
        raise ValueError("model name must be a non-empty string")
    return f"{name}@{revision}" if revision else name


def chain_seed(model_id: str) -> BlockHash:
    """The parent digest of block 0 for a model identity."""
    return _sha256(_SEED_DOMAIN + model_id.encode()).digest()


def _tagged(tag: bytes, text: str) -> bytes:
    raw = text.encode()
    return tag + struct.pack("<I", len(raw)) + raw


def _extra_keys(adapter: str | None, cache_salt: str | None) -> tuple[bytes, bytes]:
    """(extra bytes for every block, extra bytes for block 0)."""
    every = _tagged(b"A", adapter) if adapter else b""
    first = every + (_tagged(b"S", cache_salt) if cache_salt else b"")
    return every, first


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    *,
    model_id: str,
    cache_salt: str | None = None,
    adapter: str | None = None,
    parent: BlockHash | None = None,
) -> list[BlockHash]:
    """Hashes of the full blocks of ``token_ids``.

    With ``parent=None`` the first block is block 0 of a chain (seeded by ``model_id`` and
    salted with ``cache_salt``). With a ``parent`` digest the tokens continue an existing
    chain: ``block_hashes(a + b, ...) == x + block_hashes(b, ..., parent=x[-1])`` whenever
    ``len(a)`` is a multiple of ``block_size``; ``cache_salt`` is then ignored since it
    only enters block 0. A trailing partial block is not hashed.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    every, first = _extra_keys(adapter, cache_salt)
    if parent is None:
        prev = chain_seed(model_id)
        extra = first
    else:
        prev = parent
        extra = every
    n_full = len(token_ids) // block_size
    if n_full == 0:
        return []
    header = b"T" + struct.pack("<I", block_size)
    pack = struct.Struct(f"<{block_size}I").pack
    out: list[BlockHash] = []
    append = out.append
    for i in range(n_full):
        lo = i * block_size
        prev = _sha256(prev + header + pack(*token_ids[lo : lo + block_size]) + extra).digest()
        append(prev)
        extra = every
    return out


def hash_to_u64(block_hash: BlockHash) -> int:
    """Low 64 bits of the digest read as a big-endian integer (the KV-event id form)."""
    return int.from_bytes(block_hash[-8:], "big")
