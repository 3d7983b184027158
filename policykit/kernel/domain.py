"""The number domain a round is decided in: ints for the planner, terms for the checker.

The planner decides a round on ints; the checker decides the same round on z3 terms. Both
ask the same policies the same questions, charge the same ledger and refuse the same broken
answers, so the decisions (:mod:`policykit.kernel`) are written against :class:`Numbers`:
a small arithmetic interface that :class:`Ints` implements on plain ints (the scheduler's planner,
:mod:`policykit.planner`) and ``policykit.spec.encoding.Terms`` on z3 terms (the checker's round
model). Arithmetic and comparisons are Python's own operators (``Sym`` overloads them);
what an int and a term do differently goes through the domain:

* ``all`` / ``any`` / ``not_`` / ``choose``: logic and selection (``if`` on a term cannot be
  branched on);
* ``decide``: ask a policy and name its answer, and say whether the answer breaks the
  planner's contract (ints raise a :class:`PolicyError` that names the policy; terms return
  the condition, which the round model folds into its ``contract`` property);
* ``when``: a branch's work that only matters where a condition holds. Ints do it only there
  (a truncation of a deferred chunk would ask the alignment policy a question with no
  answer); terms always do it, and the caller selects its result by the condition;
* ``name`` / ``known_zero``: terms name a value (a fresh variable bound to it keeps formulas
  small) and leave out the work for a term that is the constant 0; on ints these are the
  value itself and ``== 0``.

The ledger (:class:`~policykit.ledger.Ledger`) already runs on both; so do the views.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from policykit.errors import PolicyError
from policykit.kernel.blame import ask, describe
from policykit.policy import AdmitView
from policykit.registry import Combo

#: KV a prefill node keeps per request for generated tokens: the first token only
FIRST_TOKENS = 1


class Logic(Protocol):
    """Truth values and selection in a number domain: all that a rule asking no policy (the
    between-round rules, :mod:`policykit.kernel.between`) needs."""

    def all(self, *conds: Any) -> Any: ...

    def any(self, *conds: Any) -> Any: ...

    def not_(self, cond: Any) -> Any: ...

    def choose(self, cond: Any, a: Any, b: Any) -> Any: ...


class Numbers(Logic, Protocol):
    """The arithmetic a round is decided in (see the module docstring)."""

    def decide(
        self,
        kind: str,
        method: str,
        view: Any,
        request_id: str,
        *,
        label: str,
        bad: Callable[[Any], Any],
        complaint: Callable[[Any], str],
    ) -> tuple[Any, Any]:
        """The ``kind`` policy's answer to ``method(view)``, named ``label``, and whether it
        breaks the contract (``bad(answer)``; ``complaint(answer)`` says how, after the
        policy's name)."""
        ...

    def admits(self, view: AdmitView, request_id: str, *, label: str = "admit") -> Any:
        """The admission policy's verdict on ``view`` (a truth value)."""
        ...

    def when(self, cond: Callable[[], bool], work: Callable[[], Any]) -> Any:
        """``work()`` where it matters: ints only if ``cond()`` (else None), terms always."""
        ...

    def name(self, label: str, value: Any) -> Any:
        """``value`` (a number or a truth value) under a fresh name ``label``."""
        ...

    def known_zero(self, x: Any) -> bool:
        """Whether ``x`` is 0 for sure (on terms: the constant 0), so work on it can go."""
        ...


def is_int(x: Any) -> bool:
    """Whether ``x`` is a plain int (not a bool, not a term)."""
    return isinstance(x, int) and not isinstance(x, bool)


class IntLogic:
    """:class:`Logic` on plain truth values and ints."""

    def all(self, *conds: Any) -> bool:
        return all(conds)

    def any(self, *conds: Any) -> bool:
        return any(conds)

    def not_(self, cond: Any) -> bool:
        return not cond

    def choose(self, cond: Any, a: Any, b: Any) -> Any:
        return a if cond else b


#: the int domain's logic, for a node that asks a rule but no policy (its releases)
INT_LOGIC = IntLogic()


class Ints(IntLogic):
    """The int domain: the scheduler's planner. A broken answer raises at once."""

    def __init__(self, combo: Combo) -> None:
        self.combo = combo

    def decide(
        self,
        kind: str,
        method: str,
        view: Any,
        request_id: str,
        *,
        label: str,
        bad: Callable[[Any], Any],
        complaint: Callable[[Any], str],
    ) -> tuple[int, bool]:
        policy = getattr(self.combo, kind)
        answer = ask(policy, getattr(policy, method), view, request_id)
        if not is_int(answer) or bad(answer):
            raise PolicyError(
                f"{describe(policy, method)} {complaint(answer)}", request_id=request_id
            )
        return answer, False

    def admits(self, view: AdmitView, request_id: str, *, label: str = "admit") -> bool:
        policy = self.combo.admission
        verdict = ask(policy, policy.admit, view, request_id)
        if not isinstance(verdict, bool):
            raise PolicyError(
                f"{describe(policy, 'admit')} answered {verdict!r} to whether request "
                f"{request_id!r} may enter; an admission verdict is True or False.",
                request_id=request_id,
            )
        return verdict

    def when(self, cond: Callable[[], bool], work: Callable[[], Any]) -> Any:
        return work() if cond() else None

    def name(self, label: str, value: Any) -> Any:
        return value

    def known_zero(self, x: Any) -> bool:
        return x == 0
