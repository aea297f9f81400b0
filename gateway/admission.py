"""Admission control: at most ``max_in_flight`` requests answered at once, an optional
bounded wait for a place, and 429 with ``Retry-After`` for the rest (``LimitsConfig``);
the bytes of request bodies being received (``bodies``), which are read before a request
takes a place; and the bytes of the bodies received whole, held by their requests until
each one's answer ends (``held_bodies``: ``hold_body`` and ``let_go``).

A request holds a ``Slot`` from admission until its answer ends (relayed, failed or
abandoned); ``Slot.release`` is idempotent, so every way out may call it. Waiters get
places first come, first served; one that gives up (timeout, client gone) is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

from gateway.config import LimitsConfig
from kvwire.openai_schema import OpenAIError, TooManyRequests
from kvwire.request_edge import HeldBodyBytes

# the bytes of its body a request holds (``Admission.hold_body``), in its ASGI scope
HELD_BODY = "kvgate.held_body_bytes"


class Slot:
    __slots__ = ("_admission", "_held", "_since", "waited")

    def __init__(self, admission: Admission, waited: bool = False) -> None:
        self._admission = admission
        self._held = True
        self._since = time.monotonic()
        self.waited = waited  # it waited for a place (its client may have left meanwhile)

    def release(self) -> None:
        if self._held:
            self._held = False
            self._admission._leave(time.monotonic() - self._since)


class Admission:
    def __init__(self, limits: LimitsConfig) -> None:
        self.limits = limits
        self.bodies = HeldBodyBytes(limits.max_receiving_bytes, server="gateway",
                                    setting="limits.max_receiving_bytes")
        self.held_bodies = HeldBodyBytes(limits.max_held_body_bytes, server="gateway",
                                         setting="limits.max_held_body_bytes")
        self.in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()  # and some given up
        self.waiting = 0  # requests waiting that no place was handed to yet
        self._mean_s = 1.0  # recent mean time a slot is held

    def hold_body(self, scope: MutableMapping[str, Any], size: int) -> None:
        """Count the ``size`` bytes of a request's body, read whole, as held until its
        answer ends (``let_go``, called once the app's call for ``scope`` returns, however
        it ends); TooManyRequests naming ``limits.max_held_body_bytes`` past it. A body
        already held (``/invocations`` reads it again to serve it) is not counted twice."""
        if HELD_BODY not in scope:
            self.held_bodies.take(size)
            scope[HELD_BODY] = size

    def let_go(self, scope: MutableMapping[str, Any]) -> None:
        """The body ``scope``'s request held (if any) is no longer held: its answer ended."""
        size = scope.pop(HELD_BODY, 0)
        if size:
            self.held_bodies.give(size)

    def retry_after_s(self) -> int:
        """Seconds until a place is likely free for one more request, at least 1."""
        ahead = self.waiting + 1
        return max(1, math.ceil(self._mean_s * ahead / self.limits.max_in_flight))

    def enter_now(self) -> Slot | None:
        """A place at once, if one is free and nobody waits for it; else None."""
        if self._free():
            self.in_flight += 1
            return Slot(self)
        return None

    def _free(self) -> bool:
        """Whether a place is free for a request arriving now (and nobody waits for one)."""
        return self.in_flight < self.limits.max_in_flight and not self.waiting

    def check_room(self) -> None:
        """TooManyRequests when a request arriving now would be refused at once (no place
        free, and no room to wait for one): called once its body is read, before anything
        is done with it (``intake.read_timed_body``), so that a refusal costs no decoding."""
        if not self._free() and self.waiting >= self.limits.max_pending:
            raise self._refusal()

    async def enter(self) -> Slot:
        """A place, now or after a bounded wait; TooManyRequests otherwise."""
        limits = self.limits
        slot = self.enter_now()
        if slot is not None:
            return slot
        if self.waiting >= limits.max_pending:
            raise self._refusal()
        if len(self._waiters) > 2 * limits.max_pending + 16:  # drop those who gave up
            self._waiters = deque(w for w in self._waiters if not w.done())
        place: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(place)
        self.waiting += 1
        try:
            async with asyncio.timeout(limits.max_pending_s):
                await place  # _leave hands its place over: in_flight is unchanged
        except BaseException as exc:
            if place.done() and not place.cancelled():
                self._leave(None)  # handed a place just as it gave up: pass it on
            else:
                place.cancel()
                self.waiting -= 1
            if isinstance(exc, TimeoutError):
                raise self._refusal() from None
            raise
        return Slot(self, waited=True)

    def _refusal(self) -> TooManyRequests:
        after = self.retry_after_s()
        return TooManyRequests(
            f"the gateway is at its limit of {self.limits.max_in_flight} requests in flight "
            f"with {self.waiting} waiting; retry after {after} s",
            code="gateway_overloaded", headers={"Retry-After": str(after)})

    def _leave(self, held_s: float | None) -> None:
        if held_s is not None:
            self._mean_s += (held_s - self._mean_s) * 0.05
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                # it waits no more, though it resumes later: counted until then, it kept
                # a place freed meanwhile from the next request, which queued behind it
                # with no slot's end to wake it for that place (a place lost for as long
                # as requests kept waiting)
                waiter.set_result(None)
                self.waiting -= 1
                return
        self.in_flight -= 1


@contextlib.contextmanager
def released_on_error(slot: Slot, count: Callable[[str], None]) -> Iterator[None]:
    """Release ``slot`` when the block raises (its answer will never end it); an error the
    client gets is counted with its status: a fault of the gateway's own as the 500 it
    answers (``ErrorBoundary``)."""
    try:
        yield
    except OpenAIError as exc:
        slot.release()
        count(str(exc.status))
        raise
    except Exception:
        slot.release()
        count("500")
        raise
    except BaseException:
        slot.release()
        raise
