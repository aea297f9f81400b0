"""An idle timeout for a relay loop that costs one timer per answer, not one per chunk.

``asyncio.timeout`` around each read schedules and cancels a timer for every chunk of a
stream, a measurable share of relaying one. ``IdleWatch`` arms one timer; each read marks
when it began waiting; when the timer fires it re-arms itself for the current wait's
deadline, and only cancels the task when a wait has really lasted ``idle_s``.
"""

from __future__ import annotations

import asyncio


class IdleWatch:
    """Cancels the current task when one ``waiting()`` lasts ``idle_s`` (``fired`` then
    says why it was cancelled; ``absorbed`` when the task goes on to wait again). ``stop``
    before leaving the loop."""

    __slots__ = ("_handle", "_loop", "_task", "fired", "idle_s", "since")

    def __init__(self, idle_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self.idle_s = idle_s
        self.since: float | None = None  # when the current wait began; None: not waiting
        self.fired = False
        self._handle = self._loop.call_at(self._loop.time() + idle_s, self._check)

    def waiting(self, waited_s: float = 0.0) -> None:
        """A read begins; ``waited_s``: its wait counts that long already (the quiet time
        of reads before it), and the timer is brought forward where its deadline is
        earlier than the timer's time."""
        since = self._loop.time()
        if waited_s and not self.fired:
            since -= waited_s
            due = since + self.idle_s
            if due < self._handle.when():
                self._handle.cancel()
                self._handle = self._loop.call_at(due, self._check)
        self.since = since

    def got(self) -> None:
        """The read returned."""
        self.since = None

    def _check(self) -> None:
        now = self._loop.time()
        if self.since is not None and now >= self.since + self.idle_s:
            self.fired = True
            self._task.cancel()
            return
        due = now + self.idle_s if self.since is None else self.since + self.idle_s
        self._handle = self._loop.call_at(due, self._check)

    def fire(self) -> None:
        """Cancel the task now, as a wait that lasted ``idle_s`` does (``fired``)."""
        if not self.fired:
            self.fired = True
            self._task.cancel()

    def absorbed(self) -> None:
        """The task took the cancel back and goes on: the waits after it are watched again
        (``fired`` is cleared)."""
        self.fired = False
        self.since = None
        self._handle.cancel()  # (one ``fire`` left scheduled)
        self._handle = self._loop.call_at(self._loop.time() + self.idle_s, self._check)

    def stop(self) -> None:
        self._handle.cancel()
