"""Admission keeps every place it has: a place freed while the request handed the one
before it has not yet resumed is free for the next request, not held back behind a
queue no slot will ever wake."""

from __future__ import annotations

import asyncio

from gateway.admission import Admission, Slot
from gateway.config import LimitsConfig


async def _until(condition: object) -> None:
    for _ in range(100):
        if callable(condition) and condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


async def test_a_place_freed_while_a_waiter_resumes_is_not_lost() -> None:
    limits = LimitsConfig(max_in_flight=2, max_pending=4, max_pending_s=60)
    limits.validate()
    admission = Admission(limits)
    a, b = admission.enter_now(), admission.enter_now()
    assert a is not None and b is not None
    first = asyncio.create_task(admission.enter())
    await _until(lambda: admission.waiting == 1)
    body_read = asyncio.Event()

    async def arriving() -> Slot:  # as ``intake.take_place`` asks, once its body is read
        await body_read.wait()
        return admission.enter_now() or await admission.enter()

    late = asyncio.create_task(arriving())
    await asyncio.sleep(0)
    body_read.set()  # it runs next, before ...
    a.release()  # ... the waiter this place is handed to
    b.release()  # nobody else waits: a place is free
    held = await first
    await _until(late.done)  # the free place, at once (not after the first ends)
    second = late.result()
    assert admission.in_flight == 2 and admission.waiting == 0
    held.release()
    second.release()
    assert admission.in_flight == 0 and admission.enter_now() is not None


async def test_a_waiter_that_gives_up_after_being_handed_a_place_passes_it_on() -> None:
    limits = LimitsConfig(max_in_flight=1, max_pending=4, max_pending_s=60)
    limits.validate()
    admission = Admission(limits)
    a = admission.enter_now()
    assert a is not None
    first = asyncio.create_task(admission.enter())
    second = asyncio.create_task(admission.enter())
    await _until(lambda: admission.waiting == 2)
    a.release()  # handed to the first waiter ...
    first.cancel()  # ... whose client leaves before it runs: the second gets it
    held = await second
    assert first.cancelled() and admission.in_flight == 1 and admission.waiting == 0
    held.release()
    assert admission.in_flight == 0
