"""Feeds a policy's exact index (``Policy.kv_index``: the ``kv_events`` policy's, and
``cost``'s) from the replicas' KV event streams.

One ZMQ SUB socket per replica whose config names a ``kv_events`` endpoint, each read by
its own task on the event loop (the index has one owner, so no locks). A reconcile loop
follows the fleet: it subscribes to replicas added at runtime, unsubscribes from removed
ones and restarts a reader that failed; it runs every ``reconcile_s`` and at once when the
fleet tells of a replica joining or leaving. All tasks are owned by ``KVEventSubscriber``,
started and stopped in the app's lifespan.

A message is ``[topic, seq (u64 big-endian), payload]`` (see ``kvwire.kv_event_format``); a
malformed one is logged and skipped (a malformed event inside a batch alone is skipped, and
counted). A message over ``MAX_MESSAGE_BYTES`` is refused by the socket: ZMQ drops that
connection and, a protocol error, never connects to that publisher again (it does after a
network error). The socket's monitor tells of it (a disconnection no retry follows): the
reader logs it, counts it as malformed and opens a new socket, and what the stream missed
meanwhile is a gap like any other. When the replica's config names a ``kv_events_replay``
endpoint, what the stream missed is asked for there:

* on (re)subscribing, at once: everything the engine still keeps from sequence 0 (blocks
  it cached before this gateway listened, or while the replica was out of the fleet);
* when the replica restarted: its sequence numbers went back (the numbers its new process
  sent before the one received are replayed), or the index was ``reset`` (its prefix-cache
  counters went back at a scrape: everything from sequence 0 again, at once);
* before a message whose sequence number jumps (messages dropped on the way), from the
  last batch applied: an endpoint that keeps another batch under that number is a new
  process numbered past the old one (which died young, its successor's first batches sent
  before this subscriber reconnected), replayed from 0 after the replica is cleared.

A hybrid model's engine (vLLM with full-attention and sliding-window layers, say) stores
and evicts each block once per KV cache group (``group_idx``), under the same hash. Only
the groups of a full-attention kind (``FULL_ATTENTION_KINDS``, or no kind named) hold a
prompt's whole prefix: beside one of those, the others' events are skipped, their removals
included, once a store has named their kind (a sliding window's group evicts the early
blocks of every prompt while the full-attention group still holds them). A removal from a
group none of whose stores was seen since following (its kind unknown) is skipped: the
index holds no copy stored by it, and a window's eviction took the full-attention blocks.

A live message that a catch-up replay applied already (queued on the SUB socket meanwhile:
the same number and the same bytes) is skipped; any other numbered at or below it is a
restart. Without a replay endpoint, or when the replay fails, the index counts the gap and
blocks cached in it stay unknown until stored again; a jump forward is then taken as a gap
of the same process (nothing in the stream tells a new process numbered past the old one:
the next scrape whose counters went back clears the replica), and a restart the stream
showed is not cleared again by that scrape (``KVIndex.restarted``): what the new process
stored since would be lost for good.

A replica's stored events whose block size is not the index's (an engine started with
another ``--block-size``) are all dropped by the index: its cache is never matched. A
warning names the replica, both sizes and the setting to change, at most once a minute per
replica; the index's drops are exported per replica and reason (``gateway.metrics``).

A replica whose stream is judged stalled (``KVIndex.stalled``: prompts answered there
stored blocks, and no message of it came for ``stall_s`` after: held back on the way, or a
publisher that stopped while its socket stays open) is warned of at most once a minute,
naming the replica, its endpoint and how long it has been silent; the policies stop
trusting its index meanwhile, and ``kvgate_kv_events_stalled{replica}`` is 1. Its next
message clears it (a gap it shows is replayed as any other).

An endpoint is followed for one replica: one that joins naming an endpoint another replica
is followed on (discovery found both) is not followed until it is free (``_apart``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from dataclasses import replace

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from gateway.fleet import Fleet
from gateway.fleet_events import FleetEvent, ReplicaAdded
from gateway.log_throttle import LogThrottle
from kvwire.kv_event_format import (
    REPLAY_END,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventBatch,
    KVWireError,
    decode_payload,
)
from policies.base import Policy, ReplicaRemoved
from policies.kv_events import KVEvents
from policies.kv_index import MIN_BLOCK_LIMIT, KVIndex

log = logging.getLogger("kvgate.kv_events")

# one engine step's events (a few thousand blocks stored or removed, their token ids: a
# few hundred KB) is far below this
MAX_MESSAGE_BYTES = 4 << 20
_DUPLICATES_KEPT = 1024  # replayed batches a live duplicate is recognised among
_POLL_MS = 250  # how soon a reader notices that its replica's index was reset
_THREAD_DECODE_BYTES = 256 << 10  # a payload past this is decoded off the event loop
_SLICE_HASHES = 8192  # a batch is applied this many block hashes at a time, the loop
# served in between (a message of millions of hashes held it for seconds)
_REPLAY_BACKOFF_S = (1.0, 60.0)  # after a failed replay, none for this long (doubling)
# KV cache groups of these kinds (vLLM's KVCacheSpecKind) hold every block of a prefix
FULL_ATTENTION_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})
_MAX_GROUPS = 64  # KV cache groups whose kind is kept, per replica
# a replica whose stored events are dropped for their block size: warned of at most once
# this often (each of its engine steps drops more)
_BLOCK_SIZE_WARN_S = 60.0
_STALL_WARN_S = 60.0  # a replica whose stream is stalled: warned of at most once this often
# what a SUB socket's monitor tells: whether libzmq still connects to the publisher
_LINK_EVENTS = (zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_DELAYED | zmq.EVENT_CONNECT_RETRIED
                | zmq.EVENT_DISCONNECTED)
# a feed dropped again with no message read since it was reopened is reopened after this
# long (doubling)
_REOPEN_BACKOFF_S = (0.25, 30.0)
_monitors = itertools.count()  # each monitor's inproc address is its own


class _EndlessReplay(Exception):
    """A replay endpoint sent more batches than a replay applies."""


class _Replaced(Exception):
    """A replay endpoint keeps another batch under the number of the last one applied:
    the engine restarted."""


class KVEventSubscriber:
    def __init__(self, fleet: Fleet, index: KVIndex, reconcile_s: float = 1.0,
                 block_size_key: str = "policy.block_size") -> None:
        self.fleet = fleet
        self.index = index
        self.reconcile_s = reconcile_s
        # the config key that sets the index's block size, as a warning names it
        self.block_size_key = block_size_key
        self.messages = 0
        # messages skipped (a connection ZMQ dropped for one included), and events
        # skipped inside a batch
        self.malformed = 0
        self.gaps = 0  # sequence jumps and late starts seen (replayed or not)
        self.replays = 0  # gaps filled from a replay endpoint
        self.replay_failures = 0
        self.replay_timeout_s = 2.0
        # batches a replay applies at most (vLLM keeps 10,000 steps): an endpoint that
        # sends new ones without end held the replica's reader, its live stream unread,
        # for good; past this the replay ends as failed
        self.replay_max_batches = 1 << 18
        self._ctx: zmq.asyncio.Context | None = None
        # id -> (publish endpoint, replay endpoint), task
        self._readers: dict[str, tuple[tuple[str, str | None], asyncio.Task[None]]] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self._membership_changed = asyncio.Event()
        # replica -> the last batches a catch-up replay applied (sequence number -> hash of
        # the payload) and the highest number, until a live message numbered past it
        self._replayed: dict[str, tuple[int, dict[int, int]]] = {}
        # replica -> (no replay before this monotonic time, the next backoff): a replay
        # endpoint that fails is not asked at every gap, which held the live stream 2 s
        # each time
        self._replay_backoff: dict[str, tuple[float, float]] = {}
        # replica -> its KV cache groups (``group_idx``) seen storing, and whether they
        # hold whole prefixes (None: their stores name no kind, kept): the events of those
        # that do not (a sliding window's) are skipped beside one that does; a removal
        # from a group none of whose stores was seen is skipped (no copy of its is held)
        self._groups: dict[str, dict[int, bool | None]] = {}
        # replica -> the sequence number and payload hash of the last batch applied (a
        # replay that keeps another under that number tells of a restart)
        self._last_applied: dict[str, tuple[int, int]] = {}
        # replica -> when its stored events dropped for their block size were last logged
        self._block_size_warned: dict[str, LogThrottle] = {}
        # replica -> (the replica followed on an endpoint it names too, that endpoint): it
        # is not followed (``_apart``)
        self._clashes: dict[str, tuple[str, str]] = {}
        # replica -> when its stalled stream was last warned of, while it stays stalled
        self._stall_warned: dict[str, LogThrottle] = {}

    def _on_fleet_event(self, event: FleetEvent) -> None:
        if isinstance(event, ReplicaAdded | ReplicaRemoved):
            self._membership_changed.set()

    @classmethod
    def for_policy(cls, fleet: Fleet, policy: Policy) -> KVEventSubscriber | None:
        """A subscriber feeding ``policy``'s index, or None when the policy keeps none."""
        endpoints = [s.id for s in fleet if s.config.kv_events]
        index = policy.kv_index
        if index is None:
            if endpoints:
                log.info("policy %s ignores the kv_events endpoints of %s", policy.name,
                         ", ".join(endpoints))
            return None
        if not endpoints and policy.name == KVEvents.name:
            log.warning("policy kv_events: no replica has a kv_events endpoint yet; "
                        "routing by load only")
        key = "policy.block_size" if policy.name == KVEvents.name else "policy.kv_block_size"
        return cls(fleet, index, block_size_key=key)

    async def start(self) -> None:
        self._ctx = zmq.asyncio.Context()
        self.fleet.listen(self._on_fleet_event)
        await self.reconcile()
        self._loop_task = asyncio.create_task(self._reconcile_loop(), name="kvgate-kv-events")

    async def stop(self) -> None:
        self.fleet.unlisten(self._on_fleet_event)
        tasks = [t for _, t in self._readers.values()]
        if self._loop_task is not None:
            tasks.append(self._loop_task)
        for task in tasks:
            task.cancel()
        # a reader that failed earlier re-raises its error here: it was logged already
        await asyncio.gather(*tasks, return_exceptions=True)
        self._readers.clear()
        self._loop_task = None
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    async def _reconcile_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._membership_changed.wait(), self.reconcile_s)
            self._membership_changed.clear()
            try:
                await self.reconcile()
                self.warn_stalled()
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad round must not stop the following ones
                log.exception("KV event reconcile failed")

    async def reconcile(self) -> None:
        """Match the readers to the fleet's replicas and their endpoints."""
        # replica -> (publish endpoint, replay endpoint): a reader follows both, and one
        # re-added with another replay endpoint (same publish one) asks the new one
        wanted = self._apart({s.id: (s.config.kv_events, s.config.kv_events_replay)
                              for s in self.fleet if s.config.kv_events})
        for rid, (endpoints, task) in list(self._readers.items()):
            failed = task.done() and not task.cancelled() and task.exception() is not None
            now = wanted.get(rid)
            if now == endpoints and not failed:
                continue
            if failed:
                log.error("replica %s: KV event reader failed: %r", rid, task.exception())
            elif not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            del self._readers[rid]
            if now is None or now[0] != endpoints[0]:
                # gone, moved or no longer publishing: what it held is unknown now, and
                # another endpoint's messages are numbered from its own start (a policy
                # reads the replica's cache otherwise until they arrive)
                self.index.remove_replica(rid)
                self._groups.pop(rid, None)
                self._last_applied.pop(rid, None)
                self._block_size_warned.pop(rid, None)
            if now != endpoints:
                # a replica back under this id (a pod of a StatefulSet) is asked for its
                # replay at once, not after an old endpoint's failures (its first live
                # message would pass the catch-up for good); nor are ids kept without end
                self._replay_backoff.pop(rid, None)
        for rid, (endpoint, replay) in wanted.items():
            if rid not in self._readers:
                assert endpoint is not None
                task = asyncio.create_task(self._read(rid, endpoint, replay),
                                           name=f"kvgate-kv-events-{rid}")
                self._readers[rid] = ((endpoint, replay), task)

    def warn_stalled(self) -> None:
        """Log each replica whose stream the index judges stalled, at most once per
        ``_STALL_WARN_S`` each, and that it speaks again once it does."""
        stalled = self.index.stalled()
        for rid in [r for r in self._stall_warned if r not in stalled]:
            del self._stall_warned[rid]
            if self.index.tracks(rid):  # (else it left, or changed endpoints)
                log.info("replica %s: KV event messages arrive again; its index is read "
                         "again", rid)
        for rid, stall in stalled.items():
            throttle = self._stall_warned.get(rid)
            if throttle is None:
                throttle = self._stall_warned[rid] = LogThrottle(_STALL_WARN_S)
            if throttle.due() is None:
                continue
            followed = self._readers.get(rid)
            endpoint = followed[0][0] if followed is not None else "its endpoint"
            log.warning("replica %s: no KV event message from %s for %.1f s, though "
                        "prompts answered there since (%d) stored blocks, which the engine "
                        "publishes within a step: its stream is stalled (held back on the "
                        "way, or its publisher stopped), and what the index holds of it is "
                        "not trusted until a message comes", rid, endpoint, stall.silent_s,
                        stall.answers)

    def _apart(self, wanted: dict[str, tuple[str | None, str | None]]
               ) -> dict[str, tuple[str | None, str | None]]:
        """``wanted`` less each replica one of whose KV event endpoints another of them
        names (followed for both, one engine's cache would be mirrored twice and the
        other's never seen): the replica followed already keeps it, else the first in
        the fleet's order; the other is not followed until the endpoint is free, and is
        warned of once. The config and the admin API refuse such a replica; one that
        discovery found (or that two sources found) gets here."""
        ends = [e for pair in wanted.values() for e in pair if e is not None]
        if len(set(ends)) == len(ends):  # (all apart: one pass, no more)
            self._clashes.clear()
            return wanted
        held: dict[str, str] = {}  # endpoint -> the replica followed on it
        clashes: dict[str, tuple[str, str]] = {}  # replica -> (holder, endpoint)
        followed = [rid for rid, (now, _) in self._readers.items() if wanted.get(rid) == now]
        for rid in itertools.chain(followed, wanted):
            mine = [e for e in wanted[rid] if e is not None]
            clash = next(((h, e) for e in mine if (h := held.get(e, rid)) != rid), None)
            if clash is None:
                held.update(dict.fromkeys(mine, rid))
                continue
            clashes[rid] = clash
            if self._clashes.get(rid) != clash:
                log.warning("replica %s: its KV event endpoint %s is also replica %s's: not "
                            "followed (each replica's engine publishes on endpoints of its "
                            "own); its cache is not matched until the endpoint is free",
                            rid, clash[1], clash[0])
        self._clashes = clashes
        return {rid: pair for rid, pair in wanted.items() if rid not in clashes}

    async def _read(self, replica: str, endpoint: str, replay: str | None = None) -> None:
        assert self._ctx is not None
        self._replayed.pop(replica, None)
        caught_up = -1  # the index's reset count for this replica when last replayed from 0
        drops = 0  # connections ZMQ dropped for good since the last message
        feed = _Feed(self._ctx, endpoint)
        try:
            log.info("replica %s: following KV events at %s", replica, endpoint)
            while True:
                resets = self.index.resets[replica]
                if replay is not None and caught_up != resets and self._may_replay(replica):
                    caught_up = resets
                    if self.index.last_seq(replica) is None:
                        await self.catch_up(replica, replay)
                frames = await feed.recv(_POLL_MS)
                if frames is not None:
                    drops = 0
                    await self.receive(replica, frames, replay)
                elif feed.dropped:
                    feed.close()
                    self.malformed += 1
                    if drops == 0:  # once, not for each retry of a peer that does it again
                        log.warning("replica %s: ZMQ dropped its KV event connection to %s "
                                    "for good (a message over the %d-byte limit, or a peer "
                                    "not speaking ZMTP): reconnecting; what it missed is a "
                                    "gap", replica, endpoint, MAX_MESSAGE_BYTES)
                    else:  # again with no message between: not at once
                        first, most = _REOPEN_BACKOFF_S
                        await asyncio.sleep(min(first * 2 ** min(drops - 1, 16), most))
                    drops += 1
                    feed = _Feed(self._ctx, endpoint)
        finally:
            self._replayed.pop(replica, None)
            feed.close()

    async def catch_up(self, replica: str, replay: str) -> None:
        """Apply every batch the replica's replay endpoint keeps, from sequence 0 (its
        index knows no sequence number: newly followed, or reset)."""
        applied: dict[int, int] = {}
        last = await self._replay(replica, replay, 0, None, applied)
        if last is not None:
            self._replayed[replica] = (last, {seq: digest for seq, digest in applied.items()
                                              if seq > last - _DUPLICATES_KEPT})

    async def receive(self, replica: str, frames: list[bytes], replay: str | None) -> None:
        """``handle``, first filling from ``replay`` what the stream missed before it (a
        large payload decoded on a thread, a large batch applied in slices)."""
        message = await self._decode_off_loop(replica, frames)
        if message is None:
            return
        seq = message[0]
        replayed = self._replayed.get(replica)
        if replayed is not None:
            if replayed[1].get(seq) == hash(frames[2]):
                return  # a replay applied it already
            if seq > replayed[0]:
                del self._replayed[replica]
        last = self.index.last_seq(replica)
        if last is not None and seq <= last:
            # numbered from a new start: the engine restarted, and what its new process
            # sent before this message (if any) is replayed below
            log.warning("replica %s: KV event sequence went back from %d to %d: it "
                        "restarted", replica, last, seq)
            self.index.restarted(replica, replayed=replay is not None)
            last = None
        start = 0 if last is None else last + 1
        if seq > start:
            self.gaps += 1
            if replay is not None and self._may_replay(replica):
                try:
                    # from the last batch applied: the same bytes, the same process
                    await self._replay(replica, replay, start, seq,
                                       known=self._last_applied.get(replica))
                except _Replaced:
                    # numbered past the old process by a new one (the old one died
                    # young, the new one's first batches sent before this subscriber
                    # reconnected): what it sent from 0 is replayed
                    log.warning("replica %s: KV event replay keeps another batch %d than "
                                "the one applied: it restarted", replica, start - 1)
                    self.index.restarted(replica, replayed=True)
                    await self._replay(replica, replay, 0, seq)
        await self._apply_sliced(replica, message)
        self._last_applied[replica] = (seq, hash(frames[2]))

    async def _decode_off_loop(self, replica: str, frames: list[bytes]
                               ) -> tuple[int, KVEventBatch] | None:
        """``_decode``, a large payload decoded on a thread."""
        decoded: KVEventBatch | KVWireError | None = None
        if len(frames) == 3 and len(frames[2]) > _THREAD_DECODE_BYTES:
            decoded = await asyncio.to_thread(_decoded, frames[2])
        return self._decode(replica, frames, decoded)

    async def _apply_sliced(self, replica: str, message: tuple[int, KVEventBatch]) -> None:
        """``_apply``, a batch of many blocks in slices with the loop served between."""
        if sum(_hashes(ev) for ev in message[1].events) <= _SLICE_HASHES:
            self._apply(replica, *message)
            return
        first = True
        for part in _slices(message[1]):
            if not first:
                await asyncio.sleep(0)  # the loop serves others between slices
                if self.fleet.get(replica) is None:
                    return  # removed meanwhile
            self._apply(replica, message[0], part, count=first)
            first = False

    def _may_replay(self, replica: str) -> bool:
        backoff = self._replay_backoff.get(replica)
        return backoff is None or time.monotonic() >= backoff[0]

    def handle(self, replica: str, frames: list[bytes]) -> None:
        """Apply one received message to the index (skipped if malformed)."""
        message = self._decode(replica, frames)
        if message is not None:
            self._apply(replica, *message)

    def _decode(self, replica: str, frames: list[bytes],
                decoded: KVEventBatch | KVWireError | None = None
                ) -> tuple[int, KVEventBatch] | None:
        """(sequence number, batch) of a message, its payload ``decoded`` already where
        given; None when it is skipped (counted and logged when malformed)."""
        if self.fleet.get(replica) is None:
            return None  # removed while the message was in flight
        try:
            if len(frames) != 3 or len(frames[1]) != 8:
                raise KVWireError(f"expected [topic, 8-byte seq, payload], got "
                                  f"{len(frames)} frames")
            if decoded is None:
                decoded = _decoded(frames[2])
            if isinstance(decoded, KVWireError):
                raise decoded
            return int.from_bytes(frames[1], "big"), self._full_prefix_groups(replica, decoded)
        except KVWireError as exc:
            self.malformed += 1
            log.warning("replica %s: skipping KV event message: %s", replica, exc)
            return None

    def _full_prefix_groups(self, replica: str, batch: KVEventBatch) -> KVEventBatch:
        """``batch`` without the events of ``replica``'s KV cache groups that hold no
        whole prefixes (learned from their stores' kind, in the stream's order)."""
        if all(getattr(ev, "group_idx", None) is None for ev in batch.events):
            return batch  # a model of one group: the common case
        groups = self._groups.setdefault(replica, {})
        kept: list[KVEvent] = []
        for ev in batch.events:
            group = getattr(ev, "group_idx", None)
            room = group in groups or len(groups) < _MAX_GROUPS
            if isinstance(ev, BlockStored) and group is not None and room:
                if ev.kv_cache_spec_kind is None:
                    groups.setdefault(group, None)  # seen storing, its kind not named
                else:
                    whole = ev.kv_cache_spec_kind in FULL_ATTENTION_KINDS
                    if groups.get(group) is not whole and not whole:
                        log.info("replica %s: KV cache group %d is of kind %.64s: its "
                                 "events are skipped beside a full-attention group's",
                                 replica, group, ev.kv_cache_spec_kind)
                    groups[group] = whole
            elif isinstance(ev, BlockRemoved) and group is not None and room \
                    and group not in groups:
                # no store of that group seen since following: the index holds no copy of
                # its to remove (a sliding window's eviction, seen from mid-stream before
                # its kind, took the full-attention group's blocks out)
                continue
            # a model of windowed groups alone keeps them: they are all it has
            if group is None or groups.get(group) is not False or not any(groups.values()):
                kept.append(ev)
        return replace(batch, events=tuple(kept))

    def _apply(self, replica: str, seq: int, batch: KVEventBatch | tuple[KVEvent, ...],
               count: bool = True) -> None:
        """Apply one message's batch (or, ``count`` False, a later slice of it)."""
        events = batch.events if isinstance(batch, KVEventBatch) else batch
        if count:
            self.messages += 1
        if isinstance(batch, KVEventBatch) and batch.malformed:
            self.malformed += batch.malformed
            log.warning("replica %s: skipped %d malformed KV events of message %d", replica,
                        batch.malformed, seq)
        overflows = self.index.stats.overflows
        wrong_size = self.index.stats.wrong_block_size
        if count:  # a message's first slice: its limit read once, then its sequence number
            state = self.fleet.get(replica)
            capacity = state.kv_capacity().replica_tokens if state is not None else None
            if capacity:  # no replica holds more blocks than its KV has room for
                self.index.set_limit(replica, max(MIN_BLOCK_LIMIT,
                                                  2 * capacity // self.index.block_size))
            self.index.apply(replica, seq, events)
        else:
            for ev in events:
                self.index.apply_event(replica, ev)
        if self.index.stats.overflows > overflows:
            log.warning("replica %s: its KV events name more blocks than it can hold (%d): "
                        "its index was cleared (removals lost, or not an engine's stream)",
                        replica, self.index.limit_of(replica))
        if self.index.stats.wrong_block_size > wrong_size:
            self._warn_block_size(replica, events,
                                  self.index.stats.wrong_block_size - wrong_size)

    def _warn_block_size(self, replica: str, events: tuple[KVEvent, ...], dropped: int
                         ) -> None:
        """Log, at most once per ``_BLOCK_SIZE_WARN_S`` for ``replica``, that ``dropped``
        of its stored events were dropped for their block size: its blocks are then never
        in the index, and nothing else tells why."""
        throttle = self._block_size_warned.get(replica)
        if throttle is None:
            throttle = self._block_size_warned[replica] = LogThrottle(_BLOCK_SIZE_WARN_S)
        held = throttle.due(dropped)
        if held is None:
            return
        ours = self.index.block_size
        theirs = next((ev.block_size for ev in events
                       if isinstance(ev, BlockStored) and ev.block_size != ours), None)
        if theirs is None:  # the size agrees, the token ids do not fill the blocks
            log.warning("replica %s: %d stored KV events dropped since this was last "
                        "logged: their token ids are not %d per block", replica,
                        held + dropped, ours)
            return
        log.warning("replica %s: its KV events store blocks of %d tokens, the gateway's "
                    "index blocks of %d: %d stored events dropped since this was last "
                    "logged, and none of its cache is ever matched; set %s to %d in the "
                    "gateway's config (or start the engine with --block-size %d)", replica,
                    theirs, ours, held + dropped, self.block_size_key, theirs, ours)

    async def _replay(self, replica: str, endpoint: str, start: int, until: int | None,
                      applied_hashes: dict[int, int] | None = None,
                      known: tuple[int, int] | None = None) -> int | None:
        """Apply the batches ``start <= seq < until`` (``until`` None: every one from
        ``start``) the replica's replay endpoint keeps; the last sequence number applied,
        or None. ``applied_hashes`` gets the hash of each payload applied (the latest
        ``_DUPLICATES_KEPT`` at least). A replay ends as failed after
        ``replay_max_batches`` batches, as after ``replay_timeout_s`` with none.
        ``known``: the number ``start - 1`` and the payload hash of the batch applied
        before ``start``, asked for too: ``_Replaced`` (nothing applied) when the endpoint
        keeps another under that number (no longer keeping it tells nothing)."""
        if known is not None and known[0] == start - 1:
            check: tuple[int, int] | None = known
            start -= 1
        else:
            check = None
        assert self._ctx is not None
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IPV6, 1)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        applied = moved = 0  # batches applied; and moving the replay on (skipped too)
        last: int | None = None
        loop = asyncio.get_running_loop()
        try:
            sock.connect(endpoint)
            # ``replay_timeout_s`` for each batch that moves the replay on, not for the
            # whole replay: a long one decoded and applied on a busy machine is progress,
            # not a failure; frames that move nothing on (repeats, out of range) are not
            async with asyncio.timeout(self.replay_timeout_s) as waiting:
                await sock.send_multipart([b"", start.to_bytes(8, "big")])
                while True:
                    frames = await sock.recv_multipart()
                    if len(frames) < 3 or frames[-2] == REPLAY_END:
                        break
                    seq = int.from_bytes(frames[-2], "big")
                    if check is not None and seq >= check[0]:
                        if seq == check[0] and hash(frames[-1]) != check[1]:
                            raise _Replaced(f"batch {seq}")
                        check = None
                        if seq == start:  # the batch applied already
                            last = seq
                            waiting.reschedule(loop.time() + self.replay_timeout_s)
                            continue
                    if start <= seq and (until is None or seq < until) \
                            and (last is None or seq > last) \
                            and self.fleet.get(replica) is not None:
                        if moved >= self.replay_max_batches:
                            raise _EndlessReplay(f"more than {moved} batches")
                        moved += 1
                        message = await self._decode_off_loop(
                            replica, [b"", frames[-2], frames[-1]])
                        if message is not None:  # a malformed batch is skipped, counted
                            await self._apply_sliced(replica, message)
                            self._last_applied[replica] = (seq, hash(frames[-1]))
                            applied += 1
                        last = seq
                        if applied_hashes is not None:
                            applied_hashes[seq] = hash(frames[-1])
                            if len(applied_hashes) > 2 * _DUPLICATES_KEPT:
                                # numbered upwards: the latest are those looked for
                                for old in list(applied_hashes)[:-_DUPLICATES_KEPT]:
                                    del applied_hashes[old]
                        waiting.reschedule(loop.time() + self.replay_timeout_s)
            self.replays += 1
            self._replay_backoff.pop(replica, None)
            log.info("replica %s: replayed %d KV event batches from %d", replica, applied,
                     start)
        except (TimeoutError, zmq.ZMQError, _EndlessReplay) as exc:
            self.replay_failures += 1
            wait = self._replay_backoff.get(replica, (0.0, _REPLAY_BACKOFF_S[0]))[1]
            self._replay_backoff[replica] = (time.monotonic() + wait,
                                             min(2 * wait, _REPLAY_BACKOFF_S[1]))
            log.warning("replica %s: KV event replay from %s failed after %d batches: %r; "
                        "no replay for %g s (gaps are counted meanwhile)", replica, endpoint,
                        applied, exc, wait)
        finally:
            sock.close()
        return last


class _Feed:
    """A SUB socket following one publish endpoint, and its monitor. libzmq connects to the
    publisher again after a network error, but not after a protocol error (a message over
    ``MAX_MESSAGE_BYTES``, a peer not speaking ZMTP): the socket is silent from then on.
    ``dropped`` tells of that: the monitor's last word was a disconnection, no retry after
    it, and nothing is left queued (the messages before the drop are read first)."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str) -> None:
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.IPV6, 1)  # a discovered replica may have an IPv6 address
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self.monitor = self.sock.get_monitor_socket(
            _LINK_EVENTS, f"inproc://kvgate-kv-events-monitor-{next(_monitors)}")
        self.monitor.setsockopt(zmq.LINGER, 0)
        self.poller = zmq.asyncio.Poller()
        self.poller.register(self.sock, zmq.POLLIN)
        self.poller.register(self.monitor, zmq.POLLIN)
        self.dropped = False
        self._disconnected = False  # the monitor's last event
        try:
            self.sock.connect(endpoint)
        except zmq.ZMQError:
            self.close()
            raise

    async def recv(self, timeout_ms: int) -> list[bytes] | None:
        """The next message, or None when none came within ``timeout_ms`` (or the monitor
        spoke first)."""
        with contextlib.suppress(zmq.Again):  # a busy stream: no poll for each message
            return await self.sock.recv_multipart(zmq.NOBLOCK)
        ready = dict(await self.poller.poll(timeout_ms))
        if self.monitor in ready:
            while True:
                try:
                    event = parse_monitor_message(
                        await self.monitor.recv_multipart(zmq.NOBLOCK))["event"]
                except zmq.Again:
                    break
                self._disconnected = event == zmq.EVENT_DISCONNECTED
        if self.sock in ready:
            return await self.sock.recv_multipart()
        # a retry follows a disconnection at once where libzmq reconnects: a whole quiet
        # poll after one without it, it does not
        self.dropped = not ready and self._disconnected
        return None

    def close(self) -> None:
        if self.sock.closed:
            return
        self.sock.disable_monitor()
        self.monitor.close()
        self.sock.close()


def _decoded(payload: bytes) -> KVEventBatch | KVWireError:
    """``decode_payload``, its error returned (from a thread, as a value)."""
    try:
        return decode_payload(payload)
    except KVWireError as exc:
        return exc


def _hashes(ev: KVEvent) -> int:
    """What ``ev`` weighs in a slice: its block hashes, and at least 1 (a message of a
    quarter of a million events naming no block held the loop 0.65 s, applied whole)."""
    return max(1, len(ev.block_hashes)) if isinstance(ev, BlockStored | BlockRemoved) else 1


def _slices(batch: KVEventBatch) -> list[tuple[KVEvent, ...]]:
    """``batch``'s events in slices of about ``_SLICE_HASHES`` block hashes, an event of
    more split in order (a stored run's later blocks chained to its earlier ones), so that
    applying them one after another is applying the batch."""
    out: list[tuple[KVEvent, ...]] = []
    current: list[KVEvent] = []
    size = 0
    for ev in batch.events:
        for piece in _split(ev):
            current.append(piece)
            size += _hashes(piece)
            if size >= _SLICE_HASHES:
                out.append(tuple(current))
                current, size = [], 0
    if current:
        out.append(tuple(current))
    return out


def _split(ev: KVEvent) -> list[KVEvent]:
    """``ev`` in pieces of at most ``_SLICE_HASHES`` blocks, every other field kept (a
    stored run's extra keys sliced with its blocks: block 0's cache salt stays on it)."""
    n = _SLICE_HASHES
    if isinstance(ev, BlockRemoved) and len(ev.block_hashes) > n:
        return [replace(ev, block_hashes=ev.block_hashes[i:i + n])
                for i in range(0, len(ev.block_hashes), n)]
    if isinstance(ev, BlockStored) and len(ev.block_hashes) > n \
            and len(ev.token_ids) == len(ev.block_hashes) * ev.block_size:
        b, hashes, extra = ev.block_size, ev.block_hashes, ev.extra_keys
        return [replace(ev, block_hashes=hashes[i:i + n],
                        parent_block_hash=ev.parent_block_hash if i == 0 else hashes[i - 1],
                        token_ids=ev.token_ids[i * b:(i + n) * b],
                        extra_keys=None if extra is None else extra[i:i + n])
                for i in range(0, len(hashes), n)]
    return [ev]
