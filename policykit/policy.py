"""The six policy kinds and the small, pure views they decide on.

A policy sees a frozen *view* of plain integers and returns integers or booleans. It never
touches the pool, the cache or the request objects. That restriction is what lets the same
code run in three places: the scheduler (concrete ints), the z3 spec (symbolic ints, see
``policykit.spec``) and a printed plan.

The contract, which ``policykit check`` enforces rather than assumes: a policy method is a
*pure function of its view*. Its answer depends only on the view's fields and on what the
policy was constructed with (its parameter); it keeps no state between calls (no counters on
``self`` or in the module), reads no clock, randomness or environment, catches no exceptions,
and does not ask a value its type. Write it with ``int`` arithmetic (``//`` and ``%`` by an
int, shifts by a constant, page masks), comparisons, ``min``/``max``/``abs``, ``if`` and loops
with a bound the checker can see. The checker refuses code
outside this contract with a reason instead of giving a verdict (docs/spec.md, "What the
checker trusts, and what it refuses").

Every policy class has a ``kind``, a ``name`` and a docstring (shown by ``policykit
policies``). A policy that takes a parameter (``checkpoint:256``) declares it as ``parameter``;
the registry parses and validates it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

from policykit.config import EngineConfig
from policykit.errors import PolicyError, PolicykitError

KINDS = ("admission", "chunking", "alignment", "allocator-phase", "queue", "preemption")
#: the kinds whose decisions plan a round, and so the ones ``policykit check`` evaluates
DECISION_KINDS = ("admission", "chunking", "alignment", "queue")


@dataclass(frozen=True)
class Parameter:
    """The one optional parameter a policy takes after a colon (``checkpoint:256``)."""

    name: str
    doc: str
    parse: Callable[[str], Any] = int
    default: Any = None

    @property
    def required(self) -> bool:
        return self.default is None


class Policy:
    """Base of every policy: identity, parameter and per-configuration validation."""

    kind: ClassVar[str]
    name: ClassVar[str]
    parameter: ClassVar[Parameter | None] = None
    #: the policy decides on facts only a node that preempts has (vLLM's block pool, its count
    #: of running and waiting requests), so a combo that never preempts refuses it
    preempting_only: ClassVar[bool] = False
    #: whether every-combo enumerations (``check --all``, ``bench``/``sweep`` defaults, the
    #: comparison pages) include it: False for a built-in that decides on request fields only
    #: an engine gives (vLLM's priorities and arrival times), where every verdict would be a
    #: refusal and every simulated run the same as another combo's
    enumerated: ClassVar[bool] = True
    #: where the policy came from ("built-in" or "distribution version"); the registry sets it
    #: so that an error raised while the policy decides can name who to ask
    source: str = "not from the registry"

    def __init__(self, arg: Any = None) -> None:
        self.arg = arg

    def validate(self, config: EngineConfig) -> None:
        """Raise ``ValueError`` with a readable reason if this policy cannot run on ``config``."""

    @property
    def spec(self) -> str:
        """The ``name[:arg]`` string that selects this policy in a ``--combo``."""
        return self.name if self.arg is None else f"{self.name}:{self.arg}"

    def __repr__(self) -> str:
        return f"<{self.kind} policy {self.spec}>"


# --- admission -------------------------------------------------------------------------------
@dataclass(frozen=True)
class AdmitView:
    """A waiting request at the admission check, and the memory ledger at that moment."""

    prompt_tokens: int  #: the whole prompt
    remaining_tokens: int  #: prompt minus the device prefix hit (includes any host hit)
    host_prefix_tokens: int  #: what a load-back would copy to the device
    first_tokens: int  #: KV for generated tokens the node reserves (1 on a prefill node)
    page_size: int  #: tokens per KV page (concrete: the engine's configuration)
    rem_total_tokens: int  #: pool the ledger may still promise (this batch and earlier tails)
    cur_rem_tokens: int  #: pool this round's batch leaves (``>= rem_total_tokens``)
    hybrid_swa: bool = False  #: the model has sliding-window layers (the fields below need it)
    rem_swa_tokens: int = 0  #: sliding-window pool the ledger may still promise
    swa_need: int = 0  #: sliding-window charge of computing the rest whole now (0.5.23's estimate)
    swa_pool_tokens: int = 0  #: the whole sliding-window pool (``swa_need`` this big never fits)
    swa_chunk_cap: int = 0  #: longest first chunk the window budget gives a never-fitting request


@dataclass(frozen=True)
class TailView:
    """A request that was just truncated: what it still has to compute in later rounds."""

    tail_tokens: int  #: the prompt tokens left for later rounds after this round's chunk
    first_tokens: int  #: KV for generated tokens the node reserves (1 on a prefill node)
    page_size: int  #: tokens per KV page (concrete: the engine's configuration)


class AdmissionPolicy(Policy):
    """Decides whether a new request may enter, and what a truncation owes the ledger."""

    kind = "admission"

    def admit(self, v: AdmitView) -> bool:
        """True if the request may enter this round (checked again after its prefix is locked)."""
        raise NotImplementedError(_missing(self, "admit"))

    def tail_reserve(self, v: TailView) -> int:
        """Tokens to promise to later rounds for a truncated request's unscheduled tail."""
        raise NotImplementedError(_missing(self, "tail_reserve"))


# --- chunking --------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChunkView:
    """A request about to get a chunk, and the budgets left in this round."""

    remaining_tokens: int  #: tokens still to compute for this request
    rem_chunk_tokens: int  #: compute budget left in this round (of ``chunked_prefill_size``)
    rem_total_tokens: int  #: pool the ledger may still promise (this batch and earlier tails)
    rem_swa_tokens: int  #: sliding-window pool left (``rem_total_tokens`` without hybrid SWA)
    page_size: int  #: tokens per KV page (concrete: the engine's configuration)
    hybrid_swa: bool  #: the model has sliding-window layers (concrete per configuration)
    swa_need: int = 0  #: hybrid SWA: as in AdmitView, for what is left to compute
    swa_pool_tokens: int = 0  #: hybrid SWA: the whole sliding-window pool
    swa_chunk_cap: int = 0  #: hybrid SWA: longest first chunk for a request that never fits
    eligible_requests: int = 1  #: running + waiting requests (vLLM's ``num_eligible_reqs``)


class ChunkingPolicy(Policy):
    """Decides chunk lengths: for a new request and for the in-progress one.

    Return the number of tokens to compute this round; ``0`` means *not this round*
    (for a new request: compute budget exhausted; for the in-progress one: deferred).
    Returning the whole ``remaining_tokens`` makes it the final chunk.
    """

    kind = "chunking"

    def new_chunk(self, v: ChunkView) -> int:
        """Tokens to compute this round for a request that starts now (``0``: not this round)."""
        raise NotImplementedError(_missing(self, "new_chunk"))

    def resume_chunk(self, v: ChunkView) -> int:
        """Tokens to compute this round for the in-progress chunked request (``0``: defer it)."""
        raise NotImplementedError(_missing(self, "resume_chunk"))


# --- alignment -------------------------------------------------------------------------------
@dataclass(frozen=True)
class AlignView:
    """A non-final chunk ``[start, end)`` whose end may have to move back."""

    start: int  #: the first prompt token of the chunk
    end: int  #: where the budget would end it (exclusive); return a value in ``(start, end]``
    page_size: int  #: tokens per KV page (concrete: the engine's configuration)


class AlignmentPolicy(Policy):
    """Decides where a non-final chunk may end. The final chunk is never aligned."""

    kind = "alignment"

    def align_end(self, v: AlignView) -> int:
        """An end in ``(start, end]``: the chunk must keep at least one token."""
        raise NotImplementedError(_missing(self, "align_end"))


# --- allocator phase -------------------------------------------------------------------------
class AllocatorPhasePolicy(Policy):
    """Decides the torch caching-allocator settings of each process phase.

    The scheduler calls :meth:`on_init` before anything is allocated and :meth:`on_serving`
    at the boundary between initialisation and the serving loop. Late static buffers (RDMA
    registrations, MemPool) are allocated inside :meth:`static_allocations`.
    """

    kind = "allocator-phase"
    #: the phase switches a subclass may define; each is wrapped so that a fault is named
    _PHASES: ClassVar[tuple[str, ...]] = ("on_init", "on_serving")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Wrap the phase switches the subclass defines: they are called from the scheduler's
        and the harness's own code, where an exception would otherwise surface as a traceback
        ending in the plugin, with no word of which policy or distribution it was."""
        super().__init_subclass__(**kwargs)
        for name in cls._PHASES:
            if name in cls.__dict__:
                setattr(cls, name, _named_faults(cls.__dict__[name]))

    def on_init(self) -> None:
        """Called once before initialisation allocates anything."""

    def on_serving(self) -> None:
        """Called once after initialisation, before the first serving round."""

    @contextmanager
    def static_allocations(self) -> Iterator[None]:
        """A window in which allocations must land on non-expandable segments."""
        yield


# --- waiting queue ---------------------------------------------------------------------------
@dataclass(frozen=True)
class QueueView:
    """A waiting request, as far as its place in the queue goes: facts of the request alone.

    Nothing here changes while it waits (no wait time, no ledger), so the queue's order is the
    same in every round and a checker can reason about it once per request."""

    prompt_tokens: int  #: the whole prompt
    prefix_tokens: int  #: its prefix already cached on the device (the radix-tree match)
    host_prefix_tokens: int  #: what a load-back would copy to the device
    page_size: int  #: tokens per KV page (concrete: the engine's configuration)
    #: the engine's priority of the request (vLLM's ``priority``: lower is served first); 0
    #: where the engine has none (SGLang, policykit's own nodes and the checker's model)
    priority: int = 0
    #: how many of the requests ranked with it arrived strictly before it (vLLM's
    #: ``arrival_time``; equal times, equal stamps): only the order of stamps means something,
    #: and 0 where the node gives none
    arrival: int = 0


class QueuePolicy(Policy):
    """Decides the order of the waiting queue and what a refused request does to it.

    Every round the planner looks at the waiting requests sorted by :meth:`priority` (lower
    first; equal priorities keep arrival order) and stops at the first one that is refused,
    as SGLang's scheduler loop does. With ``skips_never_fitting`` a refused request that no
    node state could ever admit (``Planner.never_fits``) is rejected for good and the planner
    goes on to the next one, instead of letting it block everything behind it every round.
    """

    kind = "queue"
    #: reject a request that can never fit and go on, rather than stop the queue at it
    skips_never_fitting: ClassVar[bool] = False
    #: the queue stays in arrival order and :meth:`priority` is not asked (it saves a prefix
    #: match per waiting request per round, which is what upstream's ``fcfs`` saves too)
    arrival_order: ClassVar[bool] = False
    #: above this many waiting requests the queue is not sorted and :meth:`priority` is not
    #: asked: the queue keeps the order it had (the last sorted one, later arrivals behind it).
    #: SGLang 0.5.23's ``lpm`` stops sorting above 128 (``WAITING_QUEUE_PREFIX_MATCH_MAX``)
    sort_limit: ClassVar[int | None] = None

    def sorts(self, waiting: int) -> bool:
        """Whether a queue of ``waiting`` requests is sorted by :meth:`priority` this round."""
        return not self.arrival_order and (self.sort_limit is None or waiting <= self.sort_limit)

    def priority(self, v: QueueView) -> int:
        """The request's place in the queue: lower goes first (ties keep arrival order)."""
        raise NotImplementedError(_missing(self, "priority"))


# --- preemption ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PreemptView:
    """A running request, as a candidate to give its KV back so another chunk can be allocated.

    Only a node that preempts asks (vLLM 0.33.0's v1 scheduler): when ``allocate_slots`` cannot
    place a running request's chunk, one running request loses every block and its computed
    tokens and goes back to the front of the waiting queue, to be computed again (its full
    blocks may still be prefix-cache hits then)."""

    position: int  #: its place in the running list: 0 was admitted first, the last most recently
    prompt_tokens: int  #: the whole prompt
    computed_tokens: int  #: tokens computed so far (what a preemption throws away)
    held_blocks: int  #: KV blocks it holds, cached prefix included
    is_requester: bool  #: it is the request whose chunk could not be allocated
    page_size: int  #: tokens per KV block (concrete: the engine's configuration)
    #: the engine's priority of the request (vLLM's ``priority``: lower is served first)
    priority: int = 0
    #: how many running requests arrived strictly before it (vLLM's ``arrival_time``; equal
    #: times, equal stamps), so ``0 <= arrival < running_requests``
    arrival: int = 0
    #: requests in the running list; 0: the node gives no priorities or arrival stamps (only
    #: the vLLM integration does), and ``priority`` and ``arrival`` mean nothing
    running_requests: int = 0


class PreemptionPolicy(Policy):
    """Decides which running request gives its KV back when a running chunk cannot be allocated.

    The node ranks every running request with :meth:`victim_rank` and preempts the highest (on a
    tie, the one later in the running list), again until the chunk fits or the requester itself
    was preempted. A policy with ``preempts = False`` says the node never preempts: the
    engine's memory promises (SGLang's ledger) must keep every running chunk allocatable, and
    the combo is planned by the SGLang-style planner.
    """

    kind = "preemption"
    #: False: the node never preempts (SGLang's nodes); the combo runs on the ledger planner
    preempts: ClassVar[bool] = True

    def victim_rank(self, v: PreemptView) -> int:
        """How strongly to preempt this running request: the highest rank goes first."""
        raise NotImplementedError(_missing(self, "victim_rank"))


POLICY_BASES: dict[str, type[Policy]] = {
    "admission": AdmissionPolicy,
    "chunking": ChunkingPolicy,
    "alignment": AlignmentPolicy,
    "allocator-phase": AllocatorPhasePolicy,
    "queue": QueuePolicy,
    "preemption": PreemptionPolicy,
}

#: the decisions a policy of each kind must make itself (the bases only raise)
REQUIRED_METHODS: dict[str, tuple[str, ...]] = {
    "admission": ("admit", "tail_reserve"),
    "chunking": ("new_chunk", "resume_chunk"),
    "alignment": ("align_end",),
    "queue": ("priority",),
    "preemption": ("victim_rank",),
}


def defined_at(obj: Any) -> str:
    """``file:line`` where a class or a function (a bound method too) is defined, its module's
    name where the source is gone: where to send the author of a policy that is incomplete or
    answered something no scheduler can carry out."""
    try:
        _, line = inspect.getsourcelines(obj)
        return f"{inspect.getsourcefile(obj)}:{line}"
    except (OSError, TypeError):
        return getattr(obj, "__module__", None) or repr(obj)


def _named_faults(method: Callable[[Any], None]) -> Callable[[Any], None]:
    """``method`` raising :class:`~policykit.errors.PolicyError` (a fault that stops the run)
    naming the policy, its distribution, its module and the line that defines ``method`` and
    the line that raised, instead of whatever it raised."""
    where = defined_at(method)

    @functools.wraps(method)
    def named(self: Any) -> None:
        try:
            method(self)
        except PolicykitError:
            raise
        except Exception as exc:
            tb = exc.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            raised = "?" if tb is None else f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
            raise PolicyError(
                f"The {self.kind} policy {self.spec!r} ({self.source}), module "
                f"{type(self).__module__}, {method.__name__}() at {where}, raised "
                f"{type(exc).__name__}: {exc} at {raised}."
            ) from exc

    return named


def incomplete(cls: type[Policy]) -> str | None:
    """Why ``cls`` cannot decide as its kind must (a required method it does not implement),
    naming the class and where it is defined; ``None`` when it implements them all. Asked at
    registration and by the checker, so that the author reads about their own class rather
    than a ``NotImplementedError`` raised from this file."""
    base = POLICY_BASES.get(getattr(cls, "kind", ""))
    if base is None:
        return None
    missing = [
        name
        for name in REQUIRED_METHODS.get(cls.kind, ())
        if getattr(cls, name, None) is getattr(base, name)
    ]
    if not missing:
        return None
    every = " and ".join(REQUIRED_METHODS[cls.kind])
    return (
        f"{cls.__qualname__} ({defined_at(cls)}) must implement {' and '.join(missing)}: "
        f"every {cls.kind} policy decides {every}."
    )


def _missing(policy: Policy, method: str) -> str:
    return f"{type(policy).__qualname__} ({defined_at(type(policy))}) must implement {method}"
