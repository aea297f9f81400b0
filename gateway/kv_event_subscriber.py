"""Feeds the ``kv_events`` policy's index from the replicas' KV event streams.

One ZMQ SUB socket per replica whose config names a ``kv_events`` endpoint, each read by
its own task on the event loop (the index has one owner, so no locks). A reconcile loop
follows the fleet: it subscribes to replicas added at runtime, unsubscribes from removed
ones and restarts a reader that failed; it runs every ``reconcile_s`` and at once when the
fleet tells of a replica joining or leaving. All tasks are owned by ``KVEventSubscriber``,
started and stopped in the app's lifespan.

A message is ``[topic, seq (u64 big-endian), payload]`` (see ``kvwire.kv_event_format``); a
malformed one is logged and skipped. Messages sent before the socket connected are not
seen: blocks cached before that are unknown to the index until stored again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import zmq
import zmq.asyncio

from gateway.fleet import Fleet
from gateway.fleet_events import FleetEvent, ReplicaAdded
from kvwire.kv_event_format import KVWireError, decode_payload
from policies.base import Policy, ReplicaRemoved
from policies.kv_events import KVEvents
from policies.kv_index import KVIndex

log = logging.getLogger("kvgate.kv_events")


class KVEventSubscriber:
    def __init__(self, fleet: Fleet, index: KVIndex, reconcile_s: float = 1.0) -> None:
        self.fleet = fleet
        self.index = index
        self.reconcile_s = reconcile_s
        self.messages = 0
        self.malformed = 0
        self._ctx: zmq.asyncio.Context | None = None
        self._readers: dict[str, tuple[str, asyncio.Task[None]]] = {}  # id -> endpoint, task
        self._loop_task: asyncio.Task[None] | None = None
        self._membership_changed = asyncio.Event()

    def _on_fleet_event(self, event: FleetEvent) -> None:
        if isinstance(event, ReplicaAdded | ReplicaRemoved):
            self._membership_changed.set()

    @classmethod
    def for_policy(cls, fleet: Fleet, policy: Policy) -> KVEventSubscriber | None:
        """A subscriber feeding ``policy``'s index, or None when the policy keeps none."""
        endpoints = [s.id for s in fleet if s.config.kv_events]
        if not isinstance(policy, KVEvents):
            if endpoints:
                log.info("policy %s ignores the kv_events endpoints of %s", policy.name,
                         ", ".join(endpoints))
            return None
        if not endpoints:
            log.warning("policy kv_events: no replica has a kv_events endpoint yet; "
                        "routing by load only")
        return cls(fleet, policy.index)

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
                self.index.clear(rid)  # gone or moved: what it held is unknown now
        for rid, endpoint in wanted.items():
            if rid not in self._readers:
                assert endpoint is not None
                task = asyncio.create_task(self._read(rid, endpoint),
                                           name=f"kvgate-kv-events-{rid}")
                self._readers[rid] = (endpoint, task)

    async def _read(self, replica: str, endpoint: str) -> None:
        assert self._ctx is not None
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        try:
            sock.connect(endpoint)
            log.info("replica %s: following KV events at %s", replica, endpoint)
            while True:
                frames = await sock.recv_multipart()
                self.handle(replica, frames)
        finally:
            sock.close()

    def handle(self, replica: str, frames: list[bytes]) -> None:
        """Apply one received message to the index (skipped if malformed)."""
        if self.fleet.get(replica) is None:
            return  # removed while the message was in flight
        try:
            if len(frames) != 3 or len(frames[1]) != 8:
                raise KVWireError(f"expected [topic, 8-byte seq, payload], got "
                                  f"{len(frames)} frames")
            seq = int.from_bytes(frames[1], "big")
            batch = decode_payload(frames[2])
        except KVWireError as exc:
            self.malformed += 1
            log.warning("replica %s: skipping KV event message: %s", replica, exc)
            return
        self.messages += 1
        self.index.apply(replica, seq, batch.events)
