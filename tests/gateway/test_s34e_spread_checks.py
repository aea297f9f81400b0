"""A large fleet's health checks (and scrapes) spread over the interval: each replica at its
own phase, from a hash of its id, and at most ``STARTS_PER_TURN`` started in one turn of
the event loop; every replica still checked once every interval. All of a fleet's checks
started at once held the loop for over a second at 4,096 replicas."""

from __future__ import annotations

import asyncio
from collections import Counter

import aiohttp
from aiohttp import web

from gateway.config import HealthConfig, ReplicaConfig, ScrapeConfig
from gateway.fleet import Fleet
from gateway.monitor import STARTS_PER_TURN, Monitor, Round, phase
from tests.support.servers import aiohttp_site


def test_phases_spread_a_fleet_evenly_and_stay_put() -> None:
    for name in ("m{}", "vllm-{}.inference.svc.cluster.local", "10.0.{}.7:8000"):
        ids = [name.format(i) for i in range(4096)]
        phases = [phase(replica_id) for replica_id in ids]
        assert all(0.0 <= p < 1.0 for p in phases)
        assert phases == [phase(replica_id) for replica_id in ids]  # the same every time
        bins = Counter(int(p * 16) for p in phases)  # 256 a bin if even
        assert sorted(bins) == list(range(16))
        assert all(192 <= n <= 320 for n in bins.values()), (name, sorted(bins.values()))


def test_a_round_hands_out_each_job_once_when_due_and_a_bounded_number_at_a_time() -> None:
    fleet = Fleet([ReplicaConfig(id=f"m{i}", url="http://127.0.0.1:1") for i in range(1000)])
    jobs = {(i,): [state] for i, state in enumerate(fleet)}
    phases = {key: phase(states[0].id) for key, states in jobs.items()}
    began, interval_s, per_turn = 100.0, 2.0, 32
    round_ = Round(jobs, phases, began, interval_s, per_turn)
    assert round_.starts(began - 1.0) == []  # none due before the interval
    handed: list[tuple[int, ...]] = []
    turns = 0
    # the loop's turns: 5 ms apart, then one late by half the interval (everything due
    # meanwhile comes out a bounded batch a turn), then 5 ms apart again
    now = began
    while not round_.done():
        batch = round_.starts(now)
        turns += 1
        assert len(batch) <= per_turn
        for key, states in batch:
            assert began + phases[key] * interval_s <= now  # never before it is due
            assert states is jobs[key]
        handed += [key for key, _ in batch]
        if round_.done():
            break
        if turns == 100:
            now += interval_s / 2
        elif len(batch) < per_turn:  # caught up: the next turn a step on, or when due
            now = max(now + 0.005, round_.next_at())
        assert turns < 2000
    assert sorted(handed) == sorted(jobs)  # each job once
    assert handed == sorted(jobs, key=phases.__getitem__)  # in phase order
    late = Round(jobs, phases, began, interval_s, per_turn)  # a loop late by an interval
    batches = []
    while not late.done():
        batches.append(len(late.starts(began + interval_s)))
    assert batches == [per_turn] * (1000 // per_turn) + [1000 % per_turn]


async def test_the_health_loop_starts_a_fleets_checks_a_bounded_number_a_turn() -> None:
    checked: Counter[str] = Counter()

    async def health(request: web.Request) -> web.Response:
        checked[request.path] += 1
        return web.Response(text="")

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]})

    app = web.Application()
    app.router.add_get("/r{n}/health", health)
    app.router.add_get("/r{n}/v1/models", models)
    runner, port = await aiohttp_site(app)
    size = 200
    fleet = Fleet([ReplicaConfig(id=f"r{i}", url=f"http://127.0.0.1:{port}/r{i}")
                   for i in range(size)])
    started: list[int] = []  # checks of the loop started, by the loop's turns
    names: Counter[str] = Counter()

    async def count_starts() -> None:
        """Every turn, the checks started since the last: until each replica's was."""
        seen: set[asyncio.Task[object]] = set()
        while len(names) < size:
            new = {t for t in asyncio.all_tasks()
                   if t.get_name().startswith("kvgate-health ")} - seen
            seen |= new
            names.update(t.get_name() for t in new)
            started.append(len(new))
            await asyncio.sleep(0)

    try:
        async with aiohttp.ClientSession() as session:
            monitor = Monitor(fleet, session, HealthConfig(interval_s=0.5, timeout_s=30.0),
                              ScrapeConfig(enabled=False))
            await monitor.start()  # its first round, awaited whole
            assert sorted(checked.values()) == [1] * size
            try:
                async with asyncio.timeout(10.0):  # a check of every replica
                    await count_starts()
            finally:
                await monitor.stop()
    finally:
        await runner.cleanup()
    assert set(names.values()) == {1}  # each once before any twice: once an interval
    assert max(started) <= STARTS_PER_TURN, max(started)
    assert all(state.healthy for state in fleet)
