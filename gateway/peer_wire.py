"""The frames gateway copies exchange (``gateway.peers``): what each one routed and the
prefill it left pending on a replica.

A connection carries one direction. The listening copy speaks first: a challenge of
``NONCE_BYTES`` random bytes. The connecting copy answers with a hello: its instance id
and HMAC-SHA256(secret, nonce | instance id); the listener replies one status byte
(``STATUS_OK``, ``STATUS_BAD_SECRET``, or ``STATUS_SELF`` when the hello carries its own
instance id: an address that reaches the copy itself). Then the connecting copy sends
frames, ``u32 length | u8 kind | body``, little-endian:

    SENT        u64 seq, u32 tokens, u16 n, replica id (n bytes, UTF-8)
                prefill tokens sent to the replica, pending until FIRST_BYTE
    FIRST_BYTE  u64 seq        the replica's first byte for SENT ``seq`` came back
    DONE        u64 seq        the request ended (in flight no more)
    ROUTED      u32 prompt tokens, f64 tokens per chunk, i32 anchor chunks (-1: none),
                u32 m, JSON meta (m bytes: replica, model, tenant, cache salt, affinity
                key), then the prompt's chunk hashes as u32 each

ROUTED carries what a policy learns from a request (``policies.base.Routed``) but never
the prompt's text or token ids: only the hashes of its pieces (``prompt_chunks``).
A frame longer than ``MAX_FRAME`` is refused (the connection is dropped).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import sys
from array import array
from dataclasses import dataclass
from typing import Any

import orjson

from policies.base import RouteRequest
from policies.ring import token_bytes

NONCE_BYTES = 16
ID_BYTES = 16
MAC_BYTES = 32
HELLO_BYTES = ID_BYTES + MAC_BYTES
STATUS_OK, STATUS_BAD_SECRET, STATUS_SELF = 0, 1, 2
MAX_FRAME = 1 << 20

SENT, FIRST_BYTE, DONE, ROUTED = 1, 2, 3, 4
_HEAD = struct.Struct("<IB")  # length of what follows the length, kind
_SENT = struct.Struct("<QIH")
_SEQ = struct.Struct("<Q")
_ROUTED = struct.Struct("<IdiI")


class WireError(ValueError):
    """A frame that cannot be read: the connection that sent it is dropped."""


def hello_mac(secret: bytes, nonce: bytes, instance: bytes) -> bytes:
    return hmac.new(secret, nonce + instance, hashlib.sha256).digest()


def check_hello(secret: bytes, nonce: bytes, hello: bytes) -> bytes | None:
    """The instance id of a hello that proves the secret; None when it does not."""
    instance, mac = hello[:ID_BYTES], hello[ID_BYTES:]
    return instance if hmac.compare_digest(mac, hello_mac(secret, nonce, instance)) else None


def _frame(kind: int, body: bytes) -> bytes:
    if len(body) + 1 > MAX_FRAME:
        raise WireError(f"a {len(body) + 1}-byte frame exceeds {MAX_FRAME} bytes")
    return _HEAD.pack(len(body) + 1, kind) + body


def sent_frame(seq: int, replica: str, tokens: int) -> bytes:
    name = replica.encode()
    return _frame(SENT, _SENT.pack(seq, max(0, min(tokens, 0xFFFFFFFF)), len(name)) + name)


def seq_frame(kind: int, seq: int) -> bytes:
    return _frame(kind, _SEQ.pack(seq))


# chunk hashes carried at most: a prompt's first 64K pieces (4 MB of text at 64 characters)
MAX_CHUNKS = (MAX_FRAME - 4096) // 4


def routed_frame(request: RouteRequest, replica: str) -> bytes:
    meta = orjson.dumps({"replica": replica, "model": request.model, "tenant": request.tenant,
                         "salt": request.cache_salt, "affinity": request.affinity_key})
    if len(meta) > 3072:
        raise WireError(f"routing meta of {len(meta)} bytes exceeds 3072")
    chunks = token_bytes(request.chunks[:MAX_CHUNKS])
    anchor = -1 if request.anchor_chunks is None else request.anchor_chunks
    head = _ROUTED.pack(min(request.prompt_tokens, 0xFFFFFFFF), request.chunk_tokens,
                        anchor, len(meta))
    return _frame(ROUTED, b"".join((head, meta, chunks)))


@dataclass(frozen=True, slots=True)
class Sent:
    seq: int
    replica: str
    tokens: int


@dataclass(frozen=True, slots=True)
class Settled:
    kind: int  # FIRST_BYTE or DONE
    seq: int


@dataclass(frozen=True, slots=True)
class RoutedElsewhere:
    """A request another copy routed: the policy's ``RouteRequest`` (no token ids) and
    where it went."""

    request: RouteRequest
    replica: str


Frame = Sent | Settled | RoutedElsewhere


def frame_length(head: bytes) -> tuple[int, int]:
    """The body length and kind from a frame's first ``HEAD_BYTES``."""
    length, kind = _HEAD.unpack(head)
    if not 1 <= length <= MAX_FRAME:
        raise WireError(f"frame length {length} outside [1, {MAX_FRAME}]")
    return length - 1, kind


HEAD_BYTES = _HEAD.size


def parse_frame(kind: int, body: bytes, arrival_s: float) -> Frame:
    """One frame's body (``arrival_s``: the receiver's clock, the request's arrival)."""
    try:
        if kind == SENT:
            seq, tokens, n = _SENT.unpack_from(body)
            name = body[_SENT.size:]
            if len(name) != n:
                raise WireError(f"replica id of {len(name)} bytes, header says {n}")
            return Sent(seq, name.decode(), tokens)
        if kind in (FIRST_BYTE, DONE):
            (seq,) = _SEQ.unpack(body)
            return Settled(kind, seq)
        if kind == ROUTED:
            return _parse_routed(body, arrival_s)
    except (struct.error, UnicodeDecodeError, orjson.JSONDecodeError) as exc:
        raise WireError(f"a malformed frame of kind {kind}: {exc}") from None
    raise WireError(f"unknown frame kind {kind}")


def _parse_routed(body: bytes, arrival_s: float) -> RoutedElsewhere:
    prompt_tokens, chunk_tokens, anchor, m = _ROUTED.unpack_from(body)
    at = _ROUTED.size
    meta: Any = orjson.loads(body[at:at + m])
    rest = body[at + m:]
    if not isinstance(meta, dict) or len(rest) % 4:
        raise WireError("a routed frame whose meta is not an object or whose chunks are "
                        "not whole u32s")
    fields = {}
    for key in ("replica", "model", "tenant", "salt", "affinity"):
        value = meta.get(key)
        if value is not None and not isinstance(value, str):
            raise WireError(f"routed frame field {key!r} is {type(value).__name__}, "
                            "not a string")
        fields[key] = value
    if fields["replica"] is None:
        raise WireError("a routed frame without a replica")
    chunks = array("I")
    chunks.frombytes(rest)
    if sys.byteorder != "little":
        chunks.byteswap()
    request = RouteRequest(tokens=(), prompt_tokens=prompt_tokens, model=fields["model"],
                           tenant=fields["tenant"], cache_salt=fields["salt"],
                           affinity_key=fields["affinity"], arrival_s=arrival_s,
                           chunks=chunks, chunk_tokens=chunk_tokens,
                           anchor_chunks=None if anchor < 0 else anchor)
    return RoutedElsewhere(request, fields["replica"])
