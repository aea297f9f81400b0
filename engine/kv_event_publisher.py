"""Publishes the engine's KV events on a ZMQ PUB socket, one message per engine step.

The engine loop only calls :meth:`KVEventPublisher.publish` (a put on an unbounded queue,
never blocking); a daemon thread encodes each batch and sends it with ``NOBLOCK``, so a
slow or absent subscriber never stalls a step (PUB drops messages past its high-water mark;
the sequence number lets a subscriber notice). Frames follow vLLM (see ``kvwire.kv_event_format``)::

    [topic, seq (u64 big-endian, 0, 1, 2, ... per process), msgpack payload]

The socket is created and bound in :meth:`start` (so a bad endpoint fails at startup) and
from then on used only by the sending thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence

import zmq

from kvwire.kv_event_format import KVEvent, KVEventBatch, encode_payload

log = logging.getLogger(__name__)

_STOP = None


class KVEventPublisher:
    def __init__(self, endpoint: str, topic: str = "", *, data_parallel_rank: int = 0,
                 high_water_mark: int = 100_000) -> None:
        if not endpoint:
            raise ValueError("KV events endpoint must not be empty")
        self.endpoint = endpoint
        self.topic = topic.encode()
        self.data_parallel_rank = data_parallel_rank
        self.high_water_mark = high_water_mark
        self.sent = 0
        self.dropped = 0  # batches lost: socket buffer full, unencodable, or sender stopped
        self._queue: queue.SimpleQueue[KVEventBatch | None] = queue.SimpleQueue()
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._sock: zmq.Socket[bytes] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind the PUB socket and start the sending thread; ``zmq.ZMQError`` if the
        endpoint cannot be bound."""
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PUB)
        sock.setsockopt(zmq.SNDHWM, self.high_water_mark)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.bind(self.endpoint)
        except zmq.ZMQError:
            sock.close()
            ctx.term()
            raise
        self._ctx, self._sock = ctx, sock
        self._thread = threading.Thread(target=self._run, name="kv-events-pub", daemon=True)
        self._thread.start()
        log.info("publishing KV events on %s", self.endpoint)

    def publish(self, events: Sequence[KVEvent]) -> None:
        """Queue one step's events (nothing is sent for an empty step). Never blocks."""
        if not events or self._thread is None:
            return
        if not self._thread.is_alive():  # the sender stopped on an error (logged): drop
            self.dropped += 1
            return
        batch = KVEventBatch(time.time(), tuple(events), self.data_parallel_rank)
        self._queue.put(batch)

    def stop(self, timeout: float = 5.0) -> None:
        """Send what is queued, then close the socket."""
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(timeout)
            self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def _run(self) -> None:
        sock = self._sock
        assert sock is not None
        seq = 0
        while (batch := self._queue.get()) is not _STOP:
            try:
                frames = [self.topic, seq.to_bytes(8, "big"), encode_payload(batch)]
                sock.send_multipart(frames, flags=zmq.NOBLOCK)
            except zmq.Again:
                self.dropped += 1
                log.warning("KV event batch %d dropped: socket buffer full", seq)
            except zmq.ZMQError as exc:
                log.error("KV event publisher stopped: %s", exc)
                return
            except Exception:  # an unencodable batch: skip it, keep publishing
                self.dropped += 1
                log.exception("KV event batch %d dropped: could not encode it", seq)
            seq += 1
            self.sent = seq
