"""A decayed count-min sketch: how often a prefix key was seen lately, in fixed memory.

``depth`` rows of ``width`` u32 counters. A 64-bit key picks one counter per row from its
own bits (keys are already uniform hashes), ``add`` increments those counters, and
``estimate`` is the smallest of them. Every ``window`` adds, every counter is halved (as
TinyLFU does), so a key's count is a decayed count: what it got in the last window, plus
half of the window before, and so on.

Error bound (Cormode and Muthukrishnan): the estimate is never below the key's decayed
count, and it exceeds it by more than ``e / width x total`` (``total``: the decayed sum of
all adds) with probability at most ``exp(-depth)``.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence

import numpy as np

_MIX = 0x9E3779B97F4A7C15  # golden-ratio multiplier: spreads rows that share key bits
_MASK64 = (1 << 64) - 1


class FrequencySketch:
    """Decayed counts of 64-bit keys; see the module docstring."""

    __slots__ = ("_adds", "_counts", "_four", "_pairs", "_view", "depth", "halvings", "mask",
                 "total", "width", "window")

    def __init__(self, width: int = 1 << 16, depth: int = 4, window: int = 4096) -> None:
        if width < 2 or width & (width - 1):
            raise ValueError(f"width must be a power of two >= 2, got {width!r}")
        if not 1 <= depth <= 8:
            raise ValueError(f"depth must be in [1, 8], got {depth!r}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        self.width = width
        self.depth = depth
        self.mask = width - 1
        self.window = window
        self._counts = array("I", bytes(4 * width * depth))
        self._view = np.frombuffer(self._counts, dtype=np.uint32)  # for halving in bulk
        # per row: (its first counter, the shift of its window of the mixed key)
        self._pairs = [(row * width, row * 128 // depth) for row in range(depth)]
        # rows read bits [0, 32) and [32, 64) of the key and of the mixed key
        self._four = depth == 4 and width <= 1 << 32
        self._adds = 0
        self.total = 0.0  # decayed sum of all adds
        self.halvings = 0  # estimates only grow between two halvings

    def _slots(self, key: int) -> list[int]:
        mixed = (key * _MIX) & _MASK64
        both = key | (mixed << 64)  # 128 bits; rows read disjoint windows when width <= 2^16
        mask = self.mask
        return [base + ((both >> shift) & mask) for base, shift in self._pairs]

    def estimate(self, key: int) -> int:
        """The key's decayed count (never below the true one)."""
        counts = self._counts
        if self._four:  # ``_slots`` unrolled: half the time, and a decision asks a few
            mask, width = self.mask, self.width
            mixed = (key * _MIX) & _MASK64
            return min(counts[key & mask], counts[width + ((key >> 32) & mask)],
                       counts[2 * width + (mixed & mask)],
                       counts[3 * width + ((mixed >> 32) & mask)])
        return min([counts[i] for i in self._slots(key)])

    def add(self, key: int, count: int = 1) -> int:
        """Count ``key`` and return its new estimate; halves everything every ``window``."""
        counts = self._counts
        if self._four:  # ``_slots`` unrolled, as in ``estimate``
            mask, width = self.mask, self.width
            mixed = (key * _MIX) & _MASK64
            slots: Sequence[int] = (key & mask, width + ((key >> 32) & mask),
                                    2 * width + (mixed & mask), 3 * width + ((mixed >> 32) & mask))
        else:
            slots = self._slots(key)
        # conservative update: raise only the counters at the minimum (tighter estimates)
        new = min([counts[i] for i in slots]) + count
        if new > 0xFFFFFFFF:
            new = 0xFFFFFFFF
        for i in slots:
            if counts[i] < new:
                counts[i] = new
        self.total += count
        self._adds += 1
        if self._adds >= self.window:
            self.halve()
        return new

    def halve(self) -> None:
        """Decay: every counter (and the total) to half, rounded down."""
        self._view >>= 1
        self.total /= 2
        self._adds = 0
        self.halvings += 1

    def error_bound(self) -> float:
        """Over-count that an estimate exceeds with probability at most exp(-depth)."""
        return math.e / self.width * self.total
