"""The prefix cache's radix tree on hand-made token lists: matching, splitting, eviction, flushing.

``store`` is a recorder standing in for the decoder's copy into the pool: these tests are
about which entries the tree hands out and keeps, not about keys and values.
"""

from __future__ import annotations

import random

import pytest

from agentrl.inference.prefix_cache import PrefixCache


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[int, list[int]]] = []

    def __call__(self, start: int, entries: list[int]) -> None:
        self.calls.append((start, list(entries)))


def test_match_returns_the_longest_cached_prefix_even_mid_edge():
    cache, store = PrefixCache(32), Recorder()
    assert cache.insert([1, 2, 3, 4], store) == 4
    ((start, entries),) = store.calls
    assert start == 0 and len(set(entries)) == 4
    assert cache.match([1, 2, 3, 4, 5]) == entries
    assert cache.match([1, 2, 9]) == entries[:2]  # part of one edge
    assert cache.match([7, 1, 2]) == []
    assert cache.insert([1, 2, 3], store) == 0 and len(store.calls) == 1  # already cached: nothing stored


def test_a_diverging_insert_splits_the_edge_and_shares_the_common_part():
    cache, store = PrefixCache(32), Recorder()
    cache.insert([1, 2, 3, 4], store)
    assert cache.insert([1, 2, 7, 8, 9], store) == 3
    (_, first), (start, second) = store.calls
    assert start == 2  # only the new suffix is copied, from position 2
    assert cache.match([1, 2, 7, 8, 9]) == first[:2] + second
    assert cache.match([1, 2, 3, 4]) == first
    assert cache.size == 7 and not set(first) & set(second)


def test_least_recently_used_prefixes_are_evicted_when_the_pool_is_full():
    cache, store = PrefixCache(8), Recorder()
    cache.insert([1, 1, 1, 1], store)
    cache.insert([2, 2, 2, 2], store)
    cache.match([1, 1, 1, 1])  # 1s are now more recent than 2s
    assert cache.insert([3, 3, 3, 3], store) == 4
    assert cache.evicted == 4 and cache.size == 8
    assert cache.match([2, 2, 2, 2]) == []
    assert len(cache.match([1, 1, 1, 1])) == 4 and len(cache.match([3, 3, 3, 3])) == 4
    # the freed entries were reused, none is held twice
    assert sorted(cache.match([1, 1, 1, 1]) + cache.match([3, 3, 3, 3])) == list(range(8))


def test_an_insert_never_evicts_its_own_prefix_and_stores_what_fits():
    cache, store = PrefixCache(6), Recorder()
    cache.insert([1, 2, 3], store)
    # 4 new tokens, 3 free entries, and the only other cached tokens are the prefix itself
    assert cache.insert([1, 2, 3, 4, 5, 6, 7], store) == 3
    assert store.calls[-1][0] == 3 and cache.evicted == 0
    assert len(cache.match([1, 2, 3, 4, 5, 6, 7])) == 6
    big = PrefixCache(4)
    assert big.insert(list(range(10, 20)), store) == 4  # longer than the pool: its head is kept
    assert len(big.match(list(range(10, 20)))) == 4


def test_flush_forgets_everything_and_frees_every_entry():
    cache, store = PrefixCache(16), Recorder()
    cache.insert([1, 2, 3], store)
    cache.insert([4, 5], store)
    cache.flush()
    assert cache.size == 0 and cache.match([1, 2, 3]) == [] and cache.match([4, 5]) == []
    assert cache.insert(list(range(16)), store) == 16


def test_random_inserts_keep_every_entry_owned_once():
    """Whatever the order of inserts, matches and evictions: the entries on the tree's edges
    are distinct, their count is ``size``, and a cached prefix always matches in full."""
    rng = random.Random(0)
    cache, store = PrefixCache(40), Recorder()
    for _ in range(400):
        seq = [rng.randint(0, 3) for _ in range(rng.randint(1, 12))]
        if rng.random() < 0.7:
            before = len(cache.match(seq))
            added = cache.insert(seq, store)
            assert len(cache.match(seq)) == before + added  # what was added extends what was there
            if added:
                assert store.calls[-1][0] == before  # copied from the first uncached position
        else:
            cache.match(seq)
        held, stack = [], [cache._root]
        while stack:
            node = stack.pop()
            held.extend(node.entries)
            stack.extend(node.children.values())
        assert len(held) == len(set(held)) == cache.size <= 40


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity >= 1"):
        PrefixCache(0)
