"""How long to wait for a replica's first byte before trying the next one.

A streamed answer's first byte comes with its first token, so a replica that takes far
longer than the fleet's recent first tokens is hung, not busy: the wait is ``factor`` x the
recent 99th percentile of streamed first bytes, scaled up for a prompt longer than the
recent median (its prefill takes longer), never under ``floor_s`` nor over the configured
``first_byte_s``; and the proxy extends it while the replica shows progress. A non-streamed
answer's first byte comes after its last token, which no recent figure bounds; it, and a
stream before any wait is learned, get ``stall_s`` where the replica's scrapes show whether
it is working (``watched``: the proxy then waits on while it is, and leaves a hung replica,
one that passes its health checks but computes nothing, after ``stall_s``), else
``first_byte_s`` itself. A fixed ``stream_first_byte_s`` replaces the learned wait.
"""

from __future__ import annotations

from collections import deque

from gateway.config import TimeoutConfig


class FirstByteDeadline:
    __slots__ = ("_fresh", "_learned", "_median_tokens", "_samples", "_tokens", "config",
                 "factor", "floor_s")

    def __init__(self, config: TimeoutConfig, factor: float = 10.0, floor_s: float = 10.0,
                 window: int = 512) -> None:
        self.config = config
        self.factor = factor
        self.floor_s = floor_s
        self._samples: deque[float] = deque(maxlen=window)
        self._tokens: deque[int] = deque(maxlen=window)
        self._fresh = 0
        self._learned: float | None = None
        self._median_tokens = 1

    def observe(self, seconds: float, tokens: int = 0) -> None:
        """A streamed answer of a ``tokens``-token prompt had its first byte after
        ``seconds``."""
        self._samples.append(seconds)
        self._tokens.append(tokens)
        self._fresh += 1
        if self._fresh >= 32:
            self._fresh = 0
            ordered = sorted(self._samples)
            self._learned = ordered[int(0.99 * (len(ordered) - 1))]
            self._median_tokens = max(1, sorted(self._tokens)[len(self._tokens) // 2])

    def seconds(self, stream: bool, tokens: int = 0, watched: bool = False) -> float:
        """The wait for one try's first byte, for a prompt of ``tokens`` (0: unknown), on
        a replica whose progress its scrapes show (``watched``) or not."""
        cap = self.config.first_byte_s
        unlearned = min(cap, self.config.stall_s) if watched else cap
        if not stream:
            return unlearned
        if self.config.stream_first_byte_s is not None:
            return min(cap, self.config.stream_first_byte_s)
        if self._learned is None:
            return unlearned
        longer = max(1.0, tokens / self._median_tokens)
        return min(cap, max(self.floor_s, self.factor * self._learned * longer))
