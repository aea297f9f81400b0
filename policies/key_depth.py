"""Where a prompt's prefix key ends: at the part of the prompt that comes back.

A prefix key hashes a window of the prompt (``K`` units after the learned common prefix)
to name the part of it that comes back: a document, a conversation, an app's system prompt.
When that part is shorter than ``K``, the window takes in what follows it, and the key
changes with every prompt: a document's key with each question after it (with 600-token
documents and K = 1,024 tokens, ``prefix_affinity`` got fewer hits than round robin), a
conversation's with each turn (sent as a bare prompt, with no chat head to end the window
at). Two things fix the key instead:

* **Rungs.** A ladder of windows, ``K``, ``K/2``, ``K/4``, ... (``rungs`` of them), hashed
  as one chain, so each rung's digest names a prefix and extends the one before it::

      units: [0 .... skip)[skip ... +K/4)[ ... +K/2)[ ... +K) ...
              common        rung 0        rung 1      rung 2 (K)

  A decayed count-min sketch (``frequency``) counts, per rung digest, the prompts that
  reached it and those of them whose next rung had been seen before (its extensions come
  back). Let ``j`` be the deepest rung seen before. None: the prompt is new, keyed by the
  deepest rung (as distinct as can be). The deepest: keyed by it. Else the prompt branches
  off below rung ``j``: when rung ``j``'s extensions rarely came back (``(back + 1) /
  (seen + 2)`` under one half: a document, then one-off questions) it is keyed by rung
  ``j``; when they do (documents after a shared preamble, conversations after an app's
  prompt) it is a new branch, keyed by the deepest rung.
* **Turns.** A window that extends a shorter earlier one (all of it but its last unit, at
  least ``_MIN_GROWN`` units: a chat's earlier turn) takes that one's key: a table of
  chained hashes of each window's prefixes, bounded, the latest kept per slot. A window no
  longer than the earlier one is keyed by its rungs, so that a key picked too shallow
  (before a preamble was known to branch) is not passed on.

So a document at least ``K`` long keeps the ``K``-window key; a shorter one is keyed by
the deepest rung inside it from its second request on (its first gets the deepest rung);
a conversation keeps its first turn's key. The costs: a prefix is forgotten once its
counts halve to nothing (every ``window`` counts) and is keyed as new again; gateway copies
agree on a key once each has seen the prefix (and on a conversation's key when they agreed
on its first turn's); a sketch or table collision (about 1% of fresh digests at a full
window) can key a prompt a rung off.
"""

from __future__ import annotations

from array import array
from hashlib import blake2b

from policies.frequency import FrequencySketch

_WIDTH = 1 << 18  # counters per sketch row (4 rows of 4 bytes: 4 MiB), and table slots
_WINDOW = 1 << 16  # counts between two halvings
_BACK = 0x5BD1E9955BD1E995  # a rung key xor this: its prompts whose extension came back
_MUL = 0x9E3779B97F4A7C15  # the prefix hashes' multiplier (odd: 2^64 / the golden ratio)
_MASK64 = (1 << 64) - 1
_MIN_GROWN = 2  # units an earlier window must share with a prompt to pass it its key


class Window:
    """A prompt's key window: what ``KeyDepth`` picks the key from. Its prefix hashes are
    worked out when first asked for (a window seen whole before never needs them)."""

    __slots__ = ("_data", "_prefixes", "_seed", "_span", "full", "rungs")

    def __init__(self, rungs: list[int], full: bool, seed: int, data: memoryview,
                 span: tuple[int, int]) -> None:
        self.rungs = rungs  # keys of the rungs' prefixes, shallowest first; the last: all
        self.full = full  # the window is K units long (the prompt goes on past it)
        self._seed = seed
        self._data = data
        self._span = span  # [start, stop) in units
        self._prefixes: list[int] | None = None

    @property
    def prefixes(self) -> list[int]:
        """Chained hashes of the window's first 1, 2, ... units."""
        if self._prefixes is None:
            x = self._seed
            out: list[int] = []
            start, stop = self._span
            for unit in self._data[4 * start : 4 * stop].cast("I"):
                x = ((x ^ unit) * _MUL) & _MASK64  # after i+1 units: [start, start + i + 1)
                out.append(x)
            self._prefixes = out
        return self._prefixes


def rung_ends(deepest: int, rungs: int) -> tuple[int, ...]:
    """The windows' lengths, shallowest first: ``deepest`` halved ``rungs - 1`` times (at
    least one unit each, no length twice)."""
    if deepest < 1:
        raise ValueError(f"the key's window must be >= 1 unit, got {deepest!r}")
    if rungs < 1:
        raise ValueError(f"key_rungs must be >= 1, got {rungs!r}")
    return tuple(sorted({max(1, deepest >> i) for i in range(rungs)}))


class KeyDepth:
    """Picks a prompt's prefix key from its window; see the module docstring."""

    __slots__ = ("_keys", "_mask", "_sketch", "_tags", "deepest", "ends")

    def __init__(self, deepest: int, rungs: int, width: int = _WIDTH,
                 window: int = _WINDOW) -> None:
        self.ends = rung_ends(deepest, rungs)
        self.deepest = deepest
        on = len(self.ends) > 1
        self._sketch = FrequencySketch(width, 4, window) if on else None
        # keys passed on: (hash, key) in a slot per hash's low bits, the latest kept. The
        # hash is a shorter window's (less its last unit; its later turns extend it), or a
        # window's own key once it took an earlier window's key
        slots = width if on else 0
        self._mask = slots - 1
        self._tags = array("Q", bytes(8 * slots))
        self._keys = array("Q", bytes(8 * slots))

    def window(self, h: blake2b, data: memoryview, start: int, end: int) -> Window:
        """The window of ``data`` (4 bytes a unit): units ``[start, min(start + K, end))``
        after what ``h`` hashed (the model and cache salt: keys that must never meet; left
        as it was). Each rung's key is ``h``'s digest of its units, so the last, for a
        whole K, is the key with a single rung."""
        stop = min(start + self.deepest, end)
        h = h.copy()
        seed = int.from_bytes(h.digest(), "little")  # the prefix hashes' (its empty rung)
        rungs: list[int] = []
        done = start
        for length in self.ends:
            cut = start + length
            if cut >= stop:
                break
            # [4*done, 4*cut): the units this rung adds to the one before it
            h.update(data[4 * done : 4 * cut])
            done = cut
            rungs.append(int.from_bytes(h.copy().digest(), "little"))
        h.update(data[4 * done : 4 * stop])
        rungs.append(int.from_bytes(h.digest(), "little"))  # [start, stop)
        return Window(rungs, stop - start == self.deepest, seed, data, (start, stop))

    def pick(self, window: Window) -> int:
        """The key of a prompt's window; see the module docstring."""
        rungs = window.rungs
        key = rungs[-1]
        sketch = self._sketch
        if sketch is None:
            return key
        estimate = sketch.estimate
        if estimate(key):  # seen whole: as it was keyed then
            passed = self._passed(key)
            return key if passed is None else passed
        # a shorter earlier window, less its last unit, is a prefix of this one: this is a
        # later turn of its conversation (one as long is seen whole, above)
        prefixes = window.prefixes
        for i in range(len(prefixes) - 3, _MIN_GROWN - 2, -1):
            passed = self._passed(prefixes[i])
            if passed is not None:
                return passed
        for j in range(len(rungs) - 2, -1, -1):
            seen = estimate(rungs[j])
            if seen:
                break
        else:
            return key  # never seen: new
        if 2 * (estimate(rungs[j] ^ _BACK) + 1) >= seen + 2:
            return key  # a new branch of a prefix whose branches come back
        return rungs[j]  # what follows rung j rarely comes back: a document, a question

    def _passed(self, tag: int) -> int | None:
        slot = tag & self._mask
        return self._keys[slot] if self._tags[slot] == tag else None

    def _pass_on(self, tag: int, key: int) -> None:
        slot = tag & self._mask
        self._tags[slot] = tag
        self._keys[slot] = key

    def observe(self, window: Window, key: int) -> None:
        """Count a routed prompt's window, keyed ``key``."""
        sketch = self._sketch
        if sketch is None:
            return
        rungs = window.rungs
        # whether each rung's extension (the next rung) was seen, before counting any
        back = [sketch.estimate(d) > 0 for d in rungs[1:]]
        for digest, came_back in zip(rungs, back, strict=False):
            sketch.add(digest)
            if came_back:
                sketch.add(digest ^ _BACK)
        sketch.add(rungs[-1])
        if not window.full and len(window.prefixes) > _MIN_GROWN:
            self._pass_on(window.prefixes[-2], key)  # for its later turns
        if key not in rungs:
            self._pass_on(rungs[-1], key)  # a key it took: kept when it is seen whole
