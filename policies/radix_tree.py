"""An approximate radix tree of token runs, recording which replicas hold each prefix.

Token sequences are stored as little-endian u32 bytes (4 bytes per token). An edge is one
``bytes`` run; children are keyed by the first token of their edge (its 4 bytes). A node's
``end`` is its depth in tokens at the end of its edge:

    root --[t0 .. t9]--> a (end 10) --[t10 .. t14]--> b (end 15)
                           \\--[u10 .. u39]--> c (end 40)

Each node maps replica -> last access tick (a logical clock advanced per insert). Rules:

* a replica holding a node holds its parent (inserts touch whole paths; eviction takes
  only a replica's leaves), so a match for a replica is the deepest node it holds;
* a child's tick is <= its parent's (touching a child touches the parent at the same
  tick), so the replica's holding with the smallest ``(tick, -end)`` is one of its leaves:
  popping per-replica heaps in that order evicts LRU-leaf-first with no tree scan. Only
  leaves need entries: an insert pushes one, for the deepest node of its path (its
  ancestors' ticks change in place, their old entries go stale), and a release pushes the
  parent's (it may have become a leaf). A node's entry that is current while it still
  holds children cannot come first (a leaf below it sorts before it), so an insert costs
  two heap pushes whatever its path's depth; the whole-tree heap works the same way;
* every non-root node has at least one holder; a node left with none is unlinked (it can
  have no children, since they would be held by someone who then holds it).

Separate roots per namespace (model and cache salt): different namespaces never share KV.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterator
from itertools import count
from typing import Any, NamedTuple

_NODE_BYTES = 2048  # per node: object, dicts, stale heap entries (calibrated by tracemalloc)
_HOLD_BYTES = 150  # estimated bytes per (node, replica) holding: dict slot plus heap entry


class Inserted(NamedTuple):
    """What ``insert`` did, for ``take_back``: its ``tick``, and the tokens of its data the
    replica held before (``held``)."""

    tick: int
    held: int


class Node:
    __slots__ = ("children", "edge", "end", "holders", "key", "parent", "touched")

    def __init__(self, edge: bytes, end: int, parent: Node | None, key: Any) -> None:
        self.edge = edge
        self.end = end
        self.parent = parent
        self.key = key  # the edge's first 4 bytes; a root's is its namespace
        self.children: dict[bytes, Node] = {}
        self.holders: dict[str, int] = {}
        self.touched = 0


def _common_bytes(a: bytes, b: bytes) -> int:
    """Length of the common prefix of ``a`` and ``b`` in whole tokens (4 bytes each)."""
    hi = min(len(a), len(b)) // 4
    if a[: 4 * hi] == b[: 4 * hi]:
        return hi
    lo = 0  # invariant: the first lo tokens agree, the first hi do not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[4 * lo : 4 * mid] == b[4 * lo : 4 * mid]:
            lo = mid
        else:
            hi = mid
    return lo


_Entry = tuple[int, int, int, Node]


def _current(heap: list[_Entry], is_current: Callable[[_Entry], bool]) -> list[_Entry]:
    """``heap``'s current entries, one per (tick, node), as a heap."""
    seen: set[tuple[int, int]] = set()
    kept = []
    for e in heap:
        key = (e[0], id(e[3]))
        if key not in seen and is_current(e):
            seen.add(key)
            kept.append(e)
    heapq.heapify(kept)
    return kept


class RadixTree:
    """Per-replica prefix index. Every mutating method keeps ``check_integrity()`` true."""

    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.roots: dict[Hashable, Node] = {}
        self.tokens: dict[str, int] = {}  # replica -> tokens it holds
        self.held: dict[str, int] = {}  # replica -> nodes it holds
        self.total_tokens = 0
        self.nodes = 0
        self.holdings = 0
        self._tick = 0
        self._seq = count()
        self.heap_pushes = 0  # heap entries entered so far (an insert enters 2)
        self._heaps: dict[str, list[_Entry]] = {}  # replica -> its leaves' entries
        self._global: list[_Entry] = []  # the tree's leaves' entries

    def estimated_bytes(self) -> int:
        return self.total_tokens * 4 + self.nodes * _NODE_BYTES + self.holdings * _HOLD_BYTES

    # -- reading -------------------------------------------------------------------------

    def match(self, ns: Hashable, data: bytes) -> dict[str, int]:
        """Tokens of ``data`` each replica holds as a prefix (replicas with 0 left out)."""
        node = self.roots.get(ns)
        matched: dict[str, int] = {}
        if node is None:
            return matched
        # a child's holders are a subset of its parent's, so along the path a set changes
        # only where it shrinks: ``last`` (the deepest node matched whole) is recorded
        # where the next node's set is smaller, and at the end
        last: Node | None = None
        sets = -1  # the size of last's holder set
        pos, n = 0, len(data)
        while pos < n:
            child = node.children.get(data[pos : pos + 4])
            if child is None:
                break
            edge = child.edge
            size = len(edge)
            if size > 4 and not data.startswith(edge, pos):  # (4: the key is the edge)
                if last is not None:
                    for rid in last.holders:
                        matched[rid] = last.end
                depth = child.end - size // 4 + _common_bytes(edge, data[pos : pos + size])
                for rid in child.holders:
                    matched[rid] = depth
                return matched
            if len(child.holders) != sets:
                if last is not None:
                    for rid in last.holders:
                        matched[rid] = last.end
                sets = len(child.holders)
            last = child
            pos += size
            node = child
        if last is not None:
            for rid in last.holders:
                matched[rid] = last.end
        return matched

    # -- writing -------------------------------------------------------------------------

    def insert(self, ns: Hashable, data: bytes, replica: str,
               budget: int | None) -> Inserted | None:
        """Record that ``replica`` now holds ``data``; then evict that replica's LRU leaves
        while it holds more than ``budget`` tokens, and whole-tree LRU leaves while the
        estimate exceeds ``max_bytes``. Returns what ``take_back`` needs (None: no data)."""
        if not data:
            return None
        held = 0
        self._tick += 1
        tick = self._tick
        root = self.roots.get(ns)
        if root is None:
            root = self.roots[ns] = Node(b"", 0, None, ns)
        node, pos, n = root, 0, len(data)
        new_tokens = new_nodes = 0  # of the path's nodes ``replica`` did not hold
        while pos < n:
            head = data[pos : pos + 4]
            child = node.children.get(head)
            if child is None:
                child = Node(data[pos:], n // 4, node, head)
                node.children[head] = child
                self.nodes += 1
                self.total_tokens += (n - pos) // 4
                child.holders[replica] = tick
                child.touched = tick
                new_tokens += (n - pos) // 4
                new_nodes += 1
                node = child
                break
            size = len(child.edge)
            if size > 4 and not data.startswith(child.edge, pos):
                k = _common_bytes(child.edge, data[pos : pos + size])
                child = self._split(child, k)
                size = 4 * k
            holders = child.holders
            if replica in holders:
                held = child.end
            else:
                new_tokens += size // 4
                new_nodes += 1
            holders[replica] = tick
            child.touched = tick
            pos += size
            node = child
        if new_nodes:
            self.tokens[replica] = self.tokens.get(replica, 0) + new_tokens
            self.held[replica] = self.held.get(replica, 0) + new_nodes
            self.holdings += new_nodes
        self._push(node, replica)
        if budget is not None:
            self.evict_replica(replica, budget)
        if self.max_bytes is not None:
            while self.estimated_bytes() > self.max_bytes and self._evict_global():
                pass
        return Inserted(tick, held)

    def take_back(self, ns: Hashable, data: bytes, replica: str, inserted: Inserted) -> None:
        """Undo an ``insert`` of ``data`` for ``replica`` (its prompt never reached it): the
        replica lets go of the nodes of ``data``'s path that the insert brought it (deeper
        than ``inserted.held``), deepest first, up to one a later insert touched (that one
        and its ancestors are held for that insert). What the insert touched or evicted
        stays as it left it."""
        node = self.roots.get(ns)
        path: list[Node] = []
        pos, n = 0, len(data)
        # the insert split its path's edges where ``data`` and ``held`` end, and nothing
        # merges nodes: the path, as far as it is still there, is whole edges of ``data``
        while node is not None and pos < n:
            child = node.children.get(data[pos : pos + 4])
            if child is None or data[pos : pos + len(child.edge)] != child.edge:
                break
            path.append(child)
            pos += len(child.edge)
            node = child
        for node in reversed(path):
            if node.end <= inserted.held:
                break
            tick = node.holders.get(replica)
            if tick is None:
                continue  # evicted since
            if tick != inserted.tick:
                break
            self._release(node, replica)

    def _push(self, node: Node, replica: str) -> None:
        """Enter ``node`` (that ``replica`` holds) in ``replica``'s heap at its tick, and in
        the whole tree's at its ``touched``; compact a heap grown to thrice what it can
        hold current (stale and repeated entries dropped)."""
        self.heap_pushes += 2
        tick = node.holders[replica]
        heap = self._heaps.setdefault(replica, [])
        heapq.heappush(heap, (tick, -node.end, next(self._seq), node))
        heapq.heappush(self._global, (node.touched, -node.end, next(self._seq), node))
        if len(heap) > 3 * self.held[replica] + 64:
            heap[:] = _current(heap, lambda e: e[3].holders.get(replica) == e[0])
        if len(self._global) > 3 * self.nodes + 64:
            self._global = _current(
                self._global, lambda e: e[3].parent is not None and e[3].touched == e[0]
            )

    def _split(self, child: Node, k: int) -> Node:
        """Cut ``child``'s edge after ``k`` tokens; return the new upper node."""
        parent = child.parent
        assert parent is not None and 0 < k < len(child.edge) // 4
        upper = Node(child.edge[: 4 * k], child.end - len(child.edge) // 4 + k, parent, child.key)
        upper.holders = dict(child.holders)
        upper.touched = child.touched
        child.edge = child.edge[4 * k :]
        child.key = child.edge[:4]
        child.parent = upper
        upper.children[child.key] = child
        parent.children[upper.key] = upper
        self.nodes += 1
        self.holdings += len(upper.holders)
        for rid in upper.holders:  # (no entries: ``child`` below holds what it holds)
            self.held[rid] += 1
        return upper

    def evict_replica(self, replica: str, budget: int) -> None:
        """Release ``replica``'s least recently used leaves until it holds <= ``budget``."""
        heap = self._heaps.get(replica)
        while heap and self.tokens.get(replica, 0) > budget:
            tick, _, _, node = heapq.heappop(heap)
            if node.holders.get(replica) == tick:
                self._release(node, replica)

    def _release(self, node: Node, replica: str) -> None:
        del node.holders[replica]
        self.holdings -= 1
        self.held[replica] -= 1
        self.tokens[replica] -= len(node.edge) // 4
        if not self.held[replica]:
            del self.tokens[replica], self.held[replica]
            self._heaps.pop(replica, None)
        parent = node.parent
        assert parent is not None
        if not node.holders:
            self._unlink(node)
        elif node.touched not in node.holders.values():
            node.touched = max(node.holders.values())
            self.heap_pushes += 1
            heapq.heappush(self._global, (node.touched, -node.end, next(self._seq), node))
        if replica in parent.holders:  # (a root holds nothing) it may be a leaf now
            self.heap_pushes += 1
            entry = (parent.holders[replica], -parent.end, next(self._seq), parent)
            heapq.heappush(self._heaps[replica], entry)

    def _unlink(self, node: Node) -> None:
        parent = node.parent
        assert parent is not None and not node.children
        del parent.children[node.key]
        node.parent = None
        self.nodes -= 1
        self.total_tokens -= len(node.edge) // 4
        if parent.parent is None:
            if not parent.children:
                del self.roots[parent.key]
        elif not parent.children:  # a leaf now
            self.heap_pushes += 1
            heapq.heappush(self._global, (parent.touched, -parent.end, next(self._seq), parent))

    def _evict_global(self) -> bool:
        """Drop the whole tree's least recently used leaf; False when nothing is left."""
        heap = self._global
        while heap:
            tick, _, _, node = heapq.heappop(heap)
            if node.parent is not None and node.touched == tick and not node.children:
                for rid in list(node.holders):
                    self._release(node, rid)
                return True
        return False

    def drop(self, replica: str) -> None:
        """Forget everything ``replica`` holds (it left or restarted)."""
        heap = self._heaps.get(replica, [])
        while heap:  # leaves first; a release enters the parent it leaves a leaf
            tick, _, _, node = heapq.heappop(heap)
            if node.holders.get(replica) == tick:
                self._release(node, replica)
        assert replica not in self.tokens and replica not in self._heaps

    # -- checking ------------------------------------------------------------------------

    def walk(self) -> Iterator[Node]:
        """Every non-root node, parents before children."""
        stack = [c for root in self.roots.values() for c in root.children.values()]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` naming the first broken invariant and its counts."""
        tokens: dict[str, int] = {}
        held: dict[str, int] = {}
        nodes = total = holdings = 0
        live = {
            rid: {(e[0], id(e[3])) for e in heap if e[3].holders.get(rid) == e[0]}
            for rid, heap in self._heaps.items()
        }
        live_global = {(e[0], id(e[3])) for e in self._global if e[3].touched == e[0]}
        for root in self.roots.values():
            assert root.children, f"empty root {root.key!r} kept"
        for node in self.walk():
            nodes += 1
            size = len(node.edge) // 4
            total += size
            parent = node.parent
            assert parent is not None and parent.children.get(node.key) is node, "bad link"
            assert size > 0 and len(node.edge) % 4 == 0, f"bad edge of {len(node.edge)} bytes"
            assert node.key == node.edge[:4], "child key is not the edge's first token"
            assert node.end == parent.end + size, f"end {node.end} != {parent.end} + {size}"
            assert node.holders, f"node at depth {node.end} has no holder"
            assert node.touched == max(node.holders.values()), "touched is not the last tick"
            if not node.children:
                assert (node.touched, id(node)) in live_global, (
                    f"leaf at depth {node.end}: no whole-tree heap entry"
                )
            for rid, tick in node.holders.items():
                tokens[rid] = tokens.get(rid, 0) + size
                held[rid] = held.get(rid, 0) + 1
                holdings += 1
                if parent.parent is not None:
                    assert rid in parent.holders, f"{rid} holds a node but not its parent"
                    assert parent.holders[rid] >= tick, f"{rid}: child newer than parent"
                if not any(rid in c.holders for c in node.children.values()):
                    assert (tick, id(node)) in live.get(rid, ()), f"{rid}: no heap entry"
        counts = (self.nodes, self.total_tokens, self.holdings)
        assert counts == (nodes, total, holdings), f"(nodes, tokens, holdings) {counts} != " + (
            f"{(nodes, total, holdings)}"
        )
        assert self.tokens == tokens, f"per-replica tokens {self.tokens} != {tokens}"
        assert self.held == held, f"per-replica nodes {self.held} != {held}"
        idle = set(self._heaps) - set(held)
        assert not idle, f"heaps kept of replicas holding nothing: {idle}"
