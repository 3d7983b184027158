"""Cross-validation: the formula the checker reasons about must be the policy Python runs.

The checker never trusts its own reading of a policy. Before a combo gets a verdict, every
policy method is run as plain Python on a few hundred concrete views and compared, view by
view, with its lifted symbolic function (:mod:`policykit.spec.lifted`) evaluated at the same
point. Any difference — a construct the evaluator read differently from Python, a value that
behaves differently when it is not a plain ``int`` — refuses the check and prints the view
that shows it.

The views are chosen to find differences, not only to be many:

* one witness per symbolic path (z3 finds a view that takes it), so each branch the checker
  saw is run by Python at least once;
* for every comparison the policy made, views on both sides of its boundary and on it;
* boundary values (0, 1, a page, the chunk size, the pool cap, ±1 of each), views whose
  fields are all alike (identity tests and aliasing show there), and random views over the
  checked range, up to the evaluator's range limit.

Every view respects what the scheduler guarantees of it (a request has a token left, a chunk
ends after it starts), so a policy that raises on one is refused too: the scheduler would
raise there.

The same samples check **purity**: they run on the instance the checker used and on a fresh
one, in opposite orders; an answer that differs is not a function of the view (instance or
module state, randomness, the clock). The guard of :mod:`policykit.spec.guard` watches the
concrete runs as it watches the symbolic ones, so the clock or a counter is refused even where
its effect would not show in a few hundred calls.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import z3
from z3.z3util import get_vars

from policykit import kernel
from policykit.config import EngineConfig
from policykit.kernel.domain import FIRST_TOKENS
from policykit.policy import (
    DECISION_KINDS,
    AdmitView,
    AlignView,
    ChunkView,
    Policy,
    PreemptView,
    QueueView,
    TailView,
    incomplete,
)
from policykit.registry import Combo
from policykit.spec.guard import Breach, Guard, changed
from policykit.spec.lifted import Lifted, entries, forget_stale, lift, scratch_context
from policykit.spec.symbolic import (
    LIMIT,
    Sym,
    SymbolicEvaluationError,
    Unsupported,
    as_int,
    refused_who,
)
from policykit.spec.terms import compile_terms
from policykit.spec.views import guaranteed

#: random views per method, on top of the path witnesses and boundary views
RANDOM_VIEWS = 200
#: the fixed seed: a refusal must be reproducible
SEED = 20261130


class PolicyRefused(SymbolicEvaluationError):
    """The checker will not give a verdict: it cannot vouch for a policy of the combo."""


@dataclass(frozen=True)
class Method:
    """One decision a policy kind makes, and the view it makes it on."""

    kind: str
    name: str
    returns: type  #: bool or int
    template: Callable[[EngineConfig], Any]  #: a view with Sym fields, shaped as the model's
    #: what the scheduler guarantees of the view, over its int fields: z3 terms or ints alike
    valid: Callable[[dict[str, Any], EngineConfig], list[Any]]


def _sym(name: str) -> int:
    """A free symbolic integer for the view field ``name`` (an ``int`` to the view's type)."""
    return as_int(Sym(z3.Int(name)))


def _preempt_template(c: EngineConfig, requester: bool) -> PreemptView:
    return PreemptView(
        _sym("position"),
        _sym("prompt_tokens"),
        _sym("computed_tokens"),
        _sym("held_blocks"),
        requester,
        c.page_size,
    )


METHODS: tuple[Method, ...] = (
    Method(
        "admission",
        "admit",
        bool,
        lambda c: AdmitView(
            _sym("prompt_tokens"),
            _sym("remaining_tokens"),
            _sym("host_prefix_tokens"),
            FIRST_TOKENS,
            c.page_size,
            _sym("rem_total_tokens"),
            _sym("cur_rem_tokens"),
        ),
        lambda x, _: guaranteed(AdmitView, x),
    ),
    Method(
        "admission",
        "tail_reserve",
        int,
        lambda c: TailView(_sym("tail_tokens"), FIRST_TOKENS, c.page_size),
        lambda x, _: guaranteed(TailView, x),
    ),
    *(
        Method(
            "chunking",
            name,
            int,
            lambda c: ChunkView(
                _sym("remaining_tokens"),
                _sym("rem_chunk_tokens"),
                _sym("rem_total_tokens"),
                _sym("rem_swa_tokens"),
                c.page_size,
                c.hybrid_swa,
            ),
            lambda x, c: [
                *guaranteed(ChunkView, x),
                x["rem_chunk_tokens"] <= c.chunked_prefill_size,
                *([] if c.hybrid_swa else [x["rem_swa_tokens"] == x["rem_total_tokens"]]),
            ],
        )
        for name in ("new_chunk", "resume_chunk")
    ),
    Method(
        "alignment",
        "align_end",
        int,
        lambda c: AlignView(_sym("start"), _sym("end"), c.page_size),
        lambda x, _: guaranteed(AlignView, x),
    ),
    Method(
        "queue",
        "priority",
        int,
        lambda c: QueueView(
            _sym("prompt_tokens"),
            _sym("prefix_tokens"),
            _sym("host_prefix_tokens"),
            c.page_size,
        ),
        lambda x, _: guaranteed(QueueView, x),
    ),
)


#: the decisions of a node that preempts (:mod:`policykit.preempting`), on the views it asks
#: them on (``kernel.preempting_chunk_view``, ``kernel.preempting_admit_view``, ``PreemptView``):
#: what :mod:`policykit.spec.preempting_bmc` evaluates symbolically
PREEMPTING_METHODS: tuple[Method, ...] = (
    Method(
        "admission",
        "admit",
        bool,
        lambda c: kernel.preempting_admit_view(
            _sym("prompt_tokens"), _sym("remaining_tokens"), _sym("rem_total_tokens"), c.page_size
        ),
        lambda x, _: [*guaranteed(AdmitView, x), x["rem_total_tokens"] >= 0],
    ),
    *(
        Method(
            "chunking",
            name,
            int,
            lambda c: kernel.preempting_chunk_view(
                _sym("remaining_tokens"),
                _sym("rem_chunk_tokens"),
                _sym("rem_total_tokens"),
                _sym("eligible_requests"),
                c.page_size,
            ),
            lambda x, c: [
                *guaranteed(ChunkView, x),
                x["rem_chunk_tokens"] >= 1,
                x["rem_chunk_tokens"] <= c.chunked_prefill_size,
                x["rem_total_tokens"] >= 0,
                x["rem_swa_tokens"] == x["rem_total_tokens"],
                x["eligible_requests"] >= 1,
            ],
        )
        for name in ("new_chunk", "resume_chunk")
    ),
    *(m for m in METHODS if m.kind in ("alignment", "queue")),
    *(
        Method(
            "preemption",
            "victim_rank",
            int,
            functools.partial(_preempt_template, requester=requester),
            lambda x, _: guaranteed(PreemptView, x),
        )
        for requester in (False, True)
    ),
)
#: the kinds whose policies decide on a node that preempts
PREEMPTING_KINDS = (*DECISION_KINDS, "preemption")


def methods_of(combo: Combo) -> tuple[tuple[str, ...], tuple[Method, ...]]:
    """The decision kinds and the decisions the checker's model of ``combo``'s node asks."""
    if combo.preempts:
        return PREEMPTING_KINDS, PREEMPTING_METHODS
    return DECISION_KINDS, METHODS


def check_policies(
    combo: Combo, engine: EngineConfig, sources: dict[str, str] | None = None
) -> None:
    """Cross-validate every decision of ``combo``'s policies; raise :class:`PolicyRefused`."""
    sources = sources or {}
    kinds, methods = methods_of(combo)
    for kind in kinds:
        policy = getattr(combo, kind)
        forget_stale(policy)
        reason = incomplete(type(policy))
        if reason is not None:
            raise PolicyRefused(
                f"{refused_who(policy, sources.get(kind, policy.source))} cannot be checked: "
                f"{reason}"
            )
    _check_declarations(combo.queue, sources.get("queue", combo.queue.source))
    for m in methods:
        policy = getattr(combo, m.kind)
        source = sources.get(m.kind, policy.source)
        _refuse_unmodelled(policy, m, engine, source)
        view = m.template(engine)
        validate(policy, m, lift(policy, m.name, view, source=source), view, engine, source)


#: view fields the checker's model has no values for: its requests carry no priority and no
#: arrival time (vLLM's), so a policy that reads them is refused, not checked as if all were 0
UNMODELLED = ("priority", "arrival")


def _refuse_unmodelled(policy: Policy, m: Method, engine: EngineConfig, source: str) -> None:
    """Refuse ``policy`` if its ``m`` reads a field of :data:`UNMODELLED`: lifted on a view
    where those fields are variables (and the running list says it has them), its answer, a
    floor division or a branch it took must not mention them."""
    view = m.template(engine)
    names = [n for n in UNMODELLED if hasattr(view, n)]
    if not names:
        return
    given = {"running_requests": 2} if hasattr(view, "running_requests") else {}
    with scratch_context():
        probe = dataclasses.replace(view, **{n: _sym(n) for n in names}, **given)
        lifted = lift(policy, m.name, probe, source=source)
        answer = [lifted.result.t] if hasattr(lifted.result, "t") else []
        terms = [*answer, *lifted.paths, *(e for q in lifted.quotients for e in q[::2])]
        seen = {str(v) for t in terms for v in get_vars(t)}
        read = [n for n in names if str(lifted.inputs[n]) in seen]
    if read:
        raise PolicyRefused(
            f"{refused_who(policy, source, m.name)} cannot be checked: its {m.name}() "
            f"reads the request's {' and '.join(read)}, and the checker's model has none (its "
            "scenarios carry no priorities or arrival times, as policykit's nodes do not), so "
            "a verdict would be about another order than the one an engine with priorities "
            "runs."
        )


#: what a queue policy declares rather than decides: read as data by the planner and the model
QUEUE_DECLARATIONS = ("skips_never_fitting", "arrival_order")


def _check_declarations(policy: Policy, source: str) -> None:
    """A queue policy's declarations must be plain booleans: a property or anything computed
    could answer the planner differently from the model, and the checker runs no guard on it."""
    for name in QUEUE_DECLARATIONS:
        value = inspect.getattr_static(policy, name)
        if type(value) is not bool:
            raise PolicyRefused(
                f"{refused_who(policy, source)} cannot be checked: its "
                f"{name} is {type(value).__name__}, not a plain True or False class attribute, "
                "so the planner and the checker could read it differently."
            )


def check_lifted(combo: Combo, engine: EngineConfig, sources: dict[str, str] | None = None) -> None:
    """Cross-validate any lifted function the model made beyond :func:`check_policies`'s (a
    view shape with other concrete fields); run after the model, before verdicts are given."""
    sources = sources or {}
    kinds, methods = methods_of(combo)
    by_name = {m.name: m for m in methods}
    for kind in kinds:
        policy = getattr(combo, kind)
        for (name, shape), lifted in entries(policy):
            _unchanged(policy, name, lifted, sources.get(kind, policy.source))
            if not lifted.validated:
                template = _template(by_name[name].template(engine), shape)
                validate(
                    policy,
                    by_name[name],
                    lifted,
                    template,
                    engine,
                    sources.get(kind, policy.source),
                )


def _template(view: Any, shape: Any) -> Any:
    """``view`` with the concrete fields of ``shape``."""
    fields = [f.name for f in dataclasses.fields(view)]
    return dataclasses.replace(
        view,
        **{
            n: (_sym(n) if how == "sym" else value)
            for n, (how, value) in zip(fields, shape, strict=True)
        },
    )


def validate(
    policy: Policy, m: Method, lifted: Lifted, template: Any, engine: EngineConfig, source: str
) -> None:
    """Compare ``lifted`` with the Python policy on concrete views (once per lifted function)."""
    if lifted.validated:
        return
    views = list(_views(lifted, template, m, engine))
    who = refused_who(policy, source, m.name)
    fn = getattr(type(policy), m.name)
    where = f"{fn.__code__.co_filename}:{fn.__code__.co_firstlineno}"
    expect = _pointwise(lifted)
    reused = _run_all(policy, m, views, who, where)
    fresh = _fresh(policy, engine, who)
    again = list(reversed(_run_all(fresh, m, list(reversed(views)), who, where)))
    _unchanged(policy, m.name, lifted, source)
    for view, a, b in zip(views, reused, again, strict=True):
        if a != b or type(a) is not type(b):
            raise PolicyRefused(
                f"{who} is not a pure function of its view: its {m.name}() ({where}) answered "
                f"{a!r} and then {b!r} on {_show(view)} (run again on a fresh instance, in "
                "another order). Instance or module state, randomness and the clock cannot be "
                "checked."
            )
        expected = expect(view)
        if a != expected:
            raise PolicyRefused(
                f"{who} cannot be checked: its {m.name}() ({where}) returns {a!r} in Python but "
                f"{expected!r} under the checker on {_show(view)}. The checker's reading of "
                "the code differs from Python's, so no verdict would be sound."
            )
    lifted.validated = True


def _run_all(policy: Policy, m: Method, views: list[Any], who: str, where: str) -> list[Any]:
    """The policy's answers on ``views``, each call watched by a guard."""
    fn = getattr(policy, m.name)
    out = []
    guard = Guard(owner=policy)
    for view in views:
        guard.start()
        try:
            answer = fn(view)
        except (Breach, Unsupported):
            answer = None
        except Exception as exc:
            if guard.violation is None:
                raise PolicyRefused(
                    f"{who} raises {type(exc).__name__}: {exc} in {m.name}() ({where}) on "
                    f"{_show(view)}, a view the scheduler can produce."
                ) from None
        finally:
            guard.stop()
        if guard.violation is not None:
            raise PolicyRefused(
                f"{who} cannot be checked: its {m.name}() {guard.violation}, run on "
                f"{_show(view)}. The checker vouches only for a pure function of the view."
            )
        if type(answer) is not m.returns:
            raise PolicyRefused(
                f"{who} returns {answer!r} ({type(answer).__name__}) from {m.name}() ({where}) "
                f"on {_show(view)}; the scheduler expects {m.returns.__name__}."
            )
        out.append(answer)
    return out


def _unchanged(policy: Policy, method: str, lifted: Lifted, source: str) -> None:
    """Refuse when a module-level value the lifted code read is no longer what it read:
    rebound, or a frozen record mutated, while the check ran."""
    stale = changed(lifted.reads)
    if stale is not None:
        raise PolicyRefused(
            f"{refused_who(policy, source, method)} cannot be checked: {stale} "
            f"during the check ({method}()), so the scheduler may run another policy than the "
            "one checked. Keep module-level constants constant."
        )


def _fresh(policy: Policy, engine: EngineConfig, who: str) -> Policy:
    try:
        fresh = type(policy)(policy.arg)
        fresh.source = policy.source
        fresh.validate(engine)
    except Exception as exc:
        raise PolicyRefused(f"{who} cannot be made again for the purity check: {exc}") from None
    return fresh


def _pointwise(lifted: Lifted) -> Callable[[Any], Any]:
    """The lifted function as Python: a view in, a bool or int out."""
    names = list(lifted.inputs)
    r = lifted.result
    f = compile_terms([lifted.inputs[n] for n in names], [r.t], lifted.quotients)
    return lambda view: f(*(getattr(view, n) for n in names))[0]


def _show(view: Any) -> str:
    fields = ", ".join(f"{f.name}={getattr(view, f.name)!r}" for f in dataclasses.fields(view))
    return f"{type(view).__name__}({fields})"


# -- the views --------------------------------------------------------------------------------
def _views(lifted: Lifted, template: Any, m: Method, engine: EngineConfig) -> Iterator[Any]:
    """Path witnesses, boundary views and random views, each valid, without repeats."""
    x = lifted.inputs
    concrete = {
        f.name: getattr(template, f.name)
        for f in dataclasses.fields(template)
        if f.name not in x and type(getattr(template, f.name)) is int
    }
    valid = [
        *m.valid({**x, **{n: z3.IntVal(v) for n, v in concrete.items()}}, engine),
        *(z3.And(v >= -LIMIT, v <= LIMIT) for v in x.values()),
    ]

    def admissible(values: dict[str, int]) -> dict[str, int] | None:
        """``values`` repaired towards the view's guarantees, or None if still invalid."""
        full = {**values, **concrete}
        _repair(full, m, engine)
        full.update(concrete)
        ok = all(m.valid(full, engine)) and all(-LIMIT <= full[n] <= LIMIT for n in x)
        return {n: full[n] for n in x} if ok else None

    definitions = [fact for v, d, q in lifted.quotients for fact in (d * q <= v, v < d * q + d)]
    seen: set[tuple[int, ...]] = set()

    def emit(values: dict[str, int]) -> Iterator[Any]:
        key = tuple(values[n] for n in x)
        if key not in seen:
            seen.add(key)
            yield dataclasses.replace(template, **values)

    solver = z3.Solver()
    solver.set("timeout", 2000)
    solver.add(*valid, *definitions)
    for goal in [*lifted.paths, *_boundaries(lifted)]:
        solver.push()
        solver.add(goal)
        if solver.check() == z3.sat:
            model = solver.model()
            yield from emit(
                {n: model.eval(v, model_completion=True).as_long() for n, v in x.items()}
            )
        solver.pop()
    specials = _specials(engine)
    for value in specials:  # every field alike: aliasing and identity tests show here
        values = admissible(dict.fromkeys(x, value))
        if values is not None:
            yield from emit(values)
    rng = random.Random(SEED)
    wanted = len(seen) + RANDOM_VIEWS
    for _ in range(20 * RANDOM_VIEWS):
        if len(seen) >= wanted:
            break
        values = admissible({n: _draw(rng, specials) for n in x})
        if values is not None:
            yield from emit(values)


def _boundaries(lifted: Lifted) -> Iterator[z3.BoolRef]:
    """For each comparison on a path: a view on its boundary and one on either side."""
    atoms: dict[int, z3.ExprRef] = {}
    for cond in lifted.paths:
        stack = [cond]
        while stack:
            e = stack.pop()
            if z3.is_and(e) or z3.is_or(e) or z3.is_not(e):
                stack.extend(e.children())
            elif z3.is_le(e) or z3.is_lt(e) or z3.is_ge(e) or z3.is_gt(e) or z3.is_eq(e):
                a, b = e.children()
                if z3.is_int(a):
                    atoms.setdefault(e.get_id(), a - b)
    for diff in atoms.values():
        for k in (-1, 0, 1):
            yield diff == k


def _specials(engine: EngineConfig) -> list[int]:
    page, chunk = engine.page_size, engine.chunked_prefill_size
    base = [0, 1, 2, page, 2 * page, chunk, 1 << 18, 300_000, LIMIT]
    return sorted({v + d for v in base for d in (-1, 0, 1)} | {-v for v in base})


def _draw(rng: random.Random, specials: list[int]) -> int:
    pick = rng.random()
    if pick < 0.35:
        return rng.choice(specials)
    if pick < 0.7:
        return rng.randint(-4096, 65536)
    return rng.randint(-LIMIT, LIMIT)


def _repair(values: dict[str, int], m: Method, engine: EngineConfig) -> None:
    """Nudge a random draw towards the view's guarantees so fewer draws are wasted."""
    if m.name == "admit":
        values["prompt_tokens"] = max(values["prompt_tokens"], 1)
        values["remaining_tokens"] = min(
            max(values["remaining_tokens"], 1), values["prompt_tokens"]
        )
        values["host_prefix_tokens"] = min(
            max(values["host_prefix_tokens"], 0), values["remaining_tokens"]
        )
    elif m.name == "tail_reserve":
        values["tail_tokens"] = max(values["tail_tokens"], 1)
    elif m.kind == "chunking":
        values["remaining_tokens"] = max(values["remaining_tokens"], 1)
        values["rem_chunk_tokens"] = min(values["rem_chunk_tokens"], engine.chunked_prefill_size)
        if not engine.hybrid_swa:
            values["rem_swa_tokens"] = values["rem_total_tokens"]
        if "eligible_requests" in values:  # a node that preempts
            values["eligible_requests"] = max(abs(values["eligible_requests"]), 1)
            values["rem_chunk_tokens"] = max(values["rem_chunk_tokens"], 1)
    elif m.name == "victim_rank":
        values["prompt_tokens"] = max(values["prompt_tokens"], 1)
        computed = abs(values["computed_tokens"])
        values["computed_tokens"] = min(computed, values["prompt_tokens"] - 1)
        values["position"] = abs(values["position"])
        values["held_blocks"] = abs(values["held_blocks"])
    elif m.name == "priority":
        values["prefix_tokens"] = abs(values["prefix_tokens"])
        values["host_prefix_tokens"] = abs(values["host_prefix_tokens"])
        least = values["prefix_tokens"] + values["host_prefix_tokens"] + 1
        values["prompt_tokens"] = max(values["prompt_tokens"], least)
    elif m.name == "align_end":
        values["start"] = abs(values["start"])
        values["end"] = values["start"] + max(abs(values["end"] - values["start"]), 1)
