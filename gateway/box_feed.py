"""What the leading worker tells the others: fleet membership and what its health checks
and scrapes found (``serve --workers N``).

Only worker 0 (the leader) checks and scrapes the replicas and serves the admin API; the
box is checked once, not once per worker, and an admin change has one writer. The
leader's fleet is published as one JSON snapshot in a shared memory block ``PUBLISH_S``
after it changed (``Fleet.on_change``: one scrape round's changes go out together), and
each other worker (a follower) is rung a doorbell: a pipe the supervisor made for it,
whose bytes carry no message. A follower reads the block when rung and applies what is
new through the same ``Fleet`` methods the leader's monitor used:

- replicas added or removed, by the admin API or discovery (which only the leader runs),
  with their slot in ``shared_load``;
- a health check result, when the replica's check count moved (the follower's own
  thresholds then eject or readmit, as the leader's did);
- a scrape, when its sequence moved, with any KV capacity the leader's state holds as
  estimated (``gateway.kv_capacity_estimate``, which is off while the load is shared);
- a prefix cache flush (``/flush_cache``), when the replica's count of them moved: the
  follower's policy forgets what it modelled there, as the leader's did;
- the models a replica serves, when the leader listed them after this follower last did:
  a follower lists them itself when a request names a model none serves (an adapter
  loaded at run time), as a single gateway does (``intake.check_model``), and keeps what
  it found until the leader's listing is newer.

Block layout: ``seq u64 | length u64 | crc32 u64 | JSON``. The leader writes ``seq`` odd,
then the rest, then ``seq`` even (a seqlock); a reader copies the block and accepts it
only when ``seq`` is the same even number before and after and the CRC matches, so a torn
read is never applied (the write that tore it rings again when it ends). A follower lags
the leader by about ``PUBLISH_S``. Both also look every ``FALLBACK_S`` (a change no hook
saw, a ring lost): an idle box wakes about once a second per worker, not twenty times (an
idle pair of workers polling every 50 ms spent 0.013 cores against a single gateway's
0.003). Without a doorbell (a follower built alone, as in tests) a follower polls every
``PUBLISH_S``. What a worker learns from its own traffic (the policy's state; an ejection
for its requests' failures, for as long as it lasts) stays its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import struct
import time
import zlib
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

import orjson

from gateway.config import ReplicaConfig
from gateway.discovery.stats import SourceStats
from gateway.fleet import Fleet, ModelInfo
from gateway.periodic import stop_tasks
from gateway.replica_metrics import ScrapedMetrics
from gateway.shared_load import B, Block, _view
from policies.config import from_mapping

log = logging.getLogger("kvgate.box_feed")

PUBLISH_S = 0.05
FALLBACK_S = 1.0
BLOCK_BYTES = 16 << 20  # shared memory is paged in as written: a snapshot copies its length
_HEAD = struct.Struct("<QQQ")


def snapshot(fleet: Fleet, discovery: Sequence[SourceStats] = ()) -> dict[str, Any]:
    """The leader's fleet as followers need it (API keys travel by reference: files and
    variables are read again by each worker; an inline key is as the config wrote it), and
    what its discovery sources (which only it runs) counted, which every worker exports."""
    return {"replicas": [{
        "config": dataclasses.asdict(s.config), "slot": s.slot,
        "forward_auth": s.forward_auth, "source": s.source, "checks": s.checks,
        "check": list(s.last_check), "healthy": s.healthy,
        "awaiting_check": s.awaiting_check, "scrape_seq": s.scrape_seq,
        "pending_at_scrape": s.pending_at_scrape,
        "in_flight_at_scrape": s.in_flight_at_scrape,
        "scraped": dataclasses.asdict(s.scraped) if s.scraped is not None else None,
        "estimated_kv_replica_tokens": s.estimated_kv_replica_tokens, "flushes": s.flushes,
        "auth_failures": s.auth_failures,
        "models": list(s.models), "models_cut": s.models_cut, "models_at": s.models_at,
        # what the listing said beyond the ids, where it said anything
        "model_info": {m: list(i) for m, i in s.model_info.items() if any(i)}}
        for s in fleet],
        "discovery": [dataclasses.asdict(stats) for stats in discovery]}


class FeedBlock:
    """The shared memory block and its seqlock (see the module)."""

    def __init__(self, block: Block) -> None:
        self.block = block
        self._buf = _view(block)
        self._seq = 0

    @staticmethod
    def prepare(block: B) -> B:
        """``block`` (``BLOCK_BYTES`` at least) holding no snapshot yet."""
        if block.size < BLOCK_BYTES:
            raise ValueError(f"feed block {block.name!r} holds {block.size} bytes, "
                             f"needs {BLOCK_BYTES}")
        _HEAD.pack_into(_view(block), 0, 0, 0, 0)
        return block

    def write(self, data: bytes) -> None:
        if _HEAD.size + len(data) > len(self._buf):
            raise ValueError(f"fleet snapshot of {len(data)} bytes exceeds the "
                             f"{BLOCK_BYTES}-byte feed block")
        self._seq += 1
        struct.pack_into("<Q", self._buf, 0, 2 * self._seq - 1)
        self._buf[_HEAD.size:_HEAD.size + len(data)] = data
        struct.pack_into("<QQ", self._buf, 8, len(data), zlib.crc32(data))
        struct.pack_into("<Q", self._buf, 0, 2 * self._seq)

    def read(self, after: int) -> tuple[int, bytes] | None:
        """(seq, data) when a whole snapshot newer than ``after`` is there, else None."""
        seq, length, crc = _HEAD.unpack_from(self._buf, 0)
        if seq == after or seq % 2 or length > len(self._buf) - _HEAD.size:
            return None
        data = bytes(self._buf[_HEAD.size:_HEAD.size + length])
        if struct.unpack_from("<Q", self._buf, 0)[0] != seq or zlib.crc32(data) != crc:
            return None  # written meanwhile: next poll
        return seq, data

    def close(self) -> None:
        self._buf.release()
        self.block.close()


class _Applied:
    __slots__ = ("checks", "flushes", "scrape_seq")

    def __init__(self) -> None:
        self.checks = 0
        self.scrape_seq = 0
        self.flushes = 0


class BoxFeed:
    """The leader's publisher or a follower's reader, a task owned by the app's lifespan
    (``start``/``stop``). ``rings``: the leader's ends of the followers' doorbells;
    ``bell``: a follower's own. Both are ``multiprocessing`` pipes (they travel to spawned
    workers) used as bare file descriptors."""

    def __init__(self, block: FeedBlock, fleet: Fleet, leader: bool,
                 failures_to_eject: int, successes_to_readmit: int,
                 rings: Sequence[Connection] = (), bell: Connection | None = None) -> None:
        self.block = block
        self.fleet = fleet
        self.leader = leader
        self.failures_to_eject = failures_to_eject
        self.successes_to_readmit = successes_to_readmit
        self.seq = 0
        self.rings = tuple(rings)
        self.bell = bell
        for conn in (*self.rings, *(() if bell is None else (bell,))):
            os.set_blocking(conn.fileno(), False)
        self._signature: tuple[object, ...] | None = None
        # the discovery sources' counts: the leader's, published; a follower's, copied in
        self.discovery: Sequence[SourceStats] = ()
        self._applied: dict[str, _Applied] = {}
        self._unbuilt: dict[str, int] = {}  # replicas this follower failed to add: slot
        self._task: asyncio.Task[None] | None = None
        self._soon: asyncio.TimerHandle | None = None
        self._listening = False
        self._event_loop: asyncio.AbstractEventLoop | None = None

    async def start(self, first_within_s: float = 30.0) -> None:
        """Publish now and on every change (leader), or wait for the first snapshot
        (follower, at most ``first_within_s``) and then for rings; then the fallback
        loop."""
        self._event_loop = asyncio.get_running_loop()
        if self.leader:
            self.publish()
            self.fleet.on_change(self._changed)
        else:
            deadline = time.monotonic() + first_within_s
            # another process writes the block: nothing here to wait on but the clock
            while not self.poll() and time.monotonic() < deadline:
                if self._leader_gone():
                    raise RuntimeError("worker 0 exited before it published the fleet")
                await asyncio.sleep(PUBLISH_S)
            if not self.seq:
                log.warning("no fleet snapshot from worker 0 within %s s", first_within_s)
            if self.bell is not None:
                self._event_loop.add_reader(self.bell.fileno(), self._rung)
                self._listening = True
        self._task = asyncio.create_task(self._loop(), name="kvgate-box-feed")

    async def stop(self) -> None:
        if self.leader:
            self.fleet.on_change(None)
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None
        self._stop_listening()
        await stop_tasks([self._task])
        self._task = None

    def _stop_listening(self) -> None:
        if self._listening and self.bell is not None and self._event_loop is not None:
            self._event_loop.remove_reader(self.bell.fileno())
            self._listening = False

    async def _loop(self) -> None:
        every = FALLBACK_S if self.leader or self.bell is not None else PUBLISH_S
        while True:
            await asyncio.sleep(every)
            self._round()

    def _round(self) -> None:
        try:
            if self.leader:
                self.publish()
            else:
                self.poll()
        except Exception:  # one bad round must not end the loop
            log.exception("fleet snapshot %s failed", "publish" if self.leader else "read")

    def _changed(self) -> None:
        """The leader's fleet moved: publish ``PUBLISH_S`` after the first change."""
        if self._soon is None and self._event_loop is not None:
            self._soon = self._event_loop.call_later(PUBLISH_S, self._publish_soon)

    def _publish_soon(self) -> None:
        self._soon = None
        self._round()

    def _leader_gone(self) -> bool:
        """Whether the doorbell's writer (worker 0) is gone: its end closed (rings that
        came meanwhile are emptied). False without a doorbell."""
        if self.bell is None:
            return False
        try:
            while True:
                if not os.read(self.bell.fileno(), 4096):
                    return True
        except BlockingIOError:
            return False

    def _rung(self) -> None:
        """A follower's doorbell: empty it, then read the block."""
        assert self.bell is not None
        try:
            while True:
                if not os.read(self.bell.fileno(), 4096):
                    self._stop_listening()  # the leader is gone: the fallback loop reads on
                    break
        except BlockingIOError:
            pass
        except OSError as exc:  # a broken doorbell: the fallback loop reads on
            log.warning("doorbell unreadable, reading every %s s instead: %s", FALLBACK_S, exc)
            self._stop_listening()
        finally:
            self._round()

    def _ring(self) -> None:
        for conn in self.rings:
            try:
                os.write(conn.fileno(), b"\x01")
            except BlockingIOError:
                pass  # the pipe is full: that follower has rings to read already
            except BrokenPipeError:
                pass  # a follower gone: the supervisor stops the box
            except OSError as exc:
                log.warning("doorbell: %s", exc)

    def publish(self) -> None:
        """Write the fleet's snapshot when anything in it moved (a cheap signature is
        compared first: building the JSON costs ~20 us a replica)."""
        signature = (tuple((s.id, s.slot, s.checks, s.scrape_seq, s.models, s.models_cut,
                            s.models_at, s.auth_failures, s.flushes) for s in self.fleet),
                     tuple(dataclasses.astuple(stats) for stats in self.discovery))
        if signature == self._signature:
            return
        self._signature = signature
        self.block.write(orjson.dumps(snapshot(self.fleet, self.discovery)))
        self._ring()

    def poll(self) -> bool:
        """Apply a newer snapshot, if any; True when one was applied."""
        got = self.block.read(self.seq)
        if got is None:
            return False
        self.seq, data = got
        self.apply(orjson.loads(data))
        return True

    def apply(self, snap: dict[str, Any]) -> None:
        fleet = self.fleet
        for stats, counted in zip(self.discovery, snap.get("discovery", ()), strict=False):
            for name, value in counted.items():
                setattr(stats, name, value)
        wanted = {r["config"]["id"]: r for r in snap["replicas"]}
        for rid in [rid for rid in self._unbuilt if rid not in wanted]:
            del self._unbuilt[rid]
        for state in fleet:
            # gone, or removed and added again between two snapshots (a new slot)
            if state.id not in wanted or state.slot != wanted[state.id]["slot"]:
                fleet.remove(state.id)
                self._applied.pop(state.id, None)
        for rid, r in wanted.items():
            found = fleet.get(rid)
            if found is None:
                try:
                    found = fleet.add(
                        from_mapping(ReplicaConfig, r["config"], "replica"),
                        forward_auth=r["forward_auth"], source=r["source"], slot=r["slot"],
                        checked_first=r["awaiting_check"])
                except ValueError as exc:  # (its key file unreadable in this process)
                    # the others are still applied, in this snapshot and every later one;
                    # this one is said once per slot and tried again at each snapshot
                    if self._unbuilt.get(rid) != r["slot"]:
                        self._unbuilt[rid] = r["slot"]
                        log.error("replica %r from worker 0 cannot be added in this "
                                  "worker, which routes nothing to it: %s", rid, exc)
                    continue
                self._unbuilt.pop(rid, None)
            state = found
            seen = self._applied.setdefault(rid, _Applied())
            if r["checks"] != seen.checks:
                seen.checks = r["checks"]
                ok, error = r["check"]
                fleet.record_health(rid, ok, error, self.failures_to_eject,
                                    self.successes_to_readmit)
            # the leader's word, whatever checks this follower missed or counted apart
            fleet.follow_health(rid, r["healthy"], r["awaiting_check"])
            if r["scrape_seq"] != seen.scrape_seq and r["scraped"] is not None:
                seen.scrape_seq = r["scrape_seq"]
                # the box's pending when the leader took it, not now: what the gauge holds
                # beyond it is other senders' (``Fleet``)
                fleet.record_scrape(rid, ScrapedMetrics(**r["scraped"]),
                                    pending_then=r["pending_at_scrape"],
                                    in_flight_then=r["in_flight_at_scrape"])
                state.estimated_kv_replica_tokens = r["estimated_kv_replica_tokens"]
            if r["flushes"] != seen.flushes:  # flushed through the leader's admin API
                seen.flushes = r["flushes"]
                fleet.flushed(rid, r["flushes"])
            state.auth_failures = r.get("auth_failures", 0)
            # the newer listing wins: the leader's, or the one this follower asked for on
            # a miss (``Monitor.refresh_all_models``) since; one clock for the box's
            # processes (``time.monotonic``: the system's CLOCK_MONOTONIC)
            if r["models_at"] > state.models_at:
                said = r.get("model_info", {})
                state.model_info = {m: ModelInfo(*said[m]) if m in said else ModelInfo()
                                    for m in r["models"]}
                state.models_cut = r.get("models_cut", False)
                state.models_at = r["models_at"]
