"""Publishes the engine's KV events on a ZMQ PUB socket, one message per engine step.

The engine loop only calls :meth:`KVEventPublisher.publish`, which numbers the batch and
puts it on a queue of at most ``max_queued_batches`` (never blocking); a daemon thread
encodes each batch and sends it. A PUB socket never blocks a send nor tells of a loss: past
a subscriber's high-water mark it drops that subscriber's messages silently, so the engine
cannot count those. What it can lose itself it counts (``dropped``, exported as
``kvgate:engine_kv_events_dropped_total``): a batch that found the queue full (the sender
is that far behind), one it could not encode or send (a socket that failed a send sends
nothing more: every later batch is dropped too), or one left when it stopped. A lost batch's
sequence number is never given to another, so a subscriber sees the jump in the numbers
either way, and fills the gap from the replay endpoint where that still holds it. Frames
follow vLLM (see ``kvwire.kv_event_format``)::

    [topic, seq (u64 big-endian, 0, 1, 2, ... per process), msgpack payload]

The socket is created and bound in :meth:`start` (so a bad endpoint fails at startup) and
from then on used only by the sending thread.

With a ``replay_endpoint``, the last ``replay_buffer`` batches are kept and served on a
ROUTER socket there, as vLLM does: a DEALER sends ``[b"", start seq (8 bytes BE)]`` and
gets ``[b"", seq, payload]`` for each kept batch from that one on, then ``[b"", seq -1,
b""]``. A subscriber that saw a sequence number jump fills the gap from it; one that
(re)connects rebuilds from it what the engine still holds. A replay waits for a reader
slower than it (a ROUTER would drop what passes the peer's high-water mark, 1,000
messages, and the end marker with it); one that takes nothing for
``REPLAY_STALL_S``, or leaves, is given up (logged).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence

import zmq

from kvwire.kv_event_format import (
    ENCODINGS,
    REPLAY_END,
    KVEvent,
    KVEventBatch,
    encode_payload,
)

log = logging.getLogger(__name__)

_STOP = None

REPLAY_STALL_S = 10.0  # a replay's reader taking no batch for this long is given up
_REPLAY_SEND_MS = 100  # ... waited for this long at a time, so that a stop ends the wait


class BindError(Exception):
    """An endpoint :meth:`KVEventPublisher.bind` could not bind: ``replay``: the replay
    endpoint (else the PUB one); ``reason``: ZMQ's (``Address already in use``)."""

    def __init__(self, endpoint: str, *, replay: bool, reason: str) -> None:
        super().__init__(f"cannot bind {endpoint}: {reason}")
        self.endpoint = endpoint
        self.replay = replay
        self.reason = reason


class KVEventPublisher:
    def __init__(self, endpoint: str, topic: str = "", *, data_parallel_rank: int = 0,
                 high_water_mark: int = 100_000, replay_endpoint: str | None = None,
                 replay_buffer: int = 10_000, max_queued_batches: int = 10_000,
                 encoding: str = "array") -> None:
        """``max_queued_batches``: how many batches may wait for the sender; one more is
        dropped (counted) rather than held."""
        if not endpoint:
            raise ValueError("KV events endpoint must not be empty")
        if encoding not in ENCODINGS:
            raise ValueError(f"KV events encoding must be one of {ENCODINGS}, got {encoding!r}")
        self.encoding = encoding
        if replay_buffer < 1:
            raise ValueError(f"replay_buffer must be >= 1, got {replay_buffer!r}")
        if max_queued_batches < 1:
            raise ValueError(f"max_queued_batches must be >= 1, got {max_queued_batches!r}")
        self.max_queued_batches = max_queued_batches
        self.replay_endpoint = replay_endpoint
        self._kept: deque[tuple[int, bytes]] = deque(maxlen=replay_buffer)
        self._kept_lock = threading.Lock()
        self._replay_sock: zmq.Socket[bytes] | None = None
        self._replay_thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._abandon = threading.Event()  # stop: the sender drops what it has not sent
        self.replays = 0
        self.endpoint = endpoint
        self.topic = topic.encode()
        self.data_parallel_rank = data_parallel_rank
        self.high_water_mark = high_water_mark
        self.sent = 0  # batches handed to the PUB socket
        # batches lost, counted by the thread that lost them: the engine loop's (the queue
        # full, the sender gone) and the sender's (unencodable, or left at a stop)
        self._dropped_queued = 0
        self._dropped_sending = 0
        self._next_seq = 0  # the engine loop's: the number of the next batch published
        self._dropping = False  # ... and whether the last one found the queue full
        self._failed = False  # the socket failed a send: nothing more is sent
        self._queue: queue.SimpleQueue[tuple[int, KVEventBatch] | None] = queue.SimpleQueue()
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._sock: zmq.Socket[bytes] | None = None
        self._thread: threading.Thread | None = None

    def bind(self) -> None:
        """Bind the PUB socket (and the replay endpoint's ROUTER), once; :class:`BindError`
        naming the endpoint that cannot be bound (in use, its address not this host's),
        every socket closed again. :meth:`start` binds them if this was not called: a
        command line calls it first, to refuse a busy endpoint before it serves."""
        if self._ctx is not None:
            return
        ctx = zmq.Context()
        bound: list[zmq.Socket[bytes]] = []

        def bind(kind: int, endpoint: str) -> zmq.Socket[bytes]:
            sock = ctx.socket(kind)
            sock.setsockopt(zmq.LINGER, 0)
            if kind == zmq.PUB:
                sock.setsockopt(zmq.SNDHWM, self.high_water_mark)
            else:  # a peer at its high-water mark blocks a send (for a while), a gone one
                # fails it, where a ROUTER drops both silently
                sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
                sock.setsockopt(zmq.SNDTIMEO, _REPLAY_SEND_MS)
            try:
                sock.bind(endpoint)
            except zmq.ZMQError as exc:
                for opened in (sock, *bound):
                    opened.close()
                ctx.term()
                # without the address pyzmq appends to its message
                reason = exc.strerror if exc.errno is None else zmq.strerror(exc.errno)
                raise BindError(endpoint, replay=kind != zmq.PUB, reason=reason) from exc
            bound.append(sock)
            return sock

        sock = bind(zmq.PUB, self.endpoint)
        if self.replay_endpoint:
            self._replay_sock = bind(zmq.ROUTER, self.replay_endpoint)
        self._ctx, self._sock = ctx, sock

    def start(self) -> None:
        """Bind the sockets (:meth:`bind`), where not bound yet, and start the sending
        thread and the replay endpoint's."""
        self.bind()
        if self.replay_endpoint:
            self._replay_thread = threading.Thread(target=self._serve_replay,
                                                   name="kv-events-replay", daemon=True)
            self._replay_thread.start()
        self._thread = threading.Thread(target=self._run, name="kv-events-pub", daemon=True)
        self._thread.start()
        log.info("publishing KV events on %s%s", self.endpoint,
                 f" (replay on {self.replay_endpoint})" if self.replay_endpoint else "")

    @property
    def dropped(self) -> int:
        """Batches lost before the socket: the queue full, unencodable, a send failed (that
        one and every later one), or the sender stopped (a PUB socket's own drops past its
        high-water mark cannot be counted)."""
        return self._dropped_queued + self._dropped_sending

    def publish(self, events: Sequence[KVEvent]) -> None:
        """Queue one step's events under the next sequence number (nothing is sent for an
        empty step). Never blocks: with ``max_queued_batches`` waiting already, or the
        sender gone, the batch is dropped and counted, its number left unsent."""
        if not events or self._thread is None:
            return
        seq, self._next_seq = self._next_seq, self._next_seq + 1
        if self._failed or not self._thread.is_alive():  # a send failed (logged): dropped
            self._dropped_queued += 1  # here, not built and queued for the sender to drop
            return
        if self._queue.qsize() >= self.max_queued_batches:
            self._dropped_queued += 1
            if not self._dropping:  # once per run of drops: a slow sender stays slow
                self._dropping = True
                log.warning("KV event batches dropped from %d on: %d wait for the sender "
                            "already", seq, self.max_queued_batches)
            return
        self._dropping = False
        batch = KVEventBatch(time.time(), tuple(events), self.data_parallel_rank)
        self._queue.put((seq, batch))

    def stop(self, timeout: float = 5.0) -> None:
        """Send what is queued within ``timeout``, then close the sockets. A backlog the
        sender has not sent by then is dropped (counted): the sender stops at its next
        batch, and its socket is closed only once it has, since a ZMQ socket is never
        used from two threads; a sender still busy a second later keeps its socket and
        the context, left open (logged)."""
        thread = self._thread
        if thread is not None:
            self._queue.put(_STOP)
            thread.join(timeout)
            if thread.is_alive():
                self._abandon.set()
                thread.join(1.0)
            self._thread = None
        self._stopping.set()
        if thread is not None and thread.is_alive():
            log.warning("KV event publisher: the sender is still busy after %g s; its "
                        "socket is left open", timeout + 1.0)
            return
        if self._replay_thread is not None:
            self._replay_thread.join(timeout)
            self._replay_thread = None
        if self._replay_sock is not None:
            self._replay_sock.close()
            self._replay_sock = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def _run(self) -> None:
        sock = self._sock
        assert sock is not None
        # reads the queue to the stop whatever happens, so that every batch published
        # is sent or counted as dropped
        while (item := self._queue.get()) is not _STOP:
            seq, batch = item
            if self._failed or self._abandon.is_set():  # the socket failed, or stopping
                self._dropped_sending += 1
                continue
            try:
                payload = encode_payload(batch, self.encoding)
            except Exception:  # an unencodable batch: skip it, keep publishing
                self._dropped_sending += 1
                log.exception("KV event batch %d dropped: could not encode it", seq)
                continue
            if self._replay_sock is not None:
                with self._kept_lock:
                    self._kept.append((seq, payload))
            try:
                # never blocks: past a subscriber's high-water mark PUB drops silently
                sock.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
            except zmq.ZMQError as exc:
                self._failed = True
                self._dropped_sending += 1
                log.error("KV event publisher stopped at batch %d: %s; it and every later "
                          "batch are dropped (counted)", seq, exc)
                continue
            self.sent += 1

    def _serve_replay(self) -> None:
        sock = self._replay_sock
        assert sock is not None
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        while not self._stopping.is_set():
            try:
                if not poller.poll(100):
                    continue
                frames = sock.recv_multipart()
                if len(frames) != 3 or len(frames[2]) != 8:
                    log.warning("KV event replay: malformed request of %d frames", len(frames))
                    continue
                peer, start = frames[0], int.from_bytes(frames[2], "big")
                with self._kept_lock:
                    kept = [item for item in self._kept if item[0] >= start]
                for sent, (seq, payload) in enumerate(kept):
                    if not self._send_replay(sock, [peer, b"", seq.to_bytes(8, "big"),
                                                    payload], sent, len(kept)):
                        break
                else:
                    if self._send_replay(sock, [peer, b"", REPLAY_END, b""], len(kept),
                                         len(kept)):
                        self.replays += 1
            except zmq.ZMQError as exc:
                if not self._stopping.is_set():
                    log.error("KV event replay stopped: %s", exc)
                return

    def _send_replay(self, sock: zmq.Socket[bytes], frames: list[bytes], sent: int,
                     total: int) -> bool:
        """Send one replay message, waiting while its peer reads slower; False (logged)
        when the peer left, took nothing for ``REPLAY_STALL_S``, or the publisher stops."""
        deadline = time.monotonic() + REPLAY_STALL_S
        while not self._stopping.is_set():
            try:
                sock.send_multipart(frames)
                return True
            except zmq.Again:
                if time.monotonic() < deadline:
                    continue
                log.warning("KV event replay given up after %d of %d batches: its reader "
                            "took none for %g s", sent, total, REPLAY_STALL_S)
                return False
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EHOSTUNREACH:
                    raise
                log.warning("KV event replay given up after %d of %d batches: its reader "
                            "left", sent, total)
                return False
        return False
