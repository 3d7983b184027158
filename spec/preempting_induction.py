"""``admitted-completes`` on the node that preempts, for any number of steps and requests: an
induction over the step, on an invariant no step of the scheduler can break.

**The invariant.** After every step at most one request is running, part-way through its
prompt, and the blocks the rest of its prompt needs are free. It holds on the empty node.

**Why a step keeps it** (the two obligations :func:`step_breaks_it` asks the solver to break).
A step opens with the running request ``P``, if any, first in the running list, so with the
whole budget. (1) ``P``'s ``resume_chunk`` is positive, its blocks are free (the rest fits, so
no preemption, and the waiting loop runs), and if ``P`` is still part-way after it, the chunk
took the whole budget (the waiting loop, which needs budget left, admits nobody) and the rest
still fits in what is left free. (2) A waiting request ``Q`` the policies admit, with any budget
left, any free blocks and any count of eligible requests: if it is still part-way after its
first chunk, that chunk took all the budget left (nobody enters after it) and the rest of its
prompt fits in the blocks left free. Releases only free blocks. Whatever ran before, the step
ends with at most one request part-way, and its rest fits.

**Why that proves the property.** With the invariant nothing is ever preempted, so no request
leaves blocks in the prefix cache: every admission has no hit (the model's only hits are a
preempted request's own blocks; see :mod:`.preempting_bmc`). A request that is admitted either
finishes in its step or becomes the running request, which gets a positive chunk every step
without a preemption, so it finishes within its prompt's length in steps. No admitted request
is left unfinished, at any depth and with any number of requests, arrivals, pool and release
timing the model allows.

Where the solver breaks an obligation the property falls back to the bounded search: the
obligations are sufficient, not necessary (a chunk cut below the budget by the long-prefill
threshold or an alignment breaks (1) or (2), and those combos are indeed violated).
"""

from __future__ import annotations

from typing import Any

import z3

from policykit import kernel
from policykit.config import EngineConfig
from policykit.registry import Combo
from policykit.spec.encoding import Encoder, Terms
from policykit.spec.symbolic import Sym, num


def step_breaks_it(combo: Combo, config: EngineConfig, enc: Encoder, sources: dict) -> Any:
    """Either obligation broken: (1) for the running request, (2) for an admitted one."""
    terms, page = Terms(enc, combo, sources), config.page_size
    full = Sym(num(config.chunked_prefill_size))
    return z3.Or(_running_breaks(enc, terms, page, full), _admitted_breaks(enc, terms, page, full))


def _running_breaks(enc: Encoder, terms: Terms, page: int, full: Sym) -> Any:
    """(1): a part-way request whose rest fits, with the whole budget: its chunk is not
    positive, does not fit, leaves budget for an admission while it stays part-way, or leaves
    a rest that no longer fits."""
    prompt, computed, free = enc.var("p_prompt"), enc.var("p_computed"), enc.var("p_free")
    eligible = enc.var("p_eligible")
    held = enc.bind("p_held", kernel.blocks_to_allocate(computed, 0, page))
    enc.facts += [
        computed.t >= 1,
        computed.t < prompt.t,
        free.t >= 0,
        eligible.t >= 1,
        kernel.blocks_to_allocate(prompt, held, page).t <= free.t,
    ]
    chunk, need, bad = kernel.running_turn(
        terms, prompt, computed, held, full, free, eligible, page, "P"
    )
    part_way = (computed + chunk).t < prompt.t
    rest_fits = kernel.blocks_to_allocate(prompt, held + need, page).t <= (free - need).t
    return z3.Or(
        bad,
        chunk.t <= 0,
        need.t > free.t,
        z3.And(part_way, z3.Or(chunk.t < full.t, z3.Not(rest_fits))),
    )


def _admitted_breaks(enc: Encoder, terms: Terms, page: int, full: Sym) -> Any:
    """(2): a waiting request admitted (no hit, as nothing was ever preempted) with ``budget``
    tokens and ``free`` blocks left: still part-way, it left budget or a rest that does not
    fit. A policy that breaks its contract on the way breaks it too (conservatively)."""
    prompt, budget, free = enc.var("q_prompt"), enc.var("q_budget"), enc.var("q_free")
    eligible = enc.var("q_eligible")
    enc.facts += [
        prompt.t >= 1,
        budget.t >= 1,
        budget.t <= full.t,
        free.t >= 0,
        eligible.t >= 1,
    ]
    zero = Sym(num(0))
    e = kernel.waiting_turn(terms, prompt, zero, zero, budget, free, eligible, page, "Q")
    admitted = z3.And(e.chunk.t > 0, e.ok, e.takes.t <= free.t)
    part_way = e.chunk.t < prompt.t
    rest_fits = kernel.blocks_to_allocate(prompt, e.takes, page).t <= (free - e.takes).t
    left_open = z3.And(part_way, z3.Or(e.chunk.t < budget.t, z3.Not(rest_fits)))
    return z3.Or(e.bad, z3.And(admitted, left_open))
