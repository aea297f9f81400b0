"""A gateway-side model of what one replica's prefix cache probably holds.

The replica is not asked: the model replays what this gateway sent it into an LRU of the
replica's capacity, the way vLLM's and SGLang's prefix caches evict. Entries are chained
keys of a prompt's blocks (see ``prompt_chain``), each with a size in tokens::

    prompt units: [0, B) [B, 2B) ... [(n-1)B, n)
    entries:      key_1  key_2   ... key_m          key_i = H(key_{i-1}, block i)

A prompt's entries are admitted tail first, so the head is the most recently used: as in
vLLM, whose freed blocks go to the eviction queue tail first, a shared head (a system
prompt, a document) outlives the one-off tails hung under it.

Every entry remembers its *owner*, the prefix key (document or conversation) of the
request that last touched it, so a caller can value what an admission would evict.

Not thread-safe; one owner (the policy) drives it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import NamedTuple


class ChainEntry(NamedTuple):
    key: int
    tokens: int


class Victim(NamedTuple):
    key: int
    tokens: int
    owner: int


class ReplicaCacheModel:
    """LRU of chain entries within ``capacity`` tokens.

    ``match`` reads (no recency change); ``admit`` touches and inserts, then evicts the
    least recently used entries until the model fits; ``victims`` tells what an admission
    would evict without doing it.
    """

    __slots__ = ("_entries", "capacity", "used")

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity!r}")
        self.capacity = capacity
        self.used = 0
        # key -> [tokens, owner]; first = least recently used
        self._entries: OrderedDict[int, list[int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: int) -> bool:
        return key in self._entries

    def match(self, chain: Sequence[ChainEntry], before: Sequence[int] | None = None) -> int:
        """Tokens of the chain's leading entries the model holds (a last entry held
        shorter than asked counts its held size). ``before[i]``, when given, is the tokens
        of ``chain[:i]`` (``chain_tokens``), for a caller matching one chain many times.

        Admissions take whole chains, head last, so what the model holds of any chain is a
        prefix of it (an entry is never older than one after it in a chain): the held
        length is found by bisection, O(log n) lookups."""
        entries = self._entries
        lo, hi = 0, len(chain)  # chain[:lo] held, chain[hi:] not
        while lo < hi:
            mid = (lo + hi) // 2
            if chain[mid].key in entries:
                lo = mid + 1
            else:
                hi = mid
        if lo == 0:
            return 0
        matched = before[lo - 1] if before is not None else sum(e.tokens for e in chain[: lo - 1])
        last = chain[lo - 1]
        return matched + min(last.tokens, entries[last.key][0])

    def victims(self, new_tokens: int, keep: frozenset[int] = frozenset()) -> Iterator[Victim]:
        """The entries that admitting ``new_tokens`` more would evict, oldest first
        (entries in ``keep``, the admission's own, are passed over)."""
        excess = self.used + new_tokens - self.capacity
        if excess <= 0:
            return
        for key, (tokens, owner) in self._entries.items():
            if key in keep:
                continue
            yield Victim(key, tokens, owner)
            excess -= tokens
            if excess <= 0:
                return

    def admit(self, chain: Sequence[ChainEntry], owner: int) -> list[Victim]:
        """Touch or insert the chain's entries (tail first), then evict LRU entries until
        the model fits its capacity; returns what was evicted."""
        entries = self._entries
        for key, tokens in reversed(chain):
            held = entries.get(key)
            if held is None:
                entries[key] = [tokens, owner]
                self.used += tokens
            else:
                if tokens > held[0]:
                    self.used += tokens - held[0]
                    held[0] = tokens
                held[1] = owner
                entries.move_to_end(key)
        return self._evict()

    def resize(self, capacity: int) -> list[Victim]:
        """A new capacity (the replica's was learned or changed); evicts to fit."""
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity!r}")
        self.capacity = capacity
        return self._evict()

    def clear(self) -> None:
        self._entries.clear()
        self.used = 0

    def _evict(self) -> list[Victim]:
        out: list[Victim] = []
        entries = self._entries
        while self.used > self.capacity and entries:
            key, (tokens, owner) = entries.popitem(last=False)
            self.used -= tokens
            out.append(Victim(key, tokens, owner))
        return out

    def keys_lru(self) -> list[int]:
        """Keys from least to most recently used (for tests and debugging)."""
        return list(self._entries)

    def check_integrity(self) -> None:
        total = sum(tokens for tokens, _ in self._entries.values())
        if total != self.used:
            raise AssertionError(f"cache model: used {self.used} != sum of entries {total} "
                                 f"over {len(self._entries)} entries")
        if self.used > self.capacity:
            raise AssertionError(f"cache model: used {self.used} > capacity {self.capacity}")


def chain_tokens(chain: Sequence[ChainEntry]) -> list[int]:
    """Running token totals: element ``i`` is the tokens of ``chain[:i]``."""
    out = [0]
    total = 0
    for entry in chain:
        total += entry.tokens
        out.append(total)
    return out


def prompt_chain(units: memoryview | bytes, block: int, unit_tokens: float,
                 root: int) -> list[ChainEntry]:
    """The chain entries of a prompt given as unit hashes in u32 bytes (``token_bytes``),
    ``unit_tokens`` tokens each, in blocks of ``block`` units::

        key_i = H(key_{i-1}, units[(i-1)B : iB])        key_0 = root (model, cache salt)

    The last block may be shorter; an entry's size is its units x ``unit_tokens``. H is
    Python's hash of (key, block bytes): keys live only in this process's models, and it
    costs ~1/10 of a digest per block.
    """
    out: list[ChainEntry] = []
    prev = root
    data = bytes(units)
    step = 4 * block
    full = max(1, round(block * unit_tokens))
    for start in range(0, len(data), step):
        piece = data[start : start + step]
        prev = hash((prev, piece))
        size = full if len(piece) == step else max(1, round(len(piece) // 4 * unit_tokens))
        out.append(ChainEntry(prev, size))
    return out
