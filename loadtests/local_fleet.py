"""A local fleet on loopback: N engine processes behind one gateway process (or several
copies of it, each on its own port, as replicas of a gateway Deployment; or none, for a
router of another project).

``LocalFleet`` starts ``kvgate engine`` replicas (sim executor by default) on free ports,
waits for each ``/health``, writes a gateway YAML config naming them and the policy,
starts ``kvgate serve`` and waits for its ``/ready``. With ``kv_events`` every engine
publishes its KV events (and serves replays) on ZMQ endpoints of its own, which the
gateway config names. ``stop`` ends every process it
started (SIGTERM, then SIGKILL after a grace period to each and to whatever it started in
its session). A state file (``fleet.json`` in the
fleet's directory, once the fleet is ready) records the processes so that ``kvgate fleet
down`` in another shell can stop a fleet left running; while the fleet starts,
``fleet.starting.json`` records each process as it is spawned, so that ``down`` stops the
fleet of a ``kvgate fleet up`` killed while it started too. A process is recorded with its
start time, and ``down`` signals only a process that still has both its pid and that start
time: a pid reused by another process since is left alone (a record an older kvgate
wrote has no start times: its ``python -m kvgate`` processes are stopped, as that version
did). A record whose processes have
all ended does not hold up the next ``start``, which logs so and starts anew.

The state directory is this user's alone: one that is absent is made mode 0700, and one
owned by another user or writable by group or others is refused (as ssh and tmux refuse
theirs), since whoever may write there could swap the gateway config the fleet loads or
plant links that its writes would follow. The fleet writes its files there without
following links: logs are made afresh, configs and the state file written under a fresh
name and renamed into place.

Each process runs in its own session, so a Ctrl-C in the terminal reaches only the
controlling ``kvgate fleet up`` (or load-test) process, which then stops the fleet in
order: gateway first, then the engines.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import secrets
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, NamedTuple

import yaml

from engine.api_key import API_KEY_ENV

logger = logging.getLogger(__name__)

STATE_FILE = "fleet.json"  # the fleet's record once it is ready
STARTING_FILE = "fleet.starting.json"  # its record while it starts
ENGINE_BLOCK_SIZE = 16  # the engines' KV block size (``kvgate engine --block-size``' default)


def default_state_dir() -> Path:
    return Path(os.environ.get("KVGATE_FLEET_DIR", f"/tmp/kvgate-fleet-{os.getuid()}"))


class FleetError(RuntimeError):
    """A fleet process failed to start or to become ready, or the state directory is not
    this user's alone; the message says which."""


class FleetCancelled(FleetError):
    """``LocalFleet.cancel()`` came while the fleet started; what it began has stopped."""


# the cancel shared by the fleets made inside ``cancel_scope()``; None outside one
_SCOPE_CANCEL: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar(
    "local_fleet_scope_cancel", default=None)


@contextlib.contextmanager
def cancel_scope() -> Iterator[threading.Event]:
    """One cancel for every ``LocalFleet`` made inside the block, for a command whose
    fleets are made by code that does not hand them back (``kvgate demo`` runs
    ``loadtests.run``). Setting the event it yields (from a signal handler too) is each
    fleet's ``cancel()``: a fleet starting stops what it began and raises
    ``FleetCancelled`` at its next step, and one started later raises it before spawning
    anything. A fleet already started keeps running: the caller stops its own work."""
    cancelled = threading.Event()
    token = _SCOPE_CANCEL.set(cancelled)
    try:
        yield cancelled
    finally:
        _SCOPE_CANCEL.reset(token)


def scope_cancel() -> threading.Event | None:
    """The cancel of the ``cancel_scope()`` this runs inside, None outside one: for what a
    caller starts in front of a scope's fleets (a third-party router) to wait on too."""
    return _SCOPE_CANCEL.get()


@contextlib.contextmanager
def cancel_on_signals() -> Iterator[threading.Event]:
    """``cancel_scope()``, whose cancel SIGINT, SIGTERM and SIGHUP set inside the block (the
    handlers before it are back after it). The fleets' processes run in sessions of their
    own, which none of these reach, and Python's default for SIGTERM and SIGHUP ends the
    process without unwinding: they were left running. SIGHUP is left alone where ignored
    (``nohup``). The handler only sets the event: an exception raised from it could land
    inside ``subprocess.Popen`` and lose the process just started."""
    with cancel_scope() as cancelled:

        def on_signal(signum: int, frame: FrameType | None) -> None:
            cancelled.set()

        signals = [signal.SIGINT, signal.SIGTERM]
        if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
            signals.append(signal.SIGHUP)
        previous = {sig: signal.signal(sig, on_signal) for sig in signals}
        try:
            yield cancelled
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


@dataclass(frozen=True, slots=True)
class LocalFleetSpec:
    replicas: int = 2
    policy: dict[str, Any] = field(default_factory=lambda: {"name": "round_robin"})
    executor: str = "sim"
    profile: str = "llama3-8b-h100"
    kv_cache_gib: float = 25.0
    eviction: str = "lru"
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    host: str = "127.0.0.1"
    gateway_port: int = 0  # 0: a free port
    engine_args: tuple[str, ...] = ()  # passed through to every ``kvgate engine``
    # the gateway's default, and the simulator's (loadtests.sim_fleet): figures over HTTP
    # and offline see replicas' gauges as late as each other
    scrape_interval_s: float = 1.0
    gateway_config: dict[str, Any] = field(default_factory=dict)  # more gateway YAML keys
    kv_events: bool = False
    gateways: int = 1  # gateway copies, each on its own port, all with the same config
    # (0: the engines alone, for a router of another project put in front of them)
    peers: bool = False  # the copies tell each other what they route (gateway.peers)
    # each engine's device that many times slower than the profile's, r0 first (sim)
    slowdown: tuple[float, ...] = ()

    def validate(self) -> None:
        if not 1 <= self.replicas <= MAX_REPLICAS:
            raise ValueError(f"replicas must be in [1, {MAX_REPLICAS}] (each is an engine "
                             f"process on this machine), got {self.replicas!r}")
        if self.gateways < 0:
            raise ValueError(f"gateways must be >= 0, got {self.gateways!r}")
        if "name" not in self.policy:
            raise ValueError("policy needs a 'name'")
        if len(self.slowdown) > self.replicas:
            raise ValueError(f"slowdown names {len(self.slowdown)} replicas, the fleet has "
                             f"{self.replicas}")


MAX_REPLICAS = 256  # engine processes one machine's local fleet starts
_PORT_TRIES = 3  # starts of an engine whose ports were taken between picking and binding
_KILL_ROUNDS = 50  # SIGKILLs to a session's processes, for those forked meanwhile


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def check_port_free(host: str, port: int) -> None:
    """``FleetError`` when ``port`` is taken: a process already there would answer the
    readiness poll of a gateway that never bound it."""
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            raise FleetError(f"port {port} on {host} is in use ({exc.strerror}): pick "
                             "another with --port, or stop what holds it") from None


def http_ok(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError):
        return False


def wait_ready(name: str, popen: subprocess.Popen[bytes], log: Path,
               ready: Callable[[], bool], timeout_s: float, where: str = "",
               cancelled: threading.Event | None = None) -> None:
    """Poll ``ready`` until it holds; a ``FleetError`` with the tail of ``log`` if the
    process exits first, or one naming ``where`` after ``timeout_s``; ``FleetCancelled``
    once ``cancelled`` is set."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cancelled is not None and cancelled.is_set():
            raise FleetCancelled(f"cancelled while waiting for {name}")
        if popen.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise FleetError(f"{name} exited with {popen.returncode}:\n{tail}")
        if ready():
            return
        time.sleep(0.1)
    raise FleetError(f"{name} not ready {where} after {timeout_s:.0f} s (log: {log})")


def session_members(session: int) -> list[int]:
    """The processes of session ``session`` (the id of the process that made it) that have
    not ended: whatever its leader started, however they group themselves, and wherever
    they were reparented, unless they made sessions of their own. Ended but not yet reaped
    (zombies) are left out. While any of them lives the kernel gives no other process that
    id, so the session cannot be another's."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:  # ended meanwhile
            continue
        # pid (comm) state ppid pgrp session ...: comm may hold spaces and parentheses
        state, _ppid, _pgrp, sid = stat[stat.rindex(")") + 2:].split()[:4]
        if int(sid) == session and state not in ("Z", "X"):
            out.append(int(name))
    return out


def end_session(popen: subprocess.Popen[bytes], deadline: float) -> None:
    """Wait until ``popen``, started in a session of its own (``start_new_session``), and
    every process of that session have ended, then reap ``popen``; at ``deadline``
    (``time.monotonic()``) SIGKILL those left. Every process of the session, not only
    ``popen`` nor its process group: ``kvgate serve --workers`` puts each worker in a group
    of its own, and a router's children outlive it. What ``popen`` does on SIGTERM (the
    caller's to send) is its own: its children may end a moment after it."""
    while popen.poll() is None or session_members(popen.pid):
        if time.monotonic() >= deadline:
            # the session is still theirs: one of them holds its id
            kill_session(popen.pid)  # ``popen`` too, while not reaped
            break
        time.sleep(0.05)
    popen.wait()


def kill_session(session: int) -> None:
    """SIGKILL every process of session ``session`` (``session_members``), until none is
    left: one forked meanwhile is killed in the next round."""
    for _ in range(_KILL_ROUNDS):
        left = session_members(session)
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


def prepare_state_dir(path: Path) -> None:
    """Make ``path`` (mode 0700) if absent, then ``check_state_dir`` it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    check_state_dir(path)


def check_state_dir(path: Path) -> None:
    """``FleetError`` unless ``path`` is a directory that this user owns and that neither
    group nor others may write; a link to one counts only when this user owns the link."""
    me = os.geteuid()
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        if st.st_uid != me:
            raise FleetError(f"state directory {path} is a link owned by uid {st.st_uid}, "
                             f"not by uid {me}: remove it or pick another with --state-dir")
        st = path.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise FleetError(f"state directory {path} is not a directory")
    if st.st_uid != me:
        raise FleetError(f"state directory {path} is owned by uid {st.st_uid}, not by uid "
                         f"{me}: remove it or pick another with --state-dir")
    if st.st_mode & 0o022:
        raise FleetError(f"state directory {path} is writable by group or others (mode "
                         f"{stat.S_IMODE(st.st_mode):04o}): `chmod 700` it")


_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def create_file(path: Path) -> int:
    """A descriptor of a new empty file at ``path`` (mode 0600) open for writing: what was
    there is removed first, a link too, never followed."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return os.open(path, _NEW_FILE, 0o600)


def replace_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (mode 0600) through a fresh name renamed over it: a link
    at ``path`` is replaced, never followed, and no reader sees the file half written."""
    fresh = path.with_name(f".{path.name}.{secrets.token_hex(6)}")
    try:
        with open(os.open(fresh, _NEW_FILE, 0o600), "w") as out:
            out.write(text)
        os.replace(fresh, path)
    except BaseException:  # (a full disk): no half-written file left behind
        fresh.unlink(missing_ok=True)
        raise


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot), if it runs and leads a session
    of its own (as each fleet process does); None otherwise (ended, a zombie, or another
    process's). The pid with its start time names one process for good: a pid alone may
    have been given to another process since."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # none runs
        return None
    # pid (comm) state ppid pgrp session ... starttime (the 22nd field): comm may hold
    # spaces and parentheses
    rest = fields[fields.rindex(")") + 2:].split()
    if rest[0] in ("Z", "X") or int(rest[3]) != pid:
        return None
    return int(rest[19])


def is_recorded(pid: int, started: int | None) -> bool:
    """Whether ``pid`` is still the process a record names: the one that started at
    ``started`` (``start_ticks``); for a record an older kvgate wrote, without start
    times, a ``python -m kvgate`` process, as that version told them."""
    if started is not None:
        return start_ticks(pid) == started
    try:
        return b"\0-m\0kvgate\0" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def signal_if_same(pid: int, started: int | None, sig: signal.Signals) -> bool:
    """Send ``sig`` to ``pid`` only while it is the process recorded (``is_recorded``);
    whether it was sent. The process is held by a pidfd while checked, so its pid cannot
    pass to another between the check and the signal."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    try:
        if not is_recorded(pid, started):
            return False
        signal.pidfd_send_signal(pidfd, sig)
        return True
    except ProcessLookupError:  # ended after the check
        return False
    finally:
        os.close(pidfd)


@dataclass(slots=True)
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    started: int | None  # ``start_ticks`` just after the spawn


class LocalFleet:
    """Start with ``start()`` (or ``with LocalFleet(spec) as fleet:``), stop with ``stop()``."""

    def __init__(self, spec: LocalFleetSpec, state_dir: Path | None = None) -> None:
        spec.validate()
        self.spec = spec
        self.dir = state_dir or default_state_dir()
        self.engine_urls: list[str] = []
        self.replicas: list[dict[str, Any]] = []  # each engine as the gateway config names it
        self.gateway_url = ""  # the first copy's
        self.gateway_urls: list[str] = []
        self._procs: list[_Proc] = []
        given = scope_cancel()  # inside cancel_scope(): its cancel
        self._cancelled = threading.Event() if given is None else given

    def cancel(self) -> None:
        """Make a ``start()`` under way stop what it began and raise ``FleetCancelled`` at
        its next step; safe to call from a signal handler, which must not raise into
        ``start()`` itself: an exception inside ``subprocess.Popen`` would lose a process
        that had already started. Inside ``cancel_scope()`` it cancels the scope's other
        fleets too."""
        self._cancelled.set()

    def __enter__(self) -> LocalFleet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, name: str, argv: list[str],
               env: dict[str, str] | None = None) -> _Proc:
        """``kvgate`` with ``argv`` in a session of its own, with ``env`` (by default this
        process's environment)."""
        if self._cancelled.is_set():
            raise FleetCancelled(f"cancelled before {name} started")
        log = self.dir / f"{name}.log"
        with open(create_file(log), "wb") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "kvgate", "--log-level", "WARNING", *argv],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env=env,
            )
        # Popen returns once the child has made its session and run the program
        proc = _Proc(name, popen, log, start_ticks(popen.pid))
        self._procs.append(proc)
        self._write_state(ready=False)  # for `kvgate fleet down` if this process is killed
        return proc

    def _spawn_engine(self, i: int) -> tuple[_Proc, str, dict[str, Any]]:
        """Engine ``r{i}`` on free ports: its process, URL and entry in the gateway's
        config. It runs without the environment's engine API key (``API_KEY_ENV``, set for
        compose or a shell's engines): the fleet's gateway config sends its replicas none,
        and its ``engine_urls`` are called as they are, so a key taken up from the caller
        refused every request but the open ``/health`` the fleet waits on."""
        spec = self.spec
        port = free_port(spec.host)
        argv = ["engine", "--executor", spec.executor, "--profile", spec.profile,
                "--kv-cache-gib", str(spec.kv_cache_gib), "--eviction", spec.eviction,
                "--max-num-seqs", str(spec.max_num_seqs),
                "--max-num-batched-tokens", str(spec.max_num_batched_tokens),
                "--host", spec.host, "--port", str(port), "--log-level", "warning",
                "--served-by", f"r{i}",  # which replica answered, behind any router
                *spec.engine_args]
        if i < len(spec.slowdown) and spec.slowdown[i] != 1.0:
            argv += ["--slowdown", str(spec.slowdown[i])]
        url = f"http://{spec.host}:{port}"
        replica: dict[str, Any] = {"id": f"r{i}", "url": url}
        if spec.kv_events:
            events = f"tcp://{spec.host}:{free_port(spec.host)}"
            replay = f"tcp://{spec.host}:{free_port(spec.host)}"
            argv += ["--kv-events-endpoint", events, "--kv-events-replay-endpoint", replay]
            replica.update(kv_events=events, kv_events_replay=replay)
        env = {name: value for name, value in os.environ.items() if name != API_KEY_ENV}
        return self._spawn(f"engine-r{i}", argv, env), url, replica

    def _wait_ready(self, proc: _Proc, url: str, timeout_s: float) -> None:
        wait_ready(proc.name, proc.popen, proc.log, lambda: http_ok(url), timeout_s,
                   f"at {url}", self._cancelled)

    def start(self, timeout_s: float = 60.0) -> None:
        spec = self.spec
        prepare_state_dir(self.dir)
        records = state_files(self.dir)
        if records:
            running = [name for name, pid, started in recorded_processes(records)
                       if is_recorded(pid, started)]
            if running:
                raise FleetError(f"a fleet is already recorded in {records[0]} and its "
                                 f"{', '.join(running)} still run: stop it with "
                                 "`kvgate fleet down` first")
            logger.warning("the fleet recorded in %s has stopped; starting a new one",
                           records[0])
            for record in records:
                record.unlink()
        try:
            engines = [self._spawn_engine(i) for i in range(spec.replicas)]
            for i in range(spec.replicas):
                for tries_left in range(_PORT_TRIES - 1, -1, -1):
                    proc, url, _ = engines[i]
                    try:
                        self._wait_ready(proc, f"{url}/health", timeout_s)
                        break
                    except FleetError as exc:
                        # a port free when picked was taken before the engine bound it
                        # (another process's outgoing connection): pick others
                        if "address already in use" not in str(exc).lower() or not tries_left:
                            raise
                        self._procs.remove(proc)
                        engines[i] = self._spawn_engine(i)
            self.engine_urls = [url for _, url, _ in engines]
            self.replicas = replicas = [replica for _, _, replica in engines]
            gateways = []
            peers = [free_port(spec.host) for _ in range(spec.gateways)] \
                if spec.peers and spec.gateways > 1 else []
            secret = secrets.token_hex(16)
            for copy in range(spec.gateways):
                port = spec.gateway_port + copy if spec.gateway_port else free_port(spec.host)
                if spec.gateway_port:
                    check_port_free(spec.host, port)
                config = {
                    "host": spec.host,
                    "port": port,
                    "policy": dict(spec.policy),
                    "replicas": replicas,
                    "scrape": {"interval_s": spec.scrape_interval_s},
                    "health": {"interval_s": 1.0},
                    "shutdown": {"grace_s": 0, "timeout_s": 5},  # no load balancer to drain
                    **spec.gateway_config,
                }
                if peers:
                    config["peers"] = {"listen": f"{spec.host}:{peers[copy]}",
                                       "addresses": [f"{spec.host}:{p}" for p in peers],
                                       "secret": secret}
                name = "gateway" if copy == 0 else f"gateway-{copy + 1}"
                config_path = self.dir / f"{name}.yaml"
                replace_file(config_path, yaml.safe_dump(config, sort_keys=False))
                url = f"http://{spec.host}:{port}"
                gateways.append((self._spawn(name, ["serve", "--config", str(config_path)]),
                                 url))
                self.gateway_urls.append(url)
            self.gateway_url = self.gateway_urls[0] if self.gateway_urls else ""
            for proc, url in gateways:
                self._wait_ready(proc, f"{url}/ready", timeout_s)
                if proc.popen.poll() is not None:  # ready, but another process answered
                    raise FleetError(f"{proc.name} exited with {proc.popen.returncode}:\n"
                                     + proc.log.read_text(errors="replace")[-2000:])
            self._write_state(ready=True)
        except BaseException:
            self.stop()
            raise

    def _write_state(self, ready: bool) -> None:
        """Record the processes spawned so far: in ``STARTING_FILE`` until the fleet is
        ready, then in ``STATE_FILE`` (with its URLs)."""
        state = {
            "spec": asdict(self.spec),
            "gateway_url": self.gateway_url,
            "gateway_urls": self.gateway_urls,
            "engine_urls": self.engine_urls,
            "processes": [{"name": p.name, "pid": p.popen.pid, "started": p.started,
                           "log": str(p.log)} for p in self._procs],
        }
        replace_file(self.dir / (STATE_FILE if ready else STARTING_FILE),
                     json.dumps(state, indent=2))
        if ready:
            (self.dir / STARTING_FILE).unlink(missing_ok=True)

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop the gateway, then the engines, each with what it started; idempotent."""
        for proc in reversed(self._procs):  # the gateways were started last
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in reversed(self._procs):
            end_session(proc.popen, deadline)
        self._procs.clear()
        for record in (STATE_FILE, STARTING_FILE):
            (self.dir / record).unlink(missing_ok=True)

    @property
    def gateway_pid(self) -> int | None:
        return next((p.popen.pid for p in self._procs if p.name == "gateway"), None)

    def detach(self) -> None:
        """Leave the processes running; ``stop_recorded`` (``kvgate fleet down``) stops them."""
        self._procs.clear()

    def alive(self) -> bool:
        return bool(self._procs) and all(p.popen.poll() is None for p in self._procs)


def state_files(state_dir: Path) -> list[Path]:
    """The records of a fleet in ``state_dir``: ``STATE_FILE``, ``STARTING_FILE`` or both
    (its ``up`` ended between writing the one and removing the other), or none."""
    return [path for name in (STATE_FILE, STARTING_FILE)
            if (path := state_dir / name).exists()]


def recorded_processes(records: list[Path]) -> list[tuple[str, int, int | None]]:
    """The processes the state files ``records`` name, each once, in spawn order: (name,
    pid, start ticks; None where none is recorded, as an older kvgate wrote);
    ``FleetError`` naming a file that is not a fleet's state file."""
    out: dict[int, tuple[str, int, int | None]] = {}
    for path in records:
        try:
            for p in json.loads(path.read_text())["processes"]:
                started = p.get("started")
                out.setdefault(int(p["pid"]), (str(p["name"]), int(p["pid"]),
                                               started if isinstance(started, int) else None))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise FleetError(f"{path} is not a fleet's state file ({exc.__class__.__name__}: "
                             f"{exc}); stop its processes by hand") from None
    return list(out.values())


class Stopped(NamedTuple):
    """What ``stop_recorded`` found: whether a fleet was recorded, how many of its
    processes it stopped, and the pids of those recorded that were gone (ended, or their
    pid now another process's, which is left alone)."""
    recorded: bool
    stopped: int
    gone: tuple[int, ...]


def stop_recorded(state_dir: Path | None = None, grace_s: float = 10.0) -> Stopped:
    """Stop the fleet recorded in ``state_dir`` (``FleetError`` when that directory is not
    this user's alone) and remove its record."""
    where = state_dir or default_state_dir()
    if not os.path.lexists(where):
        return Stopped(False, 0, ())
    check_state_dir(where)
    records = state_files(where)
    if not records:
        return Stopped(False, 0, ())
    recorded = [(pid, started) for _, pid, started in reversed(recorded_processes(records))]
    ours: list[tuple[int, int | None]] = []
    gone: list[int] = []
    members_at_start: dict[int, set[int]] = {}
    for pid, started in recorded:
        # each started a session of its own (``LocalFleet._spawn``): what it started is
        # there; taken before the signal, while the leader holds the session's id
        members = set(session_members(pid))
        if signal_if_same(pid, started, signal.SIGTERM):
            ours.append((pid, started))
            members_at_start[pid] = members
        else:
            gone.append(pid)
    deadline = time.monotonic() + grace_s
    for pid, started in ours:
        # the session is still the fleet's while its leader runs, or while one of those
        # it had at the start does (none lives, and its id may be another's by now)
        def still_ours(pid: int = pid, started: int | None = started) -> bool:
            return (is_recorded(pid, started)
                    or bool(members_at_start[pid] & set(session_members(pid))))

        while still_ours() and time.monotonic() < deadline:
            time.sleep(0.1)
        if still_ours():
            kill_session(pid)
    for record in records:
        record.unlink()
    return Stopped(True, len(ours), tuple(sorted(gone)))
