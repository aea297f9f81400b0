"""Admission control: at most ``max_in_flight`` requests answered at once, an optional
bounded wait for a place, and 429 with ``Retry-After`` for the rest (``LimitsConfig``);
the bytes of request bodies being received (``bodies``), which are read before a request
takes a place; and the bytes of the bodies received whole, held by their requests until
each one's answer ends (``held_bodies``: ``hold_body`` and ``let_go``).

A request holds a ``Slot`` from admission until its answer ends (relayed, failed or
abandoned); ``Slot.release`` is idempotent, so every way out may call it. Places and
waiting slots are shared fairly between tenants (``Admission``); a waiter that gives up
(timeout, client gone) is skipped. ``TenantCount``, ``busiest``: what each tenant holds and
waits for, the busiest first, for the admin API (``/admin/top``), never for ``/metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from typing import Any, NamedTuple

from gateway.config import LimitsConfig
from kvwire.openai_schema import OpenAIError, TooManyRequests
from kvwire.request_edge import HeldBodyBytes

# the bytes of its body a request holds (``Admission.hold_body``), in its ASGI scope
HELD_BODY = "kvgate.held_body_bytes"
# a waiter's future: the ``clock`` reading when a place was handed to it, or None when
# another tenant took its waiting slot (``Admission._bump``)
Place = asyncio.Future[float | None]
# the tenants ``/admin/top`` names (the busiest), the rest summed: its answer stays bounded
SHOWN_TENANTS = 50
# the queue of a tenant none of whose requests waits (never appended to)
_NO_WAITERS: deque[tuple[int, Place]] = deque(maxlen=0)


class TenantShare:
    """What one tenant (None: the untenanted) holds of admission: ``held`` places
    (counting one handed to a waiter not yet resumed) and ``waiting`` requests no place
    was handed to yet; ``queue``: its waiters, oldest first, each with its arrival
    number (some given up), made when it first waits. Kept while it holds or waits
    (``Admission.shares``)."""

    __slots__ = ("held", "queue", "tenant", "waiting")

    def __init__(self, tenant: str | None, held: int = 0) -> None:
        self.tenant = tenant
        self.held = held
        self.waiting = 0
        self.queue: deque[tuple[int, Place]] = _NO_WAITERS


class TenantCount(NamedTuple):
    """What one tenant (None: requests of no tenant) has of admission now: requests
    holding a place, and requests waiting for one."""

    tenant: str | None
    in_flight: int
    waiting: int


class BusiestTenants(NamedTuple):
    """The ``shown`` busiest tenants (the most requests in flight and waiting first),
    and the rest together: how many tenants, and their requests in flight and waiting."""

    shown: list[TenantCount]
    more_tenants: int
    more_in_flight: int
    more_waiting: int

    def as_json(self) -> dict[str, Any]:
        return {"tenants": [c._asdict() for c in self.shown],
                "tenants_more": {"tenants": self.more_tenants,
                                 "in_flight": self.more_in_flight,
                                 "waiting": self.more_waiting}}


def _busy(count: TenantCount) -> tuple[int, int, bool, str]:
    """Sorts the busiest first: the most requests, then the most in flight, then by
    name, requests of no tenant last on a tie."""
    return (-count.in_flight - count.waiting, -count.in_flight, count.tenant is None,
            count.tenant or "")


def added_up(counts: Iterable[TenantCount]) -> list[TenantCount]:
    """``counts`` (several of a tenant: one per worker process) summed per tenant."""
    sums: dict[str | None, tuple[int, int]] = {}
    for tenant, in_flight, waiting in counts:
        held, waits = sums.get(tenant, (0, 0))
        sums[tenant] = (held + in_flight, waits + waiting)
    return [TenantCount(tenant, held, waits) for tenant, (held, waits) in sums.items()]


def busiest(counts: Iterable[TenantCount], limit: int) -> BusiestTenants:
    """The ``limit`` busiest of ``counts`` (one per tenant), and the rest together."""
    ranked = sorted(counts, key=_busy)
    rest = ranked[limit:]
    return BusiestTenants(ranked[:limit], len(rest), sum(c.in_flight for c in rest),
                          sum(c.waiting for c in rest))


class Slot:
    __slots__ = ("_admission", "_held", "_since", "tenant", "waited")

    def __init__(self, admission: Admission, tenant: str | None, since: float,
                 waited: bool = False) -> None:
        self._admission = admission
        self._held = True
        self._since = since  # when its place was taken (``Admission.clock``)
        self.tenant = tenant
        self.waited = waited  # it waited for a place (its client may have left meanwhile)

    def release(self) -> None:
        if self._held:
            self._held = False
            admission = self._admission
            admission._mean_s += (admission.clock() - self._since - admission._mean_s) * 0.05
            admission._pass_on(self.tenant, self._since)


class Admission:
    """Places shared between tenants: a request takes a free place at once while nobody
    waits (any tenant, even one alone, may hold every place); a place freed while
    requests wait goes to the waiter whose tenant holds the fewest places, the longest
    waiting of them on a tie, so a tenant over its share (``max_in_flight`` over the
    tenants holding or waiting) waits behind the others' requests; and the
    ``max_pending`` waiting slots are shared too: when they are all taken, a tenant
    waiting for fewer than its share of them (``max_pending`` over the tenants holding
    or waiting) takes the slot of the newest waiter of the tenant waiting for the most,
    over its share, which is refused 429. ``shares``: each tenant's counts."""

    def __init__(self, limits: LimitsConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.clock = clock
        self.bodies = HeldBodyBytes(limits.max_receiving_bytes, server="gateway",
                                    setting="limits.max_receiving_bytes")
        self.held_bodies = HeldBodyBytes(limits.max_held_body_bytes, server="gateway",
                                         setting="limits.max_held_body_bytes")
        self.in_flight = 0
        self.waiting = 0  # requests waiting that no place was handed to yet
        # the tenants holding a place or waiting for one, by tenant (None: untenanted)
        self.shares: dict[str | None, TenantShare] = {}
        self._waiting: dict[str | None, TenantShare] = {}  # those of them waiting
        self._arrivals = itertools.count()  # waiters' arrival order
        self._mean_s = 1.0  # recent mean time a slot is held (of those ended)
        self._since_sum = 0.0  # the sum of the ``clock`` readings when places were taken

    def tenant_counts(self) -> list[TenantCount]:
        """Each tenant holding a place or waiting for one: its requests in flight (a place
        handed to a waiter not yet resumed counted as held, as in ``in_flight``) and
        waiting. Read from ``shares``, which admission keeps anyway: nothing is counted
        for it on the request path."""
        return [TenantCount(share.tenant, share.held, share.waiting)
                for share in self.shares.values()]

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
        """Seconds until a place is likely free for one more request, at least 1: the
        requests waiting and this one, at the rate places free, each held as long as the
        recent ones held theirs, or as long as those held now have held theirs so far
        when that is longer (long answers, few of them ended yet)."""
        held_s = self._mean_s
        if self.in_flight:
            held_s = max(held_s, self.clock() - self._since_sum / self.in_flight)
        ahead = self.waiting + 1
        return max(1, math.ceil(held_s * ahead / self.limits.max_in_flight))

    def enter_now(self, tenant: str | None = None) -> Slot | None:
        """A place for ``tenant`` at once, if one is free and nobody waits for it; else
        None."""
        if self.in_flight < self.limits.max_in_flight and not self.waiting:
            self.in_flight += 1
            share = self.shares.get(tenant)
            if share is None:
                self.shares[tenant] = TenantShare(tenant, 1)
            else:
                share.held += 1
            now = self.clock()
            self._since_sum += now
            return Slot(self, tenant, now)
        return None

    def check_room(self, tenant: str | None = None) -> None:
        """TooManyRequests when a request of ``tenant`` arriving now would be refused at
        once (no place free, and no waiting slot for it): called once its body is read,
        before anything is done with it (``intake.read_timed_body``), so that a refusal
        costs no decoding."""
        if (self.in_flight >= self.limits.max_in_flight or self.waiting) \
                and self.waiting >= self.limits.max_pending \
                and self._bumped(tenant) is None:
            raise self._refusal(tenant)

    async def enter(self, tenant: str | None = None) -> Slot:
        """A place for ``tenant``, now or after a bounded wait; TooManyRequests otherwise
        (also when a tenant waiting for fewer slots than its share takes this one's)."""
        limits = self.limits
        slot = self.enter_now(tenant)
        if slot is not None:
            return slot
        if self.waiting >= limits.max_pending:
            bumped = self._bumped(tenant)
            if bumped is None:
                raise self._refusal(tenant)
            self._bump(bumped)
        share = self.shares.get(tenant)
        if share is None:
            share = self.shares[tenant] = TenantShare(tenant)
        queue = share.queue
        if queue is _NO_WAITERS or len(queue) > 2 * share.waiting + 16:  # (some gave up)
            share.queue = queue = deque(w for w in queue if not w[1].done())
        place: Place = asyncio.get_running_loop().create_future()
        queue.append((next(self._arrivals), place))
        share.waiting += 1
        self._waiting[tenant] = share
        self.waiting += 1
        try:
            async with asyncio.timeout(limits.max_pending_s):
                # when ``_pass_on`` handed it a place (``in_flight`` unchanged), or None:
                # another tenant took its waiting slot (``_bump``)
                since = await place
        except BaseException as exc:
            if place.done() and not place.cancelled():
                handed = place.result()
                if handed is not None:  # handed a place just as it gave up: pass it on
                    self._pass_on(tenant, handed)
            else:
                place.cancel()
                self._stop_waiting(share)
            if isinstance(exc, TimeoutError):
                raise self._refusal(tenant) from None
            raise
        if since is None:
            raise self._refusal(tenant)
        return Slot(self, tenant, since, waited=True)

    def _pending_share(self, tenant: str | None) -> int:
        """Of the ``max_pending`` waiting slots, how many ``tenant`` may have while every
        one is taken: an equal share between the tenants holding or waiting, ``tenant``
        among them, at least 1."""
        tenants = len(self.shares) + (tenant not in self.shares)
        return max(1, self.limits.max_pending // tenants)

    def _bumped(self, tenant: str | None) -> TenantShare | None:
        """The tenant whose newest waiter gives its waiting slot up to a request of
        ``tenant`` while every slot is taken: the one waiting for the most (holding the
        most places on a tie), when ``tenant`` waits for fewer than its share and that
        one for more; else None (the request is refused). Unfair only between several
        tenants: one waiting alone is never bumped."""
        if not self.limits.max_pending or not self._waiting \
                or (len(self._waiting) == 1 and tenant in self._waiting):
            return None
        share = self._pending_share(tenant)
        mine = self._waiting.get(tenant)
        if mine is not None and mine.waiting >= share:
            return None
        most = max(self._waiting.values(), key=lambda s: (s.waiting, s.held))
        return most if most.waiting > share else None

    def _bump(self, share: TenantShare) -> None:
        """Refuse ``share``'s newest waiter (429): its waiting slot is another's."""
        queue = share.queue
        while True:
            _, place = queue.pop()
            if not place.done():
                place.set_result(None)
                break
        self._stop_waiting(share)

    def _stop_waiting(self, share: TenantShare) -> None:
        """One of ``share``'s waiters waits no more, handed no place."""
        self.waiting -= 1
        share.waiting -= 1
        if not share.waiting:
            share.queue = _NO_WAITERS  # only those who gave up are left
            del self._waiting[share.tenant]
            if not share.held:
                del self.shares[share.tenant]

    def _refusal(self, tenant: str | None) -> TooManyRequests:
        after = self.retry_after_s()
        mine = self.shares.get(tenant)
        of_tenant = ""
        if tenant is not None and len(self.shares) > 1 and mine is not None:
            of_tenant = (f" (tenant {tenant!r} holds {mine.held} places and waits for "
                         f"{mine.waiting} more)")
        return TooManyRequests(
            f"the gateway is at its limit of {self.limits.max_in_flight} requests in flight "
            f"with {self.waiting} waiting{of_tenant}; retry after {after} s",
            code="gateway_overloaded", headers={"Retry-After": str(after)})

    def _pass_on(self, tenant: str | None, since: float) -> None:
        """``tenant`` gives up a place taken at ``since`` (``clock``): to the waiter
        whose tenant holds the fewest places (``_hand_over``), else it is free."""
        share = self.shares[tenant]
        share.held -= 1
        if self.waiting:
            self._since_sum -= since
            self._hand_over()
        else:
            self.in_flight -= 1
            self._since_sum = self._since_sum - since if self.in_flight else 0.0
        if not share.held and not share.waiting:
            del self.shares[tenant]

    def _hand_over(self) -> None:
        """A place given up while requests wait goes to the waiter whose tenant holds
        the fewest places, the longest waiting of them on a tie."""
        # it waits no more, though it resumes later: counted until then, it kept a place
        # freed meanwhile from the next request, which queued behind it with no slot's
        # end to wake it for that place (a place lost for as long as requests kept
        # waiting)
        best: tuple[int, int] | None = None
        for waiter in self._waiting.values():  # one per tenant waiting
            queue = waiter.queue
            while queue[0][1].done():  # given up
                queue.popleft()
            rank = (waiter.held, queue[0][0])
            if best is None or rank < best:
                best, chosen = rank, waiter
        now = self.clock()
        self._since_sum += now
        chosen.queue.popleft()[1].set_result(now)
        chosen.held += 1
        self._stop_waiting(chosen)


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
