"""The prefix cache of ``agentrl serve``: a radix tree over token ids whose nodes own KV entries.

What it is: ``PrefixCache``, the bookkeeping half of prompt sharing (SGLang's RadixAttention
is the model: ``python/sglang/srt/mem_cache/radix_cache.py``). Each edge of the tree is a run
of token ids; each token on it owns one entry of a fixed pool of KV storage (the pool's
tensors live in ``Decoder.pool_k``/``pool_v``, indexed by entry). ``match(tokens)`` returns
the entries of the longest cached prefix of ``tokens``; ``insert(tokens, store)`` caches the
part not cached yet, giving it free entries and calling ``store(start, entries)`` to copy
the keys/values in; ``flush()`` forgets everything (after a weight update, the cached KV
belongs to the old weights).

How it differs from SGLang's: the engine *copies* a matched prefix into the request's own
cache slot instead of pointing the request at the pool (the decode step then reads one
contiguous slot per row, which keeps it fast on a CPU, and the tree never has nodes in use:
no lock counts), and the unit is one token, like SGLang's default page size of 1. When the
pool is full, least-recently-used leaves are evicted — in bulk, down to
``capacity - capacity // 8`` entries in use, so that a full cache does not scan the tree on
every insert. What it is not: thread-safe (the scheduler thread owns it), nor aware of weights
(the engine flushes it on every update), nor a host-memory or disk tier.

Main hook::

    cache = PrefixCache(capacity=4096)
    entries = cache.match(prompt[:-1])   # decoder.load_prefixes([(slot, entries)]), then compute the rest
    cache.insert(prompt, lambda start, e: decoder.save_prefixes({x: (slot, start + j) for j, x in enumerate(e)}))
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence


class _Node:
    __slots__ = ("key", "entries", "children", "parent", "last_used", "pinned")

    def __init__(self, key: list[int], entries: list[int], parent: _Node | None, last_used: int) -> None:
        self.key = key  # the token ids on the edge into this node
        self.entries = entries  # one pool entry per token of key
        self.children: dict[int, _Node] = {}  # by first token
        self.parent = parent
        self.last_used = last_used
        self.pinned = False  # on the path an insert is extending: not evictable meanwhile


def _common(key: list[int], tokens: Sequence[int], at: int) -> int:
    """How many leading tokens of ``key`` equal ``tokens[at:]``."""
    n = min(len(key), len(tokens) - at)
    if key[:n] == list(tokens[at : at + n]):
        return n
    i = 0
    while i < n and key[i] == tokens[at + i]:
        i += 1
    return i


class PrefixCache:
    """A radix tree of cached token prefixes over ``capacity`` KV entries; see the module docstring."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a prefix cache needs capacity >= 1 entries, got {capacity}")
        self.capacity = capacity
        self._clock = itertools.count(1)
        self.evicted = 0  # entries evicted since start (flushes not counted)
        self.flush()

    @property
    def size(self) -> int:
        """Entries in use (= tokens cached)."""
        return self.capacity - len(self._free)

    def flush(self) -> None:
        """Forget every cached prefix."""
        self._root = _Node([], [], None, 0)
        self._free = list(range(self.capacity - 1, -1, -1))  # popped from the end: entry 0 first

    def match(self, tokens: Sequence[int]) -> list[int]:
        """Pool entries of the longest cached prefix of ``tokens`` (marks it recently used)."""
        return self._descend(tokens, split=False)[3]

    def insert(self, tokens: Sequence[int], store: Callable[[int, list[int]], None]) -> int:
        """Cache ``tokens``: the uncached suffix gets entries and ``store(start, entries)``
        copies its keys/values (positions ``start ..``) into them. Returns how many tokens
        were added — fewer than the suffix when the pool cannot hold it all."""
        node, at, path, _ = self._descend(tokens, split=True)
        need = len(tokens) - at
        if need == 0:
            return 0
        for p in path:
            p.pinned = True
        try:
            if len(self._free) < need:
                self._evict(max(need - len(self._free), self.capacity // 8))
        finally:
            for p in path:
                p.pinned = False
        n = min(need, len(self._free))
        if n == 0:
            return 0
        entries = [self._free.pop() for _ in range(n)]
        store(at, entries)
        leaf = _Node(list(tokens[at : at + n]), entries, node, next(self._clock))
        node.children[tokens[at]] = leaf
        return n

    def _descend(self, tokens: Sequence[int], *, split: bool) -> tuple[_Node, int, list[_Node], list[int]]:
        """Follow ``tokens`` down from the root, marking the nodes passed as used now. Returns
        the last node reached, how many tokens matched, the nodes passed and the matched
        entries. A partly matched edge counts in the entries; with ``split`` it is first cut
        so that the match ends on a node (``insert`` hangs the rest there)."""
        node, at, path, entries = self._root, 0, [], []
        now = next(self._clock)
        while at < len(tokens):
            child = node.children.get(tokens[at])
            if child is None:
                break
            k = _common(child.key, tokens, at)
            if k < len(child.key):
                if not split:
                    child.last_used = now
                    entries.extend(child.entries[:k])
                    at += k
                    break
                child = self._split(child, k)
            child.last_used = now
            entries.extend(child.entries)
            path.append(child)
            node, at = child, at + k
        return node, at, path, entries

    def _split(self, child: _Node, k: int) -> _Node:
        """Cut ``child``'s edge after ``k`` tokens; returns the new upper node."""
        upper = _Node(child.key[:k], child.entries[:k], child.parent, child.last_used)
        assert child.parent is not None
        child.parent.children[child.key[0]] = upper
        child.key, child.entries, child.parent = child.key[k:], child.entries[k:], upper
        upper.children[child.key[0]] = child
        return upper

    def _evict(self, amount: int) -> None:
        """Free at least ``amount`` entries (if that many are evictable), least recently used leaves first."""
        leaves, stack = [], [self._root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node is not self._root and not node.pinned:
                leaves.append((node.last_used, id(node), node))
        heapq.heapify(leaves)
        freed = 0
        while leaves and freed < amount:
            _, _, node = heapq.heappop(leaves)
            parent = node.parent
            assert parent is not None
            del parent.children[node.key[0]]
            self._free.extend(node.entries)
            freed += len(node.entries)
            if not parent.children and parent is not self._root and not parent.pinned:
                heapq.heappush(leaves, (parent.last_used, id(parent), parent))
        self.evicted += freed
