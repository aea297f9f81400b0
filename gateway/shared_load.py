"""Per-replica accounting shared by the gateway's worker processes (``serve --workers N``).

Routing depends on what the whole box has sent a replica and not yet seen answered:
pending prompt tokens, requests in flight, the oldest unanswered request. Each worker
keeps its own counts (``ReplicaState``) and copies them into its own cells of one shared
memory block; a policy's view sums every worker's cells. Layout, all little-endian::

    [0, 8)                         magic (u64)
    [8, 24)                        the box's id: 16 random bytes (``box_id``)
    cell(slot, worker) = HEADER + (slot * workers + worker) * CELL_BYTES
    cell: pending_tokens i64, in_flight i64, oldest_sent_at f64 (monotonic, 0 = none),
          oldest_tokens i64, progress_at f64 (monotonic: when the replica last gave this
          worker's requests a first byte or a whole answer; 0 = never)

A replica's slot is fixed when it joins the fleet (configured replicas in order, then each
added one the next free). The leader's ``Fleet`` hands a removed replica's slot to another
only after a quarantine and once every worker's cells for it read zero, so a late write
for a removed replica lands on a slot nobody else holds.

Consistency: every cell has exactly one writer (its worker), written with aligned 8-byte
stores, so no lock is needed and no update is lost. A reader may see one worker's cell one
update old, or one field of it updated before the next: the sums are exact once writes
stop, and never off by more than the requests moving at that moment.
``CLOCK_MONOTONIC`` is one clock for every process of a machine, so ages compare.

``TenantBoard``: each worker's admission counts per tenant, which worker 0 adds up for
``/admin/top``.

The supervisor's blocks are ``SharedBlock``: memory with no name (``memfd_create``) that
each worker maps from a descriptor it inherits, so nothing is left in ``/dev/shm`` however
the box ends. A named ``multiprocessing.shared_memory`` block serves as well (tests
open one again by name).
"""

from __future__ import annotations

import mmap
import os
import struct
from multiprocessing import reduction, shared_memory
from typing import Any, NamedTuple, TypeAlias, TypeVar

import orjson

from gateway.admission import BusiestTenants, TenantCount, busiest

MAGIC = 0x6B76676174656C64  # "kvgateld"
BOX_ID = slice(8, 24)  # 16 random bytes the supervisor writes: the box's name to peers
HEADER = 24
_CELL = struct.Struct("<qqdqd")
CELL_BYTES = _CELL.size


class SharedBlock:
    """Shared memory without a name (a Linux ``memfd``): pickled to a spawned worker (in
    its ``WorkerPlan``), it travels as a copy of its descriptor, which the worker maps. The
    memory is freed once the last process that maps it ends, however it ends: a named
    block (``/dev/shm/psm_*``) outlived a box killed whole (a container stopped; Kubernetes
    keeps a pod's ``/dev/shm`` over a container's restart), 16 MiB each time."""

    def __init__(self, fd: int, size: int, name: str) -> None:
        self._fd = fd  # kept: a worker started later is given a copy
        self.name = name
        self.size = size
        self._map = mmap.mmap(fd, size)
        self.buf: memoryview | None = memoryview(self._map)

    @classmethod
    def create(cls, name: str, size: int) -> SharedBlock:
        """A new zeroed block of ``size`` bytes; ``name`` shows in ``/proc/<pid>/maps``."""
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            return cls(fd, size, name)
        except BaseException:
            os.close(fd)
            raise

    def __reduce__(self) -> tuple[Any, ...]:
        # only while a process is spawned: the descriptor is passed to it with the pickle
        return _mapped, (reduction.DupFd(self._fd), self.size, self.name)

    def close(self) -> None:
        """Unmap it here (closing twice is harmless); other processes keep their maps."""
        if self.buf is None:
            return
        self.buf.release()
        self.buf = None
        self._map.close()
        os.close(self._fd)


def _mapped(fd: Any, size: int, name: str) -> SharedBlock:
    """A ``SharedBlock`` in the process it was passed to."""
    return SharedBlock(fd.detach(), size, name)


Block: TypeAlias = "shared_memory.SharedMemory | SharedBlock"
B = TypeVar("B", shared_memory.SharedMemory, SharedBlock)


def _view(block: Block) -> memoryview:
    buf = block.buf
    if buf is None:
        raise ValueError(f"shared memory {block.name!r} is closed")
    return buf


class LoadTotals(NamedTuple):
    pending_tokens: int
    in_flight: int
    oldest_sent_at: float  # 0.0 when nothing is pending
    oldest_tokens: int


class SharedLoad:
    """One worker's handle on the block: writes its own cells, reads everyone's."""

    def __init__(self, block: Block, workers: int, worker: int,
                 slots: int) -> None:
        if not 0 <= worker < workers:
            raise ValueError(f"worker must be in [0, {workers}), got {worker!r}")
        if block.size < self.size(workers, slots):
            raise ValueError(f"shared load block {block.name!r} holds {block.size} bytes, "
                             f"needs {self.size(workers, slots)}")
        if struct.unpack_from("<Q", _view(block), 0)[0] != MAGIC:
            raise ValueError(f"shared memory {block.name!r} is not a kvgate load block")
        self._block = block
        self._buf = _view(block)
        self.workers = workers
        self.worker = worker
        self.slots = slots
        self.clear_own()

    @property
    def box_id(self) -> bytes:
        """16 random bytes naming the box, written in its block (which every worker of it
        opens) by the supervisor. (A hash of the block's name had its 32 random bits: two
        boxes whose blocks were named alike took each other for themselves.)"""
        return bytes(self._buf[BOX_ID])

    @staticmethod
    def size(workers: int, slots: int) -> int:
        return HEADER + slots * workers * CELL_BYTES

    @staticmethod
    def prepare(block: B) -> B:
        """``block`` zeroed, marked as a load block, with a new box id."""
        buf = _view(block)
        buf[: block.size] = bytes(block.size)
        struct.pack_into("<Q", buf, 0, MAGIC)
        buf[BOX_ID] = os.urandom(BOX_ID.stop - BOX_ID.start)
        return block

    def _offset(self, slot: int, worker: int) -> int:
        # [HEADER, ...): slot-major, one cell per worker within a slot
        return HEADER + (slot * self.workers + worker) * CELL_BYTES

    def clear_own(self) -> None:
        """Zero this worker's cells (a restarted worker owns nothing in flight)."""
        for slot in range(self.slots):
            _CELL.pack_into(self._buf, self._offset(slot, self.worker), 0, 0, 0.0, 0, 0.0)

    def write(self, slot: int, pending_tokens: int, in_flight: int, oldest_sent_at: float,
              oldest_tokens: int, progress_at: float) -> None:
        """This worker's counts for the replica in ``slot``."""
        _CELL.pack_into(self._buf, self._offset(slot, self.worker), pending_tokens,
                        in_flight, oldest_sent_at, oldest_tokens, progress_at)

    def totals(self, slot: int) -> LoadTotals:
        """Every worker's counts for ``slot`` summed; the oldest request of them all."""
        pending = in_flight = oldest_tokens = 0
        oldest = 0.0
        for worker in range(self.workers):
            p, f, at, t, _ = _CELL.unpack_from(self._buf, self._offset(slot, worker))
            pending += p
            in_flight += f
            if at and (not oldest or at < oldest):
                oldest, oldest_tokens = at, t
        return LoadTotals(pending, in_flight, oldest, oldest_tokens)

    def progress_at(self, slot: int) -> float:
        """The latest progress any worker saw the replica in ``slot`` make."""
        return max(_CELL.unpack_from(self._buf, self._offset(slot, worker))[4]
                   for worker in range(self.workers))

    def close(self) -> None:
        self._buf.release()
        self._block.close()


class TenantBoard:
    """Each worker's requests in flight and waiting per tenant (``Admission``'s), for the
    admin API's ``/admin/top``, which worker 0 alone serves. Worker ``i`` owns the region
    ``[i * REGION_BYTES, (i + 1) * REGION_BYTES)`` and writes it at each heartbeat of its
    event loop (``publish``, where its counts changed); worker 0 reads the others' (``read``).
    A region::

        [0, 8)    sequence (u64): odd while the region is being written
        [8, 16)   payload bytes (u64)
        [16, ..)  payload: JSON {"t": [[tenant, in_flight, waiting], ...], "more":
                  [tenants, in_flight, waiting]}: the busiest tenants first, as many as
                  fit (thousands), the rest summed in "more"

    One writer per region; a reader copies the payload and keeps it only if the sequence,
    even, did not change meanwhile (a seqlock), so it never decodes a torn write."""

    REGION_BYTES = 64 << 10
    _HEAD = struct.Struct("<QQ")
    _READ_TRIES = 1000

    def __init__(self, block: Block, workers: int, worker: int) -> None:
        if not 0 <= worker < workers:
            raise ValueError(f"worker must be in [0, {workers}), got {worker!r}")
        if block.size < self.size(workers):
            raise ValueError(f"tenant board block {block.name!r} holds {block.size} bytes, "
                             f"needs {self.size(workers)}")
        self._block = block
        self._buf = _view(block)
        self.workers = workers
        self.worker = worker
        self._sequence = self._HEAD.unpack_from(self._buf, self._offset(worker))[0] & ~1
        self._published = b""

    @classmethod
    def size(cls, workers: int) -> int:
        return workers * cls.REGION_BYTES

    def _offset(self, worker: int) -> int:
        return worker * self.REGION_BYTES

    def publish(self, counts: list[TenantCount]) -> None:
        """This worker's ``counts`` (``Admission.tenant_counts``), the busiest first, as many
        as fit in its region; unchanged since the last call, nothing is written."""
        ranked = busiest(counts, len(counts)).shown
        room = self.REGION_BYTES - self._HEAD.size - 128  # (128: the frame and "more")
        entries: list[list[Any]] = []
        for count in ranked:
            room -= len(orjson.dumps(count.tenant)) + 48  # two u64 in decimal, brackets
            if room < 0:
                break
            entries.append(list(count))
        rest = ranked[len(entries):]
        payload = orjson.dumps({"t": entries, "more": [
            len(rest), sum(c.in_flight for c in rest), sum(c.waiting for c in rest)]})
        if payload == self._published:
            return
        offset, buf = self._offset(self.worker), self._buf
        self._sequence += 1  # odd: being written
        self._HEAD.pack_into(buf, offset, self._sequence, 0)
        start = offset + self._HEAD.size
        buf[start:start + len(payload)] = payload
        self._sequence += 1
        self._HEAD.pack_into(buf, offset, self._sequence, len(payload))
        self._published = payload

    def read(self, worker: int) -> BusiestTenants | None:
        """What ``worker`` last published (nothing before its first heartbeat), or None if
        each of many tries found it being written (the worker stopped mid-write)."""
        offset, buf = self._offset(worker), self._buf
        start = offset + self._HEAD.size
        for _ in range(self._READ_TRIES):
            sequence, length = self._HEAD.unpack_from(buf, offset)
            if sequence & 1:
                continue
            payload = bytes(buf[start:start + min(length, self.REGION_BYTES - self._HEAD.size)])
            if self._HEAD.unpack_from(buf, offset)[0] != sequence:
                continue
            if not payload:
                return BusiestTenants([], 0, 0, 0)
            board = orjson.loads(payload)
            return BusiestTenants([TenantCount(*entry) for entry in board["t"]],
                                  *board["more"])
        return None

    def close(self) -> None:
        self._buf.release()
        self._block.close()
