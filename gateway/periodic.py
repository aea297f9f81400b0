"""The gateway's background loops: a round every interval, and stopping the tasks that run
them (each owner starts its tasks in the app's lifespan and stops them there)."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable

log = logging.getLogger("kvgate.periodic")

HEARTBEAT_S = 0.5  # a worker process's event loop beats this often (``gateway.workers``)


async def every(interval_s: float, round_fn: Callable[[], Awaitable[object] | object],
                what: str) -> None:
    """Run ``round_fn`` (a coroutine function, or a plain one) every ``interval_s`` until
    cancelled; a round that fails is logged as ``what`` and the next one still runs."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            result = round_fn()
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug in one round must not end the loop
            log.exception("%s failed", what)


async def stop_tasks(tasks: Iterable[asyncio.Task[None] | None]) -> None:
    """Cancel ``tasks`` (None: never started) and wait until each has ended. A
    cancellation of the caller itself (a deadline on the stop) is raised, not taken for
    a task's own end."""
    started = [task for task in tasks if task is not None]
    for task in started:
        task.cancel()
    current = asyncio.current_task()
    for task in started:
        try:
            await task
        except asyncio.CancelledError:
            if current is not None and current.cancelling():
                raise
