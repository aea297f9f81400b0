"""The one way replicas join and leave the fleet at run time: the admin API and every
discovery source go through ``join``, ``leave`` and ``reconcile``, so the policy, the
metrics and the KV event subscriber hear of it (``ReplicaAdded`` / ``ReplicaRemoved``)
the same way whoever asked.

A replica remembers its source (``static``, ``admin``, or a discovery source's label);
``reconcile`` only ever adds or removes the replicas of the source it is given.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gateway.config import ReplicaConfig
from gateway.fleet import MAX_REPLICAS, ReplicaState
from gateway.monitor import servers
from gateway.state import GatewayState

log = logging.getLogger("kvgate.membership")

STATIC = "static"
ADMIN = "admin"


@dataclass(frozen=True, slots=True)
class Changes:
    added: tuple[str, ...]
    removed: tuple[str, ...]
    skipped: tuple[str, ...]  # ids another source already holds, or past the fleet's limit


async def join(gw: GatewayState, config: ReplicaConfig, source: str,
               forward_auth: bool = True) -> ReplicaState:
    """Add a replica (ValueError if its id is taken, or no room is left) and check its
    health at once: routing counts on it only once that check passed."""
    return (await join_all(gw, [config], source, forward_auth))[0]


async def join_all(gw: GatewayState, configs: Sequence[ReplicaConfig], source: str,
                   forward_auth: bool = True) -> list[ReplicaState]:
    """``join`` for replicas that come and go together (the ranks of one data-parallel
    replica): all of them are added before any is checked, or none (ValueError, as
    ``join``), so a removal while they are checked finds them all; their checks run at
    once, so a server that does not answer costs one health timeout, not one per rank."""
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
        await asyncio.gather(*(gw.monitor.check_one(*server) for server in servers(states)))


def leave(gw: GatewayState, replica_id: str) -> ReplicaState:
    """Remove a replica (KeyError if there is none by that id); requests in flight there
    finish, no new one goes there."""
    return gw.fleet.remove(replica_id)


async def reconcile(gw: GatewayState, source: str, wanted: Mapping[str, ReplicaConfig]
                    ) -> Changes:
    """Make the replicas of ``source`` exactly ``wanted``: those it no longer lists (or
    lists with another config, e.g. a new address) leave, new ones join. A replica of
    several data-parallel ranks is one member per rank (``ReplicaConfig.ranks``)."""
    members = {config.id: config.ranks() for config in wanted.values()}
    wanted = {rank.id: rank for ranks in members.values() for rank in ranks}
    current = {s.id: s.config for s in gw.fleet if s.source == source}
    removed = [rid for rid, config in current.items() if wanted.get(rid) != config]
    for rid in removed:
        leave(gw, rid)
    added: list[str] = []
    skipped: list[str] = []
    full: list[str] = []  # past the fleet's limit
    joining: list[ReplicaState] = []
    for ranks in members.values():
        new = [rank for rank in ranks if current.get(rank.id) != rank]
        taken = [(rank.id, holder) for rank in new if (holder := gw.fleet.get(rank.id))]
        for rid, holder in taken:
            skipped.append(rid)
            log.warning("discovery %s: replica id %s is already in the fleet (from %s); "
                        "not added", source, rid, holder.source)
        if taken or not new:
            continue
        # a replica's ranks join together or not at all (past the limit, or no slot)
        if len(gw.fleet) + len(new) > MAX_REPLICAS:
            full.extend(rank.id for rank in new)
            continue
        try:
            states = _add_all(gw, new, source)
        except ValueError as exc:  # no slot left in the workers' shared accounting
            full.extend(rank.id for rank in new)
            log.warning("discovery %s: replica %s not added: %s", source, new[0].id, exc)
            continue
        added.extend(state.id for state in states)
        joining.extend(states)
    await _checked(gw, joining)
    if full:
        log.warning("discovery %s: the fleet holds its limit of %d replicas: %s not added",
                    source, MAX_REPLICAS, _some(full))
    if added or removed:
        log.info("discovery %s: %d replicas (added %s, removed %s)", source, len(wanted),
                 _some(added), _some(removed))
    return Changes(tuple(added), tuple(removed), tuple(skipped + full))


def _some(ids: list[str], shown: int = 10) -> str:
    """``ids`` for a log line: the first ``shown``, then how many more."""
    if not ids:
        return "none"
    more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
    return ", ".join(ids[:shown]) + more
