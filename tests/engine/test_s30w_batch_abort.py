"""Aborting many requests at once (``/abort_request {"abort_all": true}``, clients leaving
together) is one pass over the queues, and leaves the engine exactly as aborting them one
by one does: the same queues, gauges, counters, freed blocks and what follows."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from itertools import count

import pytest

from engine.async_engine import AsyncEngine
from engine.core import EngineCore
from engine.request import Request, SamplingParams, Status
from tests.support.engine_cores import add, make_core, read_to_end, run_all


def _loaded(seed: int) -> EngineCore:
    """A core with requests running, waiting, preempted and finished, some waiting ones
    credited with what the prefix cache holds of their prompts."""
    rng = random.Random(seed)
    core = make_core(num_blocks=16, max_num_seqs=6, max_num_batched_tokens=16)
    core.kv.pool.events = []
    docs = [[rng.randrange(100, 200) for _ in range(12)] for _ in range(3)]
    for i in range(40):
        prompt = rng.choice(docs)[: rng.randrange(5, 13)] + [rng.randrange(100, 200)
                                                             for _ in range(rng.randrange(4))]
        add(core, f"r{i}", prompt, max_tokens=rng.randrange(1, 30), ignore_eos=True)
        if i % 5 == 4:
            core.step(0.0)
    for _ in range(rng.randrange(8, 16)):
        core.step(0.0)
    core.check_integrity()
    return core


def _state(core: EngineCore) -> tuple[object, ...]:
    sched = core.scheduler
    return (dataclasses.asdict(core.stats), [r.request_id for r in sched.running],
            [r.request_id for r in sched.waiting], sorted(core.requests),
            list(core.kv.pool.events or ()), core.kv.usage())


def _mix(core: EngineCore, rng: random.Random) -> list[str]:
    """Random ids to abort, in random order: queued ones of every kind, finished and
    unknown ones, one named twice."""
    live = list(core.requests)
    finished = [f"r{i}" for i in range(40) if f"r{i}" not in core.requests]
    assert finished
    ids = [*rng.sample(live, len(live) * 2 // 3), finished[0], "nobody"]
    ids.append(rng.choice(ids))
    rng.shuffle(ids)
    return ids


@pytest.mark.parametrize("seed", range(6))
def test_aborting_a_batch_leaves_the_engine_as_aborting_one_by_one(seed: int) -> None:
    alone, batch = _loaded(seed), _loaded(seed)
    assert _state(alone) == _state(batch)
    ids = _mix(alone, random.Random(seed))
    reqs = [alone.requests[i] for i in ids if i in alone.requests]
    kinds = {r.status for r in reqs}
    assert {Status.RUNNING, Status.WAITING} <= kinds, kinds
    if seed == 0:  # the mix holds preempted and credited requests too
        assert Status.PREEMPTED in kinds and any(r.waiting_credit for r in reqs)

    dropped = sum(alone.abort_request(i, now=1.0) for i in ids)
    assert batch.abort_requests(ids, now=1.0) == dropped == len(set(reqs))
    for core in (alone, batch):
        core.check_integrity()
    assert _state(alone) == _state(batch)
    for i in ids:
        assert i not in batch.requests
    # what the freed blocks left cached, and in which eviction order, is the same
    alone_out, batch_out = run_all(alone, 2.0), run_all(batch, 2.0)
    assert alone_out == batch_out
    assert _state(alone) == _state(batch)


def test_a_finished_request_or_one_given_twice_is_refused_with_nothing_changed() -> None:
    core = _loaded(0)
    sched = core.scheduler
    queued = [*sched.running[:2], *list(sched.waiting)[:3]]
    before = _state(core)
    with pytest.raises(ValueError, match="given twice"):
        sched.finish_many([*queued, queued[-1]], Status.ABORTED)
    gone = Request("gone", [1, 2, 3], model_id="tiny", block_size=4)
    gone.status = Status.FINISHED
    with pytest.raises(ValueError, match="request gone is already finished"):
        sched.finish_many([*queued, gone], Status.ABORTED)
    assert _state(core) == before
    core.check_integrity()


def test_aborts_queued_together_are_applied_together_where_they_stand() -> None:
    """Aborts queued one after another between steps go to the core as one batch (one
    reading of the clock stamps them all); an id added again between two aborts keeps
    its new request."""

    async def run() -> None:
        core = make_core(num_blocks=64)
        ticks = count()
        engine = AsyncEngine(core, sleep_modeled_time=False, clock=lambda: float(next(ticks)))
        params = SamplingParams(max_tokens=3, ignore_eos=True)
        reqs = {rid: core.make_request(rid, [100 + i] * 5, params)
                for i, rid in enumerate("abcd")}
        for req in reqs.values():
            engine.add(req)
        for rid in "abc":
            engine.abort(rid)
        again = engine.add(core.make_request("a", [150] * 5, params))
        engine.abort("d")
        await engine.start()
        try:
            outs = await read_to_end(again)
            assert outs[-1].finish_reason == "length"
        finally:
            await engine.stop()
        assert all(reqs[rid].status is Status.ABORTED for rid in "abcd")
        # a, b and c in one batch; d in its own, after the new a was added
        assert reqs["a"].finish_time == reqs["b"].finish_time == reqs["c"].finish_time
        assert reqs["d"].finish_time is not None
        assert reqs["d"].finish_time > reqs["c"].finish_time
        assert core.stats.num_requests_aborted == 4

    asyncio.run(run())
