"""The round's decisions, written once over a number domain.

The planner decides a round on ints; the checker decides the same round on z3 terms. Both
ask the same policies the same questions, charge the same ledger and refuse the same broken
answers, so those decisions live here, written against :class:`Numbers`: a small arithmetic
interface that :class:`Ints` implements on plain ints (the scheduler's planner,
:mod:`policykit.planner`) and ``policykit.spec.model.Terms`` on z3 terms (the checker's round
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
from dataclasses import dataclass
from functools import cache, cmp_to_key
from typing import Any, Protocol

from policykit.errors import PolicyError
from policykit.host_tier import swa_host_hit
from policykit.ledger import Ledger, ceil_paged
from policykit.liveness import idle_admit_view, idle_chunk_view, idle_swa_facts, swa_facts
from policykit.node import FIRST_TOKENS
from policykit.policy import (
    AdmitView,
    AlignView,
    ChunkView,
    Policy,
    PreemptView,
    QueueView,
    TailView,
    defined_at,
)
from policykit.registry import Combo


class Numbers(Protocol):
    """The arithmetic a round is decided in (see the module docstring)."""

    def all(self, *conds: Any) -> Any: ...

    def any(self, *conds: Any) -> Any: ...

    def not_(self, cond: Any) -> Any: ...

    def choose(self, cond: Any, a: Any, b: Any) -> Any: ...

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


def describe(policy: Policy, method: str | None = None) -> str:
    """``The chunking policy 'defer' (built-in)``: who to blame, for error messages; with
    ``method``, also the policy's module and the file and line that define the method, so a
    third-party plugin's author is sent to the line that answered."""
    who = f"The {policy.kind} policy {policy.spec!r} ({policy.source})"
    if method is None:
        return who
    where = defined_at(getattr(policy, method))
    return f"{who}, module {type(policy).__module__}, {method}() at {where},"


def ask(policy: Policy, method: Callable[..., Any], view: Any, request_id: str) -> Any:
    """Call a policy, turning its exceptions into a :class:`PolicyError` that names it, its
    distribution and the request it was deciding on."""
    try:
        return method(view)
    except PolicyError:
        raise
    except Exception as exc:
        raise PolicyError(
            f"{describe(policy, method.__name__)} raised {type(exc).__name__}: {exc} at "
            f"{_raised_at(exc)} (while deciding on request {request_id!r}: {view}).",
            request_id=request_id,
        ) from exc


def _raised_at(exc: BaseException) -> str:
    """``file:line`` of the innermost frame of ``exc``'s traceback: the line that raised."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return "?" if tb is None else f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"


def queue_rank(policy: Policy, view: QueueView, request_id: str) -> int:
    """The queue policy's priority of a waiting request (lower goes first), checked to be an
    int: a sort on anything else would order the queue by accident, not by the policy."""
    rank = ask(policy, policy.priority, view, request_id)
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise PolicyError(
            f"{describe(policy, 'priority')} gave request {request_id!r} the priority {rank!r}; "
            "a priority "
            "is an int (lower goes first).",
            request_id=request_id,
        )
    return rank


# -- the waiting queue's order --------------------------------------------------------------
# SGLang's planner, the node that preempts, both engine plugins and both checker models look at
# the waiting requests in one order: by the queue policy's priority, lower first, equal
# priorities in the queue's own order (arrival; the front for a request a node preempted).
# That is a stable sort by priority. Terms cannot be sorted, so the order is one comparison,
# :func:`goes_before`: the models turn it into facts, the nodes sort by it.
def goes_before(num: Numbers, rank: Any, other_rank: Any, own_order: Any) -> Any:
    """Whether a request of priority ``rank`` goes before one of ``other_rank``, where
    ``own_order`` says whether it comes first in the queue's own order. ``rank`` None: the
    queue keeps its own order (``arrival_order``)."""
    if rank is None:
        return own_order
    return num.any(rank < other_rank, num.all(rank == other_rank, own_order))


def in_queue_order(num: Numbers, items: list[Any], ranks: list[int]) -> list[Any]:
    """``items`` (in the queue's own order) ordered by :func:`goes_before` on their ``ranks``."""

    def compare(a: int, b: int) -> int:
        return -1 if goes_before(num, ranks[a], ranks[b], a < b) else 1

    return [items[i] for i in sorted(range(len(items)), key=cmp_to_key(compare))]


def queue_order(
    num: Numbers,
    policy: Policy,
    waiting: list[Any],
    rank: Callable[[Any], int],
    kept: dict[str, int] | None,
) -> tuple[list[Any], dict[str, int] | None]:
    """The order a round looks at ``waiting`` (in the queue's own order) under the queue
    policy, and the order to keep for a round that does not sort (None: the queue's own).

    A queue longer than the policy's ``sort_limit`` is not sorted: it keeps the order ``kept``
    from the last round that sorted, later arrivals behind in their own order, as SGLang's
    waiting list keeps its last in-place sort (which a round in arrival order leaves as it
    is). Both nodes order their queue here."""
    if policy.arrival_order:
        return waiting, kept
    if policy.sorts(len(waiting)):
        order = (
            in_queue_order(num, waiting, [rank(r) for r in waiting])
            if len(waiting) > 1
            else waiting
        )
    elif kept is None:  # the last queue was in its own order, and so is this one
        order = waiting
    else:
        order = sorted(waiting, key=lambda r: kept.get(r.id, len(kept)))
    return order, None if order == waiting else {r.id: i for i, r in enumerate(order)}


# -- between rounds ----------------------------------------------------------------------------
def kv_back(finished: Any, delay: Any, round_no: Any) -> Any:
    """Whether the KV of a request that finished in round ``finished``, its transfer to decode
    taking ``delay`` rounds, is free for round ``round_no`` to plan with. SGLang's node frees it
    as that round starts, the node that preempts as the round before ends (asking for
    ``round_no + 1``), so both give it back to round ``finished + delay``, and to the next round
    where ``delay`` is 0 or 1. Numbers of any kind: ints, or terms (the checker's models)."""
    return finished + delay <= round_no


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class Ints:
    """The int domain: the scheduler's planner. A broken answer raises at once."""

    def __init__(self, combo: Combo) -> None:
        self.combo = combo

    def all(self, *conds: Any) -> bool:
        return all(conds)

    def any(self, *conds: Any) -> bool:
        return any(conds)

    def not_(self, cond: Any) -> bool:
        return not cond

    def choose(self, cond: Any, a: Any, b: Any) -> Any:
        return a if cond else b

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
        if not _is_int(answer) or bad(answer):
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


# -- the views ----------------------------------------------------------------------------
def view_swa_facts(compute: Any, ledger: Ledger, swa_pool: Any | None) -> dict:
    """The sliding-window fields of a view for a request with ``compute`` tokens to go, with
    a sliding-window pool of ``swa_pool`` tokens in all (none without hybrid SWA)."""
    if swa_pool is None:
        return {}
    return swa_facts(ledger, compute, FIRST_TOKENS, swa_pool)


def chunk_view(remaining: Any, ledger: Ledger, swa_pool: Any | None, host: Any = 0) -> ChunkView:
    """The chunking question for a request with ``remaining`` tokens to compute (a new one:
    after ``host`` tokens it loads back), on the ledger as it stands."""
    swa_led, swa_pool = swa_loaded(ledger, swa_pool, host)
    return ChunkView(
        remaining_tokens=remaining,
        rem_chunk_tokens=ledger.rem_chunk_tokens,
        rem_total_tokens=ledger.rem_total_tokens,
        rem_swa_tokens=swa_led.rem_swa_tokens,
        page_size=ledger.page_size,
        hybrid_swa=ledger.hybrid_swa,
        **view_swa_facts(remaining, swa_led, swa_pool),
    )


def admit_view(
    prompt: Any, remaining: Any, host: Any, ledger: Ledger, swa_pool: Any | None
) -> AdmitView:
    """The admission question for a prompt of which ``remaining`` tokens are not cached on
    the device and ``host`` of those load back from the host tier, on the ledger as it
    stands."""
    swa_led, swa_pool = swa_loaded(ledger, swa_pool, host)
    return AdmitView(
        prompt_tokens=prompt,
        remaining_tokens=remaining,
        host_prefix_tokens=host,
        first_tokens=FIRST_TOKENS,
        page_size=ledger.page_size,
        rem_total_tokens=ledger.rem_total_tokens,
        cur_rem_tokens=ledger.cur_rem_tokens,
        hybrid_swa=ledger.hybrid_swa,
        rem_swa_tokens=swa_led.rem_swa_tokens,
        **view_swa_facts(remaining - host, swa_led, swa_pool),
    )


# -- the decisions ------------------------------------------------------------------------
def chunk(
    num: Numbers, method: str, view: ChunkView, request_id: str, *, label: str
) -> tuple[Any, Any]:
    """The chunking policy's chunk length (``new_chunk`` or ``resume_chunk``), which must be
    in ``[0, remaining]``; and whether it is not."""
    remaining = view.remaining_tokens
    return num.decide(
        "chunking",
        method,
        view,
        request_id,
        label=label,
        bad=lambda c: num.any(c < 0, c > remaining),
        complaint=lambda c: (
            f"returned the chunk length {c!r} for request {request_id!r} with {remaining} "
            f"tokens left; a chunk length is an int in [0, {remaining}]."
        ),
    )


def truncate(
    num: Numbers, ledger: Ledger, start: Any, end: Any, prompt: Any, request_id: str
) -> tuple[Any, Any]:
    """Place the non-final chunk ``[start, end)`` of a ``prompt``-token request on
    ``ledger``: the alignment policy moves its end, the chunk is charged, and the admission
    policy reserves the tail still to come. Returns the aligned end and whether a policy
    broke the contract."""
    page = ledger.page_size
    aligned, bad_align = num.decide(
        "alignment",
        "align_end",
        AlignView(start=start, end=end, page_size=page),
        request_id,
        label="aligned",
        bad=lambda a: num.not_(num.all(start < a, a <= end)),
        complaint=lambda a: (
            f"moved the end of the chunk [{start}, {end}) of request {request_id!r} to "
            f"{a!r}; an aligned end must be an int in ({start}, {end}]."
        ),
    )
    ledger.charge_chunk(aligned - start, first_tokens=0)
    tail = prompt - aligned
    reserve, bad_reserve = num.decide(
        "admission",
        "tail_reserve",
        TailView(tail_tokens=tail, first_tokens=FIRST_TOKENS, page_size=page),
        request_id,
        label="reserve",
        bad=lambda r: r < 0,
        complaint=lambda r: (
            f"reserved {r!r} tokens for the {tail}-token tail of request {request_id!r}; a "
            "reservation is a non-negative int."
        ),
    )
    ledger.reserve(reserve)
    return aligned, num.any(bad_align, bad_reserve)


def place(
    num: Numbers,
    ledger: Ledger,
    start: Any,
    length: Any,
    whole: Any,
    prompt: Any,
    request_id: str,
    *,
    placed: Callable[[], bool],
) -> tuple[Ledger, Any, Any]:
    """The chunk ``[start, start + length)`` of a ``prompt``-token request placed on a copy of
    ``ledger``: charged with the first tokens where it is the ``whole`` rest of the prompt,
    else truncated (:func:`truncate`). Returns that ledger, the truncated end and whether the
    truncation broke the contract. ``placed`` says (to ints) whether the chunk is placed at
    all: a chunk of 0 has no truncation to ask about."""

    def charged() -> Ledger:
        out = ledger.copy()
        out.charge_chunk(length, first_tokens=FIRST_TOKENS)
        return out

    def cut() -> tuple[Ledger, Any, Any]:
        out = ledger.copy()
        end, bad = truncate(num, out, start, start + length, prompt, request_id)
        return out, end, bad

    full = num.when(lambda: placed() and whole, charged)
    kept = num.when(lambda: placed() and not whole, cut)
    cut_ledger, end, bad = (ledger, start + length, False) if kept is None else kept
    return num.choose(whole, ledger if full is None else full, cut_ledger), end, bad


@dataclass
class Resumed:
    """The in-progress request's turn (:func:`resume`)."""

    chunk: Any
    bad_range: Any  #: the chunk is out of range (a broken contract)
    deferred: Any  #: no chunk this round
    final: Any  #: the chunk is the rest of the prompt
    ledger: Ledger  #: the ledger with the chunk placed (where it is)
    end: Any  #: a truncation's aligned end
    bad_truncation: Any  #: the truncation broke the contract


def resume(
    num: Numbers, ledger: Ledger, prompt: Any, seq: Any, swa_pool: Any | None, request_id: str
) -> Resumed:
    """The in-progress request, ``seq`` of its ``prompt`` tokens computed, resumes first
    (SGLang's chunked request): the chunking policy's ``resume_chunk``, 0 to defer it; the
    last chunk is charged with the first tokens, any other is truncated."""
    remaining = prompt - seq
    view = chunk_view(remaining, ledger, swa_pool)
    length, bad_range = chunk(num, "resume_chunk", view, request_id, label="resume_chunk")
    deferred = length == 0
    final = length == remaining
    placed, end, bad = place(
        num, ledger, seq, length, final, prompt, request_id, placed=lambda: not deferred
    )
    return Resumed(length, bad_range, deferred, final, placed, end, bad)


# -- a waiting request's admission --------------------------------------------------------
@dataclass(frozen=True)
class Offer:
    """What the cache offers a waiting request in one round: the planner's prefix match, the
    round model's ``Hit``."""

    cached: Any  #: device tokens matched
    host: Any  #: host tokens a load-back copies after them
    lock: Any  #: evictable tokens that locking the match takes out of the baseline
    slots: Any  #: the slots the load-back takes (whole pages)
    #: hybrid SWA: evictable sliding-window tokens the lock's window takes out of the
    #: sliding-window baseline (:mod:`policykit.swa_cache`)
    swa_lock: Any = 0
    #: hybrid SWA with a load-back: the sliding-window tokens the request's lock holds once
    #: the loaded KV is in the tree (its window moves onto it); None: the hit's whole
    #: sliding-window KV is charged (:func:`swa_host_charge`)
    swa_load_lock: Any = None


@dataclass
class Attempt:
    """One admission attempt of a waiting request on an :class:`Offer` (:func:`admission`)."""

    ok: Any  #: the admission policy's answer
    other: Any  #: no first chunk, or a second in-progress request (``Budget.OTHER``)
    bad_range: Any  #: the chunk is out of range (a broken contract)
    whole: Any  #: the chunk is the whole rest of the prompt
    bad_truncation: Any  #: a truncation's alignment or reservation broke the contract
    ledger: Ledger  #: the ledger with the chunk placed
    offer: Offer  #: what the attempt was made on
    start: Any
    end: Any  #: a truncation's aligned end
    chunk: Any

    @staticmethod
    def skipped(ledger: Ledger, offer: Offer) -> Attempt:
        """An attempt ints never made (refused before its chunk was asked about)."""
        return Attempt(False, False, False, False, False, ledger, offer, None, None, None)


def admits(
    num: Numbers, ledger: Ledger, prompt: Any, offer: Offer, swa_pool: Any | None, request_id: str
) -> Any:
    """The admission policy's verdict on a ``prompt``-token request offered ``offer``."""
    view = admit_view(prompt, prompt - offer.cached, offer.host, ledger, swa_pool)
    return num.admits(view, request_id)


def attempt(
    num: Numbers,
    ledger: Ledger,
    prompt: Any,
    offer: Offer,
    ok: Any,
    has_chunked: Any,
    swa_pool: Any | None,
    request_id: str,
) -> Attempt:
    """The admission of a request the admission policy answered ``ok`` about, on a copy of
    ``ledger``: the lock and the load-back lower the baseline, the chunking policy gives the
    first chunk, which is placed (:func:`place`) unless it is 0 or would be a second
    in-progress request (``has_chunked``)."""
    loaded = ledger.copy()
    if not num.known_zero(offer.lock):
        loaded.lower_baseline(offer.lock)
    lower_swa(loaded, offer.swa_lock)
    loaded.lower_baseline(offer.slots)  # the load-back allocates at admission
    compute = prompt - offer.cached - offer.host
    view = chunk_view(compute, loaded, swa_pool, offer.host)
    length, bad_range = chunk(num, "new_chunk", view, request_id, label="new_chunk")
    other = num.any(length == 0, num.all(length < compute, has_chunked))
    whole = length == compute
    start = offer.cached + offer.host
    placed, end, bad = place(
        num, loaded, start, length, whole, prompt, request_id, placed=lambda: not other
    )
    load_back_swa(placed, offer)  # its sliding-window KV comes back too
    return Attempt(ok, other, bad_range, whole, bad, placed, offer, start, end, length)


def admission(
    num: Numbers,
    ledger: Ledger,
    prompt: Any,
    offer: Offer,
    has_chunked: Any,
    swa_pool: Any | None,
    request_id: str,
) -> tuple[Attempt, Any]:
    """A waiting request's admission on ``offer`` (SGLang 0.5.23's ``add_one_req``): asked,
    its cached prefix locked, asked again, then its first chunk (:func:`attempt`). Returns
    the attempt and whether it fitted until its own lock took the prefix out of the evictable
    pool (``False`` where there is no lock to take); that attempt does not stand
    (:func:`afresh`), and ints do not make it."""

    def tried(cond: Callable[[], Any]) -> Attempt:
        """:func:`attempt` where ``cond()`` holds (ints), else one not made."""
        made = num.when(
            cond, lambda: attempt(num, ledger, prompt, offer, ok, has_chunked, swa_pool, request_id)
        )
        return Attempt.skipped(ledger, offer) if made is None else made

    ok = admits(num, ledger, prompt, offer, swa_pool, request_id)
    window = not num.known_zero(offer.swa_lock)  # a window lock (ints only: see Offer)
    if num.known_zero(offer.lock) and not window:
        return tried(lambda: ok), False
    locked = ledger.copy()
    locked.lower_baseline(offer.lock)
    lower_swa(locked, offer.swa_lock)

    def takes() -> Any:
        """Whether the lock takes anything (terms have no window lock to ask about)."""
        return (offer.lock > 0 or offer.swa_lock > 0) if window else offer.lock > 0

    @cache
    def ok_locked() -> Any:
        # asked once: first by ints, which have no chunk to ask about where the lock refuses;
        # terms ask it after the first chunk, the order the formula's names are made in
        return num.when(
            lambda: ok and takes(),
            lambda: admits(num, locked, prompt, offer, swa_pool, request_id),
        )

    if window:
        asked = (ledger, prompt, offer, swa_pool, request_id)
        return _window_admission(num, asked, ok, locked, has_chunked)
    first = tried(lambda: ok and not (takes() and not ok_locked()))
    refused = num.name("lock_refused", num.all(ok, offer.lock > 0, num.not_(ok_locked())))
    return first, refused


def _window_admission(
    num: Numbers,
    asked: tuple[Ledger, Any, Offer, Any | None, str],
    ok: Any,
    locked: Ledger,
    has_chunked: Any,
) -> tuple[Attempt, Any]:
    """:func:`admission` where the lock also takes sliding-window KV (hybrid SWA): asked
    again with both locks, and re-selected only where the full lock alone refuses; where the
    window lock alone refuses, SGLang 0.5.23 answers NO_TOKEN and selects nothing else. Ints
    and terms alike (terms ask every question; the attempt stands where ``passes`` holds).
    ``asked``: the ledger, prompt, offer, sliding-window pool and request id."""
    ledger, prompt, offer, swa_pool, request_id = asked
    takes = num.any(offer.lock > 0, offer.swa_lock > 0)
    fits = num.when(
        lambda: ok and takes, lambda: admits(num, locked, prompt, offer, swa_pool, request_id)
    )
    passes = ok if fits is None else num.all(ok, num.any(num.not_(takes), fits))
    if fits is not None:
        passes = num.name("lock_passes", passes)
    made = num.when(
        lambda: passes,
        lambda: attempt(num, ledger, prompt, offer, passes, has_chunked, swa_pool, request_id),
    )
    first = Attempt.skipped(ledger, offer) if made is None else made
    full = ledger.copy()
    full.lower_baseline(offer.lock)
    alone = num.when(
        lambda: ok and offer.lock > 0,
        lambda: admits(num, full, prompt, offer, swa_pool, request_id),
    )
    if alone is None:
        return first, False
    return first, num.name("lock_refused", num.all(ok, offer.lock > 0, num.not_(alone)))


def afresh(num: Numbers, refused: Any, first: Any, retry: Callable[[], Any]) -> Any:
    """Re-selection: a request that fitted until its own lock took its cached prefix out of
    the evictable pool (``refused``: a policy that gives no credit for the prefix pays for it
    twice) is asked about afresh, nothing cached, the prompt computed from token 0
    (``retry()``); otherwise it would wait forever, since an idle node never evicts that
    prefix. ``first`` stands elsewhere."""
    if refused is False:
        return first
    again = num.when(lambda: refused, retry)
    return first if again is None else num.choose(refused, again, first)


# -- an idle node -------------------------------------------------------------------------
@dataclass
class IdleAnswers:
    """The policies' answers about a request on the best case an idle node can ever offer
    (:func:`idle_answers`)."""

    ok: Any  #: the admission policy admits it
    chunk: Any  #: its first chunk (on ints: None where it is not admitted)
    bad: Any  #: that chunk is out of range (a broken contract)


def idle_answers(
    num: Numbers,
    prompt: Any,
    cached: Any,
    host: Any,
    capacity: Any,
    swa_total: Any | None,
    *,
    page: int,
    chunk_size: int,
    window: int | None,
    request_id: str,
) -> IdleAnswers:
    """Whether a ``prompt``-token request could ever run here, asked of the policies on an
    idle node: nothing else admitted or held, ``capacity`` tokens free (every unpinned cached
    prefix evicted), the whole compute budget and the whole sliding-window pool
    (``swa_total``, None without hybrid SWA) free; ``cached`` tokens of its prompt stay cached
    (pinned) and ``host`` load back. The planner rejects for good a request that fails it
    (a queue that skips what never fits); the checker asks it of every request."""
    remaining = prompt - cached
    swa = None
    if swa_total is not None:
        # the sliding-window pool once the hit's sliding-window KV is loaded
        swa_total = swa_total - swa_host_charge(host, window, page)
    if swa_total is not None and window is not None:
        swa = idle_swa_facts(remaining - host, FIRST_TOKENS, page, chunk_size, swa_total, window)
    admit = idle_admit_view(prompt, remaining, host, FIRST_TOKENS, page, capacity, swa)
    first = idle_chunk_view(remaining - host, host, page, chunk_size, capacity, swa_total, swa)
    ok = num.admits(admit, request_id, label="idle_admit")
    asked = num.when(
        lambda: ok, lambda: chunk(num, "new_chunk", first, request_id, label="idle_chunk")
    )
    length, bad = (None, False) if asked is None else asked
    return IdleAnswers(ok, length, bad)


# -- a node that preempts (vLLM 0.33.0's v1 scheduler) ---------------------------------------
def blocks_to_allocate(tokens: Any, held_blocks: Any, page_size: int) -> Any:
    """Blocks a request holding ``held_blocks`` must still get to hold ``tokens`` tokens
    (vLLM's ``get_num_blocks_to_allocate`` for one full-attention group)."""
    return -(-tokens // page_size) - held_blocks


def preempting_chunk_view(
    remaining: Any, budget: Any, free_tokens: Any, eligible: Any, page_size: int
) -> ChunkView:
    """The chunking question on a node that preempts: ``budget`` tokens left in the step,
    ``free_tokens`` of free blocks (what a chunk may take without a preemption) and
    ``eligible`` requests running or waiting."""
    return ChunkView(
        remaining_tokens=remaining,
        rem_chunk_tokens=budget,
        rem_total_tokens=free_tokens,
        rem_swa_tokens=free_tokens,
        page_size=page_size,
        hybrid_swa=False,
        eligible_requests=eligible,
    )


def preempting_admit_view(
    prompt: Any, remaining: Any, free_tokens: Any, page_size: int
) -> AdmitView:
    """The admission question on a node that preempts: ``remaining`` of the ``prompt`` not
    hit in the prefix cache, ``free_tokens`` of free blocks once the hit is taken. Nothing is
    promised to later steps there, so what may be promised and what the batch leaves are one."""
    return AdmitView(
        prompt_tokens=prompt,
        remaining_tokens=remaining,
        host_prefix_tokens=0,
        first_tokens=FIRST_TOKENS,
        page_size=page_size,
        rem_total_tokens=free_tokens,
        cur_rem_tokens=free_tokens,
    )


def aligned_end(
    num: Numbers, start: Any, end: Any, page_size: int, request_id: str
) -> tuple[Any, Any]:
    """The alignment policy's end for the non-final chunk ``[start, end)``, which must be in
    ``(start, end]``; and whether it is not."""
    return num.decide(
        "alignment",
        "align_end",
        AlignView(start=start, end=end, page_size=page_size),
        request_id,
        label="aligned",
        bad=lambda a: num.not_(num.all(start < a, a <= end)),
        complaint=lambda a: (
            f"moved the end of the chunk [{start}, {end}) of request {request_id!r} to "
            f"{a!r}; an aligned end must be an int in ({start}, {end}]."
        ),
    )


def preempting_chunk(
    num: Numbers,
    method: str,
    start: Any,
    prompt: Any,
    budget: Any,
    free_tokens: Any,
    eligible: Any,
    page_size: int,
    request_id: str,
) -> tuple[Any, Any]:
    """A node that preempts asks the chunking policy (``new_chunk`` or ``resume_chunk``) for
    the chunk of a ``prompt``-token request from ``start``, and the alignment policy where a
    non-final one ends; 0 leaves it for this step. Returns the chunk and whether a policy
    broke its contract. The node, the vLLM plugin (:mod:`policykit.integrations.vllm`) and the
    checker's model of the node (``policykit.spec.preempting_bmc``) all take their chunk here."""
    remaining = prompt - start
    view = preempting_chunk_view(remaining, budget, free_tokens, eligible, page_size)
    length, bad = chunk(num, method, view, request_id, label=method)
    cut = num.all(length > 0, length < remaining)
    aligned = num.when(
        lambda: cut, lambda: aligned_end(num, start, start + length, page_size, request_id)
    )
    if aligned is None:  # ints, and the chunk is final or empty
        return length, bad
    end, bad_end = aligned
    length = num.name("chunk", num.choose(cut, end - start, length))
    return length, num.any(bad, num.all(cut, bad_end))


def preempting_admits(
    num: Numbers, prompt: int, start: int, free_tokens: int, page_size: int, request_id: str
) -> Any:
    """The admission policy's verdict on a waiting request of a node that preempts, ``start``
    tokens of its ``prompt`` hit in the prefix cache, ``free_tokens`` free once the hit is
    taken."""
    view = preempting_admit_view(prompt, prompt - start, free_tokens, page_size)
    return num.admits(view, request_id)


def preempting_victim(
    num: Numbers,
    running: list[tuple[int, int, int]],
    requester: int,
    page_size: int,
    request_ids: list[str],
    orders: list[tuple[int, int]] | None = None,
) -> int:
    """The place in the running list of the request to preempt so the chunk of the one at
    ``requester`` fits: each running request as ``(prompt, computed, held blocks)``, ranked by
    the preemption policy (:func:`victim`). ``orders``, where the engine has them: each one's
    ``(priority, arrival stamp)`` (``PreemptView``). On ints only: the node branches on it."""
    facts = [(0, 0)] * len(running) if orders is None else orders
    count = 0 if orders is None else len(running)
    views = [
        PreemptView(
            position=place,
            prompt_tokens=prompt,
            computed_tokens=computed,
            held_blocks=held,
            is_requester=place == requester,
            page_size=page_size,
            priority=priority,
            arrival=arrival,
            running_requests=count,
        )
        for place, ((prompt, computed, held), (priority, arrival)) in enumerate(
            zip(running, facts, strict=True)
        )
    ]
    place, _ = victim(num, views, request_ids)
    return place


def victim(
    num: Numbers,
    views: list[PreemptView],
    request_ids: list[str],
    present: list[Any] | None = None,
) -> tuple[Any, Any]:
    """Which running request to preempt, by its place in ``views`` (the running list): the
    preemption policy's highest rank, a tie going to the later one. Returns that place and
    whether a rank broke the contract (ranks are ints; any int is a rank).

    ``present`` (the checker's): per view, whether that request is still in the list; a view
    that is not never wins and its rank is not held against the policy. The checker's running
    list has a place for every request, filled or not, where the scheduler's has only the
    running ones (None: every view is present)."""
    here_all = [True] * len(views) if present is None else present
    best: Any = 0
    best_rank: Any = 0
    found: Any = False
    broken: Any = False
    for place, (view, rid, here) in enumerate(zip(views, request_ids, here_all, strict=True)):
        rank, bad = num.decide(
            "preemption",
            "victim_rank",
            view,
            rid,
            label=f"victim_rank_{place}",
            bad=lambda r: False,
            complaint=lambda r, rid=rid: (
                f"ranked running request {rid!r} {r!r}; a victim rank is an int."
            ),
        )
        broken = num.any(broken, num.all(here, bad))
        take = num.all(here, num.any(num.not_(found), rank >= best_rank))
        best = num.choose(take, place, best)
        best_rank = num.choose(take, rank, best_rank)
        found = num.any(found, here)
    return best, broken


# -- hybrid SWA with a host-tier hit ---------------------------------------------------------
def swa_host_charge(host: Any, window: int | None, page: int) -> Any:
    """Sliding-window slots a load-back of ``host`` tokens takes (hybrid SWA): the hit's
    sliding-window KV (``swa_host_hit``) in whole pages. The hit is rounded up first: its
    last window is then whole pages already, and the checker's terms need no quotient of a
    capped value."""
    return swa_host_hit(ceil_paged(host, page), window, page)


def swa_loaded(ledger: Ledger, swa_pool: Any | None, host: Any) -> tuple[Ledger, Any]:
    """The sliding-window budget as a request whose host hit loads back ``host`` tokens sees
    it: the ledger and the pool less the hit's sliding-window KV (:func:`swa_host_charge`).

    SGLang 0.5.23's ``SWAPrefillBudget`` adds that charge to the chunk's estimate
    (``estimate_swa_kv_tokens(host_hit_length=swa_host_hit_length)``) in the fit check
    (``need + charge < remaining``), the never-fits test (``need + charge >= pool``) and the
    capped chunk's headroom; taking it off the budget instead says the same, and tells a
    policy what is left once the load-back has taken it. Unchanged without hybrid SWA or a hit.
    """
    if swa_pool is None or ledger.swa_baseline is None or (_is_int(host) and host == 0):
        return ledger, swa_pool
    charge = swa_host_charge(host, ledger.sliding_window, ledger.page_size)
    out = ledger.copy()
    out.swa_baseline = out.swa_baseline - charge
    return out, swa_pool - charge


def lower_swa(ledger: Ledger, tokens: Any) -> None:
    """A lock's window makes ``tokens`` of cached sliding-window KV unevictable: SGLang's
    ``remaining_swa`` counts evictable sliding-window KV as room, so it loses them."""
    if ledger.swa_baseline is not None and not (_is_int(tokens) and tokens == 0):
        ledger.swa_baseline = ledger.swa_baseline - tokens


def load_back_swa(ledger: Ledger, offer: Offer) -> None:
    """After a load-back under hybrid SWA its sliding-window KV is on the device (0.5.23's
    ``init_load_back`` loads the host node's sliding-window values with its full ones). Where
    the offer knows the tree (``swa_load_lock``), the loaded KV joins it as evictable cache and
    the round's sliding-window baseline loses what the request's lock then holds instead of
    what its prefix's lock held; otherwise it loses the hit's whole sliding-window KV.
    Nothing without hybrid SWA."""
    if ledger.swa_baseline is None:
        return
    if offer.swa_load_lock is None:
        ledger.swa_baseline = ledger.swa_baseline - swa_host_charge(
            offer.host, ledger.sliding_window, ledger.page_size
        )
    else:
        ledger.swa_baseline = ledger.swa_baseline - (offer.swa_load_lock - offer.swa_lock)
