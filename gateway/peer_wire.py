"""The frames gateway copies exchange (``gateway.peers``): what each one routed and the
prefill it left pending on a replica.

A connection carries one direction: from the copy that connects (the sender) to the one
that listens. Both prove the shared secret before any frame moves, each over a nonce the
other chose, and each learns the other's random instance id:

    sender   -> listener  SENDER_HELLO    nonce_s (16), id_s (16)
    listener -> sender    LISTENER_HELLO  nonce_l (16), id_l (16),
                                          HMAC(secret, "listener" | nonce_s | id_l | id_s)
    sender   -> listener  SENDER_PROOF    HMAC(secret, "sender" | nonce_l | id_s | id_l)
    listener -> sender    one status byte: STATUS_OK or STATUS_BAD_SECRET

A sender that meets its own id (an address that reaches the copy itself), or the id of a
copy it already has a connection to (a second address of the same copy), closes before
proving anything. Then the sender sends frames, ``u32 length | u8 kind | body``,
little-endian:

    SENT        u64 seq, u32 tokens, u16 n, replica id (n bytes, UTF-8)
                prefill tokens sent to the replica, pending until FIRST_BYTE
    FIRST_BYTE  u64 seq        the replica's first byte for SENT ``seq`` came back
    DONE        u64 seq        the request ended (in flight no more)
    ROUTED      u32 prompt tokens, f64 tokens per chunk, i32 anchor chunks (-1: none),
                u32 m, JSON meta (m bytes, at most ``MAX_META``: replica, model, tenant,
                cache salt, affinity key, an adapter's base model; ``again``: true on a
                later try of a request whose earlier try the sender told), then the
                prompt's chunk hashes as u32 each
    HEARTBEAT   (empty)        the sender is alive (sent when it has been quiet)
    ANSWERED    JSON: a stored response's ``id``, the
                ``replica`` that answered it and the ``tenant`` it is (null: the
                anonymous tenant's); told between the workers of one box, and to peers
                unless ``peers.tell_responses`` is false (a copy of a release before this
                kind drops a link at a kind it does not know)

ROUTED carries what a policy learns from a request (``policies.base.Routed``) but never
the prompt's text or token ids: only the hashes of its pieces (``prompt_chunks``). A
sender knows its retries by the request object (``ToldRequests``); the receiver, whose
object is new per frame, by ``again`` (``Routed.again``), and so counts a request's share
of the traffic once however many replicas the sender tried it on, while holding nothing of
its own for it (a first try it skipped, to a replica it does not route to, leaves the
request counted nowhere there). A receiver reads the meta keys it knows and skips the
others, so a sender without ``again`` is read as telling first tries only, and one with it
by a receiver without it as before.
A frame longer than ``MAX_FRAME`` is refused (the connection is dropped). Nothing is
encrypted, and frames carry no MAC of their own: the handshake keeps copies without the
secret out, not someone on the network path.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import sys
import weakref
from array import array
from dataclasses import dataclass
from typing import Any

import orjson

from policies.base import RouteRequest
from policies.ring import token_bytes

NONCE_BYTES = 16
ID_BYTES = 16
MAC_BYTES = 32
SENDER_HELLO_BYTES = NONCE_BYTES + ID_BYTES
LISTENER_HELLO_BYTES = NONCE_BYTES + ID_BYTES + MAC_BYTES
STATUS_OK, STATUS_BAD_SECRET = 0, 1
MAX_FRAME = 1 << 20
# a ROUTED frame's JSON meta, in bytes: what a sender sends at most (a longer route is
# dropped there) and a receiver reads at most (a longer one drops the connection)
MAX_META = 3072

SENT, FIRST_BYTE, DONE, ROUTED, HEARTBEAT, ANSWERED = 1, 2, 3, 4, 5, 6
_HEAD = struct.Struct("<IB")  # length of what follows the length, kind
_SENT = struct.Struct("<QIH")
_SEQ = struct.Struct("<Q")
_ROUTED = struct.Struct("<IdiI")


class WireError(ValueError):
    """A frame that cannot be read: the connection that sent it is dropped."""


def _mac(secret: bytes, role: bytes, nonce: bytes, prover: bytes, verifier: bytes) -> bytes:
    return hmac.new(secret, role + nonce + prover + verifier, hashlib.sha256).digest()


def listener_hello(secret: bytes, sender_hello: bytes, nonce: bytes, listener: bytes
                   ) -> bytes:
    """The listener's answer to ``sender_hello``: its nonce, its id and its proof."""
    sender_nonce, sender = sender_hello[:NONCE_BYTES], sender_hello[NONCE_BYTES:]
    return nonce + listener + _mac(secret, b"listener", sender_nonce, listener, sender)


def check_listener(secret: bytes, sender_nonce: bytes, sender: bytes, hello: bytes
                   ) -> tuple[bytes, bytes] | None:
    """(the listener's nonce, its id) when its hello proves the secret; else None."""
    nonce, listener = hello[:NONCE_BYTES], hello[NONCE_BYTES:NONCE_BYTES + ID_BYTES]
    mac = hello[NONCE_BYTES + ID_BYTES:]
    if not hmac.compare_digest(mac, _mac(secret, b"listener", sender_nonce, listener, sender)):
        return None
    return nonce, listener


def sender_proof(secret: bytes, listener_nonce: bytes, sender: bytes, listener: bytes
                 ) -> bytes:
    return _mac(secret, b"sender", listener_nonce, sender, listener)


def check_sender(secret: bytes, listener_nonce: bytes, sender: bytes, listener: bytes,
                 proof: bytes) -> bool:
    return hmac.compare_digest(proof, sender_proof(secret, listener_nonce, sender, listener))


def _frame(kind: int, body: bytes) -> bytes:
    if len(body) + 1 > MAX_FRAME:
        raise WireError(f"a {len(body) + 1}-byte frame exceeds {MAX_FRAME} bytes")
    return _HEAD.pack(len(body) + 1, kind) + body


def sent_frame(seq: int, replica: str, tokens: int) -> bytes:
    name = replica.encode()
    return _frame(SENT, _SENT.pack(seq, max(0, min(tokens, 0xFFFFFFFF)), len(name)) + name)


def seq_frame(kind: int, seq: int) -> bytes:
    return _frame(kind, _SEQ.pack(seq))


HEARTBEAT_FRAME = _frame(HEARTBEAT, b"")


# chunk hashes carried at most: a prompt's first 261,120 pieces (about 16 MB of text at 64
# characters)
MAX_CHUNKS = (MAX_FRAME - 4096) // 4
# the most tokens a piece may stand for (a piece is 64 characters or 16 token ids; a
# figure far past that, 1e308, overflowed the receiver's prompt chains)
MAX_CHUNK_TOKENS = 65536.0


def told_to_peers(request: RouteRequest) -> bool:
    """Whether a route of ``request`` is sent to the peers at all. Not one a policy keyed by
    its token ids alone (``chunk_chars: 0``): the wire never carries them, and the peers'
    policies would learn an empty prompt (one sharing nothing, which unlearned their common
    prefix)."""
    return not (len(request.tokens) and not len(request.chunks))


class ToldRequests:
    """The requests a sender built a route's frame of, while they live, so that a later
    route of one is told as a retry (``routed_frame``'s ``again``). Each is held weakly, by
    identity: what it holds is at most the requests alive (in flight), each an entry that
    goes when its request does, and another request never takes a kept one's ``id``."""

    __slots__ = ("_told",)

    def __init__(self) -> None:
        self._told: weakref.WeakValueDictionary[int, RouteRequest] = \
            weakref.WeakValueDictionary()

    def frame(self, request: RouteRequest, replica: str) -> bytes:
        """``routed_frame`` of ``request`` to ``replica``, marked ``again`` when a frame of
        the same request object was built here before. The request is noted once its frame
        is built: a try whose frame cannot be (``WireError``: its meta, which holds the
        replica's id, too long) is told to no one, and leaves the next try a first one."""
        told = self._told
        again = told.get(id(request)) is request
        built = routed_frame(request, replica, again)
        if not again:
            told[id(request)] = request
        return built

    def __len__(self) -> int:
        return len(self._told)


def routed_frame(request: RouteRequest, replica: str, again: bool = False) -> bytes:
    """``request`` routed to ``replica``; ``again``: a later try of a request told before."""
    fields: dict[str, object] = {
        "replica": replica, "model": request.model, "tenant": request.tenant,
        "salt": request.cache_salt, "affinity": request.affinity_key,
        "base": request.base_model}
    if again:  # (absent on a first try: its frame is as a sender without it wrote)
        fields["again"] = True
    meta = orjson.dumps(fields)
    if len(meta) > MAX_META:
        raise WireError(f"routing meta of {len(meta)} bytes exceeds {MAX_META}")
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
    """A request another copy routed: the policy's ``RouteRequest`` (no token ids), where
    it went, and whether the sender told an earlier try of it (``again``)."""

    request: RouteRequest
    replica: str
    again: bool = False


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The sender is alive."""


@dataclass(frozen=True, slots=True)
class Answered:
    """A stored response (``/v1/responses``) the sender saw answered: its id, the replica
    that stores it, and its tenant (None: the anonymous tenant's)."""

    response: str
    replica: str
    tenant: str | None


Frame = Sent | Settled | RoutedElsewhere | Heartbeat | Answered


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
        if kind == HEARTBEAT:
            return Heartbeat()
        if kind == ANSWERED:
            return _parse_answered(body)
    except (struct.error, UnicodeDecodeError, orjson.JSONDecodeError) as exc:
        raise WireError(f"a malformed frame of kind {kind}: {exc}") from None
    raise WireError(f"unknown frame kind {kind}")


def answered_frame(response: str, replica: str, tenant: str | None) -> bytes:
    """``response`` answered by ``replica`` for ``tenant`` (a frame of ``MAX_FRAME`` at
    most: a tenant's name, from a header of up to 64 KiB, fits)."""
    return _frame(ANSWERED, orjson.dumps({"id": response, "replica": replica,
                                          "tenant": tenant}))


def _parse_answered(body: bytes) -> Answered:
    meta: Any = orjson.loads(body)
    if not isinstance(meta, dict):
        raise WireError(f"an answered response's meta is {type(meta).__name__}, not an "
                        "object")
    response, replica, tenant = meta.get("id"), meta.get("replica"), meta.get("tenant")
    if not isinstance(response, str) or not isinstance(replica, str) or not response \
            or not replica:
        raise WireError(f"an answered response's id {response!r} or replica {replica!r} "
                        "is no string")
    if tenant is not None and not isinstance(tenant, str):
        raise WireError(f"an answered response's 'tenant' is {type(tenant).__name__}, not "
                        "a string")
    return Answered(response, replica, tenant)


def _parse_routed(body: bytes, arrival_s: float) -> RoutedElsewhere:
    prompt_tokens, chunk_tokens, anchor, m = _ROUTED.unpack_from(body)
    at = _ROUTED.size
    if m > len(body) - at:
        raise WireError(f"a routed frame's meta of {m} bytes overruns its {len(body)}-byte "
                        "body")
    if m > MAX_META:  # no sender sends one (``routed_frame``): not parsed, up to 1 MiB
        raise WireError(f"a routed frame's meta of {m} bytes exceeds {MAX_META}")
    meta: Any = orjson.loads(body[at:at + m])
    rest = body[at + m:]
    # a request of no piece hashes (a policy that keys on none: round_robin, least_load,
    # kv_events, chunk_chars 0) carries 0; one with hashes, what a piece is worth
    if not (0 < chunk_tokens <= MAX_CHUNK_TOKENS if rest else chunk_tokens == 0):
        raise WireError(f"a routed frame's tokens per chunk is {chunk_tokens!r}, not "
                        + (f"in (0, {MAX_CHUNK_TOKENS}]" if rest else "0 without chunks"))
    if not isinstance(meta, dict):
        raise WireError(f"a routed frame's meta is {type(meta).__name__}, not an object")
    if len(rest) % 4:
        raise WireError(f"a routed frame's chunk hashes take {len(rest)} bytes, not whole "
                        "u32s")
    fields = {}
    for key in ("replica", "model", "tenant", "salt", "affinity", "base"):
        value = meta.get(key)
        if value is not None and not isinstance(value, str):
            raise WireError(f"routed frame field {key!r} is {type(value).__name__}, "
                            "not a string")
        fields[key] = value
    if fields["replica"] is None:
        raise WireError("a routed frame without a replica")
    again = meta.get("again", False)
    if not isinstance(again, bool):
        raise WireError(f"routed frame field 'again' is {type(again).__name__}, not a "
                        "boolean")
    chunks = array("I")
    chunks.frombytes(rest)
    if sys.byteorder != "little":
        chunks.byteswap()
    request = RouteRequest(tokens=(), prompt_tokens=prompt_tokens, model=fields["model"],
                           tenant=fields["tenant"], cache_salt=fields["salt"],
                           affinity_key=fields["affinity"], base_model=fields["base"],
                           arrival_s=arrival_s,
                           chunks=chunks, chunk_tokens=chunk_tokens,
                           anchor_chunks=None if anchor < 0 else anchor)
    return RoutedElsewhere(request, fields["replica"], again)
