"""Drives an :class:`EngineCore` in real time inside an asyncio application.

The core is single-threaded: only the loop task touches it. Handlers queue additions,
aborts and admin calls, which the loop applies between steps; the step itself runs in a
one-thread executor so the event loop stays free. With ``sleep_modeled_time`` (the sim
executor) the loop then sleeps for what is left of the modeled step duration, and counts
how much later than modeled each step really ended (``modeled_s``, ``late_s``): a host
too busy for its fleet shows there, not as a slower GPU profile.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from engine.core import EngineCore, StepFailed, StepOutput
from engine.request import Request, RequestOutput

log = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine loop is gone: it stopped on an unexpected error, or the engine was
    stopped. Every request and call it had not answered gets one; so does every later
    ``add``, ``abort`` and ``call``."""


class RequestFailed(RuntimeError):
    """Put on a request's queue when the step that ran it failed (see
    :class:`~engine.core.StepFailed`): the request is over, the engine goes on."""


# steps failing one after another before the loop stops (a device that fails every step,
# a lost GPU, is dead: /health says so and the replica is restarted, rather than failing
# every request it is sent while it looks alive)
FAILED_STEPS_IN_A_ROW = 3


class RequestInterrupted(Exception):
    """Put on a request's queue by :meth:`AsyncEngine.interrupt`: whoever reads the queue
    ends the request as aborted (and aborts it on the engine)."""


class _Waiter:
    """One request's output queue. ``live`` once the core holds that request: until then
    an output under its id is an earlier request's, aborted while a step ran, whose id
    was given again (an RL client's ``/abort_request`` then resubmit)."""

    __slots__ = ("live", "queue")

    def __init__(self) -> None:
        self.queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.live = False


class _Aborts:
    """Aborts queued one after another for the loop, applied as one batch
    (:meth:`EngineCore.abort_requests`) where they stand among the other queued calls."""

    __slots__ = ("engine", "request_ids")

    def __init__(self, engine: AsyncEngine, request_id: str) -> None:
        self.engine = engine
        self.request_ids = [request_id]

    def __call__(self) -> None:
        self.engine.core.abort_requests(self.request_ids, now=self.engine.clock())


class AsyncEngine:
    def __init__(
        self,
        core: EngineCore,
        *,
        sleep_modeled_time: bool,
        on_step: Callable[[StepOutput], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core = core
        self.sleep_modeled_time = sleep_modeled_time
        self.clock = clock
        self._on_step = on_step
        self._queues: dict[str, _Waiter] = {}
        self._pending: list[Callable[[], object]] = []
        self._calls: set[asyncio.Future[Any]] = set()  # call()s not answered yet
        self._wake = asyncio.Event()
        self._pool: ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None
        self.error: BaseException | None = None  # what ended the loop, if it failed
        self._ended: str | None = None  # why the loop is gone: no waiter is queued then
        self._failed_in_a_row = 0
        self.modeled_s = 0.0  # with sleep_modeled_time: the steps' modeled seconds
        self.late_s = 0.0  # ... and the seconds they ended after that

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done() and self.error is None

    async def start(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="engine-step")
        self._task = asyncio.create_task(self._run(), name="engine-loop")

    async def stop(self, why: str = "engine stopped (shut down)") -> None:
        """End the loop: every request in flight and every call not answered gets an
        :class:`EngineDeadError` naming ``why`` (nothing waits on a loop that is gone),
        as does any later ``add``, ``abort`` or ``call``; a step still running is waited
        for. Stopped already, it changes nothing."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._end(why)
        if self._pool is not None:
            pool, self._pool = self._pool, None
            # a step still running there ends first: waited for off the event loop
            await asyncio.to_thread(pool.shutdown, True)

    def add(self, req: Request) -> asyncio.Queue[RequestOutput | BaseException]:
        """Queue a request; its outputs (or an exception) arrive on the returned queue.
        The request is validated by the core when the loop applies it. ValueError, and
        nothing queued, when a request of that id is in flight (a client names its own
        ids on SGLang's ``/generate``)."""
        self._check_running()
        if req.request_id in self._queues:
            raise ValueError(f"request id {req.request_id!r} is in flight already")
        waiter = self._queues[req.request_id] = _Waiter()
        arrival = self.clock()

        def apply() -> None:
            try:
                self.core.add_request(req, now=arrival)
            except ValueError as exc:
                if self._queues.get(req.request_id) is waiter:
                    del self._queues[req.request_id]
                waiter.queue.put_nowait(exc)
            else:
                waiter.live = True

        self._pending.append(apply)
        self._wake.set()
        return waiter.queue

    def abort(self, request_id: str,
              queue: asyncio.Queue[RequestOutput | BaseException] | None = None) -> None:
        """Drop a request (client went away). Safe to call for finished requests. Its id
        may be given again at once: outputs of a step that was running go to nobody.
        ``queue``: the one ``add`` returned for the request meant; when the id is in flight
        under another (given again once this request ended: a failed step ends it before
        its reader knows), nothing is dropped. EngineDeadError, and nothing queued, once
        the loop is gone (it answered every request in flight so already)."""
        self._check_running()
        if queue is not None:
            waiter = self._queues.get(request_id)
            if waiter is not None and waiter.queue is not queue:
                return
        self._queues.pop(request_id, None)
        pending = self._pending
        last = pending[-1] if pending else None
        if isinstance(last, _Aborts):  # many clients leaving at once: one pass for all
            last.request_ids.append(request_id)
        else:
            pending.append(_Aborts(self, request_id))
        self._wake.set()

    def in_flight(self) -> list[str]:
        """The ids of the requests whose outputs are still awaited."""
        return list(self._queues)

    def interrupt(self, request_id: str, message: str) -> bool:
        """Tell the reader of a request in flight to end it as aborted
        (:class:`RequestInterrupted`, whose text is ``message``); False when no request
        of that id is in flight."""
        waiter = self._queues.get(request_id)
        if waiter is None:
            return False
        waiter.queue.put_nowait(RequestInterrupted(message))
        return True

    async def call(self, fn: Callable[[EngineCore], Any]) -> Any:
        """Run ``fn(core)`` between steps and return its result; EngineDeadError when
        the loop is gone, or goes before it ran ``fn``."""
        self._check_running()
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def apply() -> None:
            if fut.done():
                return
            try:
                fut.set_result(fn(self.core))
            except Exception as exc:  # the caller's error, not the engine's
                fut.set_exception(exc)

        self._pending.append(apply)
        self._calls.add(fut)
        fut.add_done_callback(self._calls.discard)
        self._wake.set()
        return await fut

    def _check_running(self) -> None:
        """EngineDeadError, naming why, once the loop is gone: what is queued then would
        wait for it forever."""
        if self._ended is not None:
            raise EngineDeadError(self._ended) from self.error

    def _end(self, why: str) -> None:
        """The loop is gone (``why``): answer every request in flight and every call not
        answered with an EngineDeadError, drop what was queued for the loop, and refuse
        what comes later. The first reason stays."""
        if self._ended is None:
            self._ended = why
        self._pending.clear()
        waiters, self._queues = list(self._queues.values()), {}
        for waiter in waiters:
            waiter.queue.put_nowait(EngineDeadError(self._ended))
        for fut in list(self._calls):
            if not fut.done():
                fut.set_exception(EngineDeadError(self._ended))

    def _apply_pending(self) -> None:
        pending, self._pending = self._pending, []
        for fn in pending:
            fn()

    def _deliver(self, out: StepOutput) -> StepOutput:
        """Put each output on its request's queue; the step's outputs less those of
        earlier requests whose ids were given again (no metrics count them either)."""
        queues = self._queues
        stale = False
        for o in out.outputs:
            waiter = queues.get(o.request_id)
            if waiter is None:
                continue
            if not waiter.live:
                stale = True
                continue
            waiter.queue.put_nowait(o)
            if o.finished:
                del queues[o.request_id]
        if not stale:
            return out
        kept = [o for o in out.outputs
                if (w := queues.get(o.request_id)) is None or w.live]
        return dataclasses.replace(out, outputs=kept)

    def _fail(self, failed: StepFailed) -> None:
        """End the failed step's requests with :class:`RequestFailed`; re-raise its
        cause (the loop stops) when ``FAILED_STEPS_IN_A_ROW`` steps failed in a row."""
        self._failed_in_a_row += 1
        log.error("a step of requests %s failed", ", ".join(failed.request_ids),
                  exc_info=failed.cause)
        if self._failed_in_a_row >= FAILED_STEPS_IN_A_ROW:
            raise failed.cause
        error = RequestFailed(f"the engine step running this request failed: "
                              f"{type(failed.cause).__name__}: {str(failed.cause)[:200]} "
                              f"(the engine's log has the traceback)")
        for request_id in failed.request_ids:
            waiter = self._queues.get(request_id)
            if waiter is not None and waiter.live:
                del self._queues[request_id]
                waiter.queue.put_nowait(error)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        core = self.core
        try:
            while True:
                self._apply_pending()
                if not core.has_unfinished():
                    self._wake.clear()
                    if not self._pending:
                        await self._wake.wait()
                    continue
                t0 = self.clock()
                # /metrics, read on this loop, sees the core as it was before the step
                # while the step changes it in the worker thread (left held if the wait is
                # cancelled: the step may run on)
                core.step_gauges = core.gauges()
                try:
                    out = await loop.run_in_executor(self._pool, core.step, t0)
                except StepFailed as failed:
                    core.step_gauges = None
                    try:
                        self._fail(failed)
                    finally:
                        if self._on_step is not None:
                            # reported as an empty step: the blocks evicted to make room
                            # for it are gone all the same, and their KV events go out now,
                            # also when this failure stops the loop (subscribers would keep
                            # blocks the engine dropped)
                            self._on_step(StepOutput([], 0.0, 0, 0))
                    continue
                core.step_gauges = None
                self._failed_in_a_row = 0
                if self.sleep_modeled_time:
                    remaining = out.seconds - (self.clock() - t0)
                    await asyncio.sleep(max(0.0, remaining))
                    self.modeled_s += out.seconds
                    self.late_s += max(0.0, self.clock() - t0 - out.seconds)
                else:
                    await asyncio.sleep(0)
                out = self._deliver(out)
                if self._on_step is not None:
                    self._on_step(out)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in the core or executor: fail every caller
            # the step (if it raised) is over: /metrics reads the core as it is now, not
            # as it was before that step, for good
            core.step_gauges = None
            log.exception("engine loop stopped")
            self.error = exc
            self._end(f"engine loop stopped: {exc!r}")
