"""vLLM 0.33.0's scheduler with a combo's policies at its decision points.

``Scheduler.schedule`` decides a step inline; the plugin keeps it whole and answers at the
places it asks something of an overridable method or of its own containers:

* **the waiting queue's order**: ``self.waiting`` is a :class:`~.queue.PolicyQueue`, which
  the queue policy orders over vLLM's base order (fcfs, or arrival under a priority engine);
* **a chunk's length**: ``_reserve_prefill_lookahead`` is called in both loops with the chunk
  vLLM chose, just before its blocks are allocated; the plugin returns the chunking policy's
  (``resume_chunk`` for a running request, ``new_chunk`` for a waiting one), a non-final one
  ended by the alignment policy, then vLLM's own multi-token-prediction rule;
* **admission**: for a waiting request the admission policy answers next; vLLM's full-sequence
  reservation (``scheduler_reserve_full_isl``) is replaced by it, so ``allocate_slots`` only
  checks the chunk's blocks. A refusal (or a chunk of 0) stops the step's waiting loop, as a
  failed allocation does in vLLM and a refusal does in ``policykit simulate``;
* **the preemption victim**: ``self.running`` is a :class:`~.running.RunningList`, whose last
  element, read when a chunk cannot be allocated, is the preemption policy's choice. Under
  ``--scheduling-policy priority`` vLLM picks its victim inline and policykit cannot carry out
  another (start-up refuses any but ``vllm-priority``); the policy is asked there too, and a
  choice that differs from vLLM's is logged and counted as a fallback.

The questions and their arithmetic are :mod:`policykit.kernel`'s, asked of the same policy
objects as ``policykit simulate`` asks (:mod:`policykit.preempting`), on vLLM's own numbers:
its block pool's free blocks, the prefix-cache hit ``get_computed_blocks`` found, the step's
token budget and its count of running and waiting requests. Decode steps, requests that load
KV from a connector, encoder inputs and models with more than one KV cache group stay vLLM's
decisions alone, as is a waiting request whose whole prompt is a prefix hit and that vLLM pads
to the speculative-decoding shape (a first decode step, not a prefill).

Which combo runs: the one configured, over vLLM's own decisions under the engine's
configuration (:func:`~policykit.integrations.vllm.settings.derived_combo`).
"""

from __future__ import annotations

import bisect
import json
import logging
from typing import TYPE_CHECKING, Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from policykit import kernel
from policykit.integrations.vllm.guard import FALLBACK, Guard
from policykit.integrations.vllm.queue import PolicyQueue
from policykit.integrations.vllm.running import RunningList
from policykit.integrations.vllm.startup import start
from policykit.kernel import Ints, describe
from policykit.policy import QueueView

logger = logging.getLogger("policykit.vllm")

# The mixin reads and overrides vLLM's ``Scheduler`` (its configuration, its containers, the
# methods it calls super() of); at run time it comes before ``Scheduler`` or ``AsyncScheduler``
# in the class that uses it, so to the type checker it is a ``Scheduler``, and at run time it
# stays a plain mixin (the classes below pick their own base).
if TYPE_CHECKING:
    _SchedulerMixin = Scheduler
else:
    _SchedulerMixin = object


class PolicyDecisions(_SchedulerMixin):
    """The decision points, mixed in before vLLM's ``Scheduler`` (or ``AsyncScheduler``)."""

    #: what vLLM's constructor set ``scheduler_reserve_full_isl`` to (the fallback's rule)
    _configured_reserve = True
    #: the admission rule of the waiting request being allocated: None, vLLM's configured one
    _reserve_now: bool | None = None
    #: vLLM's waiting queue, replaced in ``__init__`` by one that the queue policy orders
    waiting: PolicyQueue

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.combo = start(self)
        self._num = Ints(self.combo)
        self.guard = Guard()
        self._page = int(self.block_size)
        spec = self.vllm_config.speculative_config
        self._draft_slots = spec.max_num_new_slots_for_drafting if spec is not None else 0
        #: one full-attention group and no per-step alignment of vLLM's own: what policykit
        #: models; elsewhere vLLM decides alone
        self._modelled = (
            len(self.kv_cache_config.kv_cache_groups) == 1
            and not self.need_mamba_block_aligned_split
            and not self.is_encoder_decoder
        )
        if not self._modelled:
            logger.warning(
                "policykit vLLM scheduler: this model has several KV cache groups (or Mamba "
                "alignment); policykit models one full-attention pool, so vLLM decides alone"
            )
        #: --scheduling-policy priority: vLLM's inline victim, and arrival as the base order
        self._by_priority = self.policy == SchedulingPolicy.PRIORITY
        sorts = self._modelled and not self.combo.queue.arrival_order
        rank = self._rank if sorts else None
        self.waiting = PolicyQueue(rank, by_arrival=self._by_priority)
        self.running = RunningList(self.running)
        self._in_step = False
        self._eligible = 0
        #: tokens given to each request this step, and their sum (the budget already spent)
        self._given: dict[str, int] = {}
        self._spent = 0
        #: the running request whose chunk is being placed (the preemption's requester)
        self._requester: Any = None
        #: (request, its hit in tokens, evictable hit blocks) of the waiting request looked up
        self._hit: tuple[Any, int, int] | None = None
        #: the waiting request the admission or chunking policy refused this step
        self._refused: Any = None

    # -- vLLM's full-sequence reservation, per waiting request ------------------------------
    @property
    def scheduler_reserve_full_isl(self) -> bool:
        return self._configured_reserve if self._reserve_now is None else self._reserve_now

    @scheduler_reserve_full_isl.setter
    def scheduler_reserve_full_isl(self, value: bool) -> None:
        self._configured_reserve = value

    # -- the step ----------------------------------------------------------------------------
    def schedule(self, throttle_prefills: bool = False) -> Any:
        if type(self.running) is not RunningList:
            # vLLM rebuilds the list when it removes several finished requests at once
            self.running = RunningList(self.running)
        running, waiting = self.get_request_counts()
        self._eligible = running + waiting
        self._given.clear()
        self._spent = 0
        self._requester = self._hit = self._refused = None
        self._reserve_now = None
        self.waiting.new_step()
        if self._by_priority:
            self.running.arm(witness=self._witness)
        else:
            self.running.arm(choose=self._victim)
        self._in_step = self._modelled
        try:
            return super().schedule(throttle_prefills)
        finally:
            self._in_step = False
            self.running.disarm()
            self._reserve_now = None
            if self._refused is not None:
                # vLLM counts a skipped request as deferred; a refused one waits for memory,
                # as one whose allocation failed does
                self.deferred_waiting.discard(self._refused)
                self.prefill_capacity_bound = True
            self.waiting.end_step()
            self._requester = self._hit = self._refused = None

    def shutdown(self) -> None:
        """Log the guard's counts: they live in the engine-core process, which a server's
        operator (or the CPU server check) can otherwise not ask."""
        logger.info(
            "policykit vLLM scheduler shutting down with %s: answered %s, fallbacks %s",
            self.combo,
            json.dumps(dict(sorted(self.guard.answered.items()))),
            json.dumps(dict(sorted(self.guard.fallbacks.items()))),
        )
        super().shutdown()

    def _preempt_request(self, request: Any, *args: Any, **kwargs: Any) -> None:
        self._spent -= self._given.pop(request.request_id, 0)
        super()._preempt_request(request, *args, **kwargs)

    def _get_local_prefix_cache_hit(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        found = super()._get_local_prefix_cache_hit(request, *args, **kwargs)
        if self._in_step:
            tokens = found[1]
            hit = found[0].blocks[0] if tokens else ()
            self._hit = (request, tokens, sum(1 for block in hit if block.ref_cnt == 0))
        return found

    def _reserve_prefill_lookahead(
        self, request: Any, num_computed_tokens: int, num_new_tokens: int
    ) -> int:
        own = super()._reserve_prefill_lookahead(request, num_computed_tokens, num_new_tokens)
        tokens = own
        running = request.status == RequestStatus.RUNNING
        if running:
            self._requester = request
        else:
            self._reserve_now = None  # vLLM's rule unless the admission policy answers
        padded = num_new_tokens > request.num_tokens - num_computed_tokens
        if self._in_step and not padded and self._prefilling(request, num_computed_tokens):
            if running:
                tokens = self._resume(request, num_computed_tokens, own)
            else:
                tokens = self._admit(request, num_computed_tokens, own)
        if tokens > 0:
            self._given[request.request_id] = tokens
            self._spent += tokens
        return tokens

    # -- the decisions -----------------------------------------------------------------------
    @staticmethod
    def _prefilling(request: Any, computed: int) -> bool:
        """Still computing its prompt (or, after a preemption, its prompt and output so far),
        with no encoder inputs: what the chunking policy decides on."""
        end = max(request.num_prompt_tokens, request.num_tokens - 1)
        return computed < end and not request.has_encoder_inputs

    def _budget(self) -> int:
        """Tokens the step has left: vLLM's token budget and its input budget, less what the
        step gave so far (a request that then failed to allocate only makes this smaller)."""
        tokens = self.max_num_scheduled_tokens - self._spent
        inputs = (
            self.scheduler_config.max_num_batched_tokens
            - self._spent
            - self._draft_slots * (len(self._given) + 1)
        )
        return min(tokens, inputs)

    def _chunk(self, method: str, request: Any, computed: int, free_blocks: int) -> int | None:
        """The chunking policy's chunk from ``computed`` (aligned), or None where vLLM's own
        stands."""
        budget = self._budget()
        rid = request.request_id
        chunk = self.guard.ask(
            "chunking",
            method,
            kernel.preempting_chunk,
            self._num,
            method,
            computed,
            request.num_tokens,
            budget,
            free_blocks * self._page,
            self._eligible,
            self._page,
            rid,
        )
        if chunk is FALLBACK:
            return None
        chunk, _ = chunk  # (a broken answer raised inside, as a fault the guard caught)
        if chunk > budget:
            self.guard.refuse(
                "chunking",
                method,
                "over the budget",
                f"{describe(self.combo.chunking)} gave request {rid!r} a chunk of {chunk} "
                f"tokens with {budget} left in vLLM's step budget (more would break vLLM's "
                "batch);",
            )
            return None
        return chunk

    def _resume(self, request: Any, computed: int, own: int) -> int:
        free = self.kv_cache_manager.block_pool.get_num_free_blocks()
        chunk = self._chunk("resume_chunk", request, computed, free)
        return own if chunk is None else self._lookahead(request, computed, chunk)

    def _lookahead(self, request: Any, computed: int, chunk: int) -> int:
        """vLLM's multi-token-prediction rule on the policy's chunk (none without MTP)."""
        return super()._reserve_prefill_lookahead(request, computed, chunk)

    def _admit(self, request: Any, computed: int, own: int) -> int:
        """A waiting request's first chunk, and whether it enters (0: it does not, and the
        step's waiting loop stops there)."""
        hit = self._hit
        if (
            hit is None
            or hit[0] is not request
            or hit[1] != computed
            or self.waiting.peeked is not request
        ):
            return own  # no local lookup of its own this step (a connector's load, a resume)
        free = self.kv_cache_manager.block_pool.get_num_free_blocks() - hit[2]
        chunk = self._chunk("new_chunk", request, computed, free)
        if chunk is None:
            chunk = own
        elif chunk == 0:
            return self._refuse(request)
        else:
            chunk = self._lookahead(request, computed, chunk)
        verdict = self.guard.ask(
            "admission",
            "admit",
            kernel.preempting_admits,
            self._num,
            request.num_tokens,
            computed,
            free * self._page,
            self._page,
            request.request_id,
        )
        if verdict is FALLBACK:
            self._reserve_now = None
        elif not verdict:
            return self._refuse(request)
        else:
            self._reserve_now = False
        return chunk

    def _refuse(self, request: Any) -> int:
        """Stop the step's waiting loop at ``request``: vLLM skips a request given 0 tokens,
        and the queue then reads as empty until the skipped request is put back."""
        self._refused = request
        self.waiting.close()
        return 0

    def _victim(self, running: list[Any]) -> Any:
        """The running request to preempt (``running[-1]`` in vLLM's fcfs path): the
        preemption policy's choice, where vLLM's path can carry it out."""
        last = list.__getitem__(running, -1)
        requester = self._requester
        if not self._in_step or requester is None:
            return last
        at = next((p for p, r in enumerate(running) if r is requester), None)
        if at is None:
            return last
        place = self._policy_victim(running, at)
        if place is FALLBACK:
            return last
        if place < at or (place == at and place != len(running) - 1):
            self.guard.refuse(
                "preemption",
                "victim_rank",
                "not after the requester",
                f"{describe(self.combo.preemption)} chose running request "
                f"{running[place].request_id!r} to make room for {requester.request_id!r}: "
                "vLLM 0.33.0's preemption path can only take back a request after the "
                "requester in the running list, or the requester when it is the last;",
            )
            return last
        return list.__getitem__(running, place)

    def _policy_victim(self, running: list[Any], at: int) -> Any:
        """The preemption policy's choice (a place in ``running``) to make room for the request
        at ``at``, or :data:`FALLBACK`."""
        candidates = [(r.num_tokens, r.num_computed_tokens, self._held(r)) for r in running]
        stamps = arrival_stamps(running)
        return self.guard.ask(
            "preemption",
            "victim_rank",
            kernel.preempting_victim,
            self._num,
            candidates,
            at,
            self._page,
            [r.request_id for r in running],
            [(r.priority, stamp) for r, stamp in zip(running, stamps, strict=True)],
        )

    def _witness(self, running: list[Any], chosen: Any) -> None:
        """Under a priority engine: ask the preemption policy too, and log (once) where its
        choice is not the victim vLLM took inline."""
        requester = self._requester
        if not self._in_step or requester is None:
            return
        at = next((p for p, r in enumerate(running) if r is requester), None)
        if at is None:
            return
        place = self._policy_victim(running, at)
        if place is FALLBACK or list.__getitem__(running, place) is chosen:
            return
        self.guard.refuse(
            "preemption",
            "victim_rank",
            "not vLLM's priority victim",
            f"{describe(self.combo.preemption)} chose running request "
            f"{running[place].request_id!r} where vLLM 0.33.0's priority path preempts "
            f"{chosen.request_id!r} (max by priority, then arrival time);",
        )

    def _held(self, request: Any) -> int:
        return len(self.kv_cache_manager.get_blocks(request.request_id).blocks[0])

    def _rank(self, waiting: list[Any]) -> list[Any] | None:
        """The waiting requests in the queue policy's order (stable), or None if a priority
        failed (vLLM's fcfs order stands this step)."""
        policy = self.combo.queue
        manager = self.kv_cache_manager
        page = self._page

        def order() -> list[Any]:
            ranks = []
            for request, stamp in zip(waiting, arrival_stamps(waiting), strict=True):
                view = QueueView(
                    prompt_tokens=request.num_tokens,
                    prefix_tokens=manager.get_computed_blocks(request)[1],
                    host_prefix_tokens=0,
                    page_size=page,
                    priority=request.priority,
                    arrival=stamp,
                )
                ranks.append(kernel.queue_rank(policy, view, request.request_id))
            return kernel.in_queue_order(self._num, waiting, ranks)

        ranked = self.guard.ask("queue", "priority", order)
        return None if ranked is FALLBACK else ranked


def arrival_stamps(requests: list[Any]) -> list[int]:
    """Per request, how many of ``requests`` arrived strictly before it (vLLM's
    ``arrival_time``): the views' ``arrival``, equal for equal times."""
    times = sorted(r.arrival_time for r in requests)
    return [bisect.bisect_left(times, r.arrival_time) for r in requests]


class PolicyScheduler(PolicyDecisions, Scheduler):
    """vLLM's ``Scheduler`` under a policykit combo (for ``--no-async-scheduling``)."""


class PolicyAsyncScheduler(PolicyDecisions, AsyncScheduler):
    """vLLM's ``AsyncScheduler`` under a policykit combo: the class to name in
    ``--scheduler-cls`` (vLLM builds an ``AsyncScheduler`` by default, and warns that a
    ``Scheduler`` subclass turns async scheduling off)."""
