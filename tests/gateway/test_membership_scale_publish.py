"""Discovery's publishes at scale: a large join or leave hands the loop back between
replicas (the ranks of one replica always together), and a publish that changes one
replica works on that one only."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from gateway.config import ReplicaConfig, parse_config
from gateway.data_parallel import rank_id
from gateway.fleet_events import FleetEvent, ReplicaAdded
from gateway.membership import Changes, leave, reconcile
from gateway.state import GatewayState, build_state
from policies.base import ReplicaRemoved

SOURCE = "dns:scale"


def gateway(*static: str) -> GatewayState:
    return build_state(parse_config({"replicas": [
        {"id": rid, "url": f"http://10.9.0.{i}:8000"} for i, rid in enumerate(static)]}))


def servers(n: int, ranks: int = 1, port: int = 8000) -> dict[str, ReplicaConfig]:
    return {f"s{i}": ReplicaConfig(id=f"s{i}", url=f"http://10.{i // 250}.{i % 250}.1:{port}",
                                   data_parallel_size=ranks) for i in range(n)}


def members(wanted: dict[str, ReplicaConfig]) -> list[str]:
    return [rank.id for config in wanted.values() for rank in config.ranks()]


async def watched(gw: GatewayState, pass_: Coroutine[Any, Any, Changes],
                  look: Callable[[], None]) -> tuple[Changes, int]:
    """Run ``pass_`` while another coroutine calls ``look`` each time it gets the loop;
    its result, and how many times ``look`` ran while it was not done."""
    task = asyncio.create_task(pass_)
    turns = 0
    while not task.done():
        look()
        turns += 1
        await asyncio.sleep(0)
    return await task, turns


async def test_a_large_join_lets_others_run_between_replicas_and_ranks_stay_together(
        ) -> None:
    gw = gateway()
    wanted = servers(150, ranks=2)  # 300 members
    sizes: list[int] = []

    def look() -> None:
        ids = {s.id for s in gw.fleet}
        sizes.append(len(ids))
        for gid in wanted:  # a replica's ranks: all in, or none
            assert (rank_id(gid, 0) in ids) == (rank_id(gid, 1) in ids), gid

    changes, _ = await watched(gw, reconcile(gw, SOURCE, wanted), look)
    # others ran while the fleet was partly filled, in wanted's order
    assert any(0 < n < 300 for n in sizes), sizes
    assert sizes == sorted(sizes)
    assert list(changes.added) == members(wanted) == [s.id for s in gw.fleet]
    assert {s.source for s in gw.fleet} == {SOURCE}


async def test_a_large_leave_lets_others_run_between_replicas() -> None:
    gw = gateway("static-a")
    wanted = servers(150, ranks=2)
    await reconcile(gw, SOURCE, wanted)
    sizes: list[int] = []

    def look() -> None:
        ids = {s.id for s in gw.fleet}
        sizes.append(len(ids))
        for gid in wanted:
            assert (rank_id(gid, 0) in ids) == (rank_id(gid, 1) in ids), gid

    changes, _ = await watched(gw, reconcile(gw, SOURCE, {}), look)
    assert any(1 < n < 301 for n in sizes), sizes
    assert list(changes.removed) == members(wanted)
    assert [s.id for s in gw.fleet] == ["static-a"]  # never the configured one


@dataclass(frozen=True, slots=True, eq=False)
class Noted(ReplicaConfig):
    """A replica config that notes each time it is compared (its id)."""

    def __eq__(self, other: object) -> bool:
        COMPARED.append(self.id)
        return ReplicaConfig.__eq__(self, other)

    __hash__ = ReplicaConfig.__hash__


COMPARED: list[str] = []


async def test_a_publish_that_changes_one_replica_compares_and_moves_only_it() -> None:
    gw = gateway()
    wanted: dict[str, ReplicaConfig] = {
        f"n{i}": Noted(id=f"n{i}", url=f"http://10.1.{i}.1:8000") for i in range(200)}
    wanted["dp"] = Noted(id="dp", url="http://10.2.0.1:8000", data_parallel_size=3)
    await reconcile(gw, SOURCE, wanted)
    before = {s.id: s for s in gw.fleet}
    events: list[FleetEvent] = []
    gw.fleet.listen(events.append)
    COMPARED.clear()
    # the same set, n7 at a new address (the others the same objects, as a Kubernetes
    # source hands them)
    moved = {**wanted, "n7": Noted(id="n7", url="http://10.3.0.1:8000")}
    changes = await reconcile(gw, SOURCE, moved)
    assert changes == Changes(("n7",), ("n7",), ())
    assert events == [ReplicaRemoved("n7"), ReplicaAdded("n7")]
    assert set(COMPARED) <= {"n7"}, sorted(set(COMPARED))[:5]
    after = {s.id: s for s in gw.fleet}
    assert after.keys() == before.keys()
    assert all(after[rid] is state for rid, state in before.items() if rid != "n7")
    # the data-parallel one changes: its three ranks move, together, and only they
    COMPARED.clear()
    moved["dp"] = Noted(id="dp", url="http://10.2.0.2:8000", data_parallel_size=3)
    changes = await reconcile(gw, SOURCE, moved)
    dp = [rank_id("dp", k) for k in range(3)]
    assert changes == Changes(tuple(dp), tuple(dp), ())
    assert {rid.split(".dp")[0] for rid in COMPARED} <= {"dp"}
    # nothing changed: nothing compared, nothing moves
    COMPARED.clear()
    events.clear()
    assert await reconcile(gw, SOURCE, dict(moved)) == Changes((), (), ())
    assert COMPARED == [] and events == []


async def test_a_member_removed_by_someone_else_or_held_elsewhere_is_tried_again() -> None:
    gw = gateway("s3")  # a configured replica holds the id the source lists as s3
    wanted = servers(6, ranks=2)
    wanted["s3"] = ReplicaConfig(id="s3", url="http://10.0.3.1:8000")
    changes = await reconcile(gw, SOURCE, wanted)
    assert changes.skipped == ("s3",)
    leave(gw, rank_id("s1", 1))  # the admin API removes one rank of a discovered one
    leave(gw, "s3")  # ... and the configured s3
    # the same set again, the same objects: what is missing joins now
    changes = await reconcile(gw, SOURCE, wanted)
    assert changes == Changes((rank_id("s1", 1), "s3"), (), ())
    assert sorted(s.id for s in gw.fleet) == sorted(members(wanted))
    assert {s.source for s in gw.fleet} == {SOURCE}
    assert await reconcile(gw, SOURCE, wanted) == Changes((), (), ())


async def test_a_pass_cancelled_halfway_is_made_whole_by_the_next_publish() -> None:
    gw = gateway()
    first = servers(120, ranks=2)
    await reconcile(gw, SOURCE, first)
    wanted = servers(120, ranks=2, port=9000)  # every replica moved
    task = asyncio.create_task(reconcile(gw, SOURCE, wanted))
    while not any(s.config.url.endswith(":9000") for s in gw.fleet):  # adding, halfway
        assert not task.done()
        await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()
    assert {s.config for s in gw.fleet} != {r for c in wanted.values() for r in c.ranks()}
    await reconcile(gw, SOURCE, wanted)
    assert [s.config for s in gw.fleet] == [r for c in wanted.values() for r in c.ranks()]
    # and back: what the cancelled pass left is no obstacle either
    await reconcile(gw, SOURCE, first)
    assert [s.config for s in gw.fleet] == [r for c in first.values() for r in c.ranks()]
