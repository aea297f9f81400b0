"""The one way replicas join and leave the fleet at run time: the admin API and every
discovery source go through ``join``, ``leave`` and ``reconcile``, so the policy, the
metrics and the KV event subscriber hear of it (``ReplicaAdded`` / ``ReplicaRemoved``)
the same way whoever asked.

A replica remembers its source (``static``, ``admin``, or a discovery source's label);
``reconcile`` only ever adds or removes the replicas of the source it is given. A replica
a source found joins only when it passes the checks a configured one passes, has an
address a replica can have (``gateway.discovery.replica_checks``), and has a url no replica
of the fleet has (``endpoint_clash``, as the config and the admin API check it); one that
does not is left out, named once in the log, and the rest of the set still applies.

A source hands ``reconcile`` its whole set at every change, thousands of replicas where
one moved. What a publish costs follows what changed: the set last given is kept
(``SourceBook``), a replica given as the same config object again is passed over in one
cheap pass, and only the others are compared, removed or added. Adding a replica takes
~0.25 ms (its metric series), so the first list of 4,000 held the loop a second; removals
and additions are now made a slice of the loop at a time (``each_handing_back``), the
ranks of one replica always within one slice: they join and leave together.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from gateway.config import ReplicaConfig, endpoint_clash, held_endpoints
from gateway.discovery.replica_checks import refusal, shown_id
from gateway.discovery.stats import SourceStats
from gateway.fleet import MAX_REPLICAS, ReplicaState
from gateway.fleet_events import FleetEvent
from gateway.loop_slices import each_handing_back
from gateway.monitor import servers
from gateway.state import GatewayState
from policies.base import ReplicaRemoved

log = logging.getLogger("kvgate.membership")

STATIC = "static"
ADMIN = "admin"


@dataclass(frozen=True, slots=True)
class Changes:
    added: tuple[str, ...]
    removed: tuple[str, ...]
    # ids another source already holds, or past the fleet's limit; a replica refused
    # (``replica_checks``: an id or address no replica may have, ranks that cannot be
    # made, such as one's KV event port past 65535): its own id
    skipped: tuple[str, ...]


class SourceBook:
    """What ``reconcile`` last made of one source's set (a group: a replica as the source
    lists it, one member per data-parallel rank in the fleet).

    ``given``: the set last reconciled, whole (replaced only once a pass made all its
    changes: a pass cancelled halfway is made again in full by the next).
    ``unsettled``: groups of the set not wholly in the fleet as it lists them (an id
    another source holds, no room left, a member removed by someone else), tried again
    at every publish. ``group_of``: the group of each member this source put in the
    fleet; ``heard`` (a fleet listener) makes a group unsettled when one of its members
    is removed by anyone but ``reconcile`` (which forgets a member before removing it).
    ``lock``: one pass at a time. ``warned``: what the last pass warned of (a replica
    not added, and why): warned again only once it stopped for a pass, not at every
    publish (a DNS source's every few seconds)."""

    __slots__ = ("given", "group_of", "lock", "unsettled", "warned")

    def __init__(self) -> None:
        self.given: dict[str, ReplicaConfig] = {}
        self.unsettled: set[str] = set()
        self.warned: set[tuple[str, str]] = set()
        self.group_of: dict[str, str] = {}
        self.lock = asyncio.Lock()

    def heard(self, event: FleetEvent) -> None:
        if isinstance(event, ReplicaRemoved):
            group = self.group_of.pop(event.replica, None)
            if group is not None:
                self.unsettled.add(group)


async def join(gw: GatewayState, config: ReplicaConfig, source: str,
               forward_auth: bool = True) -> ReplicaState:
    """Add a replica (ValueError if its id is taken, or no room is left) and check its
    health at once: routing counts on it only once that check passed."""
    return (await join_all(gw, [config], source, forward_auth))[0]


async def join_all(gw: GatewayState, configs: Sequence[ReplicaConfig], source: str,
                   forward_auth: bool = True) -> list[ReplicaState]:
    """``join`` for replicas that come and go together (the ranks of one data-parallel
    replica, at most ``MAX_RANKS``): all of them are added before any is checked, or none
    (ValueError, as ``join``), within one turn of the loop, so no request and no removal
    sees some of them without the others; their checks run at once, so a server that
    does not answer costs one health timeout, not one per rank."""
    states = _add_all(gw, configs, source, forward_auth)
    await _checked(gw, states)
    return states


def _add_all(gw: GatewayState, configs: Sequence[ReplicaConfig], source: str,
             forward_auth: bool = True) -> list[ReplicaState]:
    """Add every one of ``configs`` to the fleet, unchecked, or none: ValueError (an id
    taken, no room left) after those added leave again."""
    states: list[ReplicaState] = []
    try:
        for config in configs:
            states.append(gw.fleet.add(config, forward_auth=forward_auth, source=source,
                                       checked_first=gw.monitor is not None))
    except ValueError:
        for state in states:
            leave(gw, state.id)
        raise
    return states


async def _checked(gw: GatewayState, states: Sequence[ReplicaState]) -> None:
    """Check the health of ``states`` at once, once a server: its answer counts for each
    of its ranks."""
    if gw.monitor is not None:
        await asyncio.gather(*(gw.monitor.check_joined(*server)
                               for server in servers(states)))


def leave(gw: GatewayState, replica_id: str) -> ReplicaState:
    """Remove a replica (KeyError if there is none by that id); requests in flight there
    finish, no new one goes there."""
    return gw.fleet.remove(replica_id)


async def reconcile(gw: GatewayState, source: str, wanted: Mapping[str, ReplicaConfig],
                    stats: SourceStats | None = None) -> Changes:
    """Make the replicas of ``source`` exactly ``wanted``: those it no longer lists (or
    lists with another config, e.g. a new address) leave, new ones join, in ``wanted``'s
    order (the first ones when room runs out). A replica of several data-parallel ranks
    is one member per rank (``ReplicaConfig.ranks``): they join together or not at all.
    A replica ``refusal`` names joins never (until listed otherwise): it is warned of,
    and counted in ``stats.refused``, once. Returns what this call changed; the loop is
    handed back between replicas."""
    book = gw.source_books.get(source)
    if book is None:
        book = gw.source_books[source] = SourceBook()
        gw.fleet.listen(book.heard)
    # each server's health check starts as its replica joins: the checks of a first list
    # of 4,000 started at once held the loop ~0.3 s for their first steps
    async with asyncio.TaskGroup() as checks, book.lock:
        changes = await _reconciled(gw, source, dict(wanted), book, checks, stats)
    if changes.added or changes.removed:
        log.info("discovery %s: %d replicas listed (added %s, removed %s)", source,
                 len(wanted), _some(list(changes.added)), _some(list(changes.removed)))
    return changes


async def _reconciled(gw: GatewayState, source: str, wanted: dict[str, ReplicaConfig],
                      book: SourceBook, checks: asyncio.TaskGroup,
                      stats: SourceStats | None = None) -> Changes:
    """``reconcile``'s changes to the fleet (``wanted``: the caller's own copy); the
    health check of each server added is started in ``checks``."""
    given, unsettled = book.given, book.unsettled
    warned_before, book.warned = book.warned, set()

    def fresh(kind: str, rid: str) -> bool:
        """Whether to warn of ``rid`` not added for ``kind``: not warned of last pass."""
        book.warned.add((kind, rid))
        return (kind, rid) not in warned_before
    # groups to look at, in wanted's order: new, changed, or not wholly in the fleet; one
    # given as the same config object as last time (a Kubernetes source keeps them) is
    # passed over here (~0.1 us each)
    maybe = [gid for gid, config in wanted.items()
             if given.get(gid) is not config or gid in unsettled]
    changed: dict[str, list[ReplicaConfig]] = {}  # group -> its members, as now listed
    refused: list[str] = []  # groups refused (replica_checks): no member, until changed
    async for gid in each_handing_back(maybe):  # equal copies (a DNS answer's): compared
        if gid in unsettled or given.get(gid) != wanted[gid]:
            # a refused one is looked at again only once listed otherwise: said once
            why = refusal(wanted[gid])
            if why is None:  # (its ranks can then be made)
                changed[gid] = wanted[gid].ranks()
                continue
            changed[gid] = []  # the others still join and leave
            refused.append(gid)
            if fresh("refused", gid):
                log.warning("discovery %s: replica %s not added: %s", source,
                            shown_id(gid), why)
                if stats is not None:
                    stats.refused += 1
    gone = given.keys() - wanted.keys()
    stale = [gid for gid in changed if gid in given]
    if gone:
        stale += [gid for gid in given if gid in gone]

    removed: list[str] = []
    async for gid in each_handing_back(stale):  # a group's members leave in one slice
        now = {rank.id: rank for rank in changed.get(gid, ())}
        for rank in _members(given[gid]):
            holder = gw.fleet.get(rank.id)
            if holder is not None and holder.source == source \
                    and holder.config != now.get(rank.id):
                book.group_of.pop(rank.id, None)  # (not heard as someone else's removal)
                leave(gw, rank.id)
                removed.append(rank.id)

    added: list[str] = []
    skipped: list[str] = []
    full: list[str] = []  # past the fleet's limit
    held: HeldPlaces | None = None  # made once a pass, when a replica is to join
    async for gid in each_handing_back(list(changed)):  # a group's members join in one
        ranks = changed[gid]
        new = [rank for rank in ranks if not _in_place(gw, source, rank)]
        taken = [(rank.id, holder) for rank in new if (holder := gw.fleet.get(rank.id))]
        for rid, holder in taken:
            skipped.append(rid)
            if fresh("taken", rid):
                log.warning("discovery %s: replica id %s is already in the fleet (from %s); "
                            "not added", source, rid, holder.source)
        if taken:
            unsettled.add(gid)
            continue
        if new:
            if held is None:
                held = await HeldPlaces.of(gw)
            # nothing awaited from here until it joins: no other add comes between
            held.own = {rank.id for rank in ranks}  # (its ranks in place: its own url)
            clash = endpoint_clash(new, held)
            if clash is not None:
                skipped.extend(rank.id for rank in new)
                unsettled.add(gid)
                if fresh("clash", gid):
                    log.warning("discovery %s: replica %s not added: %s", source,
                                shown_id(gid), clash)
                continue
            # a replica's ranks join together or not at all (past the limit, or no slot)
            if len(gw.fleet) + len(new) > MAX_REPLICAS:
                full.extend(rank.id for rank in new)
                unsettled.add(gid)
                continue
            try:
                states = _add_all(gw, new, source)
            except ValueError as exc:  # no slot left in the workers' shared accounting,
                # its api_key_file unreadable now: said here, not as the fleet's limit
                skipped.extend(rank.id for rank in new)
                unsettled.add(gid)
                if fresh("not_added", gid):
                    log.warning("discovery %s: replica %s not added: %s", source, new[0].id,
                                exc)
                continue
            added.extend(state.id for state in states)
            held.hold(states)
            if gw.monitor is not None:
                for server in servers(states):
                    checks.create_task(gw.monitor.check_joined(*server))
        book.group_of.update(dict.fromkeys([rank.id for rank in ranks], gid))
        unsettled.discard(gid)
    book.given = wanted
    book.unsettled = {gid for gid in book.unsettled if gid in wanted}  # (none gone)
    if [rid for rid in full if fresh("full", rid)]:
        log.warning("discovery %s: the fleet holds its limit of %d replicas: %s not added",
                    source, MAX_REPLICAS, _some(full))
    return Changes(tuple(added), tuple(removed), tuple(skipped + full + refused))


class HeldPlaces(Mapping[str, tuple[str, str]]):
    """The urls the fleet's replicas hold, as ``endpoint_clash`` reads them
    (``held_endpoints``), taken once a pass (a slice of the loop at a time) and kept as it
    adds replicas: a url whose replica has left the fleet since, or is one of ``own`` (the
    replica being added, some of its ranks in place), is held by none. (Their KV event
    endpoints are not compared: a found replica's are its own address and a port.)"""

    __slots__ = ("_fleet", "_places", "own")

    def __init__(self, gw: GatewayState) -> None:
        self._fleet = gw.fleet
        self._places: dict[str, tuple[ReplicaState, tuple[str, str]]] = {}
        self.own: set[str] = set()

    @classmethod
    async def of(cls, gw: GatewayState) -> HeldPlaces:
        held = cls(gw)
        async for state in each_handing_back(list(gw.fleet)):
            held.hold([state])
        return held

    def hold(self, states: Sequence[ReplicaState]) -> None:
        for state in states:
            for place, holder in held_endpoints([state.config]).items():
                if holder[1] == "url":
                    self._places[place] = (state, holder)

    def __getitem__(self, place: str) -> tuple[str, str]:
        state, holder = self._places[place]
        if state.id in self.own or self._fleet.get(state.id) is not state:
            raise KeyError(place)
        return holder

    def __iter__(self) -> Iterator[str]:
        return (place for place in self._places if place in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _members(config: ReplicaConfig) -> list[ReplicaConfig]:
    """``config.ranks()``; none when they cannot be made (a rank's KV event port past
    65535: a port a Kubernetes object names, offset by the template's
    ``data_parallel_size`` ranks), as no member of such a replica joins."""
    try:
        return config.ranks()
    except ValueError:
        return []


def _in_place(gw: GatewayState, source: str, rank: ReplicaConfig) -> bool:
    """Whether the fleet holds ``rank`` for ``source``, as it is configured now."""
    holder = gw.fleet.get(rank.id)
    return holder is not None and holder.source == source and holder.config == rank


def _some(ids: list[str], shown: int = 10) -> str:
    """``ids`` for a log line: the first ``shown``, then how many more."""
    if not ids:
        return "none"
    more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
    return ", ".join(ids[:shown]) + more
