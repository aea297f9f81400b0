"""``kvgate serve --workers N``: N gateway processes on one port, under a supervisor.

The supervisor (the process started) creates the shared memory blocks (``shared_load``:
per-replica accounting; ``box_feed``: the leader's fleet snapshot), a doorbell pipe per
follower (rung when a snapshot is new) and a directory for prometheus-client's
multiprocess mode, then starts the workers (``spawn``). The blocks have no name (each
worker inherits a descriptor), so nothing of them outlives the box's processes, however
they end. The directory is locked (``flock``) while the supervisor or a worker lives, and
removed when the supervisor stops, or else (it was killed) at the next start on the
machine. Each worker
binds the port itself with ``SO_REUSEPORT``, so the kernel spreads connections over them
without a shared accept queue.

- Worker 0 leads: it alone checks and scrapes the replicas and serves the admin API; the
  others apply what it publishes (``box_feed``).
- ``/metrics`` on any worker sums every worker's counters and histograms (multiprocess
  mode; a removed replica's series leave each worker's files, ``MetricFiles``); the
  per-replica gauges come from the shared accounting, the box's view.
- Limits (``max_in_flight``, ``max_pending``, ``max_connections``) are the box's: each
  worker takes its share, rounded up. Each writes its own capture log (``path.w<i>``),
  within its share of ``capture.max_mb`` and ``capture.queue_mb``;
  ``/admin/prefix-report`` shows worker 0's requests.
- Discovery runs in worker 0 only; the others take membership from its snapshot.
- Each worker tells the others every route it makes (``worker_routes``: a Unix socket
  pair per worker, made here), so every worker's policy learns from the box's traffic;
  ``--no-worker-routes`` keeps each to its own (less CPU, fewer hits).
- A SIGTERM or SIGINT to the supervisor reaches every worker, which drains as a single
  gateway does (``ShutdownConfig``); a second stops them at once. Workers sit in their
  own process group (a terminal's Ctrl-C reaches them once, through the supervisor) and
  die with it. If a worker exits on its own the supervisor drains the rest and exits 1
  (an operator's signal meanwhile joins that drain; a second one stops at once).
  A signal while the workers are being started starts no more (those started drain).
  A worker still running ``KILL_AFTER_S`` past the drain's ``timeout_s`` is killed (and
  the supervisor exits 1): a stuck one no longer held the supervisor, or outlived it on
  the port.
- Each worker's event loop beats (``Heartbeats``: a count in shared memory, every
  ``BEAT_S``), and at each beat a follower copies its requests in flight and waiting per
  tenant to shared memory (``TenantBoard``), which worker 0 adds up for ``/admin/top``;
  a worker whose count stands still for ``silent_s`` (``SILENT_ENV``, default
  ``SILENT_S``) while the box serves is stuck: its loop answers nothing, yet the kernel
  still hands it its share of new connections on the port. The supervisor kills it and
  goes on as when a worker exits on its own (the rest drain; exit 1).
"""

from __future__ import annotations

import ctypes
import dataclasses
import fcntl
import logging
import math
import multiprocessing
import os
import shutil
import signal
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing import connection, reduction
from types import FrameType
from typing import Any

from gateway.box_feed import BLOCK_BYTES, FeedBlock
from gateway.config import GatewayConfig
from gateway.fleet import MAX_REPLICAS
from gateway.listen_sockets import listen_socket, passive_addresses
from gateway.periodic import HEARTBEAT_S
from gateway.shared_load import SharedBlock, SharedLoad, TenantBoard
from gateway.worker_routes import WorkerRoutes, route_pair

log = logging.getLogger("kvgate.workers")

# slots in the workers' shared accounting beyond the fleet's limit: those of replicas that
# left within the quarantine (``fleet.SLOT_QUARANTINE_S``), not yet given to others
SPARE_SLOTS = 1024
# seconds past the drain's ``timeout_s`` (within which a worker exits on its own) before
# a worker still running is killed
KILL_AFTER_S = 5.0
# the signal the kernel sends a worker when a thread of its supervisor ends (``die_with_parent``)
PARENT_DEATH = signal.SIGUSR2
# the signals the supervisor forwards to the workers
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# the multiprocess metrics directories: tempfile.gettempdir()/<prefix><random><suffix>
METRICS_PREFIX = "kvgate-metrics-"
METRICS_SUFFIX = ".flock"
# seconds between two heartbeats of a worker's event loop
BEAT_S = HEARTBEAT_S  # (set in gateway.periodic, where the app beats it)
# seconds a worker's heartbeat may stand still before the supervisor takes the worker for
# stuck (and kills it): 20 beats. Nothing a sound worker does holds its loop near that: a
# full collection of its heap (what start-up built is frozen out of the collector's sight)
# and a routing decision take milliseconds, and whatever is slow (tokenizing, the capture
# log's writes) runs off the loop. A stuck worker leaves its share of new connections
# unanswered for this long at most (plus the supervisor's second between two looks).
SILENT_S = 10.0
# the variable that sets that bound, in seconds (at least ``2 * BEAT_S``)
SILENT_ENV = "KVGATE_WORKER_SILENT_S"
# a supervisor that looked at the heartbeats nothing for this long (the whole box paused,
# as by ``docker pause``, or the supervisor starved of CPU) saw no silence meanwhile: the
# workers' silences count again from that look
LOOK_GAP_S = 3.0


@dataclass(frozen=True, slots=True)
class HeldLock:
    """A descriptor that holds a lock (``flock``). Pickled to a spawned worker, it travels
    as a copy of the descriptor: one open file, whose lock lasts until the last process
    that has it ends (the supervisor, or a worker draining after it was killed)."""

    fd: int

    def __reduce__(self) -> tuple[Any, ...]:
        return _held, (reduction.DupFd(self.fd),)


def _held(fd: Any) -> HeldLock:
    """A ``HeldLock`` in the worker it was passed to (not passed on to its children)."""
    lock = HeldLock(fd.detach())
    os.set_inheritable(lock.fd, False)
    return lock


class Heartbeats:
    """Every worker's heartbeat count, in one shared block: a u64 per worker, worker ``i``'s
    at ``[8 * i, 8 * i + 8)``, written by that worker alone (aligned 8-byte stores) and read
    by the supervisor; 0 until the worker's first beat (it is starting). A read torn by a
    write can only show a count that changed, never a count that stood still."""

    def __init__(self, block: SharedBlock, workers: int) -> None:
        if block.size < self.size(workers):
            raise ValueError(f"heartbeat block {block.name!r} holds {block.size} bytes, "
                             f"needs {self.size(workers)}")
        self.block = block
        self.workers = workers

    @staticmethod
    def size(workers: int) -> int:
        return _BEAT.size * workers

    def _buf(self) -> memoryview:
        buf = self.block.buf
        if buf is None:
            raise ValueError(f"shared memory {self.block.name!r} is closed")
        return buf

    def beat(self, worker: int) -> None:
        """One more beat of ``worker`` (called by that worker alone)."""
        buf = self._buf()
        offset = _BEAT.size * worker
        _BEAT.pack_into(buf, offset, _BEAT.unpack_from(buf, offset)[0] + 1)

    def count(self, worker: int) -> int:
        """``worker``'s beats so far."""
        return int(_BEAT.unpack_from(self._buf(), _BEAT.size * worker)[0])


_BEAT = struct.Struct("<Q")


def silent_bound_s(environ: Mapping[str, str]) -> float:
    """The seconds a worker's heartbeat may stand still: ``SILENT_ENV`` in ``environ``,
    or ``SILENT_S``."""
    raw = environ.get(SILENT_ENV)
    if raw is None:
        return SILENT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 2 * BEAT_S):
        raise ValueError(f"{SILENT_ENV} must be a number of seconds >= {2 * BEAT_S:g} "
                         f"(a worker beats every {BEAT_S:g} s), got {raw!r}")
    return value


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    """What one worker process is started with."""

    config: GatewayConfig
    index: int
    workers: int
    slots: int
    load_block: SharedBlock
    feed_block: SharedBlock
    log_level: str
    # doorbells (``box_feed``): worker 0's ends of every follower's pipe, or a follower's
    rings: tuple[connection.Connection, ...] = ()
    bell: connection.Connection | None = None
    supervisor: int = 0  # the supervisor's process id
    # routes and stored responses told between the workers (``worker_routes``): this
    # worker's inbox, and the other workers' inboxes' sending ends; routes only with
    # ``share_routes`` (stored responses always: each worker refuses another tenant's)
    routes_inbox: socket.socket | None = None
    routes_out: tuple[socket.socket, ...] = ()
    share_routes: bool = True
    metrics_lock: HeldLock | None = None  # the metrics directory's, held while this runs
    beats: SharedBlock | None = None  # the box's heartbeats (``Heartbeats``)
    tenants: SharedBlock | None = None  # each worker's requests per tenant (``TenantBoard``)


def share_of(config: GatewayConfig, workers: int, index: int = 0) -> GatewayConfig:
    """``config`` for worker ``index``: its share of the box's limits, and a capture log
    of its own (``path.w<index>``: two writers never share a file) with its share of the
    log's bounds (``max_mb``, ``queue``, ``queue_mb``), so the box's files stay under
    ``max_mb`` as one gateway's do. (Only worker 0, which serves
    ``/admin/prefix-report``, keeps the report's ring: ``Capture``'s ``serves_report``.)"""
    limits = config.limits
    capture = config.capture
    if capture.path and workers > 1:
        capture = dataclasses.replace(
            capture, path=f"{capture.path}.w{index}", max_mb=capture.max_mb / workers,
            queue=math.ceil(capture.queue / workers), queue_mb=capture.queue_mb / workers)
    return dataclasses.replace(config, capture=capture,
                               limits=dataclasses.replace(
        limits, max_in_flight=math.ceil(limits.max_in_flight / workers),
        max_pending=math.ceil(limits.max_pending / workers),
        max_connections=math.ceil(limits.max_connections / workers),
        connections_per_replica=math.ceil(limits.connections_per_replica / workers),
        max_receiving_bytes=max(config.max_body_bytes,
                                math.ceil(limits.max_receiving_bytes / workers)),
        max_held_body_bytes=max(config.max_body_bytes,
                                math.ceil(limits.max_held_body_bytes / workers))))


def reuse_port_sockets(host: str, port: int) -> list[socket.socket]:
    """Sockets bound (``SO_REUSEPORT``) to every address ``host`` names, as one gateway's
    server binds them (asyncio's ``create_server``): an empty host is every interface,
    IPv4 and IPv6; an IPv6 socket takes IPv6 only. (One socket of the family a ``:``
    chose listened on IPv4 alone for an empty host or a name, where one gateway listens
    on both.)"""
    socks: list[socket.socket] = []
    try:
        for info in passive_addresses(host, port):
            try:
                socks.append(listen_socket(info, reuse_port=True))
            except OSError as exc:
                raise OSError(exc.errno, f"cannot listen on {info[4][0]!r} port {port}: "
                              f"{exc.strerror}") from None
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


def die_with_parent(supervisor: int) -> None:
    """SIGTERM this process once when the supervisor (process id ``supervisor``) dies, or
    now when it died before this call. The kernel's parent-death signal (Linux
    ``PR_SET_PDEATHSIG``) comes whenever the *thread* that holds this process ends, which
    hands it to another thread of the supervisor while one lives: a dying supervisor with
    several threads sent SIGTERM several times, and a second SIGTERM stops a worker at once
    (its answers in flight cut, not drained). So the kernel's signal is ``PARENT_DEATH``,
    acted on only once the parent is no longer the supervisor, and once. Compared with the
    supervisor's own id, not with 1: in a container without an init the supervisor *is*
    process 1, and a worker reparented after its death gets another parent."""
    told = False

    def parent_died(sig: int, frame: FrameType | None) -> None:
        nonlocal told
        if told or os.getppid() == supervisor:  # one of the supervisor's threads ended
            return
        told = True
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(PARENT_DEATH, parent_died)
    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, PARENT_DEATH)
    parent_died(PARENT_DEATH, None)  # the supervisor died before the line above


def worker_main(plan: WorkerPlan) -> None:
    """One worker: the gateway of ``gateway.serve`` over the shared blocks."""
    os.setpgid(0, 0)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the supervisor's to act on: it drains us
    die_with_parent(plan.supervisor)
    logging.basicConfig(level=plan.log_level,
                        format=f"%(asctime)s %(levelname)s %(name)s[w{plan.index}]: "
                        "%(message)s")
    from gateway.admin import create_admin_app
    from gateway.app import create_app
    from gateway.box_feed import BoxFeed
    from gateway.http_server import run_server
    from gateway.state import build_state

    config = share_of(plan.config, plan.workers, plan.index)
    load = SharedLoad(plan.load_block, plan.workers, plan.index, plan.slots)
    feed = FeedBlock(plan.feed_block)
    gw = build_state(config, shared=load)
    gw.worker = plan.index
    gw.box = BoxFeed(feed, gw.fleet, plan.index == 0, config.health.failures_to_eject,
                     config.health.successes_to_readmit, rings=plan.rings, bell=plan.bell)
    if plan.routes_inbox is not None:  # routes and stored responses, a peer's too (keep_told)
        gw.worker_routes = WorkerRoutes(plan.routes_inbox, plan.routes_out, gw.policy,
                                        gw.fleet, gw.keep_told, tell_routes=plan.share_routes)
        gw.router.before_choose = gw.worker_routes.catch_up  # each decision knows them
        gw.metrics.watch_worker_routes(gw.worker_routes)
        if gw.peers is not None and plan.share_routes:
            gw.peers.forward = gw.worker_routes.routed
    board = None if plan.tenants is None else TenantBoard(plan.tenants, plan.workers,
                                                          plan.index)
    if board is not None and plan.index == 0:  # it serves /admin/top
        gw.metrics.watch_box_tenants(board)
    if plan.beats is not None:
        beats, index = Heartbeats(plan.beats, plan.workers), plan.index
        admission = gw.admission

        def heartbeat() -> None:
            beats.beat(index)
            if board is not None and index:  # worker 0 reads its own counts live
                board.publish(admission.tenant_counts())

        gw.heartbeat = heartbeat
    app = create_app(config, gw)
    token = config.admin.resolved_token() if plan.index == 0 else None
    admin_app = None if token is None else create_admin_app(gw, token)

    def drain() -> None:
        gw.draining = True

    socks = reuse_port_sockets(config.host, config.port)
    try:
        run_server(app, config, admin_app, drain, sockets=socks,
                   on_cutoff=gw.stop_relays, on_refused=gw.refused_by_server)
    finally:
        for sock in socks:
            sock.close()
        feed.close()
        load.close()
        if plan.beats is not None:
            plan.beats.close()
        if board is not None:
            board.close()


def _sweep_metrics_dirs(parent: str) -> None:
    """Remove the metrics directories under ``parent`` that no process holds: those of a
    supervisor killed (and of its workers, all gone), which no stop removed."""
    with os.scandir(parent) as entries:
        dirs = [entry.path for entry in entries if entry.name.startswith(METRICS_PREFIX)
                and entry.name.endswith(METRICS_SUFFIX) and entry.is_dir(follow_symlinks=False)]
    for path in dirs:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:  # gone meanwhile, or another user's
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # its box runs
            os.close(fd)
            continue
        log.info("removing %s, left by a supervisor that was killed", path)
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)  # a supervisor starting meanwhile that made it sees it gone


def metrics_dir() -> tuple[str, HeldLock]:
    """A new directory for prometheus-client's multiprocess mode, and its lock, held: first
    the directories of dead boxes are removed (``_sweep_metrics_dirs``)."""
    parent = tempfile.gettempdir()
    _sweep_metrics_dirs(parent)
    while True:
        path = tempfile.mkdtemp(prefix=METRICS_PREFIX, suffix=METRICS_SUFFIX, dir=parent)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:  # swept before it was opened: another
            continue
        fcntl.flock(fd, fcntl.LOCK_EX)  # waits while a sweep that took it removes it
        try:
            mine = os.path.samestat(os.stat(path), os.fstat(fd))
        except FileNotFoundError:
            mine = False
        if mine:
            return path, HeldLock(fd)
        os.close(fd)  # swept before it was locked: another


def _close_doorbells(bells: list[tuple[connection.Connection, connection.Connection]]
                     ) -> None:
    """Close the supervisor's copies of both ends of every doorbell (closing twice is
    harmless), so a follower reads end-of-file once worker 0 is gone."""
    for pair in bells:
        for end in pair:
            end.close()


def _close_route_sockets(routes: list[tuple[socket.socket, socket.socket]]) -> None:
    """Close the supervisor's copies of the workers' route sockets (twice is harmless)."""
    for ends in routes:
        for end in ends:
            end.close()


class Supervisor:
    def __init__(self, config: GatewayConfig, workers: int, log_level: str,
                 share_routes: bool = True, silent_s: float | None = None) -> None:
        """``silent_s``: the seconds a worker's heartbeat may stand still (None: from
        ``SILENT_ENV``, or ``SILENT_S``)."""
        if workers < 1:
            raise ValueError(f"--workers must be >= 1, got {workers!r}")
        self.silent_s = silent_bound_s(os.environ) if silent_s is None else silent_s
        self.config = config
        self.workers = workers
        self.log_level = log_level
        self.share_routes = share_routes  # the workers tell each other their routes
        self.signals = 0  # the stops asked for by signals
        self.crashed = False  # a worker exited on its own: the others were told to stop
        self.procs: list[multiprocessing.process.BaseProcess] = []
        self.kill_after_s = KILL_AFTER_S
        self._stop_at: float | None = None  # when the workers were first told to stop
        self._told = 0  # the stops the workers were told
        self._wakeup: int | None = None  # readable when a signal came (run)
        self.beats: Heartbeats | None = None  # the workers' heartbeats (run)
        # per worker (by index) that has beaten: its count when last seen to change, and
        # when (the supervisor's clock); the supervisor's last look at them
        self._heard: dict[int, tuple[int, float]] = {}
        self._looked_at: float | None = None
        self._silenced: set[int] = set()  # the workers killed for their silence

    def _signalled(self, sig: int, frame: FrameType | None) -> None:
        """The signal handler: only counts. A handler that told the workers itself missed
        one being started (not yet in ``procs``), which then served until killed: the main
        loop tells them (``_tell``), woken by ``_wakeup``."""
        self.signals += 1
        if self._stop_at is None:
            self._stop_at = time.monotonic()

    def _tell(self) -> None:
        """Each stop not yet told, to every worker running: a SIGTERM (a second one stops
        a worker at once). A stop the box began itself (a worker exited on its own) and an
        operator's first signal are one drain: only a second signal stops at once."""
        while self._told < max(self.signals, int(self.crashed)):
            self._told += 1
            for proc in self.procs:
                if proc.pid is not None and proc.exitcode is None:
                    os.kill(proc.pid, signal.SIGTERM)

    def _stop(self) -> None:
        """Drain the workers running, as a signal would, without counting one."""
        self.crashed = True
        if self._stop_at is None:
            self._stop_at = time.monotonic()
        self._tell()

    def _left_s(self) -> float | None:
        """Seconds until the workers still running are killed; None: no stop began."""
        if self._stop_at is None:
            return None
        return (self._stop_at + self.config.shutdown.timeout_s + self.kill_after_s
                - time.monotonic())

    def _kill_stuck(self) -> None:
        """Kill the workers still running past the stop's time."""
        for proc in self.procs:
            if proc.pid is not None and proc.exitcode is None:
                print(f"kvgate serve: {proc.name} still running "
                      f"{self.config.shutdown.timeout_s + self.kill_after_s:g} s after "
                      "it was told to stop; killed", file=sys.stderr)
                proc.kill()

    def _kill_silent(self) -> None:
        """Kill each worker whose heartbeat stood still for ``silent_s`` while the box
        serves (a stop begun has its own bound, ``_kill_stuck``); its end is then taken
        as any worker's exit (``wait``). A worker is watched from its first beat."""
        if self.beats is None or self._stop_at is not None:
            return
        now = time.monotonic()
        if self._looked_at is not None and now - self._looked_at > LOOK_GAP_S:
            # not looked at meanwhile (the box paused whole): no silence was seen
            self._heard = {index: (count, now) for index, (count, _) in self._heard.items()}
        self._looked_at = now
        for index, proc in enumerate(self.procs):
            count = self.beats.count(index)
            if not count or index in self._silenced:
                continue
            last, since = self._heard.get(index, (0, now))
            if count != last:
                self._heard[index] = (count, now)
            elif now - since >= self.silent_s:
                self._silenced.add(index)
                print(f"kvgate serve: {proc.name} (pid {proc.pid}) silent for "
                      f"{now - since:.1f} s (its event loop stuck: no heartbeat within "
                      f"{self.silent_s:g} s); killed", file=sys.stderr)
                proc.kill()

    def wait(self) -> int:
        """Wait for every worker to end, stopping the rest when one ends on its own and
        killing those still running past the stop's time; the exit status."""
        status = 0
        killed = False
        live = {proc.sentinel: proc for proc in self.procs}
        while live:
            self._tell()
            self._kill_silent()
            left = self._left_s()
            if left is not None and left <= 0 and not killed:
                self._kill_stuck()
                status, killed = 1, True
            # a signal wakes it (``_wakeup``; without one, as in tests, it is seen within
            # a second); the killed end now
            timeout = None if killed else 1.0 if left is None else min(max(left, 0.0), 1.0)
            wakeup = [] if self._wakeup is None else [self._wakeup]
            for ready in connection.wait([*live, *wakeup], timeout):
                assert isinstance(ready, int)
                if ready == self._wakeup:
                    os.read(ready, 4096)  # the signals' numbers: counted already
                    continue
                ended = live.pop(ready)
                ended.join()
                if not self.signals and not self.crashed:
                    why = "killed for its silence" if self.procs.index(ended) in \
                        self._silenced else f"exited with {ended.exitcode}"
                    print(f"kvgate serve: {ended.name} {why}; stopping the others",
                          file=sys.stderr)
                    status = 1
                    self._stop()
                elif ended.exitcode not in (0, -signal.SIGTERM, -signal.SIGINT):
                    status = 1  # uvicorn re-raises the signal it stopped on
        return status

    def run(self) -> int:
        """Start the workers, forward signals, wait for them all; the exit status."""
        slots = max(MAX_REPLICAS, len(self.config.fleet_replicas())) + SPARE_SLOTS
        load = SharedLoad.prepare(SharedBlock.create(
            "kvgate-load", SharedLoad.size(self.workers, slots)))
        feed = FeedBlock.prepare(SharedBlock.create("kvgate-feed", BLOCK_BYTES))
        beats = SharedBlock.create("kvgate-beats", Heartbeats.size(self.workers))
        tenants = SharedBlock.create("kvgate-tenants", TenantBoard.size(self.workers))
        self.beats = Heartbeats(beats, self.workers)
        metrics, metrics_lock = metrics_dir()
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics  # the workers inherit it
        ctx = multiprocessing.get_context("spawn")
        # a hang-up (the terminal closed) drains the box too
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._signalled)
        self._wakeup, wakeup_w = os.pipe()
        os.set_blocking(wakeup_w, False)
        previous_wakeup = signal.set_wakeup_fd(wakeup_w)
        status = 0
        # one doorbell per follower: (its end, worker 0's end); the workers get copies
        bells = [ctx.Pipe(duplex=False) for _ in range(self.workers - 1)]
        # one route inbox per worker: (its end, the end the others send to)
        routes = [route_pair() for _ in range(self.workers)] if self.workers > 1 else []
        try:
            for index in range(self.workers):
                if self.signals:  # told to stop meanwhile: those started drain, no more
                    break
                plan = WorkerPlan(self.config, index, self.workers, slots, load,
                                  feed, self.log_level,
                                  rings=tuple(ring for _, ring in bells) if index == 0 else (),
                                  bell=bells[index - 1][0] if index else None,
                                  supervisor=os.getpid(),
                                  routes_inbox=routes[index][0] if routes else None,
                                  routes_out=tuple(out for j, (_, out) in enumerate(routes)
                                                   if j != index),
                                  share_routes=self.share_routes,
                                  metrics_lock=metrics_lock, beats=beats,
                                  tenants=tenants)
                proc = ctx.Process(target=worker_main, args=(plan,),
                                   name=f"kvgate-worker-{index}")
                proc.start()
                self.procs.append(proc)  # a signal that came meanwhile is told it (wait)
            _close_doorbells(bells)  # the workers hold their copies
            _close_route_sockets(routes)
            status = self.wait()
        finally:
            if any(proc.exitcode is None for proc in self.procs):  # run() failed
                self._stop()
                status = max(status, self.wait())
            signal.set_wakeup_fd(previous_wakeup)
            os.close(wakeup_w)
            os.close(self._wakeup)
            self._wakeup = None
            _close_doorbells(bells)  # a no-op when closed already
            _close_route_sockets(routes)
            self.beats = None
            for block in (load, feed, beats, tenants):
                block.close()
            shutil.rmtree(metrics, ignore_errors=True)
            os.close(metrics_lock.fd)
        return status
