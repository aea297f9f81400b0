"""Learning how far the prefixes shared by most traffic go (a fleet-wide system prompt).

Hashing the first K tokens of every prompt collapses all traffic onto one ring key when a
shared system prompt is longer than K. This learner finds such prefixes from the traffic
itself so ``prefix_affinity`` can hash the K tokens *after* them.

Each observed prompt is cut at block boundaries ``b = block, 2*block, ...`` and the hash of
``tokens[0:b]`` (a chain: each digest covers everything before it) is counted over a window
of recent prompts. A boundary is *common* when its prefix appears in at least ``share`` of
the window. Common prefixes are closed under shortening (a prefix is at least as frequent as
any extension of it), so a prompt's skip is found by walking its boundaries from the
shallowest and stopping at the first that is not common:

    tokens: [0 ........ skip)[skip ........ skip + K) ...
             common prefix     hashed for the ring key

``depth`` is the deepest common boundary seen in any traffic; callers tokenize
``depth + K`` tokens so the learner keeps seeing one key's worth past what it knows.

The counted digests form a tree (a digest's parent is the one a block shorter), and a
digest is counted at least as often as any child, so finding the common ones walks the tree
from its roots and goes down only under common digests: the work is the window's distinct
first blocks plus the common prefixes' children, not every digest counted.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from hashlib import blake2b
from typing import Protocol

_ROOT = b""  # the parent of first-block digests in the tree of counted digests


class CommonPrefixSettings(Protocol):
    """The keys a policy config has when it learns a common prefix (see its preset)."""

    @property
    def learn_common_prefix(self) -> bool: ...
    @property
    def common_share(self) -> float: ...
    @property
    def common_window(self) -> int: ...
    @property
    def common_block(self) -> int: ...
    @property
    def common_min_samples(self) -> int: ...
    @property
    def max_common_prefix(self) -> int: ...


def check_settings(cfg: CommonPrefixSettings) -> None:
    """``ValueError`` naming the first bad ``common_*`` key."""
    for key in ("common_window", "common_block", "common_min_samples"):
        if getattr(cfg, key) < 1:
            raise ValueError(f"{key} must be >= 1, got {getattr(cfg, key)!r}")
    if not 0.0 < cfg.common_share <= 1.0:
        raise ValueError(f"common_share must be in (0, 1], got {cfg.common_share!r}")
    if cfg.max_common_prefix < 0:
        raise ValueError(f"max_common_prefix must be >= 0, got {cfg.max_common_prefix!r}")
    if cfg.learn_common_prefix and cfg.common_min_samples > cfg.common_window:
        # the window holds at most common_window prompts: nothing would ever be learned
        raise ValueError(f"common_min_samples ({cfg.common_min_samples!r}) must be at most "
                         f"common_window ({cfg.common_window!r}) with learn_common_prefix on: "
                         "the window never holds more prompts to learn from")


def learner_for(cfg: CommonPrefixSettings) -> CommonPrefixLearner | None:
    """The learner ``cfg`` asks for, or None when learning is off (or cannot go a block
    deep)."""
    if not cfg.learn_common_prefix or cfg.max_common_prefix < cfg.common_block:
        return None
    return CommonPrefixLearner(block=cfg.common_block, share=cfg.common_share,
                               window=cfg.common_window, min_samples=cfg.common_min_samples,
                               max_depth=cfg.max_common_prefix)


class CommonPrefixLearner:
    """Counts prefix digests at block boundaries over a sliding window of prompts.

    ``observe`` mutates; ``skip`` and ``depth`` only read. Not thread safe (the caller
    serializes, like every policy's ``observe``).
    """

    def __init__(
        self, *, block: int, share: float, window: int, min_samples: int, max_depth: int
    ) -> None:
        self.block = block
        self.share = share
        self.window = window
        self.min_samples = min_samples
        self.max_depth = max_depth
        # per routed prompt: its fingerprint (or None) and the digests it counted; a prompt
        # whose fingerprint is already in the window counts nothing (a burst of one prompt
        # is not a prefix shared by many)
        self._recent: deque[tuple[object, bool, tuple[Hashable, ...]]] = deque()
        self._counts: Counter[Hashable] = Counter()
        self._prints: Counter[object] = Counter()
        self._counted = 0  # prompts in the window whose digests are counted
        # the tree of counted digests (``_ROOT``'s children: first blocks), a digest's
        # first child in ``_first`` and any others in ``_more``: most digests of a chain
        # have one child, and a container for each would be most of the learner's memory
        self._first: dict[Hashable, Hashable] = {}
        self._more: dict[Hashable, set[Hashable]] = {}
        self._common: frozenset[Hashable] = frozenset()
        self._depth = 0
        self._since_refresh = 0

    @property
    def depth(self) -> int:
        """Deepest common boundary in tokens (0 until enough traffic was seen)."""
        return self._depth

    def _digests(self, data: memoryview, limit: int) -> Iterator[bytes]:
        """Chain digests of ``data`` (u32 tokens as bytes) at boundaries ``<= limit``,
        hashed as they are read (a repeated prompt's are never read)."""
        h = blake2b(digest_size=16)
        prev = 0
        for b in range(self.block, limit + 1, self.block):
            h.update(data[4 * prev : 4 * b])
            yield h.copy().digest()
            prev = b

    def skip(self, data: memoryview, n_tokens: int) -> int:
        """Tokens of common prefix at the start of this prompt (a multiple of ``block``,
        strictly less than ``n_tokens`` so something is left to hash)."""
        if not self._common:
            return 0
        h = blake2b(digest_size=16)
        block = 4 * self.block

        def digest(i: int) -> bytes:
            h.update(data[i * block : (i + 1) * block])
            return h.copy().digest()
        return self.skip_digests(digest, n_tokens)

    def skip_digests(self, digest: Callable[[int], Hashable], n_tokens: int) -> int:
        """``skip`` for a caller with digests of its own: ``digest(i)`` names the prompt's
        first ``(i + 1) * block`` tokens (asked for ``i = 0, 1, ...`` in order), the same
        way in every call."""
        common = self._common
        if not common:
            return 0
        skip = 0
        for i in range(min(n_tokens - 1, self._depth) // self.block):
            if digest(i) not in common:
                break
            skip += self.block
        return skip

    def boundaries(self, n_tokens: int, prompt_tokens: int) -> int:
        """How many digests ``observe_digests`` counts for a prompt of ``prompt_tokens``
        whose first ``n_tokens`` are known."""
        return min(n_tokens, prompt_tokens - 1, self.max_depth) // self.block

    def observe(self, data: memoryview, n_tokens: int, prompt_tokens: int,
                fingerprint: object = None) -> None:
        """Count one routed prompt whose first ``n_tokens`` token ids are in ``data``.
        ``fingerprint`` identifies the whole prompt, when the caller knows it."""
        self.observe_digests(
            self._digests(data, self.boundaries(n_tokens, prompt_tokens) * self.block),
            fingerprint)

    def observe_digests(self, digests: Iterable[Hashable], fingerprint: object = None) -> None:
        """``observe`` for a caller with digests of its own (as ``skip_digests`` takes
        them): the first ``boundaries(...)`` of the prompt's, read only when the prompt is
        not a repeat."""
        repeat = fingerprint is not None and self._prints[fingerprint] > 0
        counted: tuple[Hashable, ...] = ()
        if not repeat:
            counted = tuple(digests)
            self._counted += 1
            counts, first = self._counts, self._first
            if all(map(counts.__contains__, counted)):
                counts.update(counted)  # a prefix seen before: every digest in the tree
            else:
                parent: Hashable = _ROOT
                for d in counted:
                    if d not in counts:
                        if parent in first:
                            self._more.setdefault(parent, set()).add(d)
                        else:
                            first[parent] = d
                    counts[d] += 1
                    parent = d
        if fingerprint is not None:
            self._prints[fingerprint] += 1
        self._recent.append((fingerprint, not repeat, counted))
        if len(self._recent) > self.window:
            self._forget(*self._recent.popleft())
        self._since_refresh += 1
        if self._since_refresh >= max(1, len(self._recent) // 16):
            self._refresh()

    def _forget(self, fingerprint: object, counted: bool,
                digests: tuple[Hashable, ...]) -> None:
        if fingerprint is not None:
            self._prints[fingerprint] -= 1
            if self._prints[fingerprint] <= 0:
                del self._prints[fingerprint]
        if counted:
            self._counted -= 1
        counts = self._counts
        # deepest first: a digest's count reaches 0 no later than its parent's
        for i in range(len(digests) - 1, -1, -1):
            d = digests[i]
            counts[d] -= 1
            if counts[d] <= 0:
                del counts[d]
                self._unlink(digests[i - 1] if i else _ROOT, d)

    def _unlink(self, parent: Hashable, child: Hashable) -> None:
        """Takes ``child`` (counted no more, and childless) out of the tree."""
        first, more = self._first, self._more
        others = more.get(parent)
        if first[parent] == child:
            if others:
                first[parent] = others.pop()
            else:
                del first[parent]
        elif others is not None:
            others.discard(child)
        if others is not None and not others:
            del more[parent]

    def _children(self, parent: Hashable) -> Iterator[Hashable]:
        child = self._first.get(parent, _ROOT)
        if child is not _ROOT:
            yield child
            yield from self._more.get(parent, ())

    def _refresh(self) -> None:
        self._since_refresh = 0
        seen = self._counted  # distinct prompts, when fingerprints tell repeats apart
        if seen < self.min_samples:
            self._common, self._depth = frozenset(), 0
            return
        need = self.share * seen
        counts, children = self._counts, self._children
        common: list[Hashable] = []
        level = [d for d in children(_ROOT) if counts[d] >= need]
        depth = 0
        while level:
            common.extend(level)
            depth += self.block
            level = [c for d in level for c in children(d) if counts[c] >= need]
        self._common = frozenset(common)
        self._depth = depth
