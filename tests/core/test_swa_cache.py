"""The hybrid-SWA prefix cache (policykit.swa_cache): SGLang 0.5.23's SWA radix tree rules,
without SGLang (tests/upstream/test_sglang_conformance.py compares them with SGLang's own)."""

from __future__ import annotations

from policykit.pool import TokenPool
from policykit.swa_cache import SWAPrefixCache, window_start

PAGE, WINDOW = 4, 8


def cache(full: int = 64, swa: int = 64) -> SWAPrefixCache:
    return SWAPrefixCache(TokenPool(full, PAGE), TokenPool(swa, PAGE, name="swa"), WINDOW)


def put(c: SWAPrefixCache, tokens: tuple[int, ...], swa_from: int):
    pages = c.pool.alloc(len(tokens) // PAGE)
    live = c.swa_pool.alloc((len(tokens) - swa_from) // PAGE)
    return c.insert_swa(tokens, pages, live, swa_from)


def test_a_prefix_matches_only_through_a_window_of_live_sliding_window_kv():
    c = cache()
    tokens = tuple(range(24))
    put(c, tokens, window_start(24, WINDOW, PAGE))  # [0, 16) a tombstone, [16, 24) live
    assert c.match(tokens)[0] == 24
    assert c.match(tokens[:20])[0] == 0  # 4 live tokens after the tombstone: not a window
    assert c.swa_evictable_tokens == 8 and c.swa_pool.free_tokens == 56


def test_a_lock_holds_one_window_of_sliding_window_kv_and_the_full_path():
    c = cache()
    tokens = tuple(range(24))
    _, leaf, _ = put(c, tokens, 0)  # all live: a leaf capped at one window, over the rest
    assert [len(n) for n in leaf.path()] == [8, 16]
    c.lock(leaf)
    assert c.evictable_tokens == 0
    assert c.swa_evictable_tokens == 16  # only the window is locked
    c.unlock(leaf)
    assert c.swa_evictable_tokens == 24


def test_sliding_window_eviction_takes_a_leaf_whole_and_tombstones_an_inner_node():
    c = cache()
    _, leaf, _ = put(c, tuple(range(24)), 0)
    upper = leaf.parent
    undo: list = []
    freed = c.evict_swa(16, target=64, freed=0, undo=undo)
    # the least recent first: the upper node (an inner node) becomes a tombstone, its full KV
    # stays, and the leaf's window still carries the whole match
    assert freed == 16 and upper.swa is None and c.evictable_tokens == 24
    assert c.match(tuple(range(24)))[0] == 24
    c.evict_swa(8, target=64, freed=0, undo=undo)
    assert c.total_tokens == 16 and c.swa_pool.free_tokens == 64  # the leaf went whole
    for step in reversed(undo):
        step()
    assert c.total_tokens == 24 and c.swa_pool.free_tokens == 40
    assert c.cached_swa_pages().numel() == 24 // PAGE  # the rollback put every page back
