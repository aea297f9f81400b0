"""Estimate a workload's documents from the prefixes its requests share.

Each prompt is a chain of units (16-token blocks of a captured prompt, or the segments of
a generated one), each unit a key and a token length. The units go into a trie; a node
counts the requests that pass through it. A request's document is the deepest node on its
path that another request also reached: the longest prefix it shares. A request that
shares nothing is a one-off document of its own (it still takes cache room). A document
only a little deeper than another on the same path (at most ``merge_tokens``: questions
that happen to start alike, "Question 1..." and "Question 1...") is the same document.

Documents are then ranked by requests; the hot set is the fewest top documents that
together receive ``hot_share`` of the requests.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from loadtests.plan_arithmetic import Library

Unit = tuple[Hashable, int]  # (key, tokens)


@dataclass(frozen=True, slots=True)
class RequestShape:
    """One request split at its shared prefix: ``[0, doc_tokens)`` its document (``doc``
    None when it shares nothing), ``[doc_tokens, doc_tokens + tail_tokens)`` its own."""

    doc: int | None
    doc_tokens: int
    tail_tokens: int


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

    def walk(self, units: Sequence[Unit], count: bool) -> list[int]:
        """The nodes of ``units``' path (root excluded), counted once more when
        ``count``."""
        node, path = 0, []
        for key, tokens in units:
            child = self.children.get((node, key))
            if child is None:
                child = len(self.counts)
                self.children[(node, key)] = child
                self.counts.append(0)
                self.depth_tokens.append(self.depth_tokens[node] + tokens)
                self.parents.append(node)
            if count:
                self.counts[child] += 1
            node = child
            path.append(node)
        return path


    def merged(self, docs: set[int], merge_tokens: int) -> dict[int, int]:
        """Each of ``docs`` -> itself, or the document above it on its path when that is
        at most ``merge_tokens`` shallower (resolved shallowest first)."""
        out: dict[int, int] = {}
        for doc in sorted(docs, key=lambda d: self.depth_tokens[d]):
            above = self.parents[doc]
            while above and above not in out:
                above = self.parents[above]
            near = above and self.depth_tokens[doc] - self.depth_tokens[above] <= merge_tokens
            out[doc] = out[above] if near else doc
        return out


def estimate(prompts: Sequence[Sequence[Unit]], hot_share: float = 0.8,
             merge_tokens: int = 32) -> Estimate:
    """The library ``prompts`` form (see the module docstring)."""
    if not prompts:
        raise ValueError("no requests to estimate a library from")
    if not 0 < hot_share <= 1:
        raise ValueError(f"hot_share must be in (0, 1], got {hot_share!r}")
    trie = _Trie()
    paths = [trie.walk(units, count=True) for units in prompts]
    deepest = [next((n for n in reversed(path) if trie.counts[n] >= 2), None)
               for path in paths]
    canonical = trie.merged({d for d in deepest if d is not None}, merge_tokens)
    shapes: list[RequestShape] = []
    uses: dict[int, int] = {}
    for units, found in zip(prompts, deepest, strict=True):
        total = sum(tokens for _, tokens in units)
        if found is None:
            shapes.append(RequestShape(None, 0, total))
            continue
        doc = canonical[found]
        doc_tokens = trie.depth_tokens[doc]
        uses[doc] = uses.get(doc, 0) + 1
        shapes.append(RequestShape(doc, doc_tokens, total - doc_tokens))
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
    hot_set = frozenset(hot)
    hot_doc_tokens = sum(trie.depth_tokens[d] for d in hot) / len(hot)
    with_doc = [s for s in shapes if s.doc is not None]
    library = Library(
        docs=len(uses) + one_offs,
        doc_tokens=hot_doc_tokens,
        hot_docs=len(hot),
        hot_share=covered / len(shapes),
        tail_tokens=sum(s.tail_tokens for s in with_doc) / len(with_doc),
    )
    return Estimate(tuple(shapes), library, hot_set, one_offs)


def block_units(ids: Sequence[int], block_size: int = 16) -> list[Unit]:
    """A prompt's token ids as full blocks, then its last partial block (if any)."""
    units: list[Unit] = []
    for start in range(0, len(ids), block_size):  # [start, start + block_size)
        block = tuple(ids[start:start + block_size])
        units.append((block, len(block)))
    return units
