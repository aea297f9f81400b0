"""KV cache events in vLLM's wire format: what the engine publishes and gateways decode.

The block pool records an event whenever the set of cached block hashes changes (a block
registered after its KV was computed, blocks evicted, the whole cache reset); the server
drains them after each engine step and hands them to the publisher (``engine.kv_event_publisher``),
one message per step::

    frames:   [topic, seq (u64 big-endian, from 0 per process), msgpack payload]
    payload:  [ts, [event, ...](, data_parallel_rank)]
    events:   ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
               lora_id, medium, lora_name(, extra_keys(, group_idx(, kv_cache_spec_kind)))]
              ["BlockRemoved", block_hashes, medium(, group_idx)]
              ["AllBlocksCleared"]

The newer form has each event as a map tagged by its ``"type"`` key instead (``{"type":
"BlockStored", "block_hashes": ..., ...}``); vLLM's router reads only that one, so the
engine publishes it on request (``kvgate engine --kv-events-encoding map``).

A replay endpoint (a ROUTER socket) serves kept batches again: a DEALER sends
``[b"", start seq (8 bytes BE)]`` and gets ``[b"", seq, payload]`` per batch from ``start``,
then ``[b"", REPLAY_END, b""]`` (seq -1).

Block hashes on the wire are u64: the low 64 bits of the engine's digest
(:func:`kvwire.block_hashing.hash_to_u64`). ``token_ids`` covers exactly the stored blocks,
``parent_block_hash`` is the block before the first one (None for a chain's first block).

:func:`decode_payload` also reads the newer encoding where the batch and each event are
maps (events tagged by a ``"type"`` key), ignores unknown fields and unknown event types,
and accepts hashes as ints of any sign or size or as raw digest bytes. Events of another
``medium`` than ``"GPU"`` (vLLM's KV offloading to CPU memory) are dropped: the index they
feed is of the GPU's prefix cache.

``extra_keys`` (one entry per stored block, or absent) are what a block's hash was computed
over besides its tokens and parent: vLLM's adapter name, multimodal content hashes, the
request's cache salt (block 0 of a salted chain), prompt embedding hashes. A gateway keys
blocks by their tokens (and adapter) alone, so a block whose hash has other extra keys (and
every block chained after it) is one that no prompt's tokens can name:
:meth:`BlockStored.token_keyed` says how many of an event's blocks come before the first such
block. The engine publishes a salted chain's salt there as vLLM does.

``group_idx`` names the KV cache group of a hybrid model's engine (one per kind of
attention layer: full attention beside a sliding window, say) and ``kv_cache_spec_kind``,
on stores, its kind: each group stores and evicts the same prefix's blocks, under the same
hashes, on its own (a sliding window's group evicts early blocks the full-attention group
still holds). Both are absent from a model of one group. This module is pure Python plus
msgpack, so the engine core, the gateway and the offline simulator share it.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

U64 = (1 << 64) - 1


REPLAY_END = (-1).to_bytes(8, "big", signed=True)  # the seq frame ending a replay
# the tier whose blocks a prefix lookup hits (vLLM names it so; older vLLM sends no medium)
GPU_MEDIUM = "GPU"

@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks whose KV now exists and that a lookup can hit."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = "GPU"
    lora_name: str | None = None
    # per block, what its hash covers besides its tokens and parent (see the module)
    extra_keys: tuple[tuple[Any, ...] | None, ...] | None = None
    group_idx: int | None = None  # a hybrid model's KV cache group (see the module)
    kv_cache_spec_kind: str | None = None  # ... and its kind ("full_attention", ...)

    def token_keyed(self) -> int:
        """How many leading blocks are keyed by their tokens (and adapter) alone: those
        before the first whose extra keys hold more than the adapter's name."""
        extra = self.extra_keys
        if extra is None:
            return len(self.block_hashes)
        for i, keys in enumerate(extra[:len(self.block_hashes)]):
            if keys and any(key != self.lora_name for key in keys):
                return i
        return len(self.block_hashes)


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks evicted: their hashes no longer answer a lookup."""

    block_hashes: tuple[int, ...]
    medium: str | None = "GPU"
    group_idx: int | None = None  # a hybrid model's KV cache group (see the module)


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The prefix cache was reset: every hash is gone."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class KVEventBatch:
    """One published message: the events of one engine step."""

    ts: float
    events: tuple[KVEvent, ...]
    data_parallel_rank: int | None = None
    malformed: int = 0  # events skipped on decoding: not of the wire format


class KVWireError(ValueError):
    """A payload does not follow the KV event wire format; the message says where."""


def _shown(value: Any) -> str:
    """``value`` as an error names it: a bounded ``repr`` (a few levels, items and
    characters), never the whole of a huge or deeply nested value, whose full ``repr``
    costs its size or overflows the stack (msgpack nests deeper than ``repr`` goes)."""
    return _REPR.repr(value)


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict = 3, 8, 8, 8
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 120, 120, 40


# -- the fields of each event type, in their array order -----------------------------------

_FIELDS: dict[str, tuple[str, ...]] = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size",
                    "lora_id", "medium", "lora_name", "extra_keys", "group_idx",
                    "kv_cache_spec_kind"),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}


# -- encoding ------------------------------------------------------------------------------

# each event as a tagged array (the classic form), or as a map tagged by its "type" key
# (the newer form, the only one vLLM's router reads); the batch stays an array either way
ENCODINGS = ("array", "map")


def _event_array(ev: KVEvent) -> list[Any]:
    if isinstance(ev, BlockStored):
        fields: list[Any] = ["BlockStored", list(ev.block_hashes), ev.parent_block_hash,
                             list(ev.token_ids), ev.block_size, ev.lora_id, ev.medium,
                             ev.lora_name]
        extra = None if ev.extra_keys is None else [
            None if keys is None else list(keys) for keys in ev.extra_keys]
        tail = [extra, ev.group_idx, ev.kv_cache_spec_kind]
    elif isinstance(ev, BlockRemoved):
        fields, tail = ["BlockRemoved", list(ev.block_hashes), ev.medium], [ev.group_idx]
    else:
        return ["AllBlocksCleared"]
    while tail and tail[-1] is None:  # trailing defaults left out, as vLLM omits them
        tail.pop()
    return fields + tail


def _event_map(ev: KVEvent) -> dict[str, Any]:
    kind, *values = _event_array(ev)
    return {"type": kind, **dict(zip(_FIELDS[kind], values, strict=False))}


def encode_payload(batch: KVEventBatch, encoding: str = "array") -> bytes:
    """The msgpack payload frame of ``batch``, its events in ``encoding`` (``ENCODINGS``)."""
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {ENCODINGS}, got {encoding!r}")
    encode = _event_array if encoding == "array" else _event_map
    payload: list[Any] = [batch.ts, [encode(ev) for ev in batch.events]]
    if batch.data_parallel_rank is not None:  # left out at its default, as vLLM omits it
        payload.append(batch.data_parallel_rank)
    return msgpack.packb(payload, use_bin_type=True)


# -- decoding (array and map forms, at both levels) ---------------------------------------


def wire_hash(value: Any) -> int:
    """A block hash as u64: low 64 bits of an int, or of a digest read big-endian."""
    if isinstance(value, bool):
        raise KVWireError(f"block hash must be an int or bytes, got {_shown(value)}")
    if isinstance(value, int):
        return value & U64
    if isinstance(value, bytes | bytearray) and value:
        return int.from_bytes(value[-8:], "big")
    raise KVWireError(f"block hash must be an int or bytes, got {_shown(value)}")


def _fields(raw: Any) -> tuple[str, dict[str, Any]] | None:
    """(event type, known fields) of an array or map event; None for an unknown type."""
    if isinstance(raw, Mapping):
        kind = raw.get("type")
        if not isinstance(kind, str):
            return _bad_event(raw)
        if kind not in _FIELDS:
            return None
        return kind, {k: raw[k] for k in _FIELDS[kind] if k in raw}
    if isinstance(raw, list | tuple) and raw and isinstance(raw[0], str):
        kind = raw[0]
        if kind not in _FIELDS:
            return None
        return kind, dict(zip(_FIELDS[kind], raw[1:], strict=False))  # extra items ignored
    return _bad_event(raw)


def _bad_event(raw: Any) -> Any:
    raise KVWireError(f"event must be a tagged array or a map with 'type', got {_shown(raw)}")


U32 = (1 << 32) - 1  # token ids are hashed as u32


def _token_ids(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list | tuple) or not all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= U32
        for v in value
    ):
        raise KVWireError(f"{what} must be a list of token ids (0..{U32}), got "
                          f"{_shown(value)}")
    return tuple(value)


def _optional(value: Any, kind: type, what: str) -> Any:
    """``value`` when None or of ``kind`` (a bool is no int), else KVWireError."""
    if value is None or (isinstance(value, kind) and not isinstance(value, bool)):
        return value
    raise KVWireError(f"{what} must be {kind.__name__} or null, got {_shown(value)}")


def _lenient(value: Any, kind: type) -> Any:
    """``value`` when of ``kind`` (a bool is no int), else None: a field read when it
    can be, as an event of an older or other form does not have it."""
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


def decode_event(raw: Any) -> KVEvent | None:
    """One event of either form; None for an event type this decoder does not know, and
    for one of another tier than the GPU's prefix cache (``GPU_MEDIUM``): vLLM's KV
    offloading publishes the blocks it copies to CPU memory (``medium`` "CPU", no token
    ids, block size 0) and evicts from there under the GPU blocks' own hashes, and such
    an eviction says nothing of the GPU's copy."""
    parsed = _fields(raw)
    if parsed is None:
        return None
    kind, f = parsed
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    medium = _optional(f.get("medium"), str, f"{kind}.medium")
    if medium is not None and medium.upper() != GPU_MEDIUM:
        return None
    hashes = f.get("block_hashes")
    if not isinstance(hashes, list | tuple):
        raise KVWireError(f"{kind}.block_hashes must be a list, got {_shown(hashes)}")
    block_hashes = tuple(wire_hash(h) for h in hashes)
    group = _lenient(f.get("group_idx"), int)
    if kind == "BlockRemoved":
        return BlockRemoved(block_hashes, medium, group)
    parent = f.get("parent_block_hash")
    size = f.get("block_size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise KVWireError(f"BlockStored.block_size must be a positive int, got {_shown(size)}")
    return BlockStored(
        block_hashes=block_hashes,
        parent_block_hash=None if parent is None else wire_hash(parent),
        token_ids=_token_ids(f.get("token_ids"), "BlockStored.token_ids"),
        block_size=size,
        lora_id=_optional(f.get("lora_id"), int, "BlockStored.lora_id"),
        medium=medium,
        lora_name=_optional(f.get("lora_name"), str, "BlockStored.lora_name"),
        extra_keys=_extra_keys(f.get("extra_keys")),
        group_idx=group,
        kv_cache_spec_kind=_lenient(f.get("kv_cache_spec_kind"), str),
    )


def _extra_keys(value: Any) -> tuple[tuple[Any, ...] | None, ...] | None:
    """``extra_keys``: null, or a list of one entry per block, each null or a list."""
    if value is None:
        return None
    if not isinstance(value, list | tuple) or not all(
            keys is None or isinstance(keys, list | tuple) for keys in value):
        raise KVWireError("BlockStored.extra_keys must be a list of lists or nulls, got "
                          f"{_shown(value)}")
    return tuple(None if keys is None else tuple(keys) for keys in value)


# A payload decodes to at most one list or map per this many of its bytes (and
# ``_FREE_CONTAINERS`` more): one of a byte (an empty map) costs about 70 bytes of memory,
# so a 4 MiB message of them held 290 MiB while it was decoded. The engine's own messages
# (array form; the map form spends more) spend 10.8 bytes or more on each at its default
# block size of 16: the fewest in BlockStored events of a salted chain's one block (5 lists
# for 54 bytes: the event's array, its hashes, its token ids, under 128 each, its extra
# keys and the block's). At a block size of 1 such events spend 7.4 (37 bytes for 5), which
# ``_FREE_CONTAINERS`` covers in a payload of up to about 100 KB of them.
_BYTES_PER_CONTAINER = 8
_FREE_CONTAINERS = 1024


class _TooManyContainers(Exception):
    """Raised from inside msgpack's decoding to stop it."""


def _container_budget(limit: int) -> Any:
    """A msgpack ``list_hook``/``object_hook`` that stops the decoding past ``limit``
    lists and maps."""
    seen = 0

    def count(value: Any) -> Any:
        nonlocal seen
        seen += 1
        if seen > limit:
            raise _TooManyContainers
        return value

    return count


def decode_payload(payload: bytes) -> KVEventBatch:
    """A payload frame of either form; unknown event types are dropped, and a malformed
    event is skipped and counted (``malformed``) while the others are kept. KVWireError
    for a payload that is no msgpack, or holds more lists and maps than its size allows
    (``_BYTES_PER_CONTAINER``): its decoding stops there."""
    limit = _FREE_CONTAINERS + len(payload) // _BYTES_PER_CONTAINER
    budget = _container_budget(limit)
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False, list_hook=budget,
                              object_hook=budget)
    except _TooManyContainers:
        raise KVWireError(f"payload of {len(payload)} bytes holds more than {limit} lists "
                          f"and maps (one per {_BYTES_PER_CONTAINER} bytes and "
                          f"{_FREE_CONTAINERS} more)") from None
    except (ValueError, TypeError, msgpack.UnpackException) as exc:  # TypeError: a map
        raise KVWireError(f"payload is not msgpack: {exc}") from exc  # key unhashable
    if isinstance(raw, Mapping):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    elif isinstance(raw, list | tuple) and len(raw) >= 2:
        ts, events = raw[0], raw[1]
        rank = raw[2] if len(raw) > 2 else None
    else:
        raise KVWireError(f"payload must be [ts, events(, rank)] or a map, got {_shown(raw)}")
    if not isinstance(events, list | tuple):
        raise KVWireError(f"payload events must be a list, got {_shown(events)}")
    decoded: list[KVEvent] = []
    malformed = 0
    for raw_event in events:
        try:
            ev = decode_event(raw_event)
        except KVWireError:
            malformed += 1
            continue
        if ev is not None:
            decoded.append(ev)
    return KVEventBatch(float(ts) if isinstance(ts, int | float) else 0.0, tuple(decoded),
                        rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
                        malformed)


def stored_runs(
    hashes: Sequence[int], new: Sequence[bool], tokens: Sequence[int], parent: int | None,
    block_size: int, lora_name: str | None = None, cache_salt: str | None = None,
) -> list[BlockStored]:
    """One ``BlockStored`` per run of consecutive newly cached blocks.

    ``hashes[i]`` covers ``tokens[i * block_size : (i + 1) * block_size]``; ``new[i]`` says
    whether block i was newly cached; ``parent`` is the hash before ``hashes[0]``. Each
    block's extra keys name what its hash covers besides its tokens, as vLLM publishes
    them: the adapter (``lora_name``) on every block, then, on a chain's first block (no
    ``parent``) salted with ``cache_salt``, the salt.
    """
    every = (lora_name,) if lora_name else ()
    out: list[BlockStored] = []
    start = -1
    for i in range(len(hashes) + 1):
        if i < len(hashes) and new[i]:
            if start < 0:
                start = i
            continue
        if start >= 0:
            run_parent = parent if start == 0 else hashes[start - 1]
            # blocks [start, i) hold tokens [start * B, i * B)
            salted = cache_salt and start == 0 and parent is None
            first = (*every, cache_salt) if salted else every
            extra = (first or None,) + (every or None,) * (i - start - 1)
            out.append(BlockStored(tuple(hashes[start:i]), run_parent,
                                   tuple(tokens[start * block_size : i * block_size]),
                                   block_size, None, "GPU", lora_name,
                                   extra if any(extra) else None))
            start = -1
    return out
