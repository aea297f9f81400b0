"""Running a coroutine on an event loop of its own, in a worker thread.

For a library call that is ``async`` but blocks between its awaits: kubernetes_asyncio's
``load_kube_config`` reads and parses the kubeconfig's YAML, reads a token file and writes
certificates to temporary files, all synchronously, and awaits an exec credential plugin
(a subprocess) in between. Run here, none of it holds the caller's loop, and the plugin
still runs as an asyncio subprocess (on the worker's loop).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def _awaited(task: asyncio.Task[T]) -> T:
    return await task


async def on_own_loop(coro: Coroutine[Any, Any, T]) -> T:
    """``await coro``, run to its end on a new event loop in a worker thread. Cancelling
    the caller cancels it there, and returns only once it has ended (its ``finally``
    clauses run, a subprocess it started killed and reaped); the loop is closed after."""
    loop = asyncio.new_event_loop()
    task = loop.create_task(coro)  # its first step runs once the worker runs the loop

    def run() -> T:
        with asyncio.Runner(loop_factory=lambda: loop) as runner:
            return runner.run(_awaited(task))

    worker = asyncio.ensure_future(asyncio.to_thread(run))
    try:
        return await asyncio.shield(worker)
    except asyncio.CancelledError:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the task had ended
            loop.call_soon_threadsafe(task.cancel)
        await asyncio.wait({worker})  # not cancelled by a second cancel of the caller
        if not worker.cancelled():
            worker.exception()  # the caller hears of its cancellation, not of this
        raise
