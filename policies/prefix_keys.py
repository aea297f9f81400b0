"""What the ``cost`` policy derives from a prompt before routing it: its chain of cache
entries and its prefix key, from the prompt's chunk hashes, never from its tokens.

* **Pieces.** The gateway hands over hashes of the prompt's ``chunk_chars``-character
  pieces (``prompt_chunks``), each worth ``chunk_tokens`` gateway tokens; a prompt that
  came as token ids is cut into pieces of 16 ids. At most ``max_chunks`` are read.
* **Chain.** The cache model's entries are chained keys of ``block_chunks`` pieces
  (``cache_model.PromptChain``), rooted at a hash of (model, cache salt), so a chat's
  later turn, which repeats the earlier ones, matches them where they went.
* **Prefix key.** A stable hash of (model, cache salt) and the affinity key header, or
  else of ``key_chunks`` pieces after a learned common prefix (a system prompt most
  traffic shares; ``common_prefix``): a document, or an app's system prompt and tools.
  It is the same in every gateway process.

Not thread-safe; one owner (the policy) drives it.
"""

from __future__ import annotations

from collections.abc import Sequence
from hashlib import blake2b
from typing import NamedTuple

from policies.base import RouteRequest
from policies.cache_model import PromptChain
from policies.common_prefix import learner_for
from policies.cost_config import CostConfig
from policies.prefix_affinity import request_namespace
from policies.prompt_chunks import IDS_PER_CHUNK, id_chunks
from policies.ring import stable_hash, token_bytes

_NAMESPACES_KEPT = 1024  # (model, cache salt) pairs whose key hashes are kept
_NAMESPACE_KEPT_BYTES = 512  # ... when their names take at most this many bytes


class Prefix(NamedTuple):
    """A prompt's prefix key, its chunk hashes and its chain."""

    key: int
    units: memoryview  # the prompt's chunk hashes as u32 bytes (at most max_chunks)
    chain: PromptChain
    common: int  # pieces of the prompt's head the learned common prefix covers


class PrefixKeys:
    """Prefix keys and chains of prompts, with the common prefix they learn from; see the
    module docstring."""

    __slots__ = ("_chain_digests", "_config", "_first_name", "_namespaces", "block_chunks",
                 "key_chunks", "learner", "lookahead", "max_chunks")

    def __init__(self, config: CostConfig) -> None:
        self.max_chunks = config.max_chunks
        self.block_chunks = config.block_chunks
        self.key_chunks = config.key_chunks
        self.lookahead = config.common_lookahead
        self.learner = learner_for(config)
        # the chain's keys name the same prefixes as the learner's digests when their
        # blocks agree (the preset's), and are hashed once for both
        self._chain_digests = config.common_block == config.block_chunks
        self._namespaces: dict[tuple[str | None, str | None], tuple[blake2b, int]] = {}
        self._config = config
        self._first_name: tuple[str | None, str | None] | None = None

    def prefix(self, request: RouteRequest) -> Prefix:
        """``request``'s prefix key, chunk hashes and chain."""
        chunks, unit = self._units(request)
        units = token_bytes(chunks)
        chain = PromptChain(units, self.block_chunks, unit, self._namespace(request)[1])
        key, common = self._key(request, units, chain)
        return Prefix(key, units, chain, common)

    def learn(self, request: RouteRequest, units: memoryview, chain: PromptChain) -> None:
        """Show the common-prefix learner a routed prompt (one with no affinity key): its
        ``Prefix``'s ``units`` and ``chain``."""
        learner = self.learner
        if learner is None or request.affinity_key is not None:
            return
        # the learner counts ``lookahead`` pieces past the prefix it has learned (a longer
        # one is learned a step at a time), not a whole long prompt
        pieces = len(units) // 4
        n = min(pieces, learner.depth + self.lookahead)
        if self._chain_digests:
            learner.observe_digests(chain.keys(learner.boundaries(n, pieces)),
                                    request.fingerprint)
        else:
            learner.observe(units, n, pieces, request.fingerprint)

    def kept_names(self) -> list[tuple[str | None, str | None]]:
        """The (model, cache salt) pairs whose hashes are kept."""
        return list(self._namespaces)

    def _units(self, request: RouteRequest) -> tuple[Sequence[int], float]:
        """The prompt's chunk hashes (at most ``max_chunks``) and tokens per chunk (from
        the request's own chunks, or cut from its token ids when it has none)."""
        if request.chunks:
            chunks, unit = request.chunks, max(request.chunk_tokens, 1e-9)
        else:
            chunks, unit = id_chunks(request.tokens), float(IDS_PER_CHUNK)
        limit = self.max_chunks
        return (chunks[:limit] if len(chunks) > limit else chunks), unit

    def _namespace(self, request: RouteRequest) -> tuple[blake2b, int]:
        """For the request's model and cache salt: a hash of them to start its prefix key
        from, and its chain's root (kept for the last ``_NAMESPACES_KEPT`` pairs of short
        names: a model name is as long as a client makes it)."""
        name = (request.model, request.cache_salt)
        found = self._namespaces.get(name)
        if found is None:
            self._another_name(name)
            space = request_namespace(request)
            found = (blake2b(space, digest_size=8, person=b"kvgate-cost"), stable_hash(space))
            if len(space) <= _NAMESPACE_KEPT_BYTES:
                if len(self._namespaces) >= _NAMESPACES_KEPT:
                    self._namespaces.clear()
                self._namespaces[name] = found
        return found

    def _another_name(self, name: tuple[str | None, str | None]) -> None:
        """A (model, cache salt) pair not kept: where it is the second one seen, the
        learner counts the prompts' own piece hashes from now on, not their chains' keys,
        which are rooted at each pair: a system prompt that adapters or tenants share
        never reached the learner's share in any one of them (learned again, fresh)."""
        if self._first_name is None:
            self._first_name = name
        elif self._chain_digests and name != self._first_name:
            self._chain_digests = False
            self.learner = learner_for(self._config)

    def _key(self, request: RouteRequest, units: memoryview, chain: PromptChain
             ) -> tuple[int, int]:
        """The request's prefix key (stable across processes), and the pieces of its head
        the learned common prefix covers."""
        h = self._namespace(request)[0].copy()
        n = len(units) // 4
        learner, skip = self.learner, 0
        if learner is not None:
            skip = learner.skip_digests(chain.key, n) if self._chain_digests \
                else learner.skip(units, n)
        if request.affinity_key is not None:
            h.update(b"\x01" + request.affinity_key.encode())
        else:
            # units holds 4 bytes per chunk: [4*skip, 4*(skip+K)) is the hashed window
            h.update(b"\x00")
            h.update(units[4 * skip : 4 * (skip + self.key_chunks)])
        return int.from_bytes(h.digest(), "little"), skip
