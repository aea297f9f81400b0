"""A gateway-side model of what one replica's prefix cache probably holds.

The replica is not asked: the model replays what this gateway sent it into an LRU of the
replica's capacity, the way vLLM's and SGLang's prefix caches evict. Entries are the keys
of the prefixes ending at a prompt's blocks (``PromptChain``), each with a size in tokens::

    prompt units: [0, B) [B, 2B) ... [(m-1)B, n)
    entries:      key_0  key_1   ... key_{m-1}      key_i = H(root, units[0 : (i+1)B])

A prompt's entries are admitted tail first, so the head is the most recently used: as in
vLLM, whose freed blocks go to the eviction queue tail first, a shared head (a system
prompt, a document) outlives the one-off tails hung under it.

Every entry remembers its *owner*, the prefix key (document or conversation) of the
request that last touched it, so a caller can value what an admission would evict. The
model keeps each owner's tokens, so that telling what an admission would evict costs at
most its victims plus ``PASSED_OVER_MAX`` entries, whatever the model's size (a decision
asks it of every candidate it scores).

An admission may be *pending*: its prompt was sent, but the replica may still refuse it
before taking it (shedding load). Each entry counts the pending admissions that would
bring it (those that inserted it, or touched it while it was pending); ``forget`` takes
one back, removing the entries no other admission brings, and ``confirm`` lets one stand.
An admission names the entries it brought, not their keys: an entry evicted and admitted
again is another, which only its new admissions bring (and an emptied model's entries are
no longer the model's). An entry once brought by an admission that stands (or that was
never pending) is held for good, as any other. Since every admission takes a whole
chain, what the model holds of a chain stays a prefix of it: an entry deeper in a chain
than a removable one was brought by the same pending admissions, or more of them.

Entries are tuples of ints, which the garbage collector stops tracking, rather than lists:
a model of millions of tokens is hundreds of thousands of entries per replica, and a full
collection walking them all held the event loop for 100-300 ms at a time. An entry changes
by being replaced; its serial number, not its identity, names it.

Not thread-safe; one owner (the policy) drives it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple, overload


class ChainEntry(NamedTuple):
    key: int
    tokens: int


class Victim(NamedTuple):
    key: int
    tokens: int
    owner: int


# the most entries of an admission's own owner that telling its victims passes over
# (``ReplicaCacheModel.victims``): the admission touches those of its chain, at most a
# prompt's worth, and an owner with more at the LRU end (one affinity key over many unique
# prompts) holds old entries the admission does not touch, which go first
PASSED_OVER_MAX = 1 << 11

# the entries a pending admission brings: (key, serial) each, the serial the entry's when it
# was brought (an entry evicted and admitted again is another serial, which that admission
# does not bring)
Brought = list[tuple[int, int]]

# an entry: (tokens, owner, pending admissions bringing it (0: held for good), serial)
Entry = tuple[int, int, int, int]


class ReplicaCacheModel:
    """LRU of chain entries within ``capacity`` tokens.

    ``match`` reads (no recency change); ``admit`` touches and inserts, then evicts the
    least recently used entries until the model fits; ``forget`` and ``confirm`` settle a
    pending admission (see the module docstring); ``victims`` tells what an admission
    would evict without doing it.
    """

    __slots__ = ("_entries", "_owned", "_serial", "capacity", "used", "walked")

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity!r}")
        self.capacity = capacity
        self.used = 0
        # key -> Entry; first = least recently used
        self._entries: OrderedDict[int, Entry] = OrderedDict()
        self._serial = 0  # the last entry's serial number
        self._owned: dict[int, int] = {}  # owner -> tokens of its entries (none at 0)
        self.walked = 0  # entries the last ``victims`` or ``evicted_tokens`` visited

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: int) -> bool:
        return key in self._entries

    def match(self, chain: Sequence[ChainEntry]) -> int:
        """Tokens of the chain's leading entries the model holds (a last entry held
        shorter than asked counts its held size)."""
        return self.tokens_of(chain, self.held(chain))

    def tokens_of(self, chain: Sequence[ChainEntry], n: int) -> int:
        """Tokens the model holds of the chain's first ``n`` entries, ``n`` being what it
        holds of the chain (``held``): a last entry held shorter counts its held size."""
        if n == 0:
            return 0
        last = chain[n - 1]
        if isinstance(chain, PromptChain):
            before = chain.tokens_before(n - 1)
        else:
            before = sum(e.tokens for e in chain[: n - 1])
        return before + self.tokens_held(last.key, last.tokens)

    def held(self, chain: Sequence[ChainEntry], hint: int = 0) -> int:
        """How many of the chain's leading entries the model holds.

        Admissions take whole chains, head last, so what the model holds of any chain is a
        prefix of it (an entry is never older than one after it in a chain): the held
        length is found by bisection, O(log n) lookups. ``hint``, the number of entries
        another model held of this chain, is tried first (two lookups when it is right,
        as it mostly is among the replicas that hold a document)."""
        entries = self._entries
        key_at = chain.key if isinstance(chain, PromptChain) else lambda i: chain[i].key
        lo, hi = 0, len(chain)  # chain[:lo] held, chain[hi:] not
        if 0 < hint <= hi:
            if key_at(hint - 1) in entries:
                lo = hint
                if hint < hi and key_at(hint) not in entries:
                    hi = hint
            else:
                hi = hint - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if key_at(mid) in entries:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def tokens_held(self, key: int, tokens: int) -> int:
        """Of an entry of ``tokens`` tokens, how many the model holds under ``key``."""
        entry = self._entries.get(key)
        return 0 if entry is None else min(tokens, entry[0])

    def victims(self, new_tokens: int, keep_owner: int | None = None) -> Iterator[Victim]:
        """The entries that admitting ``new_tokens`` more would evict, oldest first
        (entries owned by ``keep_owner``, the admission's own prefix key, are passed over:
        the admission touches them before anything is evicted). Past ``PASSED_OVER_MAX``
        of them passed over, the rest of the excess is taken to fall on ``keep_owner``'s
        own entries: the walk stops there, and where no other owner's entries are left."""
        self.walked = 0
        excess = self.used + new_tokens - self.capacity
        others = self.used - self._owned.get(keep_owner, 0) if keep_owner is not None \
            else self.used  # tokens of the entries not passed over
        if excess <= 0 or others <= 0:
            return
        walked = passed = 0
        for key, (tokens, owner, _, _) in self._entries.items():
            walked += 1
            if owner == keep_owner:
                passed += 1
                if passed > PASSED_OVER_MAX:
                    break
                continue
            self.walked = walked
            yield Victim(key, tokens, owner)
            excess -= tokens
            others -= tokens
            if excess <= 0 or others <= 0:
                break
        self.walked = walked

    def evicted_tokens(self, new_tokens: int, keep_owner: int | None,
                       counts: Callable[[int], bool],
                       memo: dict[int, bool] | None = None) -> int:
        """Tokens of the ``victims(new_tokens, keep_owner)`` whose owner ``counts``, summed
        without building them (a decision asks this of every candidate it scores).
        ``memo`` keeps ``counts``' answers by owner (a prefix's entries sit together)."""
        self.walked = 0
        excess = self.used + new_tokens - self.capacity
        others = self.used - self._owned.get(keep_owner, 0) if keep_owner is not None \
            else self.used  # tokens of the entries not passed over
        total = 0
        if excess <= 0 or others <= 0:
            return 0
        memo = {} if memo is None else memo
        last_owner, last_counts = None, False
        walked = passed = 0
        for tokens, owner, _, _ in self._entries.values():
            walked += 1
            if owner == keep_owner:
                passed += 1
                if passed > PASSED_OVER_MAX:
                    break
                continue
            if owner != last_owner:
                found = memo.get(owner)
                if found is None:
                    found = memo[owner] = counts(owner)
                last_owner, last_counts = owner, found
            if last_counts:
                total += tokens
            excess -= tokens
            others -= tokens
            if excess <= 0 or others <= 0:
                break
        self.walked = walked
        return total

    def admit(self, chain: Sequence[ChainEntry], owner: int,
              pending: Brought | None = None) -> list[int]:
        """Touch or insert the chain's entries (tail first), then evict LRU entries until
        the model fits its capacity; returns the keys evicted, oldest first. ``pending``
        given, the admission is pending: the entries it brings (inserted, or pending
        already), each ``(key, serial)``, are appended to it, for ``forget`` or
        ``confirm``; else it stands, and every entry of the chain is held for good."""
        entries, owned = self._entries, self._owned
        gained = 0  # tokens the owner's entries gain
        # a prompt chain's keys and sizes, without an entry tuple per block
        pairs: Iterable[tuple[int, int]] = chain.pairs_reversed() \
            if isinstance(chain, PromptChain) else reversed(chain)
        for key, tokens in pairs:
            held = entries.get(key)
            if held is None:
                self._serial = serial = self._serial + 1
                entries[key] = (tokens, owner, 0 if pending is None else 1, serial)
                self.used += tokens
                gained += tokens
                if pending is not None:
                    pending.append((key, serial))
                continue
            size, was, count, serial = held
            if was != owner:
                self._disown(size, was)
                gained += size
            if tokens > size:
                self.used += tokens - size
                gained += tokens - size
                size = tokens
            if count:
                if pending is None:
                    count = 0
                else:
                    count += 1
                    pending.append((key, serial))
            entries[key] = (size, owner, count, serial)
            entries.move_to_end(key)
        if gained:
            owned[owner] = owned.get(owner, 0) + gained
        return self._evict()

    def forget(self, pending: Iterable[tuple[int, int]]) -> list[int]:
        """Take back a pending admission (its ``pending`` entries): its prompt never
        reached the replica. An entry no other pending admission brings is removed (what
        the admission touched, evicted or grew stays as it left it). Only the entries it
        brought count: one evicted since, even if another admission brought its key back
        (a new entry), or one of an emptied model is not the model's. Returns the keys
        removed."""
        entries = self._entries
        removed: list[int] = []
        for key, serial in pending:
            entry = entries.get(key)
            if entry is None or entry[3] != serial or not entry[2]:
                continue  # evicted since, or held for good
            tokens, owner, count, _ = entry
            if count > 1:
                entries[key] = (tokens, owner, count - 1, serial)
            else:
                del entries[key]
                self.used -= tokens
                self._disown(tokens, owner)
                removed.append(key)
        return removed

    def confirm(self, pending: Iterable[tuple[int, int]]) -> None:
        """Let a pending admission (its ``pending`` entries) stand: those the model still
        holds (as ``forget`` tells them) are held for good."""
        entries = self._entries
        for key, serial in pending:
            entry = entries.get(key)
            if entry is not None and entry[3] == serial and entry[2]:
                entries[key] = (entry[0], entry[1], 0, serial)

    def resize(self, capacity: int) -> list[int]:
        """A new capacity (the replica's was learned or changed); evicts to fit and returns
        the keys evicted."""
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity!r}")
        self.capacity = capacity
        return self._evict()

    def clear(self) -> None:
        self._entries.clear()
        self._owned.clear()
        self.used = 0

    def _evict(self) -> list[int]:
        out: list[int] = []
        entries = self._entries
        used, capacity = self.used, self.capacity
        while used > capacity and entries:
            key, (tokens, owner, _, _) = entries.popitem(last=False)
            used -= tokens
            self._disown(tokens, owner)
            out.append(key)
        self.used = used
        return out

    def _disown(self, tokens: int, owner: int) -> None:
        """Take an entry's ``tokens`` off its ``owner``'s."""
        owned = self._owned
        left = owned.get(owner, 0) - tokens
        if left:
            owned[owner] = left
        else:
            owned.pop(owner, None)

    def keys_lru(self) -> list[int]:
        """Keys from least to most recently used (for tests and debugging)."""
        return list(self._entries)

    def check_integrity(self) -> None:
        total = sum(entry[0] for entry in self._entries.values())
        if total != self.used:
            raise AssertionError(f"cache model: used {self.used} != sum of entries {total} "
                                 f"over {len(self._entries)} entries")
        if self.used > self.capacity:
            raise AssertionError(f"cache model: used {self.used} > capacity {self.capacity}")
        owned: dict[int, int] = {}
        for tokens, owner, _, _ in self._entries.values():
            owned[owner] = owned.get(owner, 0) + tokens
        wrong = [(o, self._owned.get(o, 0), owned.get(o, 0)) for o in owned.keys() | self._owned
                 if self._owned.get(o, 0) != owned.get(o, 0)]
        if wrong or 0 in self._owned.values():
            raise AssertionError(f"cache model: tokens kept per owner differ from their "
                                 f"entries' (owner, kept, held): {wrong[:5]}")


_STRETCH = 16  # entries hashed from one base key (see PromptChain)


class PromptChain(Sequence[ChainEntry]):
    """A prompt's chain entries, each key hashed on first use: ``match`` bisects, so a
    decision reads a few keys of a chain it does not admit. Entry ``i`` covers units
    ``[iB, (i+1)B)``; its key hashes the units from the start of its stretch of ``S``
    (``_STRETCH``) entries to its end, after the key that ends the stretch before::

        key_i = H(base_a, units[aSB : (i+1)B])    a = i // S
        base_0 = root (model and cache salt),  base_a = key_{aS-1}

    so, like a chain of block hashes, it names the whole prefix, while a key costs at most
    ``S`` blocks of hashing plus one key per stretch before it: hashing every prefix
    whole cost the square of the chain's length to admit (about 12 ms for a 128k-token
    prompt, on the event loop). H is Python's hash of a tuple, over a view of the units
    rather than a copy: keys live only in this process's models. Entries hold
    ``block x unit_tokens`` tokens; the last may hold fewer.
    """

    __slots__ = ("_data", "_full", "_keys", "_last", "_n", "_root", "_step", "unit_tokens")

    def __init__(self, units: memoryview | bytes, block: int, unit_tokens: float,
                 root: int) -> None:
        self._data = data = memoryview(bytes(units))
        self._step = step = 4 * block
        self._root = root
        self._n = n = -(-len(data) // step)
        self.unit_tokens = unit_tokens
        self._full = max(1, round(block * unit_tokens))
        tail = len(data) - (n - 1) * step
        self._last = self._full if tail == step else max(1, round(tail // 4 * unit_tokens))
        self._keys: list[int | None] = [None] * n

    def __len__(self) -> int:
        return self._n

    def key(self, i: int) -> int:
        keys = self._keys
        key = keys[i]
        if key is None:
            data, step, base = self._data, self._step, self._root
            start = i - i % _STRETCH
            for end in range(_STRETCH - 1, start, _STRETCH):  # the stretches' last keys
                found = keys[end]
                if found is None:
                    found = keys[end] = hash((base, data[(end + 1 - _STRETCH) * step
                                                         : (end + 1) * step]))
                base = found
            key = keys[i] = hash((base, data[start * step : (i + 1) * step]))
        return key

    def keys(self, count: int | None = None) -> list[int]:
        """The first ``count`` entries' keys (default: all), in order."""
        n = self._n if count is None else min(count, self._n)
        keys, base, data, step = self._keys, self._root, self._data, self._step
        start = last = 0
        for i in range(n):
            if i - start == _STRETCH:
                base, start = last, i
            key = keys[i]
            if key is None:
                key = keys[i] = hash((base, data[start * step : (i + 1) * step]))
            last = key
        return keys[:n]  # type: ignore[return-value]

    def pairs_reversed(self) -> Iterator[tuple[int, int]]:
        """(key, tokens) of every entry, the last first (the order of admission)."""
        keys = self.keys()
        n = len(keys)
        if n:
            full = self._full
            sizes = [full] * n
            sizes[-1] = self._last
            return zip(reversed(keys), reversed(sizes), strict=True)
        return iter(())

    def size(self, i: int) -> int:
        """Tokens of entry ``i`` (``0 <= i < len``)."""
        return self._last if i == self._n - 1 else self._full

    def __reversed__(self) -> Iterator[ChainEntry]:
        """The entries, the last first (the order of admission)."""
        return (ChainEntry(key, tokens) for key, tokens in self.pairs_reversed())

    def tokens_before(self, i: int) -> int:
        """Tokens of entries ``[0, i)``, for ``0 <= i <= len``."""
        return i * self._full if i < self._n else (self._n - 1) * self._full + self._last

    @overload
    def __getitem__(self, i: int) -> ChainEntry: ...
    @overload
    def __getitem__(self, i: slice) -> list[ChainEntry]: ...
    def __getitem__(self, i: int | slice) -> ChainEntry | list[ChainEntry]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"chain entry {i} of {self._n}")
        return ChainEntry(self.key(i), self.size(i))


def match_models(models: Sequence[ReplicaCacheModel], chain: PromptChain, hint: int = 0
                 ) -> tuple[list[int], int]:
    """``match(chain)`` of each model (tokens of the chain it holds) and the entries the
    last one holds. Each model is first asked for the entries the one before held (or
    ``hint``): two lookups when that is right, as it mostly is among the models that hold
    a document, and the keys and sizes they read are shared."""
    out: list[int] = []
    n = len(chain)
    probe: tuple[int, int | None, int | None, int, int] | None = None
    for model in models:
        entries = model._entries
        if probe is None or probe[0] != hint:
            probe = (hint, None, None, 0, 0) if not 0 < hint <= n else (
                hint, chain.key(hint - 1), chain.key(hint) if hint < n else None,
                chain.tokens_before(hint - 1), chain.size(hint - 1))
        _, last, after, before, size = probe
        if last is not None:
            entry = entries.get(last)
            if entry is not None and (after is None or after not in entries):
                out.append(before + (size if size < entry[0] else entry[0]))
                continue
        hint = model.held(chain, hint)
        out.append(model.tokens_of(chain, hint))
    return out, hint
