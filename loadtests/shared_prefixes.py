"""Estimate a workload's documents from the prefixes its requests share.

Each prompt is a chain of units (16-token blocks of a captured prompt, or the segments of
a generated one), each unit a key and a token length. The units go into a trie; a node
counts the requests that pass through it. A request's shared prefix ends at the deepest
node on its path that another request also reached; a request that shares nothing is a
one-off document of its own (it still takes cache room). Those ends are grouped into
documents:

* an end only a little deeper than another on the same path (at most ``merge_tokens``:
  questions that happen to start alike, "Question 1..." and "Question 1...") is that one;
* an end with exactly one chain of deeper ends under it (a conversation: each turn extends
  the last) is one document with them, as large as its deepest end; an end under which
  several branch (a library's system prompt, an app's tools) stays a document of its own.

Documents are then ranked by requests; the hot set is the fewest top documents that
together receive ``hot_share`` of the requests. What a cache must hold at once is the peak
count of hot documents in use, one being in use from its first request to its last: all
of a library's hot documents, but only the conversations going on at the same time; the
library's ``hot_docs`` is that peak (``Estimate.hot`` keeps them all). Each request keeps
the chain of ends above its own (``RequestShape.prefix``), so a replay can rebuild exactly
what it shares.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from loadtests.plan_arithmetic import Library

Unit = tuple[Hashable, int]  # (key, tokens)


@dataclass(frozen=True, slots=True)
class RequestShape:
    """One request: ``[0, doc_tokens)`` the prefix it shares, as ``prefix``, the
    ``(end id, depth in tokens)`` of each shared end down its path; ``[doc_tokens,
    doc_tokens + tail_tokens)`` its own. ``doc``: its document (None when it shares
    nothing)."""

    doc: int | None
    doc_tokens: int
    tail_tokens: int
    prefix: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Estimate:
    requests: tuple[RequestShape, ...]
    library: Library
    hot: frozenset[int]  # document ids of the hot set
    one_off_requests: int


class _Trie:
    def __init__(self) -> None:
        self.children: dict[tuple[int, Hashable], int] = {}
        self.counts: list[int] = [0]  # node 0: the empty prefix
        self.depth_tokens: list[int] = [0]
        self.parents: list[int] = [0]

    def walk(self, units: Sequence[Unit]) -> list[int]:
        """The nodes of ``units``' path (root excluded), each counted once more."""
        node, path = 0, []
        for key, tokens in units:
            child = self.children.get((node, key))
            if child is None:
                child = len(self.counts)
                self.children[(node, key)] = child
                self.counts.append(0)
                self.depth_tokens.append(self.depth_tokens[node] + tokens)
                self.parents.append(node)
            self.counts[child] += 1
            node = child
            path.append(node)
        return path

    def above(self, node: int, among: set[int] | dict[int, int]) -> int:
        """The deepest node of ``among`` strictly above ``node`` (0: none)."""
        up = self.parents[node]
        while up and up not in among:
            up = self.parents[up]
        return up

    def merged(self, ends: set[int], merge_tokens: int) -> dict[int, int]:
        """Each of ``ends`` -> itself, or the end above it on its path when that is at
        most ``merge_tokens`` shallower (resolved shallowest first)."""
        out: dict[int, int] = {}
        for end in sorted(ends, key=lambda d: self.depth_tokens[d]):
            up = self.above(end, out)
            near = up > 0 and self.depth_tokens[end] - self.depth_tokens[up] <= merge_tokens
            out[end] = out[up] if near else end
        return out


def _documents(trie: _Trie, ends: set[int]) -> tuple[dict[int, int], dict[int, int]]:
    """(end -> its document, end -> the end above it or 0) for the canonical ``ends``."""
    above = {e: trie.above(e, ends) for e in ends}
    below: dict[int, list[int]] = {}
    for e, a in above.items():
        if a:
            below.setdefault(a, []).append(e)
    doc: dict[int, int] = {}
    for e in sorted(ends, key=lambda n: -trie.depth_tokens[n]):  # deepest first
        under = below.get(e, [])
        doc[e] = doc[under[0]] if len(under) == 1 else e
    return doc, above


def _peak_in_use(shapes: Sequence[RequestShape], docs: set[int]) -> int:
    """The most of ``docs`` in use at once, each from its first request to its last."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, shape in enumerate(shapes):
        if shape.doc in docs:
            first.setdefault(shape.doc, i)
            last[shape.doc] = i
    starts = sorted(first.values())
    ends = sorted(last.values())
    peak = live = j = 0
    for start in starts:  # a document ending at i is still in use at i
        while j < len(ends) and ends[j] < start:
            live -= 1
            j += 1
        live += 1
        peak = max(peak, live)
    return peak


def estimate(prompts: Sequence[Sequence[Unit]], hot_share: float = 0.8,
             merge_tokens: int = 32) -> Estimate:
    """The library ``prompts`` form (see the module docstring)."""
    if not prompts:
        raise ValueError("no requests to estimate a library from")
    if not 0 < hot_share <= 1:
        raise ValueError(f"hot_share must be in (0, 1], got {hot_share!r}")
    trie = _Trie()
    paths = [trie.walk(units) for units in prompts]
    deepest = [next((n for n in reversed(path) if trie.counts[n] >= 2), None)
               for path in paths]
    canonical = trie.merged({d for d in deepest if d is not None}, merge_tokens)
    doc_of, above = _documents(trie, set(canonical.values()))
    shapes: list[RequestShape] = []
    uses: dict[int, int] = {}
    for units, found in zip(prompts, deepest, strict=True):
        total = sum(tokens for _, tokens in units)
        if found is None:
            shapes.append(RequestShape(None, 0, total))
            continue
        end = canonical[found]
        chain = [end]
        while above[chain[-1]]:
            chain.append(above[chain[-1]])
        doc = doc_of[end]
        depth = trie.depth_tokens[end]
        uses[doc] = uses.get(doc, 0) + 1
        shapes.append(RequestShape(doc, depth, total - depth,
                                   tuple((e, trie.depth_tokens[e]) for e in reversed(chain))))
    one_offs = sum(1 for s in shapes if s.doc is None)
    ranked = sorted(uses, key=lambda d: (-uses[d], d))
    hot: list[int] = []
    covered, wanted = 0, hot_share * len(shapes)
    for doc in ranked:
        if covered >= wanted:
            break
        hot.append(doc)
        covered += uses[doc]
    if not hot:  # nothing shared: every request is its own document
        mean = sum(s.tail_tokens for s in shapes) / len(shapes)
        library = Library(docs=len(shapes), doc_tokens=max(mean, 1.0), hot_docs=1,
                          hot_share=1 / len(shapes), tail_tokens=0.0)
        return Estimate(tuple(shapes), library, frozenset(), one_offs)
    with_doc = [s for s in shapes if s.doc is not None]
    library = Library(
        docs=len(uses) + one_offs,
        doc_tokens=sum(trie.depth_tokens[d] for d in hot) / len(hot),
        hot_docs=_peak_in_use(shapes, set(hot)),
        hot_share=covered / len(shapes),
        tail_tokens=sum(s.tail_tokens for s in with_doc) / len(with_doc),
    )
    return Estimate(tuple(shapes), library, frozenset(hot), one_offs)


def block_units(ids: Sequence[int], block_size: int = 16) -> list[Unit]:
    """A prompt's token ids as full blocks, then its last partial block (if any)."""
    units: list[Unit] = []
    for start in range(0, len(ids), block_size):  # [start, start + block_size)
        block = tuple(ids[start:start + block_size])
        units.append((block, len(block)))
    return units
