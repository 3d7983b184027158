"""Bounded model checking of a node that preempts: vLLM 0.33.0's v1 step over symbolic requests.

The step is :class:`policykit.preempting.PreemptingScheduler`'s, unrolled over a few requests
and rounds with symbolic prompt lengths, pool size, arrivals and release timing; its decisions
and arithmetic are :mod:`policykit.kernel`'s (``running_turn``, ``waiting_turn``,
``blocks_to_allocate``, ``victim``), run on z3 terms by :class:`~policykit.spec.encoding.Terms`,
so no rule is written twice. What the model adds is bookkeeping the scheduler keeps in lists:

* **the running list** as one place per request, ordered by when each entered (``rkey``); the
  loop over it takes them in that order, each once, which is the scheduler's index walk (a
  victim behind the requester leaves the list before its turn, a victim before it was already
  served, and the requester preempting itself ends its own turn);
* **the waiting queue** ordered by a key: arrivals append (``arrival * (n + 1) + index``), a
  preempted request goes to the front (a negative key, more negative the later it happened),
  and a sorting queue orders by the policy's priority first;
* **the block pool** as a count of free blocks: a running request holds the blocks of its
  computed tokens, a finished one those of its prompt until its KV is released.

The prefix cache is where the model over-approximates. Without device prefixes in the scenario
the only hits are a preempted request's own full blocks, which stay cached until the free queue
hands them to someone else; which survive depends on the queue's order, so each round the model
lets a waiting request hit any prefix of the full blocks it left (``hit``), none to all. Every
run of the scheduler is then a run of the model (the proofs hold for it); a run of the model the
scheduler does not take is caught by replaying the counterexample (:mod:`.preempting_check`).
``exact_hits`` are the facts of the run where nothing was evicted, tried when a counterexample
over the wider model does not replay.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import z3

from policykit import kernel
from policykit.config import EngineConfig
from policykit.policy import PreemptView, QueueView
from policykit.registry import Combo
from policykit.spec.encoding import Encoder, Terms, ite
from policykit.spec.symbolic import Sym, as_int, num

#: the properties of a node that preempts, in the order they are reported
PREEMPTING_PROPERTIES = ("admitted-completes", "no-starvation")


def _sym(x: Any) -> Sym:
    """A view field as a term even where it is a constant, so every view has one shape."""
    return x if isinstance(x, Sym) else Sym(num(x))


def _sum(terms: list[Any]) -> Sym:
    return sum(terms, Sym(num(0)))


def _pick(conds: list[z3.BoolRef], values: list[Any]) -> Sym:
    """The value whose condition holds (at most one does); 0 where none does."""
    out: Any = Sym(num(0))
    for cond, value in zip(conds, values, strict=True):
        out = ite(cond, value, out)
    return out


@dataclass
class PRequest:
    name: str
    prompt: Sym
    arrival: Sym
    blocks: Sym  #: the blocks its whole prompt holds (``blocks_to_allocate(prompt, 0)``)
    #: its idle verdict: the policies admit it with a first chunk on an empty node
    fits_idle: z3.BoolRef = field(default_factory=lambda: z3.BoolVal(False))


@dataclass
class PInputs:
    """The symbolic scenario (what a counterexample exports)."""

    pool_blocks: Sym
    release_never: z3.BoolRef
    release_rounds: Sym
    requests: list[PRequest]
    facts: list[z3.BoolRef]


@dataclass
class PState:
    """The node between steps, one entry per request."""

    running: list[z3.BoolRef]
    finished: list[Sym]  #: the round it finished in, 0 while not
    released: list[z3.BoolRef]
    computed: list[Sym]
    ever: list[z3.BoolRef]  #: it was admitted at least once
    wkey: list[Sym]  #: its place in the waiting queue (lower first)
    rkey: list[Sym]  #: its place in the running list (lower first)
    cached: list[Sym]  #: full blocks of its prompt it left in the prefix cache
    free: Sym  #: free blocks
    alive: z3.BoolRef  #: no policy broke its contract so far


@dataclass
class PUnrolling:
    """The growing formula: the states after each step and each property's violation."""

    combo: Combo
    config: EngineConfig
    enc: Encoder
    terms: Terms
    inputs: PInputs
    states: list[PState] = field(default_factory=list)
    #: per step, per property, its violation in that step
    violations: list[dict[str, z3.BoolRef]] = field(default_factory=list)
    #: per step, per property, per request: the request the violation is about
    culprits: list[dict[str, list[z3.BoolRef]]] = field(default_factory=list)
    #: the facts of the run where no cached block was evicted (see the module docstring)
    exact_hits: list[z3.BoolRef] = field(default_factory=list)


def make_inputs(
    enc: Encoder, terms: Terms, config: EngineConfig, n: int, rounds: int, pool_cap: int, g: int
) -> PInputs:
    """``n`` requests numbered in arrival order (same-round arrivals in the order added: any
    scenario can be numbered so), a pool of at most ``pool_cap`` tokens that holds every prompt
    (vLLM will not start with a KV cache smaller than its longest sequence), prompts in
    multiples of ``g``, arrivals and releases within ``rounds``."""
    page = config.page_size
    pool = enc.var("pool_blocks")
    never, delay = enc.bool("release_never"), enc.var("release_rounds")
    facts = [pool.t >= 1, (pool * page).t <= pool_cap, delay.t >= 0, delay.t <= rounds]
    reqs = []
    for i in range(n):
        prompt, arrival = enc.var(f"prompt{i}"), enc.var(f"arrival{i}")
        facts += [
            prompt.t >= 1,
            (prompt % g).t == 0,
            prompt.t <= (pool * page).t,
            arrival.t >= 1,
            arrival.t <= rounds,
        ]
        blocks = enc.bind("prompt_blocks", kernel.blocks_to_allocate(prompt, 0, page))
        reqs.append(PRequest(chr(ord("A") + i), prompt, arrival, blocks))
    facts += [a.arrival.t <= b.arrival.t for a, b in itertools.pairwise(reqs)]
    enc.facts.extend(facts)
    for q in reqs:
        q.fits_idle = _fits_idle(terms, config, q, pool)
    return PInputs(pool, never, delay, reqs, facts)


def _fits_idle(terms: Terms, config: EngineConfig, q: PRequest, pool: Sym) -> z3.BoolRef:
    """Whether the policies would start ``q`` on an empty node: admitted with the whole pool
    free and a first chunk of the whole budget, alone (one eligible request)."""
    page = config.page_size
    free = pool * page
    ok = terms.admits(kernel.preempting_admit_view(q.prompt, q.prompt, free, page), q.name)
    budget, alone = _sym(config.chunked_prefill_size), _sym(1)
    view = kernel.preempting_chunk_view(q.prompt, budget, free, alone, page)
    first, bad = kernel.chunk(terms, "new_chunk", view, q.name, label="idle_chunk")
    return z3.And(ok, first.t > 0, z3.Not(bad))


def initial_state(inp: PInputs) -> PState:
    n, zero = len(inp.requests), Sym(num(0))
    return PState(
        running=[z3.BoolVal(False)] * n,
        finished=[zero] * n,
        released=[z3.BoolVal(False)] * n,
        computed=[zero] * n,
        ever=[z3.BoolVal(False)] * n,
        wkey=[q.arrival * (n + 1) + i for i, q in enumerate(inp.requests)],
        rkey=[zero] * n,
        cached=[zero] * n,
        free=inp.pool_blocks,
        alive=z3.BoolVal(True),
    )


@dataclass
class _Step:
    """One step's terms as its phases hand them on."""

    r: int
    eligible: Sym
    budget: Sym
    free: Sym
    bad: Any = False
    #: per running place (the running list's order at the step's start)
    slot_of: list[list[z3.BoolRef]] = field(default_factory=list)
    present: list[Any] = field(default_factory=list)
    prompt: list[Sym] = field(default_factory=list)
    computed: list[Sym] = field(default_factory=list)
    held: list[Sym] = field(default_factory=list)
    sched: list[Sym] = field(default_factory=list)
    preempted: list[Any] = field(default_factory=list)
    order: list[Sym] = field(default_factory=list)  #: its place among this step's preemptions
    left: list[Sym] = field(default_factory=list)  #: full blocks it left cached, if preempted
    #: per waiting place (the queue's order)
    wslot: list[list[z3.BoolRef]] = field(default_factory=list)
    admitted: list[Any] = field(default_factory=list)
    wchunk: list[Sym] = field(default_factory=list)
    wstart: list[Sym] = field(default_factory=list)


def unroll_step(u: PUnrolling, s: PState, r: int) -> PState:
    """Step ``r``: arrivals, the running loop, the waiting loop (if nothing was preempted), the
    chunks computed, the transfers done. Appends the next state and the violations."""
    enc, inp, cfg = u.enc, u.inputs, u.config
    reqs = inp.requests
    arrived = [q.arrival.t <= r for q in reqs]
    unfinished = [f.t == 0 for f in s.finished]
    eligible = enc.bind(
        "eligible",
        _sum([ite(z3.And(a, f), 1, 0) for a, f in zip(arrived, unfinished, strict=True)]),
    )
    w = _Step(r, eligible, _sym(cfg.chunked_prefill_size), s.free)
    _running_loop(u, s, w)
    waiting = [z3.And(arrived[i], z3.Not(s.running[i]), unfinished[i]) for i in range(len(reqs))]
    hits = _hits(u, s, r)
    _waiting_loop(u, s, w, waiting, hits)
    nxt = _compute(u, s, w, r)
    u.violations.append(_violations(u, s, nxt, w, waiting))
    u.states.append(nxt)
    return nxt


def _running_loop(u: PUnrolling, s: PState, w: _Step) -> None:
    """Running requests in the list's order, each once while the budget lasts: its
    ``resume_chunk``; while its blocks do not fit, the preemption policy's victim gives its
    blocks back (``kernel.victim`` over the places still filled), until they fit or the
    requester itself was the victim."""
    enc, terms, page, n = u.enc, u.terms, u.config.page_size, len(u.inputs.requests)
    rank = [
        _sum(
            [ite(z3.And(s.running[j], s.rkey[j].t < s.rkey[i].t), 1, 0) for j in range(n) if j != i]
        )
        for i in range(n)
    ]
    w.slot_of = [[z3.And(s.running[i], rank[i].t == p) for i in range(n)] for p in range(n)]
    w.present = [z3.Or(*row) for row in w.slot_of]
    w.prompt = [
        enc.bind("r_prompt", _pick(row, [q.prompt for q in u.inputs.requests])) for row in w.slot_of
    ]
    w.computed = [enc.bind("r_computed", _pick(row, s.computed)) for row in w.slot_of]
    w.held = [enc.bind("r_held", kernel.blocks_to_allocate(c, 0, page)) for c in w.computed]
    zero = Sym(num(0))
    w.sched, w.preempted, w.order, w.left = [zero] * n, [False] * n, [zero] * n, [zero] * n
    halted: Any = False
    count: Any = Sym(num(0))
    ids = [f"running place {p}" for p in range(n)]
    for turn in range(n):
        halted = z3.Or(halted, z3.And(w.present[turn], w.budget.t <= 0))
        go = z3.And(w.present[turn], z3.Not(halted))
        at = (w.prompt[turn], w.computed[turn], w.held[turn])
        chunk, need, bad = kernel.running_turn(
            terms, *at, w.budget, w.free, w.eligible, page, ids[turn]
        )
        w.bad = z3.Or(w.bad, z3.And(go, bad))
        want = z3.And(go, chunk.t > 0)
        out: Any = False
        for _ in range(n):
            short = z3.And(want, z3.Not(out), need.t > w.free.t)
            victim = _victim(u, w, turn, short)
            for p in range(n):
                hit = z3.And(short, victim.t == p)
                w.free = w.free + ite(hit, w.held[p], 0)
                w.budget = w.budget + ite(hit, w.sched[p], 0)
                full = (w.computed[p] + w.sched[p]) // page
                w.left[p] = ite(hit, full, w.left[p])
                w.order[p] = ite(hit, count, w.order[p])
                w.sched[p] = ite(hit, 0, w.sched[p])
                w.held[p] = ite(hit, 0, w.held[p])
                w.present[p] = z3.And(w.present[p], z3.Not(hit))
                w.preempted[p] = z3.Or(w.preempted[p], hit)
            count = enc.bind("preemptions", count + ite(short, 1, 0))
            out = z3.Or(out, z3.And(short, victim.t == turn))
            w.free = enc.bind("free", w.free)
            w.budget = enc.bind("budget", w.budget)
        placed = z3.And(want, z3.Not(out))
        w.free = enc.bind("free", w.free - ite(placed, need, 0))
        w.held[turn] = enc.bind("r_held", ite(placed, w.held[turn] + need, w.held[turn]))
        w.sched[turn] = enc.bind("r_sched", ite(placed, chunk, 0))
        w.budget = enc.bind("budget", w.budget - ite(placed, chunk, 0))


def _victim(u: PUnrolling, w: _Step, turn: int, short: z3.BoolRef) -> Sym:
    """The preemption policy's victim among the places still filled (``kernel.victim``)."""
    n, page = len(w.present), u.config.page_size
    views = [
        PreemptView(
            position=as_int(_sum([ite(w.present[q], 1, 0) for q in range(p)])),
            prompt_tokens=as_int(w.prompt[p]),
            computed_tokens=as_int(w.computed[p]),
            held_blocks=as_int(w.held[p]),
            is_requester=p == turn,
            page_size=page,
        )
        for p in range(n)
    ]
    ids = [f"running place {p}" for p in range(n)]
    place, bad = kernel.victim(u.terms, views, ids, w.present)
    w.bad = z3.Or(w.bad, z3.And(short, bad))
    return u.enc.bind("victim", place)


def _hits(u: PUnrolling, s: PState, r: int) -> list[Sym]:
    """Each request's prefix-cache hit this step, in blocks: any prefix of the full blocks it
    left cached, never the whole prompt (vLLM keeps one token to compute)."""
    enc, page = u.enc, u.config.page_size
    out = []
    for i, q in enumerate(u.inputs.requests):
        h = enc.var(f"hit{i}_{r}")
        enc.facts += [h.t >= 0, h.t <= s.cached[i].t, (h * page).t <= (q.prompt - 1).t]
        # none evicted: the longest such prefix
        u.exact_hits.append(z3.Or(h.t == s.cached[i].t, ((h + 1) * page).t > (q.prompt - 1).t))
        out.append(h)
    return out


def _waiting_loop(
    u: PUnrolling, s: PState, w: _Step, waiting: list[z3.BoolRef], hits: list[Sym]
) -> None:
    """Waiting requests in the queue's order, only if nothing was preempted: each with its hit,
    ``new_chunk``, ``admit`` and the chunk's blocks; the first that does not get in stops it."""
    enc, page, n = u.enc, u.config.page_size, len(u.inputs.requests)
    reqs = u.inputs.requests
    before = _queue_order(u, s, hits)
    rank = [
        _sum([ite(z3.And(waiting[j], before[j][i]), 1, 0) for j in range(n) if j != i])
        for i in range(n)
    ]
    w.wslot = [[z3.And(waiting[i], rank[i].t == p) for i in range(n)] for p in range(n)]
    stopped: Any = z3.Or(*w.preempted)
    for p, row in enumerate(w.wslot):
        prompt = enc.bind("w_prompt", _pick(row, [q.prompt for q in reqs]))
        hit = enc.bind("w_hit", _pick(row, hits))
        asked = z3.And(z3.Or(*row), z3.Not(stopped), w.budget.t > 0)
        e = kernel.waiting_turn(
            u.terms, prompt, hit, hit, w.budget, w.free, w.eligible, page, f"waiting {p}"
        )
        w.bad = z3.Or(w.bad, z3.And(asked, e.bad))
        admitted = enc.bind_bool(
            "admitted", z3.And(asked, e.chunk.t > 0, e.ok, e.takes.t <= w.free.t)
        )
        stopped = z3.Or(stopped, z3.And(z3.Or(*row), z3.Not(admitted)))
        w.free = enc.bind("free", w.free - ite(admitted, e.takes, 0))
        w.budget = enc.bind("budget", w.budget - ite(admitted, e.chunk, 0))
        w.admitted.append(admitted)
        w.wchunk.append(e.chunk)
        w.wstart.append(hit * page)


def _queue_order(u: PUnrolling, s: PState, hits: list[Sym]) -> list[list[Any]]:
    """``before[j][i]``: waiting request j goes before i (``kernel.goes_before``): the queue's
    own order (its key), under a sorting queue after the policy's priority."""
    n, page = len(s.wkey), u.config.page_size
    keyed = [[s.wkey[j].t < s.wkey[i].t for i in range(n)] for j in range(n)]
    queue = u.combo.queue
    if queue.arrival_order:
        return keyed
    prio = []
    for i, q in enumerate(u.inputs.requests):
        view = QueueView(as_int(q.prompt), as_int(hits[i] * page), as_int(_sym(0)), page)
        rank, _ = u.terms.decide(
            "queue",
            "priority",
            view,
            q.name,
            label="priority",
            bad=lambda _r: False,
            complaint=lambda _r: "",
        )
        prio.append(rank)
    return [
        [kernel.goes_before(u.terms, prio[j], prio[i], keyed[j][i]) for i in range(n)]
        for j in range(n)
    ]


def _compute(u: PUnrolling, s: PState, w: _Step, r: int) -> PState:
    """The scheduled chunks are computed (a prompt computed to its end finishes and holds its
    KV), preempted requests go to the front of the queue, and transfers done release KV."""
    enc, inp = u.enc, u.inputs
    n = len(inp.requests)
    nxt = PState([], [], [], [], [], [], [], [], w.free, z3.And(s.alive, z3.Not(w.bad)))
    free = w.free
    for i, q in enumerate(inp.requests):
        mine = [row[i] for row in w.slot_of]
        pre = z3.Or(*(z3.And(a, b) for a, b in zip(mine, w.preempted, strict=True)))
        run_sched = _pick(mine, w.sched)
        placed = [z3.And(row[i], a) for row, a in zip(w.wslot, w.admitted, strict=True)]
        adm = z3.Or(*placed)
        base = ite(adm, _pick(placed, w.wstart), s.computed[i])
        chunk = run_sched + _pick(placed, w.wchunk)
        total = enc.bind("computed", base + chunk)
        done = z3.And(chunk.t > 0, total.t == q.prompt.t)
        finished = enc.bind("finished", ite(done, r, s.finished[i]))
        rel = z3.And(
            finished.t > 0,
            z3.Not(s.released[i]),
            z3.Not(inp.release_never),
            kernel.kv_back(finished.t, inp.release_rounds.t, r + 1),
        )
        free = free + ite(rel, q.blocks, 0)
        nxt.running.append(
            enc.bind_bool(
                "running", z3.And(z3.Or(z3.And(s.running[i], z3.Not(pre)), adm), z3.Not(done))
            )
        )
        nxt.finished.append(finished)
        nxt.released.append(enc.bind_bool("released", z3.Or(s.released[i], rel)))
        nxt.computed.append(enc.bind("computed", ite(pre, 0, total)))
        nxt.ever.append(enc.bind_bool("ever", z3.Or(s.ever[i], adm)))
        order = _pick(mine, w.order)
        nxt.wkey.append(enc.bind("wkey", ite(pre, -(r * (n + 1)) - order, s.wkey[i])))
        place = _pick(placed, [Sym(num(p)) for p in range(n)])
        nxt.rkey.append(enc.bind("rkey", ite(adm, r * (n + 1) + place, s.rkey[i])))
        left = _pick(mine, w.left)
        grown = ite(left.t > s.cached[i].t, left, s.cached[i])
        nxt.cached.append(enc.bind("cached", ite(pre, grown, s.cached[i])))
    nxt.free = enc.bind("free", free)
    return nxt


# -- the properties ---------------------------------------------------------------------------
def _due(u: PUnrolling, s: PState) -> z3.BoolRef:
    """Held KV that will still come back."""
    never = u.inputs.release_never
    return u.terms.any(
        *(
            kernel.kv_due(u.terms, f, [rel], never)
            for f, rel in zip(s.finished, s.released, strict=True)
        )
    )


def _same(a: PState, b: PState) -> z3.BoolRef:
    """The node is in the same state: every request's place (running, waiting, finished), its
    progress, whether it was ever admitted, its KV released, and the order of the running list
    and of the queue. (The cached-block bound only grows, so every hit possible after ``a`` is
    possible after ``b``: from ``b`` the model can repeat what it did from ``a``.)"""
    n = len(a.running)
    facts = []
    for i in range(n):
        facts += [
            a.running[i] == b.running[i],
            (a.finished[i].t == 0) == (b.finished[i].t == 0),
            a.computed[i].t == b.computed[i].t,
            a.ever[i] == b.ever[i],
            a.released[i] == b.released[i],
        ]
        for j in range(n):
            if i != j:
                facts.append((a.wkey[i].t < a.wkey[j].t) == (b.wkey[i].t < b.wkey[j].t))
                facts.append((a.rkey[i].t < a.rkey[j].t) == (b.rkey[i].t < b.rkey[j].t))
    return z3.And(*facts)


def _violations(
    u: PUnrolling, s: PState, nxt: PState, w: _Step, waiting: list[z3.BoolRef]
) -> dict[str, z3.BoolRef]:
    """Each property's violation in this step.

    ``admitted-completes``: the state after this step repeats an earlier one, with no arrival
    and no KV release still to come, while a request that was admitted is unfinished: the steps
    in between repeat forever (a lasso; one step long where the node stalls). ``no-starvation``:
    on a drained node (nothing running, no KV held) a waiting request the policies would start
    on an empty node is not admitted, and nothing else is either."""
    inp, r = u.inputs, len(u.states) + 1
    reqs = inp.requests
    unfinished = [z3.And(e, f.t == 0) for e, f in zip(nxt.ever, nxt.finished, strict=True)]
    stuck = z3.Or(*unfinished)
    loops = [
        z3.And(_same(u.states[j - 1], nxt), *(q.arrival.t <= j for q in reqs)) for j in range(1, r)
    ]
    never = z3.And(nxt.alive, z3.Not(_due(u, nxt)), stuck, z3.Or(*loops) if loops else False)
    held = [z3.And(f.t > 0, z3.Not(rel)) for f, rel in zip(s.finished, s.released, strict=True)]
    drained = kernel.drained(u.terms, s.running, held)
    would_start = [z3.And(wt, q.fits_idle) for wt, q in zip(waiting, reqs, strict=True)]
    starves = z3.And(nxt.alive, kernel.starves(u.terms, drained, would_start, w.admitted))
    u.culprits.append({"admitted-completes": unfinished, "no-starvation": would_start})
    return {"admitted-completes": never, "no-starvation": starves}


def drained_head_refused(combo: Combo, config: EngineConfig, enc: Encoder, sources: dict) -> Any:
    """The induction of ``no-starvation`` in one step: on a drained node (every block free,
    nothing running, so the whole budget and no preemption) the head of the queue, any prompt
    the pool holds with any hit and any count of eligible requests, is refused. Where that
    cannot be, every step that opens on a drained node with a request waiting admits the
    head, whatever came before: no request starves, at any depth."""
    terms, page = Terms(enc, combo, sources), config.page_size
    pool, prompt, hit = enc.var("pool_blocks"), enc.var("prompt"), enc.var("hit")
    eligible = enc.var("eligible")
    enc.facts += [
        pool.t >= 1,
        prompt.t >= 1,
        prompt.t <= (pool * page).t,
        hit.t >= 0,
        (hit * page).t <= (prompt - 1).t,
        eligible.t >= 1,
    ]
    budget = _sym(config.chunked_prefill_size)
    e = kernel.waiting_turn(terms, prompt, hit, hit, budget, pool, eligible, page, "the head")
    admitted = z3.And(e.chunk.t > 0, e.ok, e.takes.t <= pool.t)
    return z3.And(z3.Not(e.bad), z3.Not(admitted))


def unroll(
    combo: Combo,
    config: EngineConfig,
    enc: Encoder,
    sources: dict[str, str],
    *,
    requests: int,
    rounds: int,
    pool_cap: int,
    granule: int,
) -> PUnrolling:
    """The model of ``rounds`` steps of ``requests`` requests (inside ``enc``'s context)."""
    terms = Terms(enc, combo, sources)
    inp = make_inputs(enc, terms, config, requests, rounds, pool_cap, granule)
    u = PUnrolling(combo, config, enc, terms, inp)
    state = initial_state(inp)
    for r in range(1, rounds + 1):
        state = unroll_step(u, state, r)
    return u
