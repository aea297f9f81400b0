"""Live state of every replica: health, scraped load, and this gateway's own accounting.

Only the event loop thread touches a ``Fleet``; nothing here awaits. ``views()`` takes the
immutable snapshot a policy decides on. Membership, health and restarts are told to the
listeners registered with ``listen`` (see ``fleet_events``).

Queued prompt tokens of a replica, as a policy sees them::

    queued = pending                         (this gateway's, sent and not yet answered
                                              with a first byte: exact, and fresh)
           + max(0, gauge - pending then)    (what the replica's queue gauge held at the
                                              last scrape beyond this gateway's own
                                              pending at that moment: other senders')

``pending then`` is this gateway's pending when the scrape was recorded. A replica that
exposes no queue gauge (vLLM does not) counts ``pending`` alone. The gauge is never
trusted for this gateway's own requests: it is up to a scrape interval old, and a request
sent just before a scrape is often missing from it (still in the replica's front end),
so a replica a few hundred milliseconds into a long prefill read as idle. In the
simulator (``contracts-400``, 20,000 requests, a gauge-exporting fleet) counting the
gauge plus what was sent since it gave a p95 time to first token of 0.452 s, against
0.437 s this way (round robin: 0.446 s). A request's tokens are the ones its replica must
prefill (the prompt less what the policy predicts it holds), and the age of the oldest
such request tells policies how far the replica got through them.

Requests in flight at a replica are counted the same way (``ReplicaView.in_flight``, this
gateway's, now; ``others_in_flight``, what the running and waiting gauges held at the last
scrape beyond this gateway's in flight then). Taking the gauges for the count, a replica
scraped full of this gateway's requests looked full of them for a scrape interval after
they finished: in the simulator (``contracts-400`` with 200-token documents at 60
requests/s) ``cost`` waited for decode slots that had freed, and its p95 time to first
token was 0.51 s against round robin's 0.22 s (0.27 s counted this way).

With worker processes (``serve --workers N``) those counts are the whole box's: each
worker copies its own into shared memory (``shared_load``) and a view sums them all.
"""

from __future__ import annotations

import contextlib
import logging
import math
import operator
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from gateway.calibration import TokenCalibration
from gateway.config import ReplicaConfig
from gateway.data_parallel import RANK_HEADER
from gateway.fleet_events import (
    CacheFlushed,
    FleetEvent,
    FleetListener,
    HealthChanged,
    ReplicaAdded,
)
from gateway.log_throttle import LogThrottle
from gateway.replica_metrics import HitRateWindow, ScrapedMetrics, moved
from gateway.shared_load import LoadTotals, SharedLoad
from kvwire.secret_source import file_stamp
from policies.base import ReplicaRemoved, ReplicaReset, ReplicaView

# seconds before a removed replica's slot in the workers' shared accounting is given to
# another: followers apply a removal within a snapshot (50 ms to 1 s), and a request
# routed there meanwhile shows in the slot's cells
# replicas one gateway follows at most (health checks and scrapes of each): a discovery
# answer of thousands of records must not add them all
MAX_REPLICAS = 4096
SLOT_QUARANTINE_S = 10.0
# a replica's api_key_file is looked at (one stat) at most this often, and read again when
# it changed: a rotated Secret reaches the next request within a few health checks
KEY_RECHECK_S = 5.0
_KEY_WARN_S = 60.0  # a key file that cannot be read again: one warning a minute a replica

log = logging.getLogger("kvgate.fleet")


def _without_auth(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() != "authorization"}


class ModelInfo(NamedTuple):
    """A model as a replica's /v1/models lists it, beyond its id (vLLM's fields: an
    adapter's ``parent`` is its base model, its ``root`` where it was loaded from).
    ``card``: the listing's other fields (``object``, ``created``, ``owned_by``...; not
    vLLM's ``permission`` list) as JSON text, for ``GET /v1/models`` to show as the replica gave
    them; None where it gave none (a replica listed by its /metrics)."""

    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    card: str | None = None


_LENGTH = operator.attrgetter("max_model_len")


class KVCapacity(NamedTuple):
    """A replica's KV capacity in its own tokens, and where the figure came from:
    ``scraped`` (its gauges), ``configured`` (``kv_capacity_tokens``) or ``estimated``
    (``gateway.kv_capacity_estimate``); both None when nothing tells it."""

    replica_tokens: int | None
    source: str | None


@dataclass(slots=True, eq=False)
class Pending:
    """One request sent to a replica that has not yet answered with its first byte. It
    holds the replica's state itself, so a replica removed and re-added under the same id
    is never charged for the old one's requests."""

    state: ReplicaState | None
    tokens: int
    sent_at: float = 0.0
    settled: bool = False
    done: bool = False
    seq: int = 0  # its number for the gateway's peers (0: not told them)


class _Steady(NamedTuple):
    """A replica view's fields worked out from a scrape, a restart or its config
    (capacity and prefill rate in the replica's own tokens)."""

    url: str
    weight: float
    running: int
    waiting: int
    others_in_flight: int  # running + waiting beyond this gateway's in flight then
    kv_usage: float
    kv_capacity_tokens: int | None
    token_hit_rate: float | None
    prefill_tokens_per_s: float | None
    scrape_seq: int
    prefilling: int  # this process's requests running there without a first byte then
    slot_hold_s: float | None


@dataclass(slots=True)
class ReplicaState:
    config: ReplicaConfig
    window_s: float
    forward_auth: bool = True  # clients' Authorization headers may be sent to it
    source: str = "static"  # who added it: static, admin, or a discovery source's label
    # answers 401/403 to the gateway's own calls, and to requests it sent with its key for
    # the replica (a missing or wrong api_key): ``auth_refused``
    auth_failures: int = 0
    healthy: bool = True
    # added at run time and not checked yet: out of routing until its first health check
    # passes (a replica still starting, or a wrong address, got requests meanwhile)
    awaiting_check: bool = False
    consecutive_failures: int = 0
    consecutive_successes: int = 0
    last_error: str | None = None
    request_failures: int = 0  # requests failed in a row (5xx, timeouts, cuts)
    # answers cut after the client got part of them, in a row of their kind (event
    # streams, bodies): only an answer of that kind relayed whole ends it (``answer_cut``)
    streams_cut: int = 0
    bodies_cut: int = 0
    ejected_until: float = 0.0  # monotonic: no health check readmits before this
    ejections: int = 0  # outlier ejections in a row, each soon after the last
    scraped: ScrapedMetrics | None = None
    scrape_seq: int = 0
    scrape_failures: int = 0  # scrapes failed in a row (the leader's)
    # its prompt plus generated tokens counter at the last scrape that told it: a figure
    # below it means a restart (an SGLang server has no prefix-cache counter to show one)
    work_tokens_seen: float | None = None
    # its finished requests' running seconds and count at the last scrape that told them,
    # and the mean of those finished since the one before (``ReplicaView.slot_hold_s``)
    ran_seen: tuple[float, float] | None = None
    slot_hold_s: float | None = None
    epoch: int = 0
    flushes: int = 0  # its prefix cache flushed through the admin API (the leader's count)
    pending_tokens: int = 0  # sent, no first byte yet
    pending_at_scrape: int = 0  # pending_tokens (the box's, with workers) when last scraped
    in_flight_at_scrape: int = 0  # in_flight (the box's, with workers) when last scraped
    # this process's requests there still waiting for a first byte when last scraped (a
    # follower worker's when it applied the leader's scrape)
    awaiting_at_scrape: int = 0
    in_flight: int = 0
    # monotonic: when it last gave this worker's requests a first byte or a whole answer
    # (a try waiting on it past its wait is then waiting on a busy replica, not a hung one;
    # ``progress``: any worker's)
    progress_at: float = 0.0
    unsettled: dict[Pending, None] = field(default_factory=dict)  # oldest first
    # each model its /v1/models lists, in its order, and what it said of it beyond its id
    model_info: dict[str, ModelInfo] = field(default_factory=dict)
    models_cut: bool = False  # it serves more models than ``model_info`` holds
    models_at: float = 0.0
    checks: int = 0  # health checks recorded (what a follower worker compares)
    last_check: tuple[bool, str | None] = (True, None)
    shared: SharedLoad | None = None  # the box's accounting, with worker processes
    slot: int = -1  # this replica's cells there
    estimated_kv_replica_tokens: int | None = None  # see gateway.kv_capacity_estimate
    hits: HitRateWindow = field(init=False)
    credentials: dict[str, str] = field(init=False)  # headers carrying its api_key, if any
    # its api_key_file as last read (``file_stamp``; None: no file, or not read) and when it
    # was last looked at (monotonic), for ``recheck_key``; the last_error a refusal of the
    # key set (``auth_refused``), which a new key clears
    _key_stamp: tuple[int, int, int, int] | None = field(
        default=None, init=False, repr=False, compare=False)
    _key_checked_at: float = field(default=-math.inf, init=False, repr=False, compare=False)
    _key_warned: LogThrottle | None = field(default=None, init=False, repr=False, compare=False)
    _key_refusal: str | None = field(default=None, init=False, repr=False, compare=False)
    # the header that sends a request to its data-parallel rank (gateway.data_parallel)
    pinned: dict[str, str] = field(init=False)
    # the view's fields that change only with a scrape, a health change, a restart or a
    # new config, and what they were taken at (``view``)
    _steady: tuple[tuple[object, ...], _Steady] | None = field(
        default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.hits = HitRateWindow(self.window_s)
        file = self.config.api_key_file
        if file is not None:  # taken before the read: a change while reading is seen later
            with contextlib.suppress(OSError):  # the read below names the file
                self._key_stamp = file_stamp(file)
        key = self.config.resolved_api_key()
        self.credentials = {"authorization": f"Bearer {key}"} if key else {}
        rank = self.config.data_parallel_rank
        self.pinned = {} if rank is None else {RANK_HEADER: str(rank)}

    def upstream_headers(self, client: Mapping[str, str], forward_client_auth: bool
                         ) -> Mapping[str, str]:
        """What a client's forwarded headers become toward this replica: its own API key,
        else the client's ``Authorization`` only when both sides allow it; toward a
        data-parallel rank, that rank's header in place of any the client sent."""
        if self.pinned:
            client = {**{k: v for k, v in client.items() if k.lower() != RANK_HEADER},
                      **self.pinned}
        if self.credentials:
            return {**_without_auth(client), **self.credentials}
        if forward_client_auth and self.forward_auth:
            return client
        return _without_auth(client)

    def recheck_key(self, now: float | None = None, refused: bool = False) -> bool:
        """Read its ``api_key_file`` again where the file changed since it was read (a
        rotated Secret: a new inode, size or modification time): looked at (one ``stat``)
        at most every ``KEY_RECHECK_S`` (``now``: monotonic seconds), and at once when the
        replica has just refused the gateway (``refused``). The next request, health check
        and scrape send the key read. A file that cannot be read now, or holds no key (one
        being rewritten), leaves the last key in use, with a warning naming the replica and
        the file at most once a minute, and is read again once it changes. ``api_key`` and
        ``api_key_env`` are read once, when the replica is added. True when the key
        changed."""
        file = self.config.api_key_file
        if file is None:
            return False
        now = time.monotonic() if now is None else now
        if not refused and now - self._key_checked_at < KEY_RECHECK_S:
            return False
        self._key_checked_at = now
        try:
            stamp = file_stamp(file)
        except OSError as exc:
            self._key_unread(f"api_key_file {file!r}: {exc.strerror}")
            return False
        if stamp == self._key_stamp:
            return False
        try:
            key = self.config.resolved_api_key()
        except ValueError as exc:  # names the file, never the key
            self._key_unread(str(exc))
            return False
        if key is None and self.credentials:
            self._key_unread(f"api_key_file {file!r} holds no key")
            return False
        self._key_stamp = stamp
        credentials = {"authorization": f"Bearer {key}"} if key else {}
        if credentials == self.credentials:  # rewritten with the same key
            return False
        self.credentials = credentials
        if self._key_refusal is not None and self.last_error == self._key_refusal:
            self.last_error = None  # the key refused is no longer sent
        self._key_refusal = None
        log.warning("replica %s: its api_key_file %r holds a new key, sent from now on",
                    self.id, file)
        return True

    def _key_unread(self, why: str) -> None:
        if self._key_warned is None:
            self._key_warned = LogThrottle(_KEY_WARN_S)
        held = self._key_warned.due()
        if held is not None:
            log.warning("replica %s: its key cannot be read again (%s); the key read before "
                        "is still sent%s", self.id, why,
                        f" ({held} such reads since the last warning)" if held else "")

    def auth_refused(self, path: str, status: int) -> None:
        """The replica answered ``status`` (401 or 403) to ``path``: one of the gateway's
        own calls, or a request the gateway sent with its key for the replica. Counted in
        ``auth_failures`` and said in ``last_error`` (logged unless it said a refusal
        already), and its ``api_key_file`` looked at again at once (``recheck_key``)."""
        self.auth_failures += 1
        if self.credentials:
            error = (f"{path} answered {status}: the replica refused the gateway's key for "
                     "it; check its api_key (or the key its api_key_file or api_key_env "
                     "holds) against the replica's")
        else:
            error = (f"{path} answered {status}: the replica wants an API key; set api_key "
                     "(or api_key_file, api_key_env) for it")
        if self._key_refusal is None or self.last_error != self._key_refusal:
            log.warning("replica %s: %s", self.id, error)  # once, not per path refused
        self.last_error = self._key_refusal = error
        self.recheck_key(refused=True)

    @property
    def id(self) -> str:
        return self.config.id

    def token_hit_rate(self) -> float | None:
        if self.scraped is not None and self.scraped.hit_rate_gauge is not None:
            return self.scraped.hit_rate_gauge
        return self.hits.rates().hit_rate

    def load(self) -> LoadTotals:
        """What was sent and not yet answered: this gateway's, or with worker processes
        the whole box's."""
        if self.shared is not None:
            return self.shared.totals(self.slot)
        return self._own()

    def _own(self) -> LoadTotals:
        """This process's counts: pending tokens, in flight, the oldest unanswered."""
        oldest = next(iter(self.unsettled), None)
        return LoadTotals(self.pending_tokens, self.in_flight,
                          oldest.sent_at if oldest is not None else 0.0,
                          oldest.tokens if oldest is not None else 0)

    def publish(self) -> None:
        """Copy this worker's counts to the shared block (no-op without one)."""
        if self.shared is not None:
            self.shared.write(self.slot, *self._own(), self.progress_at)

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self.model_info)

    @property
    def watched(self) -> bool:
        """Whether its progress can be seen in its scrapes: they come, are fresh, and in a
        dialect the gateway reads (a page of another server's names tells no figure that
        could move, so its every answer looked hung after ``stall_s``)."""
        s = self.scraped
        return s is not None and not s.stale and s.dialect != "unknown"

    def made_progress(self) -> None:
        """It gave a request its first byte or a whole answer, or its scrapes show it
        working (``replica_metrics.moved``): alive, if busy."""
        self.progress_at = time.monotonic()
        self.publish()

    def answered_whole(self, stream: bool) -> None:
        """It relayed an answer whole: an event stream (``stream``) or a body. Ends the
        run of cuts of that kind (``Fleet.answer_cut``)."""
        if stream:
            self.streams_cut = 0
        else:
            self.bodies_cut = 0

    def progress(self) -> float:
        """When it last made progress for any of the box's workers (monotonic)."""
        if self.shared is not None:
            return max(self.progress_at, self.shared.progress_at(self.slot))
        return self.progress_at

    def kv_capacity(self) -> KVCapacity:
        """Scraped beats configured beats estimated: an estimate never overrides a figure
        the replica or its operator gave."""
        s = self.scraped
        if s is not None and s.kv_capacity_tokens:
            return KVCapacity(s.kv_capacity_tokens, "scraped")
        if self.config.kv_capacity_tokens is not None:
            return KVCapacity(self.config.kv_capacity_tokens, "configured")
        if self.estimated_kv_replica_tokens is not None:
            return KVCapacity(self.estimated_kv_replica_tokens, "estimated")
        return KVCapacity(None, None)

    def queued_tokens(self, ratio: float = 1.0, load: LoadTotals | None = None) -> int:
        """Prompt tokens queued, in gateway tokens: this gateway's pending plus what the
        last scraped gauge held beyond its pending then (see the module; the gauge counts
        the replica's tokens, ``ratio`` is replica tokens per gateway token)."""
        load = self.load() if load is None else load
        return self._queued(load.pending_tokens, ratio)

    def _queued(self, pending: int, ratio: float) -> int:
        s = self.scraped
        if s is None or s.queued_tokens is None:
            return pending
        others = int(s.queued_tokens / ratio) - self.pending_at_scrape
        return pending + others if others > 0 else pending

    def view(self, now: float | None = None, ratio: float = 1.0) -> ReplicaView:
        """A snapshot at ``now`` (default: monotonic); ``ratio`` (replica tokens per gateway
        token) converts the replica's figures into gateway tokens. (Every request takes
        one of each replica: what changes only with a scrape, a health change, a restart
        or a new config is worked out once per change, and the rest is read in place.)"""
        now = time.monotonic() if now is None else now
        taken = (self.healthy, self.scrape_seq, self.epoch, self.estimated_kv_replica_tokens,
                 self.config)
        steady = self._steady
        if steady is None or steady[0] != taken:
            steady = self._steady = (taken, self._steady_fields())
        f = steady[1]
        # ``load()`` read in place: its call and tuple were a quarter of 64 views' time
        if self.shared is not None:
            pending, in_flight, sent_at, head = self.shared.totals(self.slot)
        else:
            pending, in_flight = self.pending_tokens, self.in_flight
            oldest = next(iter(self.unsettled), None)
            sent_at, head = (0.0, 0) if oldest is None else (oldest.sent_at, oldest.tokens)
        # in the replica's tokens until here: the ratio moves with every answer
        capacity, prefill = f.kv_capacity_tokens, f.prefill_tokens_per_s
        age = now - sent_at if sent_at else 0.0
        return ReplicaView._make((  # positional: the fields in their order
            self.config.id, f.url, self.healthy, f.weight, self._queued(pending, ratio),
            f.running, f.waiting, in_flight, f.kv_usage,
            None if capacity is None else int(capacity / ratio), f.token_hit_rate,
            self.epoch, None if prefill is None else prefill / ratio,
            age if age > 0.0 else 0.0, head, f.others_in_flight, f.scrape_seq,
            f.prefilling, f.slot_hold_s))

    def _steady_fields(self) -> _Steady:
        s = self.scraped
        running, waiting = (s.running, s.waiting) if s else (0, 0)
        return _Steady(
            self.config.base_url, self.config.weight, running, waiting,
            max(0, running + waiting - self.in_flight_at_scrape),
            s.kv_usage if s else 0.0, self.kv_capacity().replica_tokens,
            self.token_hit_rate(), self.hits.prefill_per_s(), self.scrape_seq,
            max(0, self.awaiting_at_scrape - waiting), self.slot_hold_s)


class Outbox(Protocol):
    """Who hears of this gateway's pending requests (``gateway.peers``)."""

    def sent(self, pending: Pending, replica: str) -> None: ...

    def settled(self, pending: Pending, done: bool) -> None: ...


class Fleet:
    def __init__(self, replicas: list[ReplicaConfig], window_s: float = 60.0,
                 shared: SharedLoad | None = None) -> None:
        self.window_s = window_s
        self.shared = shared
        self._next_slot = 0
        # with shared accounting: slots whose replica left -> when (``_free_slot``)
        self._released: dict[int, float] = {}
        self.slot_quarantine_s = SLOT_QUARANTINE_S
        self.calibration = TokenCalibration()
        # told of what this gateway sends and when it settles (``gateway.peers``)
        self.outbox: Outbox | None = None
        self._replicas: dict[str, ReplicaState] = {}
        self._listeners: list[FleetListener] = []
        self._on_change: Callable[[], None] | None = None
        # the last ``advertised`` answer, and the listings and health it was made of
        self._advertised: tuple[tuple[object, ...], dict[str, ModelInfo]] | None = None
        for config in replicas:
            self.add(config)

    def on_change(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` (one at a time; None stops) on the loop thread whenever
        membership, a health check, a scrape or a replica's models moved: what a leading
        worker tells the others (``box_feed``). It must not block or raise (it is called
        halfway through the fleet's updates)."""
        self._on_change = callback

    def changed(self) -> None:
        """Tell the ``on_change`` callback that something it publishes moved (the fleet's
        own methods call it; so does the monitor when a replica's models change)."""
        if self._on_change is not None:
            self._on_change()

    def listen(self, listener: FleetListener) -> None:
        self._listeners.append(listener)

    def unlisten(self, listener: FleetListener) -> None:
        """Stop telling ``listener`` (a no-op when it was not listening)."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _tell(self, event: FleetEvent) -> None:
        for listener in list(self._listeners):
            listener(event)

    def __iter__(self) -> Iterator[ReplicaState]:
        return iter(list(self._replicas.values()))

    def __len__(self) -> int:
        return len(self._replicas)

    def get(self, replica_id: str) -> ReplicaState | None:
        return self._replicas.get(replica_id)

    def add(self, config: ReplicaConfig, forward_auth: bool = True, source: str = "static",
            slot: int | None = None, checked_first: bool = False) -> ReplicaState:
        """A new replica; ``forward_auth`` False: clients' ``Authorization`` headers are
        not sent to it (one added at run time rather than configured). ``source``: who
        added it (see ``gateway.membership``). ``slot``: its cells in the shared
        accounting (default: the next unused one). ``checked_first``: it takes no request
        until a health check passes (``record_health``)."""
        if config.id in self._replicas:
            raise ValueError(f"replica {config.id!r} already exists")
        if len(self._replicas) >= MAX_REPLICAS:
            raise ValueError(f"no room for replica {config.id!r}: the fleet holds its limit "
                             f"of {MAX_REPLICAS} replicas")
        slot = self._free_slot() if slot is None else slot
        if self.shared is not None and slot >= self.shared.slots:
            raise ValueError(f"no room for replica {config.id!r}: the workers' shared "
                             f"accounting has {self.shared.slots} slots, all in use or "
                             "left by replicas with requests still in flight")
        self._released.pop(slot, None)
        self._next_slot = max(self._next_slot, slot + 1)
        state = ReplicaState(config, self.window_s, forward_auth=forward_auth, source=source,
                             shared=self.shared, slot=slot, healthy=not checked_first,
                             awaiting_check=checked_first)
        self._replicas[config.id] = state
        self._tell(ReplicaAdded(config.id))
        self.changed()
        return state

    def _free_slot(self) -> int:
        """A slot for a new replica: one a replica left at least ``slot_quarantine_s``
        ago whose cells every worker has zeroed (nothing of it in flight, in any worker;
        its old state would write there again only for such a request), else the next
        never used. Without reuse, discovery's churn (pods replaced, DNS answers that
        vary) used up the slots and the box stopped taking replicas."""
        if self.shared is not None and self._released:
            now, idle = time.monotonic(), LoadTotals(0, 0, 0.0, 0)
            for slot, left in self._released.items():
                if now - left >= self.slot_quarantine_s and self.shared.totals(slot) == idle:
                    return slot
        return self._next_slot

    def remove(self, replica_id: str) -> ReplicaState:
        try:
            state = self._replicas.pop(replica_id)
        except KeyError:
            raise KeyError(f"no replica {replica_id!r}") from None
        if self.shared is not None:
            self._released[state.slot] = time.monotonic()
        self.calibration.forget(replica_id)
        self._tell(ReplicaRemoved(replica_id))
        self.changed()
        return state

    def views(self, model: str | None = None, now: float | None = None) -> list[ReplicaView]:
        """Snapshots of the replicas serving ``model``, at ``now`` (monotonic seconds, or the
        simulator's virtual ones). A model none lists goes to those that may serve it
        unlisted: a replica whose list is longer than the gateway keeps, or not known
        yet; failing those, to all."""
        now = time.monotonic() if now is None else now
        ratio = self.calibration.ratio(model)
        states = list(self._replicas.values())
        if model is not None:
            serving = [s for s in states if model in s.model_info] \
                or [s for s in states if s.models_cut or not s.model_info]
            if serving:
                states = serving
        return [s.view(now, ratio) for s in states]

    def models(self, allowed: Callable[[str], bool] | None = None) -> set[str]:
        """The models the replicas serve (those ``allowed``, a tenant's partition); one
        C-level union (600 replicas of 300 adapters: 180,000 names in ~3 ms)."""
        return set().union(*(s.model_info for s in self._replicas.values()
                             if allowed is None or allowed(s.id)))

    def lists(self, model: str | None, allowed: Callable[[str], bool] | None = None) -> bool:
        """Whether a replica (one ``allowed``, of a tenant's partition) lists ``model``
        among those it serves: without building the set of every model (``models``)."""
        return any(model in s.model_info for s in self._replicas.values()
                   if allowed is None or allowed(s.id))

    def models_known(self) -> bool:
        """Whether some replica's model list is known (without building the set of them)."""
        return any(s.model_info for s in self._replicas.values())

    def model_info(self, model: str) -> ModelInfo | None:
        """What the first replica listing ``model`` said of it (routing reads its
        ``parent``; ``advertised`` is what clients are told); None: none lists it."""
        for s in self._replicas.values():
            info = s.model_info.get(model)
            if info is not None:
                return info
        return None

    def advertised(self, allowed: Callable[[str], bool] | None = None
                   ) -> Mapping[str, ModelInfo]:
        """Each model the replicas (those ``allowed``, a tenant's partition) serve, as
        ``GET /v1/models`` shows it: what a request may rely on whichever replica takes
        it. Its ``root`` and ``parent`` are the first healthy replica's listing it (the
        first's of any while none healthy does), its ``max_model_len`` the smallest of the
        healthy ones listing it: a replica at 1,024 tokens beside one at 8,192 (a rolling
        change of ``--max-model-len``, a mixed fleet) takes only prompts of 1,024. The
        answer is kept until a listing (each is a new dict) or a health changes: 600
        replicas of 300 adapters take ~10 ms to merge (``dict.update``, lengths read by
        ``map``; models walked one by one only where healthy replicas' lengths differ),
        and ~50 us to find unchanged. Not to be changed by the caller."""
        states = [s for s in self._replicas.values() if allowed is None or allowed(s.id)]
        # the listings by identity (a tuple compares its items by ``is`` first)
        made_of = tuple((s.model_info, s.healthy) for s in states)
        kept = self._advertised
        if kept is not None and kept[0] == made_of:
            return kept[1]
        cards = self._merged(states)
        self._advertised = (made_of, cards)
        return cards

    @staticmethod
    def _merged(states: list[ReplicaState]) -> dict[str, ModelInfo]:
        """``advertised``'s answer for the replicas ``states``."""
        healthy = [s for s in states if s.healthy]
        cards: dict[str, ModelInfo] = {}
        # the last update wins: the first healthy replica's listing over any other's
        for s in (*reversed([s for s in states if not s.healthy]), *reversed(healthy)):
            cards.update(s.model_info)
        lengths: set[int | None] = set()
        lengths.update(*(map(_LENGTH, s.model_info.values()) for s in healthy))
        lengths.discard(None)
        if len(lengths) < 2:
            return cards
        shortest: dict[str, int] = {}
        for s in healthy:
            for name, info in s.model_info.items():
                n = info.max_model_len
                if n is not None and n < shortest.get(name, n + 1):
                    shortest[name] = n
        for name, n in shortest.items():
            if cards[name].max_model_len != n:
                cards[name] = cards[name]._replace(max_model_len=n)
        return cards

    def longer_context(self, limit: int, failed: str, among: Iterable[str]) -> list[str]:
        """Those of ``among`` (replica ids, kept in their order) that are healthy and list
        a model replica ``failed`` lists with a ``max_model_len`` over ``limit`` tokens:
        where a prompt ``failed`` refused as longer than its context of ``limit`` may fit
        (the replicas a request is ranked to all serve its model)."""
        state = self._replicas.get(failed)
        models = () if state is None else tuple(state.model_info)
        longer = []
        for rid in among:
            s = self._replicas.get(rid)
            if s is None or not s.healthy or rid == failed:
                continue
            for model in models:
                info = s.model_info.get(model)
                if info is not None and info.max_model_len is not None \
                        and info.max_model_len > limit:
                    longer.append(rid)
                    break
        return longer

    def models_cut(self) -> bool:
        """Whether a replica serves more models than the gateway keeps of its list."""
        return any(s.models_cut for s in self._replicas.values())

    def any_healthy(self) -> bool:
        return any(s.healthy for s in self._replicas.values())

    def answered(self, replica_id: str, model: str | None, gateway_tokens: int,
                 replica_prompt_tokens: int, replica_cached_tokens: int, teach: bool = True
                 ) -> int:
        """``replica_id``'s ``usage`` for a prompt this gateway counted ``gateway_tokens``:
        teaches the token calibration (unless ``teach`` is false: the replica counted
        tokens the gateway did not see; nor when the replica has left the fleet, which
        keeps answers only of its members); returns the cached tokens in gateway tokens."""
        if teach and replica_id in self._replicas:
            self.calibration.observe(model, replica_prompt_tokens, gateway_tokens,
                                     replica_id)
        return min(gateway_tokens, self.calibration.to_gateway(replica_cached_tokens, model))

    # -- this gateway's own accounting ----------------------------------------------------
    def sent(self, replica_id: str, tokens: int, now: float | None = None,
             relay: bool = True) -> Pending:
        """``tokens`` to prefill were sent to the replica at ``now`` (default: monotonic);
        ``relay``: by this gateway, so its peers are told (``outbox``), not by a peer."""
        state = self._replicas.get(replica_id)
        if state is None:
            return Pending(None, tokens)
        state.pending_tokens += tokens
        state.in_flight += 1
        pending = Pending(state, tokens,
                          time.monotonic() if now is None else now)
        state.unsettled[pending] = None
        state.publish()
        if relay and self.outbox is not None:
            self.outbox.sent(pending, replica_id)
        return pending

    def first_byte(self, pending: Pending) -> None:
        state = pending.state
        if pending.settled or state is None:
            return
        pending.settled = True
        state.unsettled.pop(pending, None)
        state.pending_tokens -= pending.tokens
        state.publish()
        if pending.seq and self.outbox is not None:
            self.outbox.settled(pending, False)

    def done(self, pending: Pending) -> None:
        """Settle a request for good (idempotent)."""
        self.first_byte(pending)
        if not pending.done and pending.state is not None:
            pending.done = True
            pending.state.in_flight -= 1
            pending.state.publish()
            if pending.seq and self.outbox is not None:
                self.outbox.settled(pending, True)

    # -- health and scrapes ---------------------------------------------------------------
    def record_scrape(self, replica_id: str, metrics: ScrapedMetrics,
                      now: float | None = None, pending_then: int | None = None,
                      in_flight_then: int | None = None) -> bool:
        """Store a scrape taken at ``now`` (monotonic seconds, or the simulator's virtual
        ones); returns True when the replica's counters went back (it restarted): its
        prefix-cache counters, or its prompt and generated tokens'.
        ``pending_then``, ``in_flight_then``: the pending tokens and requests in flight
        when the scrape was taken, where that was elsewhere (a follower worker applying
        the leader's; default: now's)."""
        state = self._replicas.get(replica_id)
        if state is None:
            return False
        if moved(state.scraped, metrics):
            state.made_progress()
        state.scraped = metrics
        state.scrape_seq += 1
        load = state.load()
        state.pending_at_scrape = load.pending_tokens if pending_then is None \
            else pending_then
        state.in_flight_at_scrape = load.in_flight if in_flight_then is None \
            else in_flight_then
        state.awaiting_at_scrape = len(state.unsettled)
        state.publish()
        reset = False
        if metrics.stale:  # its rates are as old as its load figures: dropped with them
            state.hits.clear()
        if metrics.hit_tokens is not None and metrics.query_tokens is not None:
            reset = state.hits.add(time.monotonic() if now is None else now,
                                   metrics.hit_tokens, metrics.query_tokens)
        if metrics.work_tokens is not None:  # (a stale copy tells none)
            seen, state.work_tokens_seen = state.work_tokens_seen, metrics.work_tokens
            reset = reset or (seen is not None and metrics.work_tokens < seen)
        state.slot_hold_s = None
        if metrics.ran_seconds is not None and metrics.ran_requests is not None:
            ran, state.ran_seen = state.ran_seen, (metrics.ran_seconds, metrics.ran_requests)
            # (not across a restart: its counters began again, however far they came)
            if ran is not None and not reset and metrics.ran_requests > ran[1] \
                    and metrics.ran_seconds >= ran[0]:
                state.slot_hold_s = (metrics.ran_seconds - ran[0]) \
                    / (metrics.ran_requests - ran[1])
        if reset:
            state.epoch += 1
            self._tell(ReplicaReset(replica_id))
        self.changed()
        return reset

    def flushed(self, replica_id: str, count: int | None = None) -> None:
        """``replica_id``'s prefix cache was flushed (``gateway.cache_flush``): counted
        (``count``: the leader's count, where a follower worker applies it) and told as
        ``CacheFlushed``."""
        state = self._replicas.get(replica_id)
        if state is None:
            return
        state.flushes = state.flushes + 1 if count is None else count
        self._tell(CacheFlushed(replica_id))
        self.changed()

    def record_health(self, replica_id: str, ok: bool, error: str | None,
                      failures_to_eject: int, successes_to_readmit: int) -> bool | None:
        """Count a check; returns the new health when it changed, else None."""
        state = self._replicas.get(replica_id)
        if state is None:
            return None
        state.checks += 1
        state.last_check = (ok, error)
        self.changed()  # the check count moved, whatever the health
        if state.awaiting_check:
            state.awaiting_check = False
            if ok:  # a replica just added: in at its first check that passes (no news)
                state.consecutive_failures, state.consecutive_successes = 0, 1
                state.healthy = True
                self._tell(HealthChanged(replica_id, True))
                return None
        if ok:
            state.consecutive_failures = 0
            state.consecutive_successes += 1
            if not state.healthy and state.consecutive_successes >= successes_to_readmit \
                    and time.monotonic() >= state.ejected_until:
                state.healthy = True
                state.last_error = None
                self._tell(HealthChanged(replica_id, True))
                return True
        else:
            state.consecutive_successes = 0
            state.consecutive_failures += 1
            state.last_error = error
            if state.healthy and state.consecutive_failures >= failures_to_eject:
                state.healthy = False
                self._tell(HealthChanged(replica_id, False))
                return False
        return None

    def request_ok(self, replica_id: str) -> None:
        state = self._replicas.get(replica_id)
        if state is not None:
            state.request_failures = 0

    def request_failed(self, replica_id: str, error: str, failures_to_eject: int,
                       ejection_s: float, now: float | None = None) -> bool:
        """A request failed there (5xx, first-byte timeout, cut); after
        ``failures_to_eject`` in a row the replica is ejected for ``ejection_s``, twice as
        long each time it is ejected again within that long of coming back (up to 32x).
        Health checks readmit it only after that; True when it was ejected now."""
        state = self._replicas.get(replica_id)
        if state is None:
            return False
        state.request_failures += 1
        if state.request_failures < failures_to_eject or not state.healthy:
            return False
        state.request_failures = 0
        return self._eject_for_requests(state, error, ejection_s, now)

    def answer_cut(self, replica_id: str, stream: bool, error: str, failures_to_eject: int,
                   ejection_s: float, now: float | None = None) -> bool:
        """The replica broke off an answer after the client got part of it (an event
        stream, ``stream``, or a body). Cuts count in a run of their kind that only an
        answer of the same kind relayed whole ends (``ReplicaState.answered_whole``): not
        the opening of an answer, nor a whole answer of the other kind, so a replica that
        cuts every stream is ejected though its whole bodies succeed. After
        ``failures_to_eject`` in a run it is ejected as ``request_failed`` ejects; True
        when it was ejected now. A client that hangs up cuts nothing."""
        state = self._replicas.get(replica_id)
        if state is None:
            return False
        if stream:
            state.streams_cut += 1
            run = state.streams_cut
        else:
            state.bodies_cut += 1
            run = state.bodies_cut
        if run < failures_to_eject or not state.healthy:
            return False
        state.answered_whole(stream)  # the run starts again once it is back
        return self._eject_for_requests(state, error, ejection_s, now)

    def _eject_for_requests(self, state: ReplicaState, error: str, ejection_s: float,
                            now: float | None) -> bool:
        """Eject ``state`` for its failed requests (``request_failed``, ``answer_cut``)."""
        now = time.monotonic() if now is None else now
        soon = now - state.ejected_until < ejection_s * 2 ** state.ejections
        state.ejections = min(state.ejections + 1, 5) if soon else 0
        state.ejected_until = now + ejection_s * 2 ** state.ejections
        state.healthy = False
        state.consecutive_successes = 0
        state.last_error = error
        self._tell(HealthChanged(state.id, False))
        return True

    def follow_health(self, replica_id: str, healthy: bool, awaiting_check: bool) -> None:
        """Take another process's word for a replica's health (a worker following the
        box's first worker, which runs the checks); but not over this process's own
        ejection (its requests failed there) while that lasts: the first worker, which saw
        none of them, readmits the replica at its next scrape, and ``ejection_s`` (and its
        backoff) would hold there only."""
        state = self._replicas.get(replica_id)
        if state is None:
            return
        state.awaiting_check = awaiting_check
        if healthy and not state.healthy and time.monotonic() < state.ejected_until:
            return
        if state.healthy != healthy:
            state.healthy = healthy
            self._tell(HealthChanged(replica_id, healthy))

    def eject(self, replica_id: str, error: str) -> bool:
        """Passive ejection after a connect error; True when it was healthy before."""
        state = self._replicas.get(replica_id)
        if state is None or not state.healthy:
            return False
        state.healthy = False
        state.consecutive_successes = 0
        state.last_error = error
        self._tell(HealthChanged(replica_id, False))
        return True
