"""Routes told between the worker processes of one box (``serve --workers N``).

A policy learns from the requests it routes: ``cost``'s frequency sketch and cache model,
prefix_affinity's key depth, the common prefix. Each worker used to learn from its own
share of the box's traffic only, as unpeered gateway copies do, and lost what such copies
lose (offline, ``loadtests.simulate --scenario contracts-400 --requests 6000 --gateways 2``:
0.664 token hit rate and p95 0.72 s against one copy's 0.706 and 0.43 s). Now each worker
sends every route it makes to the others, in the frame peers send each other
(``peer_wire.routed_frame``: the prompt's piece hashes, never its text), and their policies
learn from it as from their own. Pending load needs no telling: the workers share it in
memory (``shared_load``). A route from a peer (another box) reaches the worker whose link
received it, which passes it on to the others (``Peers.forward``).

Transport: one Unix ``SOCK_SEQPACKET`` socket pair per worker, made by the supervisor before
it starts them (``route_pair``). Worker ``i`` reads its own pair's first end; every other worker
holds the second and sends to it. A message arrives whole or not at all, and sending never
blocks: a worker whose buffer is full (stalled) misses the route, counted in ``dropped``.
Nothing leaves the box, and only the supervisor's children hold the sockets.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
from collections.abc import Sequence

from gateway.peer_wire import (
    HEAD_BYTES,
    MAX_FRAME,
    RoutedElsewhere,
    WireError,
    frame_length,
    parse_frame,
    routed_frame,
)
from policies.base import Policy, Routed, RouteRequest

log = logging.getLogger("kvgate.workers")

DROPPED_LOG_S = 60.0  # at most one warning of dropped routes per this many seconds


def route_pair() -> tuple[socket.socket, socket.socket]:
    """A worker's (inbox, the others' outbox) pair of connected sockets."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


class WorkerRoutes:
    """One worker's end: ``routed`` tells the others; what they tell reaches ``policy``."""

    def __init__(self, inbox: socket.socket, outboxes: Sequence[socket.socket],
                 policy: Policy) -> None:
        self.inbox = inbox
        self.outboxes = list(outboxes)
        self.policy = policy
        self.sent = self.received = self.dropped = self.malformed = 0
        self._warned = (-DROPPED_LOG_S, 0)  # (logged at, dropped then)
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Read the inbox on the running loop."""
        self._loop = asyncio.get_running_loop()
        self.inbox.setblocking(False)
        for out in self.outboxes:
            out.setblocking(False)
        self._loop.add_reader(self.inbox.fileno(), self._read)

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self.inbox.fileno())
            self._loop = None
        for sock in (self.inbox, *self.outboxes):
            sock.close()

    def routed(self, request: RouteRequest, replica: str) -> None:
        """This worker sends ``request`` to ``replica`` (its policy observed ``Routed``)."""
        if not self.outboxes:
            return
        try:
            frame = routed_frame(request, replica)
        except WireError as exc:
            log.debug("not told to the other workers: %s", exc)
            return
        for out in self.outboxes:
            try:
                out.send(frame)
            except OSError:  # full (a stalled worker), or gone (the box is stopping)
                self.dropped += 1
            else:
                self.sent += 1
        if self.dropped != self._warned[1]:
            self._warn_dropped()

    def _warn_dropped(self) -> None:
        now = time.monotonic()
        at, before = self._warned
        if now - at >= DROPPED_LOG_S:
            log.warning("%d routes not told to the other workers (their buffers were full)",
                        self.dropped - before)
            self._warned = (now, self.dropped)

    def _read(self) -> None:
        """Every message waiting in the inbox, each a routed frame."""
        now = time.monotonic()
        while True:
            try:
                message = self.inbox.recv(HEAD_BYTES + MAX_FRAME)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # the inbox is gone: the box is stopping
                log.debug("worker routes: %s", exc)
                return
            if not message:
                return
            try:
                length, kind = frame_length(message[:HEAD_BYTES])
                body = message[HEAD_BYTES:]
                if len(body) != length:
                    raise WireError(f"a {len(body)}-byte body, its head says {length}")
                frame = parse_frame(kind, body, now)
            except (WireError, ValueError, struct.error) as exc:
                self.malformed += 1
                log.debug("a malformed route from another worker: %s", exc)
                continue
            if isinstance(frame, RoutedElsewhere):
                self.received += 1
                self.policy.observe(Routed(frame.request, frame.replica))
