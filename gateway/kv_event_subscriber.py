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
counted). A message over ``MAX_MESSAGE_BYTES`` is refused by the socket (ZMQ drops that
connection; the gap it leaves is replayed). When the replica's config names a
``kv_events_replay`` endpoint, what the stream missed is asked for there:

* on (re)subscribing, at once: everything the engine still keeps from sequence 0 (blocks
  it cached before this gateway listened, or while the replica was out of the fleet);
* when the replica restarted: its sequence numbers went back (the numbers its new process
  sent before the one received are replayed), or the index was ``reset`` (its prefix-cache
  counters went back at a scrape: everything from sequence 0 again, at once);
* before a message whose sequence number jumps (messages dropped on the way).

A live message that a catch-up replay applied already (queued on the SUB socket meanwhile:
the same number and the same bytes) is skipped; any other numbered at or below it is a
restart. Without a replay endpoint, or when the replay fails, the index counts the gap and
blocks cached in it stay unknown until stored again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import zmq
import zmq.asyncio

from gateway.fleet import Fleet
from gateway.fleet_events import FleetEvent, ReplicaAdded
from kvwire.kv_event_format import REPLAY_END, KVEventBatch, KVWireError, decode_payload
from policies.base import Policy, ReplicaRemoved
from policies.kv_events import KVEvents
from policies.kv_index import KVIndex

log = logging.getLogger("kvgate.kv_events")

MAX_MESSAGE_BYTES = 16 << 20  # one engine step's events: far below this
_DUPLICATES_KEPT = 1024  # replayed batches a live duplicate is recognised among
_POLL_MS = 250  # how soon a reader notices that its replica's index was reset


class KVEventSubscriber:
    def __init__(self, fleet: Fleet, index: KVIndex, reconcile_s: float = 1.0) -> None:
        self.fleet = fleet
        self.index = index
        self.reconcile_s = reconcile_s
        self.messages = 0
        self.malformed = 0  # messages skipped, and events skipped inside a batch
        self.gaps = 0  # sequence jumps and late starts seen (replayed or not)
        self.replays = 0  # gaps filled from a replay endpoint
        self.replay_failures = 0
        self.replay_timeout_s = 2.0
        self._ctx: zmq.asyncio.Context | None = None
        self._readers: dict[str, tuple[str, asyncio.Task[None]]] = {}  # id -> endpoint, task
        self._loop_task: asyncio.Task[None] | None = None
        self._membership_changed = asyncio.Event()
        # replica -> the last batches a catch-up replay applied (sequence number -> hash of
        # the payload) and the highest number, until a live message numbered past it
        self._replayed: dict[str, tuple[int, dict[int, int]]] = {}

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
        return cls(fleet, index)

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
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad round must not stop the following ones
                log.exception("KV event reconcile failed")

    async def reconcile(self) -> None:
        """Match the readers to the fleet's replicas and their endpoints."""
        wanted = {s.id: s.config.kv_events for s in self.fleet if s.config.kv_events}
        replay = {s.id: s.config.kv_events_replay for s in self.fleet}
        for rid, (endpoint, task) in list(self._readers.items()):
            failed = task.done() and not task.cancelled() and task.exception() is not None
            if wanted.get(rid) == endpoint and not failed:
                continue
            if failed:
                log.error("replica %s: KV event reader failed: %r", rid, task.exception())
            elif not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            del self._readers[rid]
            if wanted.get(rid) != endpoint:
                # gone, moved or no longer publishing: what it held is unknown now, and
                # another endpoint's messages are numbered from its own start (a policy
                # reads the replica's cache otherwise until they arrive)
                self.index.remove_replica(rid)
        for rid, endpoint in wanted.items():
            if rid not in self._readers:
                assert endpoint is not None
                task = asyncio.create_task(self._read(rid, endpoint, replay.get(rid)),
                                           name=f"kvgate-kv-events-{rid}")
                self._readers[rid] = (endpoint, task)

    async def _read(self, replica: str, endpoint: str, replay: str | None = None) -> None:
        assert self._ctx is not None
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IPV6, 1)  # a discovered replica may have an IPv6 address
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self._replayed.pop(replica, None)
        caught_up = -1  # the index's reset count for this replica when last replayed from 0
        try:
            sock.connect(endpoint)
            log.info("replica %s: following KV events at %s", replica, endpoint)
            while True:
                resets = self.index.resets[replica]
                if replay is not None and caught_up != resets:
                    caught_up = resets
                    if self.index.last_seq(replica) is None:
                        await self.catch_up(replica, replay)
                if await sock.poll(_POLL_MS) == 0:
                    continue
                frames = await sock.recv_multipart()
                await self.receive(replica, frames, replay)
        finally:
            self._replayed.pop(replica, None)
            sock.close()

    async def catch_up(self, replica: str, replay: str) -> None:
        """Apply every batch the replica's replay endpoint keeps, from sequence 0 (its
        index knows no sequence number: newly followed, or reset)."""
        applied: dict[int, int] = {}
        last = await self._replay(replica, replay, 0, None, applied)
        if last is not None:
            self._replayed[replica] = (last, {seq: digest for seq, digest in applied.items()
                                              if seq > last - _DUPLICATES_KEPT})

    async def receive(self, replica: str, frames: list[bytes], replay: str | None) -> None:
        """``handle``, first filling from ``replay`` what the stream missed before it."""
        message = self._decode(replica, frames)
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
            self.index.reset(replica)
            last = None
        start = 0 if last is None else last + 1
        if seq > start:
            self.gaps += 1
            if replay is not None:
                await self._replay(replica, replay, start, seq)
        self._apply(replica, *message)

    def handle(self, replica: str, frames: list[bytes]) -> None:
        """Apply one received message to the index (skipped if malformed)."""
        message = self._decode(replica, frames)
        if message is not None:
            self._apply(replica, *message)

    def _decode(self, replica: str, frames: list[bytes]) -> tuple[int, KVEventBatch] | None:
        if self.fleet.get(replica) is None:
            return None  # removed while the message was in flight
        try:
            if len(frames) != 3 or len(frames[1]) != 8:
                raise KVWireError(f"expected [topic, 8-byte seq, payload], got "
                                  f"{len(frames)} frames")
            return int.from_bytes(frames[1], "big"), decode_payload(frames[2])
        except KVWireError as exc:
            self.malformed += 1
            log.warning("replica %s: skipping KV event message: %s", replica, exc)
            return None

    def _apply(self, replica: str, seq: int, batch: KVEventBatch) -> None:
        self.messages += 1
        if batch.malformed:
            self.malformed += batch.malformed
            log.warning("replica %s: skipped %d malformed KV events of message %d", replica,
                        batch.malformed, seq)
        self.index.apply(replica, seq, batch.events)

    async def _replay(self, replica: str, endpoint: str, start: int, until: int | None,
                      applied_hashes: dict[int, int] | None = None) -> int | None:
        """Apply the batches ``start <= seq < until`` (``until`` None: every one from
        ``start``) the replica's replay endpoint keeps; the last sequence number applied,
        or None. ``applied_hashes`` gets the hash of each payload applied."""
        assert self._ctx is not None
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IPV6, 1)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        applied = 0
        last: int | None = None
        try:
            sock.connect(endpoint)
            async with asyncio.timeout(self.replay_timeout_s):
                await sock.send_multipart([b"", start.to_bytes(8, "big")])
                while True:
                    frames = await sock.recv_multipart()
                    if len(frames) < 3 or frames[-2] == REPLAY_END:
                        break
                    seq = int.from_bytes(frames[-2], "big")
                    if start <= seq and (until is None or seq < until) \
                            and (last is None or seq > last) \
                            and self.fleet.get(replica) is not None:
                        self._apply(replica, seq, decode_payload(frames[-1]))
                        applied, last = applied + 1, seq
                        if applied_hashes is not None:
                            applied_hashes[seq] = hash(frames[-1])
            self.replays += 1
            log.info("replica %s: replayed %d KV event batches from %d", replica, applied,
                     start)
        except (TimeoutError, zmq.ZMQError, KVWireError) as exc:
            self.replay_failures += 1
            log.warning("replica %s: KV event replay from %s failed after %d batches: %r",
                        replica, endpoint, applied, exc)
        finally:
            sock.close()
        return last
