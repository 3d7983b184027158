"""TokenRuns behaves as the tuple of its ids; the indexed host tier and eviction order answer
what a scan of every entry / node answers."""

from __future__ import annotations

import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from policykit.host_tier import HostTier
from policykit.pool import TokenPool
from policykit.prefix_cache import Node, PrefixCache
from policykit.tokens import TokenRuns

runs = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 6)), max_size=6)


@given(runs, st.integers(-3, 30), st.integers(-3, 30))
def test_token_runs_are_the_tuple_of_their_ids(pairs, a, b):
    tokens = TokenRuns(pairs)
    ids = tuple(i for first, n in pairs for i in range(first, first + n))
    assert tuple(tokens) == ids and len(tokens) == len(ids)
    assert tokens == ids and ids == tokens and hash(tokens) == hash(ids)
    assert tokens[a:b] == ids[a:b] and tuple(tokens[a:b]) == ids[a:b]
    assert tokens[a:b] == TokenRuns((i, 1) for i in ids[a:b])  # canonical runs
    assert [tokens[i] for i in range(-len(ids), len(ids))] == [*ids, *ids]
    assert tuple(tokens + TokenRuns.span(7, 2)) == (*ids, 7, 8)
    assert pickle.loads(pickle.dumps(tokens)) == tokens


def test_a_span_is_one_run_whatever_its_length():
    tokens = TokenRuns.span(1 << 40, 1 << 27)
    assert len(tokens) == 1 << 27 and tokens.runs == ((1 << 40, 1 << 27),)
    assert tokens[5:9] == tuple(range((1 << 40) + 5, (1 << 40) + 9))


def _scan_lookup(puts, tokens, start):
    """The host tier before its index: every entry that continues ``tokens[:start]`` (its
    head and run are the prompt's, and its run begins right there, or it holds KV from token 0
    up past it), longest fit, first wins."""
    best = None
    for head, run, held in puts:
        at, end = len(head), len(head) + len(run)
        same = tuple(tokens[:at]) == head and tuple(tokens[at:end]) == run
        reaches = start == at or (held == 0 and start < end)
        longer = best is None or end > len(best[0]) + len(best[1])
        if same and reaches and end <= len(tokens) and longer:
            best = (head, run, held)
    return best


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(st.lists(st.integers(0, 2), max_size=6), st.integers(0, 6), st.booleans()),
        max_size=8,
    ),
    st.lists(st.integers(0, 2), max_size=8),
    st.integers(0, 8),
)
def test_host_lookup_answers_what_a_scan_answers(puts, prompt, start):
    host = HostTier()
    held = []
    for tokens, at, from_zero in puts:
        at = min(at, len(tokens))
        entry = host.put(tuple(tokens), at, held_from=0 if from_zero else None)
        held.append(((tuple(tokens[:at]), tuple(tokens[at:]), 0 if from_zero else at), entry))
    start = min(start, len(prompt))
    want = _scan_lookup([h for h, _ in held], prompt, start)
    got = host.lookup(tuple(prompt), start)
    if want is None:
        assert got is None
    else:
        first = next(e for h, e in held if h == want)
        assert got is first
    assert len(host) == len(puts)


def _scan_victims(cache: PrefixCache, tokens: int, keep=(), gone=()) -> list[Node]:
    """Eviction order before the leaf index: every node, sorted by last access each step."""
    taken = set(gone)

    def free_leaf(n):
        return (
            n.lock_ref == 0
            and n.id not in keep
            and n.id not in taken
            and all(c.id in taken for c in n.children.values())
        )

    leaves = [n for n in cache._nodes() if free_leaf(n)]
    out, freed = [], 0
    while freed < tokens and leaves:
        leaves.sort(key=lambda n: n.last_access)
        leaf = leaves.pop(0)
        taken.add(leaf.id)
        out.append(leaf)
        freed += len(leaf)
        if leaf.parent is not cache.root and free_leaf(leaf.parent):
            leaves.append(leaf.parent)
    return out


ops = st.lists(
    st.tuples(st.sampled_from(["insert", "match", "lock", "evict"]), st.integers(0, 30)),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(1, 200), st.sets(st.integers(0, 30), max_size=4))
def test_eviction_order_is_what_a_scan_of_every_node_gives(steps, want, pick):
    page = 4
    pool = TokenPool(64 * page, page)
    cache = PrefixCache(pool)
    prompts = [tuple([i % 3] * 4 + [i % 5] * 4 + [i] * 4) for i in range(31)]
    for op, i in steps:
        prompt = prompts[i]
        if op == "insert" and pool.free_pages >= 3:
            cache.insert(prompt, pool.alloc(3))
        elif op == "match":
            cache.match(prompt)
        elif op == "lock":
            _, last, _ = cache.match(prompt)
            if last is not cache.root:
                cache.lock(last)
        else:
            cache.evict(i * page)
    nodes = list(cache._nodes())
    ids = [n.id for n in nodes]
    keep = {ids[i % len(ids)] for i in pick} if ids else set()
    gone = {ids[(i * 7) % len(ids)] for i in pick} - keep if ids else set()
    assert [n.id for n in cache.victims(want, keep, gone)] == [
        n.id for n in _scan_victims(cache, want, keep, gone)
    ]
    assert [n.id for n in cache.victims(want)] == [n.id for n in _scan_victims(cache, want)]
