"""Decode slots: how long a new request waits for a place in a replica's running batch.

An engine runs at most ``max_num_seqs`` sequences at once (vLLM, SGLang and kvgate's
engine alike); past that, a new request waits in line until one finishes, however short
its prompt. With long answers that wait, not prefill, is the tail of time to first token,
and a replica with an empty prefill queue is not free.

Neither engine exports its slot count, so it is learned per replica: the most sequences
ever seen running, once ``confirm`` (2) scrapes showed others waiting at that count. Each
scrape counts once, however many decisions read it: when eight reads were needed instead,
a limit took two seconds at the decisions' four reads of the views a second, and one
scrape read often enough could set it alone. (Views with no scrape number, the
simulator's exact ones, count each read as a scrape of its own.) Waiting requests are no
slot limit where:

- none ran: requests just came in;
- half or more of the running ones were still in prefill (this gateway's requests there
  without a first byte, beyond the waiting ones: ``ReplicaView.prefilling``): the wait is
  for that prefill, or for prefill budget or KV, which a replica runs short of at any
  count. With most of them decoding, requests waiting is the batch being full: a busy
  fleet whose prompts share a cached prefix has a request or two in prefill at almost
  every scrape, and when none was allowed its replicas were never seen full, their slot
  wait never counted (offline, LRU engines, p95 / p99: few-shot 0.609 / 0.910 -> 0.515 /
  0.814 s; chat-apps, seeds 0-2, 0.402 / 0.352 / 0.343 -> 0.319 / 0.345 / 0.345 s and
  0.862 / 0.997 / 0.922 -> 0.757 / 0.892 / 0.888 s; system-prompt 0.485 -> 0.474 s;
  contracts-400, contracts, rag, chat and tools unchanged);
- one request waited, in a scrape that followed none showing requests waiting at that
  count: an engine takes in a request that arrives during a step at the next step, so a
  scrape catches one waiting now and then, at any count.

A replica busy with long prefills of one-off prompts, two at a time, was taken for one of
two slots on such waits; the limit steered its share of traffic away, and with it any
chance to see more run there. How
long a slot is held is learned fleet-wide from finished requests: this gateway's, from the
end of their prefill (first token) to their last byte, plus their own prefill; and every
sender's, from each scrape of a replica that exports vLLM's
``request_inference_time_seconds`` (``ReplicaView.slot_hold_s``: the mean of the requests
that finished since the scrape before), so a gateway started or restarted in front of a
busy fleet knows it within a scrape, not after its own first answers end (long ones, tens
of seconds). With ``n`` requests in
flight on a replica (this gateway's now, and other senders' as last scraped:
``ReplicaView.others_in_flight``) of ``s`` slots that each hold a slot ``d`` seconds, the
``n - s + 1``-th finish, which frees this request's slot, comes after about ``(n - s + 1)
x d / s`` seconds.

A replica not yet seen full counts the most slots learned on any other (``slots``), unless
it was seen running more than that: a fleet's replicas run alike more often than not, and
each one learned alone took seconds after the first (a gateway starting in front of a busy
fleet, or restarted: on ``system-prompt`` offline one replica's slots were known 3 s in and
a sixth's 15 s in, and until then each took requests past its slots while others had
room). The most, not the fewest: a replica of a larger kind is charged a wait only past
what the largest seen ran, and once it runs more it is judged by its own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from policies.base import ReplicaView


class DecodeSlots:
    """Per replica slot limits and the fleet's mean slot holding time."""

    __slots__ = ("_capped", "_full_at", "_held_at", "_hold_s", "_limits", "_most", "_prior",
                 "_samples", "alpha", "confirm")

    def __init__(self, alpha: float = 0.02, confirm: int = 2) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        if confirm < 1:
            raise ValueError(f"confirm must be >= 1, got {confirm!r}")
        self.alpha = alpha
        self.confirm = confirm
        self._most: dict[str, int] = {}  # the most sequences seen running
        # scrapes (reads, where unnumbered) that showed others waiting at that count
        self._capped: dict[str, int] = {}
        self._limits: dict[str, int] = {}  # the confirmed ones
        self._prior = 0  # the most of them: a count for replicas not yet seen full
        # the first and last of the latest run of scrapes seen full, one after the other
        self._full_at: dict[str, tuple[int, int]] = {}
        self._hold_s = 0.0
        self._held_at: dict[str, int] = {}  # the scrape whose slot_hold_s was last read
        self._samples = 0

    def saw(self, replica: str, running: int, waiting: int, prefilling: int = 0,
            scrape: int = 0) -> None:
        """A scrape: ``running`` sequences ran while ``waiting`` others waited,
        ``prefilling`` of the running ones not through their prefill. ``scrape``: its
        sequence number (0: unknown, each call counts as one that followed another
        showing the same)."""
        most = self._most.get(replica, 0)
        if running > most:
            self._most[replica] = most = running
            self._capped.pop(replica, None)
            self._full_at.pop(replica, None)
            if self._limits.pop(replica, None) is not None:
                self._prior = max(self._limits.values(), default=0)
        # none running: requests just came in; half or more in prefill: the wait is theirs
        if not (waiting > 0 and running == most > 0 and 2 * prefilling < running):
            return
        if scrape:
            first, last = self._full_at.get(replica, (0, -1))  # (scrapes count from 1)
            if scrape == last:  # counted already: read again by a later decision
                return
            if scrape != last + 1:
                first = scrape  # a new run of full scrapes
            self._full_at[replica] = (first, scrape)
            # one scrape alone may catch a request that came in during a step, to run at
            # the next: for one waiting, the one before must have shown requests waiting
            # at the most too (two or more that came in during one step are rare)
            if waiting == 1 and scrape == first:
                return
        seen = self._capped[replica] = self._capped.get(replica, 0) + 1
        if seen >= self.confirm:
            self._limits[replica] = most
            if most > self._prior:
                self._prior = most

    def saw_all(self, views: Iterable[ReplicaView]) -> None:
        """``saw`` for every view (a decision's scraped gauges)."""
        most, saw, held_at = self._most, self.saw, self._held_at
        for r in views:
            if r.waiting > 0 or r.running > most.get(r.id, 0):
                saw(r.id, r.running, r.waiting, r.prefilling, r.scrape_seq)
            if r.slot_hold_s is not None and held_at.get(r.id) != r.scrape_seq:
                held_at[r.id] = r.scrape_seq
                self.held(r.slot_hold_s)

    def held(self, seconds: float) -> None:
        """One finished request held a slot for ``seconds``."""
        if not seconds >= 0 or math.isinf(seconds):
            return
        self._samples += 1
        rate = max(self.alpha, 1.0 / self._samples)  # a plain mean until 1/alpha samples
        self._hold_s += (seconds - self._hold_s) * rate

    def forget(self, replica: str) -> None:
        self._most.pop(replica, None)
        self._full_at.pop(replica, None)
        self._capped.pop(replica, None)
        self._held_at.pop(replica, None)
        if self._limits.pop(replica, None) is not None:  # the prior may go with it
            self._prior = max(self._limits.values(), default=0)

    def limit(self, replica: str) -> int | None:
        """The replica's learned slot count (None until it was seen full)."""
        return self._limits.get(replica)

    @property
    def prior(self) -> int:
        """The most slots learned on any replica: the count of one not yet seen full
        (0: none learned)."""
        return self._prior

    def slots(self, replica: str) -> int:
        """The slot count ``replica`` is judged by: its own, else the most learned on
        any other unless it ran more than that (0: none)."""
        own = self._limits.get(replica)
        if own:
            return own
        prior = self._prior
        return prior if self._most.get(replica, 0) <= prior else 0

    @property
    def blind(self) -> bool:
        """Whether nothing is known of any replica's slots yet: no slot count learned and
        no request's hold seen (a gateway just started, or restarted)."""
        return not self._prior and self._samples == 0

    @property
    def known(self) -> bool:
        """Whether any wait can be above 0: a slot limit and a holding time are known."""
        return bool(self._limits) and self._samples > 0

    @property
    def hold_s(self) -> float:
        return self._hold_s

    def wait_s(self, replica: str, in_flight: int) -> float:
        """Seconds before a slot frees for one more request, with ``in_flight`` there."""
        slots = self.slots(replica)
        if not slots or in_flight < slots or self._samples == 0:
            return 0.0
        return (in_flight - slots + 1) * self._hold_s / slots
