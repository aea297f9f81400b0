"""An exact index of the blocks each replica holds, rebuilt from its KV events.

Engines name blocks by their own hashes (opaque u64 ids here: another engine, a new
version or a cache salt changes them). The index re-keys every stored block from the token
ids the event carries, chained like Dynamo's router::

    key_0 = H(root(adapter),    tokens[0:B])
    key_i = H(key_{i-1},        tokens[iB:(i+1)B])

H is Python's hash of the pair (parent key, the block's token ids as u32 little-endian
bytes): keys live only in this process's index (each gateway worker keeps its own), so a
64-bit hash that is not stable across processes does, at a fifth of blake2b's cost. The
gateway computes the same keys from a prompt, so a replica holds the prompt's first ``k``
blocks when it holds keys ``key_0 .. key_{k-1}``.

Per replica::

    by_hash   engine hash -> key          (to apply BlockRemoved, and to find a parent)
    copies    engine hash -> stores not yet removed   (vLLM keeps one physical block per
                                                       request that computed it: two
                                                       requests filling the same prefix at
                                                       once store one hash twice, and each
                                                       copy's eviction removes it once)
    keys      key -> number of engine hashes with that key   (a salted copy of the same
                                                              tokens has another hash)

The root names the LoRA adapter a block was computed with: its ``lora_name`` (what clients
send as the request's ``model``), or for an engine that sends only a ``lora_id``, that id (such
blocks are never matched: no request names an adapter by its id). A prompt is matched from
the root of its ``model`` when it is known to be an adapter (``adapter``), or the index has
seen blocks of an adapter by that name lately (the roots of the last ``MAX_ADAPTERS``
adapters stored from: their keys, not their names, which an event may make megabytes long):
an adapter the index holds no block of matches nothing (an engine hashes the adapter
into its blocks: the base model's are no hit for it); any other from the base model's.

A stored block whose parent hash the index does not know (evicted meanwhile, or stored
before this index subscribed) is dropped and counted in ``orphans``: the engine cannot
reach it by a prefix lookup either until its parent comes back. A stored block hashed over
more than its tokens and adapter (``BlockStored.token_keyed``: a salted chain's, one holding
an image) is dropped too, with the rest of its event, and counted in ``keyed_elsewhere``: a
prompt's tokens alone would match it where the engine would not (a salted tenant's document
found for an unsalted request), and its children, stored later, are orphans. ``apply`` takes one
message's sequence number: a number not above the last one means the engine restarted
(sequence numbers start at 0 per process), so the replica is cleared first (``restarted``);
a jump forward means messages were lost and is counted in ``gaps``. ``reset`` forgets a
replica's blocks and its sequence number (a restart seen elsewhere: its counters went back
at a scrape), so that its next message starts it afresh and whoever feeds the index replays
what it missed.

One restart is usually told twice: by the stream (its numbers went back) and by the next
scrape. The first ``reset`` after a restart the stream showed is that restart's, and a
no-op: what the index learned since is the new process's (cleared again, blocks that stay
cached are never stored again, and the replica was under-reported for good), unless the
stream can be replayed from its start (``restarted(replayed=True)``). Whichever signal
comes first clears the replica once; the other finds it done::

    stream restart, then reset     cleared by the stream; the reset matches it
    reset, then the new stream     cleared by the reset; the stream starts afresh (no
                                   number to go back from)

A restart the stream showed that no scrape ever tells (counters that did not go back) is
matched by the next ``reset`` instead: one a stream that missed that later restart (no
message from its new process yet) leaves uncleared until its numbers go back.

Whether a replica's stream still speaks is judged here too. A stream held back on the way
(the connection open, no message arriving) leaves the index claiming blocks the engine
evicted meanwhile, and nothing in the stream itself tells. What does: a prompt answered
there that reached at least one block past what the index held of it must have stored
blocks, which the engine publishes within a step of its prefill. ``unheard`` counts such
prompts answered with no message of the replica applied since their send; the replica is
``stalled`` once the earliest of their prefills ended more than ``stall_s`` ago and still no
message came. The next message applied clears it (a gap it shows is replayed as any other).
Two numbers and a timestamp per replica, kept as messages come; nothing per request::

    heard_s         when its last message was applied (the ``clock``)
    unheard         answered prompts since then that must have stored blocks there
    waiting_since   the earliest of their prefills' ends

Not thread-safe: one owner (the gateway's event loop) feeds it and reads it.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from hashlib import blake2b
from typing import NamedTuple

from kvwire.kv_event_format import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from policies.ring import token_bytes

_ROOT = 1337  # parent key of a chain's first block (no adapter)
# adapters kept to match prompts by (a LoRA fleet's adapters), those stored from least
# lately let go first
MAX_ADAPTERS = 4096
# blocks a replica may hold in the index (about 200 bytes each) until its KV capacity is
# known: 2^20 blocks of 16 tokens is 16M tokens, past any one replica's KV
DEFAULT_BLOCK_LIMIT = 1 << 20
MIN_BLOCK_LIMIT = 1 << 16  # the least a known capacity limits a replica to
# the most: twice the default (32M tokens of 16), whatever capacity a replica's gauge claims
# (a garbage gauge must not lift the bound on the gateway's memory)
MAX_BLOCK_LIMIT = 1 << 21
# a replica's stream is judged stalled when an answered prompt's stores are this overdue (the
# policies pass twice their grace for a prefill: see ``stalled``)
STALL_S = 10.0


def root_key(lora_name: str | None = None, lora_id: int | None = None) -> int:
    """The parent key of block 0: fixed, or derived from the adapter's name (or, for an
    engine that names it only by id, from its id)."""
    if lora_name:
        label = lora_name.encode()
    elif lora_id is not None and lora_id != 0:
        label = f"#lora-id:{lora_id}".encode()
    else:
        return _ROOT
    digest = blake2b(label, digest_size=8, person=b"kvgate-lora").digest()
    return int.from_bytes(digest, "little")


def _packed(tokens: Sequence[int]) -> bytes:
    """Token ids as the u32 little-endian bytes keys hash (hashable, unlike a view)."""
    return token_bytes(tokens).tobytes()


def chain_key(parent: int, tokens: Sequence[int]) -> int:
    """The key of one block of ``tokens`` after the block keyed ``parent`` (``match`` and
    ``apply`` compute the same over slices of tokens packed once)."""
    return hash((parent, _packed(tokens)))


@dataclass(slots=True)
class IndexStats:
    """Counts of what the index could not apply exactly: all replicas' (``KVIndex.stats``)
    or one's (``KVIndex.stats_of``)."""

    orphans: int = 0  # stored blocks dropped: parent hash unknown
    # stored blocks dropped: hashed over more than their tokens (a cache salt, an image)
    keyed_elsewhere: int = 0
    wrong_block_size: int = 0  # stored events dropped: not the index's block size
    gaps: int = 0  # messages lost (sequence jumped forward)
    restarts: int = 0  # sequence went back: the replica was cleared
    overflows: int = 0  # a replica named more blocks than its limit: it was cleared


class Stall(NamedTuple):
    """A replica whose KV event stream is judged stalled (``KVIndex.stalled``)."""

    silent_s: float  # since its last message was applied
    answers: int  # answered prompts since that must have stored blocks there


@dataclass(slots=True)
class _Replica:
    # plain dicts of ints, which the garbage collector never tracks (a Counter it walks
    # whole at every full collection: a replica of millions of tokens holds ~10^5 blocks)
    by_hash: dict[int, int] = field(default_factory=dict)  # engine hash -> chain key
    copies: dict[int, int] = field(default_factory=dict)  # engine hash -> copies held
    keys: dict[int, int] = field(default_factory=dict)  # chain key -> engine hashes
    last_seq: int | None = None
    # the stream showed a restart (its numbers went back) that no ``reset`` has matched
    restart_unmatched: bool = False
    # the last ``reset`` matched that restart, and no message came since: the same reset
    # told again (by every model's policy, sharing this index) matches it too
    reset_matched: bool = False
    stats: IndexStats = field(default_factory=IndexStats)  # its own share of the counts
    # whether its stream still speaks (see the module docstring): when its last message
    # was applied (-inf: none through ``apply``), the answered prompts that must have
    # stored blocks there since, and the earliest of their prefills' ends
    heard_s: float = -math.inf
    unheard: int = 0
    waiting_since: float = math.inf

    def clear(self) -> None:
        self.by_hash.clear()
        self.copies.clear()
        self.keys.clear()


class KVIndex:
    """Per-replica sets of block keys; see the module docstring."""

    def __init__(self, block_size: int = 16, stall_s: float = STALL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if not stall_s > 0:
            raise ValueError(f"stall_s must be > 0, got {stall_s!r}")
        self.block_size = block_size
        self.stall_s = stall_s
        # the time messages are applied at and stalls judged by (a request's arrival_s is
        # of the same clock)
        self.clock = clock
        self._waiting: set[str] = set()  # replicas with ``unheard`` prompts
        self.stats = IndexStats()
        self._replicas: dict[str, _Replica] = {}
        # the root keys of the adapters stored from lately, least lately first (a key, not
        # the name: a name is as long as an event makes it, up to a message's 4 MiB)
        self._adapters: dict[int, None] = {}
        self.resets: Counter[str] = Counter()  # ``reset`` calls per replica
        self._limits: dict[str, int] = {}  # replica -> most blocks it may hold here

    # -- queries -------------------------------------------------------------------------

    def replicas(self) -> list[str]:
        return list(self._replicas)

    @property
    def fed(self) -> bool:
        """Whether any replica's events have reached the index."""
        return bool(self._replicas)

    def tracks(self, replica: str) -> bool:
        """Whether ``replica``'s events reach the index (it may hold nothing yet)."""
        return replica in self._replicas

    def num_blocks(self, replica: str) -> int:
        """Distinct block keys held by ``replica``."""
        r = self._replicas.get(replica)
        return len(r.keys) if r else 0

    def stats_of(self, replica: str) -> IndexStats | None:
        """What the index could not apply exactly of ``replica``'s events since it was
        first fed them (None: never, or removed since)."""
        r = self._replicas.get(replica)
        return None if r is None else r.stats

    def limit_of(self, replica: str) -> int:
        """The most blocks ``replica`` may hold in the index (``set_limit``)."""
        return self._limits.get(replica, DEFAULT_BLOCK_LIMIT)

    def set_limit(self, replica: str, blocks: int) -> None:
        """Bound what ``replica`` holds here to ``blocks`` (twice its KV capacity, say; at
        most ``MAX_BLOCK_LIMIT``): a stream that names more (its removals lost, or no
        engine's) clears it, counted in ``stats.overflows``, rather than growing the
        gateway without bound."""
        if blocks < 1:
            raise ValueError(f"blocks must be >= 1, got {blocks!r}")
        self._limits[replica] = min(blocks, MAX_BLOCK_LIMIT)

    def holds(self, replica: str, key: int) -> bool:
        r = self._replicas.get(replica)
        return r is not None and key in r.keys

    def match(self, tokens: Sequence[int], replicas: Iterable[str],
              max_blocks: int | None = None, model: str | None = None,
              adapter: bool | None = None) -> dict[str, int]:
        """For each replica, how many leading full blocks of ``tokens`` it holds (at most
        ``max_blocks``), as computed for ``model`` (an adapter's blocks when the index
        knows an adapter by that name; none for one known to be an adapter, ``adapter``,
        it knows no block of; else the base model's). Keys are computed only while some
        replica still matches."""
        sets = {rid: (r.keys if (r := self._replicas.get(rid)) else None) for rid in replicas}
        out = dict.fromkeys(sets, 0)
        root = _ROOT
        if model is not None:
            # an adapter's blocks are rooted at its name: looked for there, even when the
            # index has let the name go (past MAX_ADAPTERS others stored from since)
            named = root_key(model)
            if adapter or named in self._adapters:
                root = named
        alive = [rid for rid, keys in sets.items() if keys]
        bs = self.block_size
        limit = len(tokens) // bs if max_blocks is None else min(max_blocks, len(tokens) // bs)
        if not alive or limit <= 0:
            return out
        data = _packed(tokens[: limit * bs])
        step = 4 * bs
        prev = root
        i = 0  # block i: tokens [iB, (i+1)B), bytes [i*step, (i+1)*step)
        while i < limit and len(alive) > 1:
            prev = hash((prev, data[i * step : (i + 1) * step]))
            still = [rid for rid in alive if prev in sets[rid]]  # type: ignore[operator]
            for rid in alive:
                if rid not in still:
                    out[rid] = i
            alive, i = still, i + 1
        if len(alive) == 1:  # the common case: one holder, read on alone
            (rid,) = alive
            held = sets[rid]
            assert held is not None
            while i < limit:
                prev = hash((prev, data[i * step : (i + 1) * step]))
                if prev not in held:
                    break
                i += 1
            out[rid] = i
        else:
            for rid in alive:
                out[rid] = limit
        return out

    # -- updates -------------------------------------------------------------------------

    def apply(self, replica: str, seq: int, events: Iterable[KVEvent]) -> None:
        """Apply one message (sequence number ``seq``) from ``replica``."""
        r = self._replica(replica)
        if r.last_seq is not None:
            if seq <= r.last_seq:  # numbered from a new start: the engine restarted
                self.restarted(replica)
            elif seq > r.last_seq + 1:
                lost = seq - r.last_seq - 1
                self.stats.gaps += lost
                r.stats.gaps += lost
        r.last_seq = seq
        r.reset_matched = False
        r.heard_s = self.clock()
        if r.unheard:  # its stream speaks: what was awaited arrives now, or was replayed
            r.unheard, r.waiting_since = 0, math.inf
            self._waiting.discard(replica)
        for ev in events:
            self.apply_event(replica, ev)

    def apply_event(self, replica: str, ev: KVEvent) -> None:
        r = self._replica(replica)
        if isinstance(ev, BlockStored):
            self._stored(r, ev, self._limits.get(replica, DEFAULT_BLOCK_LIMIT))
        elif isinstance(ev, BlockRemoved):
            for h in ev.block_hashes:
                self._drop(r, h)
        elif isinstance(ev, AllBlocksCleared):
            r.clear()

    def _replica(self, replica: str) -> _Replica:
        """``replica``'s entry, made on its first event (not one made and thrown away at
        every event, as ``setdefault`` would)."""
        r = self._replicas.get(replica)
        if r is None:
            r = self._replicas[replica] = _Replica()
        return r

    def _stored(self, r: _Replica, ev: BlockStored, limit: int) -> None:
        n = len(ev.block_hashes)
        if ev.block_size != self.block_size or len(ev.token_ids) != n * ev.block_size:
            self.stats.wrong_block_size += 1
            r.stats.wrong_block_size += 1
            return
        if ev.parent_block_hash is None:
            prev = root_key(ev.lora_name, ev.lora_id)
            if ev.lora_name:  # kept by recency: the adapters stored from lately
                adapters = self._adapters
                if prev in adapters:
                    del adapters[prev]
                elif len(adapters) >= MAX_ADAPTERS:
                    del adapters[next(iter(adapters))]
                adapters[prev] = None
        elif (found := r.by_hash.get(ev.parent_block_hash)) is not None:
            prev = found
        else:
            self.stats.orphans += n
            r.stats.orphans += n
            return
        if len(r.by_hash) + n > limit:
            r.clear()  # its next chains start afresh (their parents are gone: orphans)
            self.stats.overflows += 1
            r.stats.overflows += 1
            return
        step = 4 * self.block_size
        data = _packed(ev.token_ids)
        keyed = ev.token_keyed()
        if keyed < n:
            # hashed over more than their tokens (a cache salt, an image): no prompt's
            # tokens name them, and those chained after them are orphans
            self.stats.keyed_elsewhere += n - keyed
            r.stats.keyed_elsewhere += n - keyed
        for i, h in enumerate(ev.block_hashes[:keyed]):
            prev = hash((prev, data[i * step : (i + 1) * step]))  # chain_key, sliced
            old = r.by_hash.get(h)
            if old == prev:
                r.copies[h] = r.copies.get(h, 0) + 1  # another physical copy of it
                continue
            if old is not None:
                self._drop(r, h, every_copy=True)
            r.by_hash[h] = prev
            r.copies[h] = 1
            r.keys[prev] = r.keys.get(prev, 0) + 1

    @staticmethod
    def _drop(r: _Replica, engine_hash: int, every_copy: bool = False) -> None:
        """One copy of ``engine_hash`` removed (``every_copy``: all of them); the block
        leaves the index with its last copy."""
        copies = r.copies.get(engine_hash, 0) - 1
        if copies > 0 and not every_copy:
            r.copies[engine_hash] = copies
            return
        r.copies.pop(engine_hash, None)
        key = r.by_hash.pop(engine_hash, None)
        if key is None:
            return
        left = r.keys[key] - 1
        if left:
            r.keys[key] = left
        else:
            del r.keys[key]

    def last_seq(self, replica: str) -> int | None:
        """The sequence number of the last message applied from ``replica``."""
        r = self._replicas.get(replica)
        return None if r is None else r.last_seq

    def restarted(self, replica: str, replayed: bool = False) -> None:
        """``replica``'s stream showed a restart (its sequence numbers went back): forget
        what it holds and its sequence number, and take the next ``reset`` (the same
        restart, seen at a scrape) as told already. ``replayed``: whoever feeds the index
        replays the replica from its start at every ``reset`` (a replay endpoint), which
        rebuilds it whichever restart that reset tells: it then clears it as any other."""
        r = self._replicas.get(replica)
        if r is None:
            return
        self._clear(replica, r)
        r.restart_unmatched = not replayed

    def reset(self, replica: str) -> None:
        """Forget what ``replica`` holds and its sequence number: it restarted (its next
        message is numbered from its new start) or what it holds is to be replayed. A
        no-op for the restart its stream showed already (``restarted``): see the module
        docstring."""
        r = self._replicas.get(replica)
        if r is None:
            return
        if r.restart_unmatched or r.reset_matched:
            # cleared when the stream showed it: what came since is the new process's
            r.restart_unmatched = False
            r.reset_matched = True
            return
        if r.last_seq is None and not r.by_hash:
            # nothing heard from it yet, or nothing since it was last reset (every model's
            # policy resets the one index they share): its first message starts it
            return
        self._clear(replica, r)

    def _clear(self, replica: str, r: _Replica) -> None:
        r.clear()
        r.last_seq = None
        r.restart_unmatched = r.reset_matched = False
        self.stats.restarts += 1
        r.stats.restarts += 1
        self.resets[replica] += 1

    def remove_replica(self, replica: str) -> None:
        self._replicas.pop(replica, None)
        self._waiting.discard(replica)
        self.resets.pop(replica, None)
        self._limits.pop(replica, None)

    # -- whether a stream speaks -----------------------------------------------------------

    def silent_since(self, replica: str, at: float) -> bool:
        """Whether a message of ``replica`` was applied (``apply``) before ``at`` and none
        at ``at`` or after it."""
        r = self._replicas.get(replica)
        return r is not None and -math.inf < r.heard_s < at

    def unheard(self, replica: str, prefilled_s: float) -> None:
        """A prompt answered by ``replica``, its prefill ended at ``prefilled_s``, must
        have stored blocks there that the index does not hold, and no message of the
        replica came since the prompt was sent (``silent_since``)."""
        r = self._replicas.get(replica)
        if r is None:
            return
        r.unheard += 1
        r.waiting_since = min(r.waiting_since, prefilled_s)
        self._waiting.add(replica)

    def stalled(self, now: float | None = None) -> dict[str, Stall]:
        """The replicas whose KV event streams are stalled at ``now`` (None: the clock's
        now): an answered prompt's stores there are more than ``stall_s`` overdue (its
        prefill ended that long ago) and no message of theirs came since. What the index
        holds of them is not to be trusted: evictions since are not in it. Usually none:
        the replicas awaiting nothing are not looked at."""
        if not self._waiting:
            return {}
        at = self.clock() if now is None else now
        out = {}
        for rid in self._waiting:
            r = self._replicas[rid]
            if at - r.waiting_since > self.stall_s:
                out[rid] = Stall(at - r.heard_s, r.unheard)
        return out

    # -- checks --------------------------------------------------------------------------

    def check_integrity(self) -> None:
        """Raise AssertionError if a replica's maps disagree, or the replicas awaiting
        stores are not those with answered prompts unheard."""
        awaiting = {rid for rid, r in self._replicas.items() if r.unheard}
        if awaiting != self._waiting:
            raise AssertionError(f"replicas {sorted(self._waiting)} await stores, but "
                                 f"{sorted(awaiting)} have answered prompts unheard")
        for rid, r in self._replicas.items():
            counted = Counter(r.by_hash.values())
            if dict(counted) != r.keys:
                raise AssertionError(
                    f"replica {rid}: {len(r.by_hash)} hashes map to {len(counted)} keys, "
                    f"but {len(r.keys)} keys with {sum(r.keys.values())} references are held"
                )
            if any(c <= 0 for c in r.keys.values()):
                raise AssertionError(f"replica {rid}: a key has a non-positive count")
            if r.copies.keys() != r.by_hash.keys() or any(c <= 0 for c in r.copies.values()):
                raise AssertionError(
                    f"replica {rid}: copies of {len(r.copies)} hashes counted for "
                    f"{len(r.by_hash)} hashes held, or a count not above 0")
