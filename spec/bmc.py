"""Bounded model checking: K rounds of a prefill node with N symbolic requests.

The unrolling starts from a fresh node (free + evictable pool, pinned and unpinned device
prefixes, host-tier prefixes, no in-progress request) and runs the scheduler's round K times:
release the KV of requests whose transfer completed, let arrived requests in, plan
(``model.RoundModel``), commit. Every input is symbolic within declared bounds
(:class:`Bounds`); the configuration (page size, chunk size, sliding window) is concrete.

Deepening goes a round at a time: round k's constraints extend the formula and each open
property is asked about round k, so the first counterexample found is a shortest one and its
trace is as readable as possible. Each question is a fresh one-shot query
(:mod:`policykit.spec.solver`): z3's preprocessing, which an incremental solver skips, is what
keeps the unrolled formula tractable.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any

import z3

import policykit.spec.swa as sw
from policykit import kernel
from policykit.config import EngineConfig
from policykit.kernel.swa import prefix_window
from policykit.liveness import idle_capacity, never_completes
from policykit.pages import cached_on_release, ceil_paged
from policykit.registry import Combo
from policykit.spec.cache import (
    Unit,
    checkpoint_tick,
    commit_tick,
    evict,
    evict_swa,
    initial_units,
    refresh_tick,
    release_tick,
    touch_tick,
)
from policykit.spec.encoding import Encoder, Terms, ite, t
from policykit.spec.model import (
    DEFERRED,
    FINAL,
    NONE,
    WHOLE,
    EntryTerms,
    Hit,
    IdleNode,
    Req,
    RoundModel,
    RoundState,
    eviction_share,
    full_need,
    make_request,
    owed,
    placed_kind,
    quiet_entry,
    swa_need,
)
from policykit.spec.symbolic import Sym, num, term_of

#: the properties, in the order they are reported
PROPERTIES = (
    "no-oom",
    "swa-no-oom",
    "admitted-completes",
    "no-starvation",
    "progress",
    "ledger",
    "contract",
)
#: the key of admitted-completes' stuck half in a round's violations (not a property of its own)
STUCK_ONLY = "admitted-completes:stuck"


@dataclass(frozen=True)
class Bounds:
    """Declared bounds of the symbolic inputs."""

    max_pool_tokens: int = 1 << 18
    max_release_rounds: int | None = None  #: None: up to the unrolling depth
    #: prompt and host-prefix lengths are multiples of this (None: the page size). Token
    #: granularity (1) is searched too, but z3 needs far longer to rule out page-remainder cases
    granule: int | None = None
    #: hybrid SWA: the smallest sliding-window pool searched (None: a page). SGLang 0.5.23
    #: refuses to start with a pool of at most ``window + page_size`` tokens
    #: (``validate_swa_pool_size``); give ``window + page_size + 1`` to search only the pools
    #: it runs with
    min_swa_pool_tokens: int | None = None

    def granule_for(self, config: EngineConfig) -> int:
        return config.page_size if self.granule is None else self.granule

    def release_cap(self, rounds: int) -> int:
        return rounds if self.max_release_rounds is None else self.max_release_rounds


@dataclass
class Inputs:
    """The symbolic scenario: pool and requests (what a counterexample exports)."""

    free: Sym
    evictable: Sym
    swa_free: Sym
    release_never: z3.BoolRef
    release_rounds: Sym
    requests: list[Req]
    #: the pool's size and the pinned prefixes in it (what never-fits measures an idle node by)
    pool_total: Sym
    pinned: Sym
    #: what the declared bounds require of the inputs (a shrunk counterexample must keep them)
    facts: list[z3.BoolRef]
    #: the evictable tokens that are no request's unpinned prefix (the scenario's filler)
    filler: Sym
    #: requests may have unpinned device prefixes: the evictable cache is then modelled
    #: (:mod:`policykit.spec.cache`); without, every device prefix is pinned
    unpinned: bool
    #: hybrid SWA: the free sliding-window slots in whole pages, and the whole pool (those
    #: and every cached prefix's live window, ``policykit.scenario.swa_pool_tokens``)
    swa_paged: Sym = field(default_factory=lambda: Sym(num(0)))
    swa_pool: Sym = field(default_factory=lambda: Sym(num(0)))

    def shrinkable(self, config: EngineConfig, granule: int) -> list[tuple[Sym, int, int]]:
        """The integer inputs as ``(input, step, floor)``, in the order a counterexample is
        shrunk: the pool (in pages), then the prompts (in the granule), then timing."""
        page, reqs = config.page_size, self.requests
        pool = [(self.free, page, 0), (self.evictable, page, 0)]
        pool += [(r.device, page, 0) for r in reqs]
        if self.unpinned:
            pool += [(r.unpinned, page, 0) for r in reqs]
        if config.hybrid_swa:
            pool.append((self.swa_free, page, page))
        prompts = [(x, granule, 0) for r in reqs for x in (r.prompt, r.host)]
        timing = [(r.arrival, 1, 1) for r in reqs] + [(self.release_rounds, 1, 0)]
        return pool + prompts + timing


@dataclass
class RoundTrace:
    """Terms describing one round, evaluated in a model to print a counterexample."""

    baseline: Sym
    swa_free: Sym
    entries: list[EntryTerms]  #: one per request (kind NONE when it did nothing)
    released: list[z3.BoolRef]
    oom_full: z3.BoolRef
    oom_swa: z3.BoolRef
    need_full: Sym
    baseline_after: Sym
    owed_after: Sym
    #: what the node can ever free again after the round (free + evictable + held KV due back)
    reclaimable_after: Sym
    #: per request: failed this round for waiting forever (the stuck-request valve)
    stuck: list[z3.BoolRef]


@dataclass
class Unrolling:
    """The growing BMC formula and, per round, each property's violation condition."""

    combo: Combo
    config: EngineConfig
    requests: int
    bounds: Bounds
    enc: Encoder
    inputs: Inputs
    rounds: list[RoundTrace] = field(default_factory=list)
    violations: list[dict[str, z3.BoolRef]] = field(default_factory=list)
    #: the bound K of ``bounded-overtaking`` where this unrolling searches it
    #: (:mod:`policykit.spec.overtaking`): its counterexamples carry it to ``simulate``
    overtaking: int | None = None


def make_inputs(
    enc: Encoder, model: RoundModel, n: int, rounds: int, bounds: Bounds, unpinned: bool = True
) -> Inputs:
    """The symbolic scenario, its requests numbered in the order the queue looks at them;
    ``unpinned``: device prefixes may be unpinned (never under a sorting queue)."""
    unpinned = unpinned and model.combo.queue.arrival_order
    config = model.config
    page = config.page_size
    first_fact = len(enc.facts)
    free, evictable = enc.var("free"), enc.var("evictable")
    swa_free = enc.var("swa_free")
    never, delay = z3.Bool("release_never"), enc.var("release_rounds")
    g = bounds.granule_for(config)
    reqs = [
        make_request(
            enc,
            chr(ord("A") + i) if n <= 26 else f"R{i}",
            tuple(enc.var(f"{what}{i}") for what in ("prompt", "device", "host", "arrival")),
            page,
            host_paged=g % page == 0,
            unpinned=enc.var(f"unpinned{i}") if unpinned else None,
        )
        for i in range(n)
    ]
    f = enc.facts
    filler = evictable
    if unpinned:
        filler = enc.bind("filler", evictable - sum((r.unpinned for r in reqs), Sym(num(0))))
        f.append(filler.t >= 0)  # unpinned prefixes are part of the evictable total
    pinned = sum((r.device for r in reqs), Sym(num(0)))
    total = free + evictable + pinned
    f += [
        free.t >= 0,
        evictable.t >= 0,
        (free % page).t == 0,
        (evictable % page).t == 0,
        total.t >= page,
        total.t <= bounds.max_pool_tokens,
        delay.t >= 0,
        delay.t <= bounds.release_cap(rounds),
    ]
    if config.hybrid_swa:
        floor = max(page, bounds.min_swa_pool_tokens or 0)
        f += [swa_free.t >= floor, swa_free.t <= bounds.max_pool_tokens]
    else:
        f += [swa_free.t == 0]
    for r in reqs:
        f += [
            (r.prompt % g).t == 0,
            (r.host % g).t == 0,
            r.prompt.t >= 1,
            r.device.t >= 0,
            (r.device % page).t == 0,
            r.host.t >= 0,
            (r.device + r.unpinned + r.host if unpinned else r.device + r.host).t < r.prompt.t,
            # arrive() refuses what can never fit the pool; such requests are not interesting
            ceil_paged(r.prompt, page).t <= total.t,
            r.arrival.t >= 1,
            r.arrival.t <= rounds,
        ]
    if unpinned:
        f += [
            fact
            for r in reqs
            for fact in (
                r.unpinned.t >= 0,
                (r.unpinned % page).t == 0,
                z3.Or(r.device.t == 0, r.unpinned.t == 0),  # one device prefix, pinned or not
            )
        ]
    # (a sorting queue, ``lpm``, ranks a request by its cached prefix, which eviction shrinks:
    # the order would change between rounds, which ``queue_order`` cannot say)
    f += queue_order(model, reqs)
    facts = enc.facts[first_fact:]
    inp = Inputs(
        free, evictable, swa_free, never, delay, reqs, total, pinned, facts, filler, unpinned
    )
    _swa_pool_inputs(enc, inp, config)
    return inp


def _swa_pool_inputs(enc: Encoder, inp: Inputs, config: EngineConfig) -> None:
    """Hybrid SWA: the free sliding-window slots in whole pages and the whole pool, as
    ``policykit.scenario.swa_pool_tokens`` sizes the node's (each cached prefix keeps its
    last window live)."""
    window, page = config.sliding_window, config.page_size
    if config.hybrid_swa and window is not None:
        inp.swa_paged = enc.bind("swa_paged", inp.swa_free // page * page)
        prefixes = [prefix_window(r.device + r.unpinned, window, page) for r in inp.requests]
        inp.swa_pool = enc.bind("swa_pool", sum(prefixes, inp.swa_paged))


def queue_order(model: RoundModel, reqs: list[Req]) -> list[z3.BoolRef]:
    """Facts that number the requests in the queue's order (``kernel.goes_before``, the order
    the planner sorts its arrival-ordered queue by).
    No scenario is lost: any one can be renumbered so. A request's priority depends on its own
    facts alone (``QueueView``), so the order is the same in every round."""
    keys = [model.priority(r) for r in reqs]
    return [
        kernel.goes_before(model.terms, ka, kb, a.arrival.t <= b.arrival.t)
        for (a, ka), (b, kb) in itertools.pairwise(zip(reqs, keys, strict=True))
    ]


@dataclass
class NodeState:
    """Node state between rounds (terms)."""

    baseline: Sym
    swa_free: Sym
    left: list[z3.BoolRef]  #: the request left the waiting queue (placed or rejected for good)
    #: with a queue in arrival order, requests leave it in order: how many have (``left`` is
    #: then ``admitted > i``). One counter instead of a flag per request keeps that order
    #: explicit, which the solver needs: with flags the round-3 query of the truncated-tail
    #: incident went from 5-12 s to over 15 s. None for a queue ordered by priority
    admitted: Sym | None
    seq: list[Sym]
    finished: list[Sym]  #: round it finished, 0 while not
    released: list[z3.BoolRef]
    swa: sw.Window  #: hybrid SWA: what each request holds of the sliding-window pool
    rejected: list[z3.BoolRef]  #: refused for good (``NEVER``): left the queue, holds nothing
    alive: z3.BoolRef  #: no OOM and no policy error so far
    free: Sym  #: the free list (the baseline less the evictable cache)
    #: per request, then the filler: the evictable cache (:mod:`policykit.spec.cache`)
    units: list[Unit]
    cached: list[Sym]  #: device tokens the request was admitted with (before: its device prefix)
    #: its place in the plan of the round it finished in (releases run in that order)
    finish_pos: list[Sym]
    #: rounds so far that sorted a non-empty waiting queue (``Scheduler._queue_sorts``)
    sorts: Sym


def initial_state(inp: Inputs, in_arrival_order: bool, config: EngineConfig) -> NodeState:
    """A fresh node; ``in_arrival_order``: the queue policy keeps arrival order. ``config``:
    with hybrid SWA, the sliding-window pool is the node's (whole pages, each cached unpinned
    prefix's live window evictable: ``policykit.scenario.swa_pool_tokens``)."""
    zero = Sym(num(0))
    n = len(inp.requests)
    live = None
    swa_free = inp.swa_free
    if config.hybrid_swa and config.sliding_window is not None:
        swa_free = inp.swa_paged
        if inp.unpinned:
            window, page = config.sliding_window, config.page_size
            live = [prefix_window(r.unpinned, window, page) for r in inp.requests]
    return NodeState(
        baseline=inp.free + inp.evictable,
        swa_free=swa_free,
        left=[z3.BoolVal(False)] * n,
        admitted=Sym(num(0)) if in_arrival_order else None,
        seq=[zero] * n,
        finished=[zero] * n,
        released=[z3.BoolVal(False)] * n,
        swa=sw.Window.empty(n),
        rejected=[z3.BoolVal(False)] * n,
        alive=z3.BoolVal(True),
        free=inp.free,
        units=initial_units([r.unpinned for r in inp.requests], inp.filler, live),
        cached=[r.device for r in inp.requests],
        finish_pos=[zero] * n,
        sorts=zero,
    )


@dataclass
class _Work:
    """Round ``r``'s terms as its phases hand them on (:func:`unroll_round`)."""

    r: int
    released: list[z3.BoolRef]  #: released at the round's start
    baseline: Sym
    swa_free: Sym
    free: Sym
    units: list[Unit]
    win: sw.Window  #: hybrid SWA: what each request holds of the sliding-window pool
    cached: list[Sym]  #: per request, ``NodeState.cached`` (a checkpoint may lock more)
    state: RoundState | None = None  #: the planner's, once the round opens
    entries: list[EntryTerms] = field(default_factory=list)
    has: z3.BoolRef = field(default_factory=lambda: z3.BoolVal(False))  #: one in progress
    progress_bad: z3.BoolRef = field(default_factory=lambda: z3.BoolVal(False))
    placed_any: list[z3.BoolRef] = field(default_factory=list)
    #: the round's load-backs so far (``LoadBacks``): what their evictions freed, what they took
    freed: Sym = field(default_factory=lambda: Sym(num(0)))
    loaded: Sym = field(default_factory=lambda: Sym(num(0)))
    # the commit's (:func:`_commit`)
    need: Any = None  #: slots the commit takes
    oom_full: Any = None
    oom_swa: Any = None
    #: hybrid SWA: a load-back found the sliding-window pool short (an OOM at the commit)
    load_short: z3.BoolRef = field(default_factory=lambda: z3.BoolVal(False))
    baseline_after: Any = None
    swa_after: Any = None  #: the sliding-window pool's free slots after it
    due: list[z3.BoolRef] = field(default_factory=list)  #: held KV still to come back


def unroll_round(
    u: Unrolling, model: RoundModel, s: NodeState, r: int
) -> tuple[NodeState, dict[str, z3.BoolRef]]:
    """Round ``r``: release, arrive, plan, commit. Returns the next state and violations."""
    w = _release(u, s, r)
    _checkpoint(u, s, w)
    f = z3.BoolVal(False)
    ledger = model.open_ledger(w.baseline, _swa_baseline(u, w))
    w.state = RoundState(ledger, f, f, z3.BoolVal(True), f, f)
    _resume(u, model, s, w)
    nxt = dataclasses.replace(s, units=w.units)
    _admit_queue(u, model, s, nxt, w)
    _commit(u, s, nxt, w)
    return _settle(u, model, s, nxt, w)


def _release(u: Unrolling, s: NodeState, r: int) -> _Work:
    """The KV of held requests whose transfer has completed goes back: the sliding-window
    pool's at once; the full pool's whole pages to the cache (where it is modelled), the
    partly filled last page and an unlocked prefix's copy to the free list."""
    enc, inp, page = u.enc, u.inputs, u.config.page_size
    released_now = [
        z3.And(
            s.finished[i].t > 0,
            z3.Not(s.released[i]),
            z3.Not(inp.release_never),
            kernel.kv_back(s.finished[i].t, inp.release_rounds.t, r),
        )
        for i in range(len(inp.requests))
    ]
    baseline, swa_free, free = s.baseline, s.swa_free, s.free
    units = list(s.units)
    win = s.swa.copy()
    cache = inp.unpinned  # the evictable cache is modelled
    for i, q in enumerate(inp.requests):
        rel, unit = released_now[i], units[i]
        # its sliding-window KV: the partly filled last page back to the free list, the rest
        # left in the tree as evictable cache (with no cache modelled, free as well)
        last_page = ceil_paged(q.prompt, page) - cached_on_release(q.prompt, page)
        freed_swa = last_page if cache else win.hold[i]
        swa_free = swa_free + ite(rel, freed_swa, 0)
        unit = dataclasses.replace(unit, swa=ite(rel, unit.swa + win.hold[i] - freed_swa, unit.swa))
        win.hold[i] = ite(rel, 0, win.hold[i])
        if not cache:
            baseline = baseline + ite(rel, owed(q.prompt, q.device, page), 0)
            continue
        own = own_pages(q.prompt, s.cached[i], page)  # a finished request's own pages
        baseline = baseline + ite(rel, own + unit.lock, 0)  # and its lock is dropped
        # its whole pages are cached (a leaf over its prefix node, if that is still cached);
        # the partly filled last page, and its own copy of a prefix it did not lock, are freed
        aligned = cached_on_release(q.prompt, page)
        partial = ceil_paged(q.prompt, page) - aligned
        # (its prefix: before the release, ``top`` and ``bottom`` hold it, the hybrid-SWA
        # prefix's live leaf and the tombstone above it)
        prefix = unit.top + unit.bottom
        free = free + ite(rel, partial + ite(unit.lock.t == 0, prefix, 0), 0)
        units[i] = Unit(
            top=enc.bind("unit_top", ite(rel, aligned - q.device - prefix, unit.top)),
            bottom=enc.bind("unit_bottom", ite(rel, prefix, unit.bottom)),
            stamp=ite(rel, release_tick(r, s.finished[i], s.finish_pos[i]), unit.stamp),
            lock=ite(rel, 0, unit.lock),
            swa=enc.bind("unit_swa", unit.swa),
            drops=z3.And(z3.Not(rel), unit.drops),
        )
    baseline = enc.bind("baseline", baseline)
    swa_free = enc.bind("swa_free", swa_free)
    if cache:
        free = enc.bind("free", free)
    return _Work(r, released_now, baseline, swa_free, free, units, win, list(s.cached))


def _checkpoint(u: Unrolling, s: NodeState, w: _Work) -> None:
    """Hybrid SWA: the in-progress request's round-start checkpoint (:func:`sw.checkpoint`)."""
    cfg, inp = u.config, u.inputs
    window = cfg.sliding_window
    if not cfg.hybrid_swa or window is None:
        return
    tick = checkpoint_tick(w.r)
    freed = Sym(num(0))
    for i in range(len(inp.requests)):
        going = z3.And(s.left[i], s.finished[i].t == 0, z3.Not(s.rejected[i]), s.seq[i].t > 0)
        done = sw.checkpoint(
            u.enc, w.win, i, going, s.seq[i], w.units[i], tick, window, cfg.page_size
        )
        freed = freed + done.swa_freed
        if inp.unpinned:
            w.units[i] = done.unit
            # a recovered tombstone is locked; the request's own copy of it is freed
            w.free = w.free + done.recovered
            w.cached[i] = u.enc.bind("cached", w.cached[i] + done.recovered)
        else:  # no cache modelled: what leaves the window lock is as good as free
            freed = freed + (done.unit.swa - w.units[i].swa)
    w.swa_free = u.enc.bind("swa_free", w.swa_free + freed)


def _swa_baseline(u: Unrolling, w: _Work) -> Sym | None:
    """The round's sliding-window baseline: free plus evictable (``PrefillNode.swa_baseline``)."""
    if not u.config.hybrid_swa:
        return None
    if not u.inputs.unpinned:
        return w.swa_free
    return u.enc.bind("swa_baseline", sum((x.swa for x in w.units), w.swa_free))


def _resume(u: Unrolling, model: RoundModel, s: NodeState, w: _Work) -> None:
    """The in-progress request (at most one: selected, resumed once) goes first; ``progress``
    fails where it is deferred with the memory to finish it."""
    enc, reqs, page = u.enc, u.inputs.requests, u.config.page_size
    in_progress = [
        z3.And(s.left[i], s.finished[i].t == 0, z3.Not(s.rejected[i])) for i in range(len(reqs))
    ]
    w.has = z3.simplify(z3.Or(*in_progress))
    w.entries = [quiet_entry() for _ in reqs]
    if z3.is_false(w.has):
        return
    prompt, seq_c = reqs[-1].prompt, s.seq[-1]
    for i in reversed(range(len(reqs) - 1)):
        prompt = ite(in_progress[i], reqs[i].prompt, prompt)
        seq_c = ite(in_progress[i], s.seq[i], seq_c)
    c_prompt, c_seq = enc.bind("c_prompt", prompt), enc.bind("c_seq", seq_c)
    assert w.state is not None
    e = model.resume(w.state, w.has, c_prompt, c_seq)
    room = z3.And(
        w.baseline.t >= owed(c_prompt, c_seq, page).t + page,
        term_of(w.state.ledger.swa_baseline) >= (c_prompt - c_seq).t + 2 * page
        if u.config.hybrid_swa
        else z3.BoolVal(True),
    )
    w.progress_bad = z3.And(w.has, room, e.kind.t == DEFERRED)
    w.entries = [_combine(quiet_entry(), e, in_progress[i]) for i in range(len(reqs))]


def _admit_queue(u: Unrolling, model: RoundModel, s: NodeState, nxt: NodeState, w: _Work) -> None:
    """The queue loop: each waiting request that has arrived, in queue order, gets its turn
    (:meth:`RoundModel.admit`); where the cache is modelled, its match touches its prefix,
    placed it holds its lock, and its load-back evicts at once what the free list lacks, so a
    later request of the round may lose its prefix (``Planner._load_back``). Updates ``nxt``'s
    queue, cache and request fields."""
    enc, inp, r = u.enc, u.inputs, w.r
    cache = inp.unpinned
    w.units, nxt.sorts = _refresh_waiting(u, model.terms, s, w.units, r, cache)
    nxt.left, nxt.rejected, nxt.cached = list(s.left), list(s.rejected), list(w.cached)
    admitted = s.admitted
    idle = _idle(u)
    assert w.state is not None
    for j, q in enumerate(inp.requests):
        waits = z3.Not(nxt.left[j]) if admitted is None else admitted.t <= j
        consider = z3.And(waits, q.arrival.t <= r)
        unit = w.units[j]
        hit = _hit(u, q, unit) if cache else None
        e, placed, never = model.admit(w.state, consider, q, idle, hit)
        if cache:
            touched = z3.And(e.kind.t != NONE, unit.top.t > 0)
            w.units[j] = dataclasses.replace(
                unit.touch(touched, touch_tick(r, j), _refreshes_window(u, q)),
                lock=enc.bind("lock", ite(placed, e.lock, unit.lock)),
            )
            nxt.cached[j] = enc.bind("cached", ite(placed, e.start - e.load_back, nxt.cached[j]))
            short = e.load_back_slots - (w.free + w.freed - w.loaded)
            w.units, taken, swa_taken = evict(enc, w.units, short)
            w.freed, w.loaded = w.freed + taken, w.loaded + e.load_back_slots
            w.swa_free = w.swa_free + swa_taken
        if u.config.hybrid_swa:
            _window_on_admission(u, w, j, e, placed, hit)
        # an entry per request per round: a waiting request cannot also be in progress
        w.entries[j] = _combine(w.entries[j], e, e.kind.t != NONE)
        if admitted is None:
            nxt.left[j] = enc.bind_bool("left", z3.Or(nxt.left[j], placed, never))
        else:
            admitted = enc.bind("admitted", ite(z3.Or(placed, never), j + 1, admitted))
        nxt.rejected[j] = z3.Or(nxt.rejected[j], never)
        w.placed_any.append(placed)
    nxt.admitted = admitted
    if admitted is not None:
        nxt.left = [admitted.t > i for i in range(len(inp.requests))]


def _refreshes_window(u: Unrolling, q: Req) -> z3.BoolRef:
    """Whether a match of ``q`` refreshes its prefix's place in the sliding-window LRU: SGLang's
    match ends at the last node of the host run after it, and the refresh covers a window and
    a page from there (``SWAPrefixCache.refresh``), so a host run that long leaves the prefix
    as old as it was. Always, without hybrid SWA (the stamp then orders nothing else)."""
    window = u.config.sliding_window
    if window is None:
        return z3.BoolVal(True)
    page = u.config.page_size
    return (q.host // page * page).t < window + page


def _idle(u: Unrolling) -> IdleNode:
    """What an idle node could ever offer (never-fits and starvation ask it)."""
    inp = u.inputs
    swa = inp.swa_pool if u.config.hybrid_swa else inp.swa_free
    return IdleNode(capacity=idle_capacity(inp.pool_total, inp.pinned), swa_total=swa)


def _hit(u: Unrolling, q: Req, unit: Unit) -> Hit:
    """What the cache offers ``q`` while ``unit`` holds its unpinned prefix. Under hybrid SWA
    a match is gated on the prefix's live leaf (``top``: the tombstone above it alone matches
    nothing), its lock's window takes the leaf's sliding-window KV, and a load-back's lock
    holds the loaded KV's last window and, where that is short of a window, the prefix's
    (``Planner._window_after_load``)."""
    page, window = u.config.page_size, u.config.sliding_window
    if not u.config.hybrid_swa or window is None:
        return Hit.of(q, unit.top, page)
    cached = ite(unit.top.t > 0, unit.top + unit.bottom, 0)
    hit = Hit.of(q, u.enc.bind("cached_unpinned", cached), page)
    swa_lock = u.enc.bind("swa_lock", ite(unit.top.t > 0, unit.swa, 0))
    cap = sw.paged_window(window, page)
    covered = ite(hit.host.t <= cap, hit.host, cap)
    held = covered + ite(covered.t < window, swa_lock, 0)
    return dataclasses.replace(
        hit, swa_lock=swa_lock, swa_load_lock=u.enc.bind("swa_load_lock", held)
    )


def _window_on_admission(
    u: Unrolling, w: _Work, j: int, e: EntryTerms, placed: z3.BoolRef, hit: Hit | None
) -> None:
    """Hybrid SWA: a placed request's window lock takes its prefix's sliding-window KV out of
    the evictable cache; its load-back, if any, evicts for itself in the sliding-window pool,
    takes its pages there, and leaves what its lock does not hold as evictable cache."""
    enc, page, window = u.enc, u.config.page_size, u.config.sliding_window
    assert window is not None
    zero = Sym(num(0))
    # (re-selected afresh, it locks nothing: its entry's lock says which offer stood)
    swa_lock = zero if hit is None else ite(e.lock.t > 0, hit.swa_lock, 0)
    loads = e.load_back_slots
    cap = sw.paged_window(window, page)
    loaded = ite(loads.t <= cap, loads, cap)  # the live tail the host holds (``swa_host_hit``)
    held_load = loaded if hit is None else hit.swa_load_lock
    held = ite(loads.t > 0, held_load, swa_lock)
    if u.inputs.unpinned:
        # its lock's window first (``_lock_prefix`` comes before the load-back); the commit's
        # match and insert refresh its KV after every match of the planning
        unit = w.units[j]
        refreshed = z3.And(placed, z3.Or(e.lock.t > 0, loads.t > 0))
        w.units[j] = dataclasses.replace(
            unit.touch(refreshed, commit_tick(w.r, j), _refreshes_window(u, u.inputs.requests[j])),
            swa=enc.bind("unit_swa", ite(placed, unit.swa - swa_lock, unit.swa)),
        )
        # ``_evict_for`` in the sliding-window pool, for the live tail the host holds
        short = loaded - w.swa_free
        w.units, swa_taken, full_taken = evict_swa(enc, w.units, ite(loads.t > 0, short, 0))
        w.swa_free, w.freed = w.swa_free + swa_taken, w.freed + full_taken
        w.load_short = z3.Or(w.load_short, z3.And(placed, loaded.t > w.swa_free.t))
        # the loaded KV joins the tree: what the lock does not hold of it (and of the
        # prefix's window it held until then) is evictable
        unit = w.units[j]
        joins = ite(z3.And(placed, loads.t > 0), swa_lock + loaded - held, 0)
        w.units[j] = dataclasses.replace(unit, swa=enc.bind("unit_swa", unit.swa + joins))
        w.swa_free = enc.bind("swa_free", w.swa_free - ite(placed, loaded, 0))
    else:
        w.load_short = z3.Or(w.load_short, z3.And(placed, loaded.t > w.swa_free.t))
        w.swa_free = enc.bind("swa_free", w.swa_free - ite(placed, held, 0))
    branch = Sym(num(0))
    if u.inputs.unpinned:  # matched less than the tree holds of its prefix
        unit = w.units[j]
        full_hit = unit.top + unit.bottom  # ``SWAPrefixCache.full_hit``
        branch = ite(full_hit.t > e.start.t, full_hit, 0)
    last = ite(loads.t > 0, loaded, swa_lock)
    sw.admitted(enc, w.win, j, placed, e.start, (held, last), branch)


def _commit(u: Unrolling, s: NodeState, nxt: NodeState, w: _Work) -> None:
    """The commit: the locks, the load-backs (evicting as foreseen), then one
    ``alloc_extend`` that evicts what the free list still lacks (an OOM where the pool cannot
    pay); each request's progress and its sliding-window hold. Updates ``nxt``'s requests."""
    enc, cfg, page, r = u.enc, u.config, u.config.page_size, w.r
    cache = u.inputs.unpinned
    w.need = enc.bind("need", sum((full_need(e, page) for e in w.entries), Sym(num(0))))
    locks: Sym = Sym(num(0))
    swa_taken = Sym(num(0))
    if cache:
        locks = enc.bind("locks", sum((e.lock for e in w.entries), Sym(num(0))))
        w.free = enc.bind("free_loaded", w.free + w.freed - w.loaded)
        demand = enc.bind("demand", sum((eviction_share(e, page) for e in w.entries), Sym(num(0))))
        w.units, taken, swa_taken = evict(enc, w.units, demand - w.free)
        if cfg.hybrid_swa:  # then what the sliding-window pool still lacks
            quota = demand - w.swa_free - swa_taken
            w.units, swa_more, full_more = evict_swa(enc, w.units, quota)
            swa_taken, taken = swa_taken + swa_more, taken + full_more
        w.free = enc.bind("free_after", w.free + taken - (w.need - w.loaded))
    w.oom_full = w.need.t > (w.baseline - locks).t
    w.oom_swa = z3.BoolVal(False)
    extends = [swa_need(e, page) for e in w.entries]
    swa_after = w.swa_free + swa_taken
    if cfg.hybrid_swa:
        # ``alloc_paged_token_slots_extend``: each extend's whole new pages, in both pools
        w.oom_swa = z3.Or(w.load_short, sum(extends, Sym(num(0))).t > swa_after.t)
    after = w.baseline - locks - w.need if cache else w.baseline - w.need
    w.baseline_after = enc.bind("baseline_after", after)
    nxt.seq, nxt.finished = list(s.seq), list(s.finished)
    nxt.finish_pos = list(s.finish_pos)
    nxt.swa = w.win
    for i, e in enumerate(w.entries):
        computes = e.end.t > e.start.t
        kind = e.kind.t
        done = z3.And(computes, z3.Or(kind == WHOLE, kind == FINAL))
        nxt.seq[i] = enc.bind("seq", ite(computes, e.end, s.seq[i]))
        nxt.finished[i] = enc.bind("finished", ite(done, r, s.finished[i]))
        # the resumed request comes first in the plan, then the queue's
        if cache:
            nxt.finish_pos[i] = enc.bind(
                "finish_pos", ite(done, ite(kind == FINAL, 0, 1 + i), s.finish_pos[i])
            )
        if cfg.hybrid_swa:
            w.win.hold[i] = enc.bind("swa_hold", w.win.hold[i] + extends[i])
            swa_after = swa_after - extends[i]
    w.swa_after = enc.bind("swa_free_after", swa_after)


def _stuck_valve(
    u: Unrolling, terms: Terms, s: NodeState, nxt: NodeState, w: _Work
) -> list[z3.BoolRef]:
    """The scheduler fails an in-progress request deferred on an otherwise idle node
    (nothing computed, no held KV due back): no memory can ever come back for it, and its
    pages go back. Returns, per request, whether it failed so; updates ``nxt`` and ``w``'s
    memory, and sets ``w.due``: per request, its held KV will still come back."""
    enc, inp, page = u.enc, u.inputs, u.config.page_size
    n, cache = len(inp.requests), inp.unpinned
    w.due = [
        kernel.kv_due(terms, nxt.finished[i].t, [s.released[i], w.released[i]], inp.release_never)
        for i in range(n)
    ]
    batch = z3.Or(*(placed_kind(e.kind) for e in w.entries))
    held = z3.Or(*w.due)
    w.freed = Sym(num(0))  # what the valve gives back
    stuck_now: list[z3.BoolRef] = []
    for i, q in enumerate(inp.requests):
        going = [nxt.left[i], nxt.finished[i].t == 0, z3.Not(nxt.rejected[i])]
        stuck = kernel.stuck(terms, batch, held, going)
        stuck_now.append(stuck)
        if cache:
            own = own_pages(nxt.seq[i], nxt.cached[i], page)
            w.freed = w.freed + ite(stuck, own + w.units[i].lock, 0)  # its pages and its lock
            w.free = w.free + ite(stuck, own, 0)
            w.units[i] = dataclasses.replace(w.units[i], lock=ite(stuck, 0, w.units[i].lock))
        else:
            w.freed = w.freed + ite(stuck, owed(nxt.seq[i], q.device, page), 0)
        # its own sliding-window pages are freed, what its window lock held is evictable
        win = nxt.swa
        locked = win.wl[i] if cache else Sym(num(0))
        w.swa_after = w.swa_after + ite(stuck, win.hold[i] - locked, 0)
        if cache:
            unit = w.units[i]
            w.units[i] = dataclasses.replace(unit, swa=ite(stuck, unit.swa + locked, unit.swa))
        win.hold[i] = ite(stuck, 0, win.hold[i])
        nxt.rejected[i] = enc.bind_bool("gone", z3.Or(nxt.rejected[i], stuck))
    w.swa_after = enc.bind("swa_free_next", w.swa_after)
    return stuck_now


def _settle(
    u: Unrolling, model: RoundModel, s: NodeState, nxt: NodeState, w: _Work
) -> tuple[NodeState, dict[str, z3.BoolRef]]:
    """The round's end: the stuck-request valve, what is owed and what can come back, each
    property's violation, the round's trace and the next state."""
    enc, inp, page = u.enc, u.inputs, u.config.page_size
    reqs, cache = inp.requests, inp.unpinned
    assert w.state is not None
    stuck_now = _stuck_valve(u, model.terms, s, nxt, w)
    # what the in-progress request (if any) still needs after this round
    owed_after = Sym(num(0))
    for i, q in enumerate(reqs):
        still = z3.And(nxt.left[i], nxt.finished[i].t == 0, z3.Not(nxt.rejected[i]))
        owed_after = owed_after + ite(still, owed(q.prompt, nxt.seq[i], page), 0)
    owed_after = enc.bind("owed_after", owed_after)
    # (and the prefix it holds locked)
    gives = [
        own_pages(q.prompt, nxt.cached[i], page) + w.units[i].lock
        if cache
        else owed(q.prompt, q.device, page)
        for i, q in enumerate(reqs)
    ]
    reclaimable = kernel.reclaimable(model.terms, w.baseline_after, w.due, gives)
    reclaimable = enc.bind("reclaimable_after", reclaimable)
    violations = _violations(u, model, s, w, owed_after, reclaimable, stuck_now)
    u.rounds.append(
        RoundTrace(
            baseline=w.baseline,
            swa_free=w.swa_free,
            entries=w.entries,
            released=w.released,
            oom_full=w.oom_full,
            oom_swa=w.oom_swa,
            need_full=w.need,
            baseline_after=w.baseline_after,
            owed_after=owed_after,
            reclaimable_after=reclaimable,
            stuck=stuck_now,
        )
    )
    oom = z3.Or(w.oom_full, w.oom_swa)
    alive = z3.And(s.alive, z3.Not(oom), z3.Not(w.state.bad_contract))
    nxt.baseline = enc.bind("baseline_next", w.baseline_after + w.freed)
    nxt.swa_free = w.swa_after
    nxt.released = [z3.Or(a, b) for a, b in zip(s.released, w.released, strict=True)]
    nxt.alive = enc.bind_bool("alive", alive)
    nxt.free = enc.bind("free_next", w.free) if cache else w.free
    nxt.units = w.units
    return nxt, violations


def _violations(
    u: Unrolling,
    model: RoundModel,
    s: NodeState,
    w: _Work,
    owed_after: Sym,
    reclaimable: Sym,
    stuck_now: list[z3.BoolRef],
) -> dict[str, z3.BoolRef]:
    """Each property's violation in the round (where no earlier round failed)."""
    inp, r = u.inputs, w.r
    assert w.state is not None
    alive, bad_contract = s.alive, w.state.bad_contract
    oom = z3.Or(w.oom_full, w.oom_swa)
    # a drained node: nothing in progress, no KV held by finished requests (due back or not)
    holding = [
        z3.And(s.finished[i].t > 0, z3.Not(s.released[i]), z3.Not(w.released[i]))
        for i in range(len(inp.requests))
    ]
    drained = kernel.drained(model.terms, [w.has], holding)
    idle = _idle(u)
    admissible = [
        z3.And(z3.Not(s.left[j]), q.arrival.t <= r, model.fits_idle(q, idle))
        for j, q in enumerate(inp.requests)
    ]
    starves = kernel.starves(model.terms, drained, admissible, w.placed_any)
    never = t(never_completes(owed_after, reclaimable))
    violations = {
        "no-oom": z3.And(alive, z3.Not(bad_contract), w.oom_full),
        "swa-no-oom": z3.And(alive, z3.Not(bad_contract), w.oom_swa),
        "admitted-completes": z3.And(
            alive, z3.Not(bad_contract), z3.Not(oom), z3.Or(never, *stuck_now)
        ),
        "no-starvation": z3.And(alive, z3.Not(bad_contract), starves),
        "progress": z3.And(alive, z3.Not(bad_contract), w.progress_bad),
        "ledger": z3.And(alive, w.state.bad_ledger),
        "contract": z3.And(alive, bad_contract),
        # admitted-completes' stuck half alone, asked where the induction proved its memory half
        STUCK_ONLY: z3.And(alive, z3.Not(bad_contract), z3.Not(oom), z3.Or(*stuck_now)),
    }
    if not u.config.hybrid_swa:
        violations["swa-no-oom"] = z3.BoolVal(False)
    return violations


def _refresh_waiting(
    u: Unrolling, terms: Terms, s: NodeState, units: list[Unit], r: int, cache: bool
) -> tuple[list[Unit], Sym]:
    """``Scheduler._refresh_waiting_prefixes``: where :func:`policykit.kernel.refresh_due` says
    so, each waiting request's prefix is touched, the head last. Modelled where the cache is
    (queues in arrival order)."""
    enc, reqs = u.enc, u.inputs.requests
    if not cache:
        return units, s.sorts
    waiting = [
        z3.And(z3.Not(s.left[j]) if s.admitted is None else s.admitted.t <= j, q.arrival.t <= r)
        for j, q in enumerate(reqs)
    ]
    nonempty = z3.Or(*waiting)
    refresh = z3.And(nonempty, kernel.refresh_due(terms, s.sorts.t, r))
    out = list(units)
    for j, unit in enumerate(units[: len(reqs)]):
        touched = z3.And(refresh, waiting[j], unit.top.t > 0)
        out[j] = unit.touch(touched, refresh_tick(r, j), _refreshes_window(u, reqs[j]))
    return out, enc.bind("sorts", s.sorts + ite(nonempty, 1, 0))


def own_pages(seq: Sym, cached: Sym, page: int) -> Sym:
    """The slots a request admitted with ``cached`` device tokens holds once ``seq`` tokens are
    computed: ``owed(seq, cached)``, written without dividing ``cached`` (a page multiple), so
    that the solver gets no quotient for it."""
    return ceil_paged(seq, page) - cached


def _combine(old: EntryTerms, new: EntryTerms, use_new: z3.BoolRef) -> EntryTerms:
    """``new`` where ``use_new`` holds, else ``old`` (a request is either in progress or
    waiting, so at most one of its resume and admission entries is not NONE)."""
    names = [f.name for f in dataclasses.fields(EntryTerms)]
    return EntryTerms(*(ite(use_new, getattr(new, k), getattr(old, k)) for k in names))
