"""Recompute-aware preemption victims: preempt the running request whose loss costs least.

vLLM 0.33.0 preempts ``running[-1]``, the request admitted last, whatever it has computed
(``vllm``). Under KV pressure a long prompt admitted last can lose tens of thousands of
computed tokens to make room for a few blocks, then compute them all again: the preemption
thrash and poor victim choice vLLM RFC #54644 (and #25538) describe. The two victims here rank
by what a preemption throws away instead:

* ``fewest-computed``: the fewest computed tokens (what vLLM's ``_preempt_request`` resets to
  zero), a tie going to the most recently admitted, as vLLM's ``running[-1]`` would;
* ``least-progress``: the smallest share of its prompt computed, so a request close to its
  first token is not thrown back behind one that has barely started.

Both are plain policies, pure functions of :class:`~policykit.policy.PreemptView` in linear
integer arithmetic, so ``policykit check`` lifts them exactly (docs/spec.md). On vLLM 0.33.0
itself the plugin can carry out a victim only after the requester in the running list (the
requester itself when it is last); any other choice is logged and vLLM's ``running[-1]`` taken
instead (:mod:`policykit.integrations.vllm.scheduler`). policykit's own node that preempts
(``simulate``, ``bench``, ``check``) takes any running request.
"""

from __future__ import annotations

from policykit.hookspecs import hookimpl
from policykit.policy import PreemptionPolicy, PreemptView


class _NotInCheckAll(PreemptionPolicy):
    """A victim ``check --all`` leaves out: with every admission, chunking, alignment and
    queue it would add 240 combos that preempt per victim to every ``--all`` run and site
    build (the two here, measured together: 480 combos, 6 min 50 s of CPU). Named with
    ``--combo`` or ``--combos`` they are checked like any other (docs/spec.md, "Combos that
    preempt")."""

    enumerated = False


#: progress is measured in 1/PROGRESS_STEPS of the prompt (a power of two: bisected in log2 steps)
PROGRESS_STEPS = 16
#: above any computed-token count (the checker's inputs stay within 2**26), so a bucket's
#: tie-break by computed tokens never reaches into the next bucket
_COMPUTED_SPAN = 1 << 27


class FewestComputedPreemption(_NotInCheckAll):
    """Preempt the running request with the fewest computed tokens (vLLM RFC #54644).

    A preemption resets the victim's computed tokens to zero (its full blocks may survive in
    the prefix cache, but nothing guarantees it), so the tokens it throws away are at most its
    ``computed_tokens``: the lowest count ranks highest. The node breaks a tie towards the
    request later in the running list, which is vLLM's own choice among equals
    (``running[-1]``, the most recently admitted)."""

    name = "fewest-computed"

    def victim_rank(self, v: PreemptView) -> int:
        return -v.computed_tokens


class LeastProgressPreemption(_NotInCheckAll):
    """Preempt the running request with the smallest share of its prompt computed (vLLM RFC
    #54644's "least progress").

    The share ``computed / prompt`` is measured in sixteenths without a division or a float:
    a bisection compares ``computed * 16`` with ``k * prompt`` (cross-multiplying against the
    fixed fractions ``k/16``), which is linear in the view's fields, so the checker lifts it
    exactly; an exact ratio between two requests would multiply two symbolic values, which it
    cannot. Within one sixteenth the fewer computed tokens rank higher, then (the node's
    tie-break) the most recently admitted."""

    name = "least-progress"

    def victim_rank(self, v: PreemptView) -> int:
        sixteenths = progress_steps(v.computed_tokens, v.prompt_tokens)
        return -(sixteenths * _COMPUTED_SPAN + v.computed_tokens)


def progress_steps(computed: int, prompt: int) -> int:
    """``floor(PROGRESS_STEPS * computed / prompt)``, clamped to ``[0, PROGRESS_STEPS]``, by
    bisection on ``computed * PROGRESS_STEPS >= k * prompt``: each comparison is linear, so
    the checker explores at most ``PROGRESS_STEPS`` paths (one per answer)."""
    low, step = 0, PROGRESS_STEPS // 2
    scaled = computed * PROGRESS_STEPS
    while step:
        if scaled >= (low + step) * prompt:
            low += step
        step //= 2
    if low == PROGRESS_STEPS - 1 and scaled >= PROGRESS_STEPS * prompt:
        low = PROGRESS_STEPS  # fully computed (the bisection above reaches 15 at most)
    return low


@hookimpl
def policykit_register_policies(register):
    register(FewestComputedPreemption)
    register(LeastProgressPreemption)
