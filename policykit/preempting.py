"""A prefill node that preempts: vLLM 0.33.0's v1 scheduler, one step per round.

SGLang's node promises memory up front (its ledger) and never takes it back; vLLM's promises
nothing beyond the step and, when a running request's chunk cannot be allocated, takes every
block from another running request and sends it back to wait (a preemption). A step, in
vLLM's order (``Scheduler.schedule``):

1. running requests first, in the running list's order, each with the chunking policy's
   ``resume_chunk`` (``0``: skip it this step); when its blocks do not fit, the preemption
   policy picks a running victim, whose blocks are freed and whose computed tokens are reset,
   until the chunk fits or the requester itself was the victim;
2. waiting requests only if nothing was preempted: the queue policy's order, each with its
   prefix-cache hit, ``new_chunk``, the admission policy's ``admit`` and the chunk's blocks;
   the first one that does not get in stops the queue.

The arithmetic (blocks to allocate, the views, the victim) is :mod:`policykit.kernel`'s, so the
checker can run the same rules on symbolic values; the blocks themselves are
:class:`~policykit.block_pool.BlockPool`'s, pages of a real tensor pool. A request finishes when
its prompt is computed and holds its KV until its transfer is done, as on a disaggregated
prefill instance.

Each step is also a :class:`~policykit.plan.Plan` (entries in scheduling order, the waiting
request that stopped the queue), so the observer hooks fire here as on SGLang's node and a
harness forward (``forward``) runs over the same batch type. There is no ledger: vLLM promises
nothing beyond what it allocates, so the hooks get a snapshot (:meth:`PreemptingScheduler.ledger`)
whose baseline is the free blocks and whose offsets are zero (docs/plugins.md).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import torch

from policykit import kernel
from policykit.block_pool import BlockPool
from policykit.kernel import INT_LOGIC, Ints
from policykit.ledger import Ledger
from policykit.plan import Entry, EntryKind, Plan, Rejection
from policykit.plugin_manager import PolicykitPluginManager
from policykit.policy import QueueView
from policykit.pool import KVLayout
from policykit.registry import Combo


@dataclass
class PagedRequest:
    """A request on a node that preempts."""

    id: str
    prompt_tokens: int
    arrival_round: int
    #: what each full block of its prompt holds (equal keys share prefix-cache blocks)
    keys: tuple[Hashable, ...]
    #: rounds its finished KV is held before the transfer is done; None: held for good
    release_rounds: int | None
    computed: int = 0
    blocks: list[int] = field(default_factory=list)
    finished_round: int | None = None
    preemptions: int = 0
    #: the prompt's token ids, for a harness forward (a pure simulation needs none)
    tokens: Sequence[int] | None = None

    @property
    def remaining(self) -> int:
        return self.prompt_tokens - self.computed


@dataclass(frozen=True)
class PreemptingConfig:
    page_size: int
    #: tokens one step may compute (vLLM's ``max_num_batched_tokens``)
    budget: int
    #: requests that may run at once (vLLM's ``max_num_seqs``); None: no cap
    max_running: int | None = None


@dataclass(frozen=True)
class Step:
    """One round's decisions, as ``policykit conformance vllm`` compares them."""

    round: int
    #: request id -> tokens scheduled, in scheduling order
    scheduled: dict[str, int]
    preempted: list[str]
    completed: list[str]
    released: list[str]
    #: blocks held right after scheduling (before this round's releases)
    blocks_used: int
    blocks_free: int


class PreemptingNode:
    """Requests and blocks of one node that preempts, between rounds."""

    def __init__(
        self,
        config: PreemptingConfig,
        num_blocks: int,
        *,
        device: str | torch.device = "cpu",
        layout: KVLayout | None = None,
    ) -> None:
        self.config = config
        self.pool = BlockPool(num_blocks, config.page_size, device=device, layout=layout)
        self.future: list[PagedRequest] = []
        self.waiting: list[PagedRequest] = []
        self.running: list[PagedRequest] = []
        self.held: list[PagedRequest] = []
        self.finished: list[PagedRequest] = []

    def add(self, request: PagedRequest) -> None:
        """Queue a request for its arrival round (same round: in the order added)."""
        at = len(self.future)
        while at and self.future[at - 1].arrival_round > request.arrival_round:
            at -= 1
        self.future.insert(at, request)

    def arrive(self, round_no: int) -> None:
        while self.future and self.future[0].arrival_round <= round_no:
            self.waiting.append(self.future.pop(0))

    def take(self, req: PagedRequest, tokens: int, hit: list[int]) -> None:
        """Give ``req`` the blocks to hold ``tokens`` tokens (its hit first), and cache the full
        ones: vLLM caches a chunk's blocks when it allocates them."""
        page = self.config.page_size
        self.pool.touch(hit)
        req.blocks.extend(hit)
        need = kernel.blocks_to_allocate(tokens, len(req.blocks), page)
        req.blocks.extend(self.pool.allocate(need))
        full = min(tokens // page, len(req.keys))
        for index in range(full):
            self.pool.cache(req.blocks[index], req.keys[index])

    def pending_releases(self) -> bool:
        """Whether held KV will still come back (:func:`policykit.kernel.kv_due`)."""
        return any(
            kernel.kv_due(INT_LOGIC, r.finished_round, [], r.release_rounds is None)
            for r in self.held
        )

    def give_back(self, req: PagedRequest) -> None:
        """Free ``req``'s blocks, last first (so its tail is evicted first)."""
        self.pool.free(reversed(req.blocks))
        req.blocks = []

    def hit(self, req: PagedRequest) -> list[int]:
        """Its prefix-cache hit: never the whole prompt (vLLM keeps one token to compute)."""
        return self.pool.hit(req.keys[: (req.prompt_tokens - 1) // self.config.page_size])


#: ``forward(plan, node)``: a harness's model forward over the step's batch, after its blocks
#: are allocated and before its chunks count as computed (as ``Scheduler(forward=...)``)
Forward = Callable[[Plan, PreemptingNode], None]


class PreemptingScheduler:
    """Drives a :class:`PreemptingNode` round by round under one combo that preempts."""

    def __init__(
        self,
        node: PreemptingNode,
        combo: Combo,
        *,
        pm: PolicykitPluginManager | None = None,
        forward: Forward | None = None,
    ) -> None:
        self.node = node
        self.combo = combo
        self.domain = Ints(combo)
        #: the waiting queue's order from the last round that sorted it (``kernel.queue_order``)
        self._kept: dict[str, int] | None = None
        self.pm = pm
        self.forward = forward
        self.round_no = 0
        #: this step's entries (scheduling order), the request that stopped the queue, and the
        #: budget left: what the step's :class:`Plan` and the hooks' ledgers are made of
        self._entries: list[Entry] = []
        self._rejected: list[Rejection] = []
        self._stop: str | None = None
        self._budget = 0
        #: the last step's plan (what a harness records and prices)
        self.last_plan = Plan(round=0)

    def step(self) -> Step:
        node = self.node
        self.round_no += 1
        node.arrive(self.round_no)
        self._entries, self._rejected, self._stop = [], [], None
        self._budget = node.config.budget
        baseline = node.pool.free_blocks * node.config.page_size
        if self.pm is not None:
            self.pm.hook.policykit_round_start(round_no=self.round_no, ledger=self.ledger())
        scheduled: dict[str, int] = {}
        # vLLM counts the eligible requests once, before either loop (its threshold is off when
        # there is only one)
        eligible = len(node.running) + len(node.waiting)
        preempted = self._schedule_running(scheduled, eligible)
        if not preempted:
            self._schedule_waiting(scheduled, eligible)
        used, free = node.pool.used_blocks, node.pool.free_blocks
        gone = set(preempted)
        plan = Plan(
            round=self.round_no,
            entries=tuple(e for e in self._entries if e.request_id not in gone),
            rejected=tuple(self._rejected),
            stop=self._stop,
            baseline=baseline,
        )
        self.last_plan = plan
        if self.forward is not None and plan.batch:
            self.forward(plan, node)
        completed = self._compute(scheduled)
        released = self._release(completed)
        if self.pm is not None:
            self.pm.hook.policykit_round_end(round_no=self.round_no, plan=plan)
        return Step(self.round_no, scheduled, sorted(preempted), completed, released, used, free)

    def ledger(self) -> Ledger:
        """The node's budgets now, in the ledger's terms: vLLM allocates a chunk's blocks when
        it schedules it and promises nothing beyond, so the baseline is the free blocks (cached
        ones included, as SGLang's free + evictable), the offsets are zero and
        ``rem_chunk_tokens`` is the step budget left."""
        page = self.node.config.page_size
        return Ledger(page, self.node.pool.free_blocks * page, self._budget)

    def idle(self, step: Step) -> bool:
        """Nothing can change any more: nothing ran, was preempted or freed this round, nothing
        arrives later and no KV is due back."""
        node = self.node
        moved = step.scheduled or step.preempted or step.released
        return not moved and not node.future and not node.pending_releases()

    def _scheduled(self, req: PagedRequest, start: int, chunk: int, *, new: bool) -> None:
        """``req`` got ``chunk`` tokens from ``start``: its plan entry, and the admit hook."""
        end = start + chunk
        finishes = end == req.prompt_tokens
        if new:
            kind = EntryKind.WHOLE if finishes else EntryKind.TRUNCATED
        else:
            kind = EntryKind.FINAL if finishes else EntryKind.RESUMED
        entry = Entry(req.id, start, end, kind, cached=start if new else 0)
        self._entries.append(entry)
        self._budget -= chunk
        if self.pm is not None:
            self.pm.hook.policykit_admit(
                round_no=self.round_no, request_id=req.id, entry=entry, ledger=self.ledger()
            )

    def _stopped(self, req: PagedRequest | None, verdict: str) -> None:
        """The waiting queue stopped (at ``req``, which was looked at and refused, if any)."""
        self._stop = verdict
        if req is None:
            return
        self._rejected.append(Rejection(req.id, verdict))
        if self.pm is not None:
            self.pm.hook.policykit_reject(
                round_no=self.round_no, request_id=req.id, verdict=verdict, ledger=self.ledger()
            )

    # -- running requests --------------------------------------------------------------------
    def _schedule_running(self, scheduled: dict[str, int], eligible: int) -> list[str]:
        node, cfg = self.node, self.node.config
        budget = cfg.budget - sum(scheduled.values())
        preempted: list[str] = []
        index = 0
        while index < len(node.running) and budget > 0:
            req = node.running[index]
            at = (req.prompt_tokens, req.computed, len(req.blocks), budget, node.pool.free_blocks)
            chunk, need, _ = kernel.running_turn(self.domain, *at, eligible, cfg.page_size, req.id)
            if chunk == 0:
                self._entries.append(Entry(req.id, req.computed, req.computed, EntryKind.DEFERRED))
                index += 1
                continue
            while need > node.pool.free_blocks:
                victim = self._victim(req)
                place = node.running.index(victim)
                del node.running[place]
                index -= place < index
                taken = scheduled.pop(victim.id, 0)
                budget += taken
                self._budget += taken
                self._preempt(victim, req)
                preempted.append(victim.id)
                if victim is req:
                    break
            if req.id in preempted:
                continue
            node.take(req, req.computed + chunk, [])
            scheduled[req.id] = chunk
            self._scheduled(req, req.computed, chunk, new=False)
            budget -= chunk
            index += 1
        return preempted

    def _victim(self, requester: PagedRequest) -> PagedRequest:
        running = self.node.running
        place = kernel.preempting_victim(
            self.domain,
            [(r.prompt_tokens, r.computed, len(r.blocks)) for r in running],
            next(place for place, r in enumerate(running) if r is requester),
            self.node.config.page_size,
            [r.id for r in running],
        )
        return running[place]

    def _preempt(self, victim: PagedRequest, requester: PagedRequest) -> None:
        """vLLM's ``_preempt_request``: blocks freed, progress reset, back to the queue's head."""
        self.node.give_back(victim)
        victim.computed = 0
        victim.preemptions += 1
        self.node.waiting.insert(0, victim)
        if self.pm is not None:
            self.pm.hook.policykit_preempt(
                round_no=self.round_no, request_id=requester.id, victim_id=victim.id
            )

    # -- waiting requests --------------------------------------------------------------------
    def _schedule_waiting(self, scheduled: dict[str, int], eligible: int) -> None:
        node, cfg = self.node, self.node.config
        budget = cfg.budget - sum(scheduled.values())
        for req in self._queue():
            if budget <= 0 or (
                cfg.max_running is not None and len(node.running) >= cfg.max_running
            ):
                self._stopped(None, "OTHER")
                return
            hit = node.hit(req)
            start = len(hit) * cfg.page_size
            at = (req.prompt_tokens, len(hit), node.pool.evictable(hit), budget)
            turn = kernel.waiting_turn(
                self.domain, *at, node.pool.free_blocks, eligible, cfg.page_size, req.id
            )
            chunk = turn.chunk
            if chunk == 0:
                self._stopped(req, "OTHER")
                return
            if not turn.ok or turn.takes > node.pool.free_blocks:
                self._stopped(req, "NO_TOKEN")
                return
            node.waiting.remove(req)
            req.computed = start
            node.take(req, start + chunk, hit)
            node.running.append(req)
            scheduled[req.id] = chunk
            self._scheduled(req, start, chunk, new=True)
            budget -= chunk

    def _queue(self) -> list[PagedRequest]:
        """The waiting requests by the queue policy's priority (stable: ties keep their place),
        a queue over the policy's ``sort_limit`` in the order last given
        (:func:`policykit.kernel.queue_order`, as SGLang's planner)."""
        order, self._kept = kernel.queue_order(
            self.domain, self.combo.queue, list(self.node.waiting), self._priority, self._kept
        )
        return order

    def _priority(self, req: PagedRequest) -> int:
        page = self.node.config.page_size
        view = QueueView(
            prompt_tokens=req.prompt_tokens,
            prefix_tokens=len(self.node.hit(req)) * page,
            host_prefix_tokens=0,
            page_size=page,
        )
        return kernel.queue_rank(self.combo.queue, view, req.id)

    def _compute(self, scheduled: dict[str, int]) -> list[str]:
        """Run the step: the chunks are computed; finished prompts hold their KV."""
        node, completed = self.node, []
        by_id = {r.id: r for r in node.running}
        for rid, chunk in scheduled.items():
            req = by_id[rid]
            req.computed += chunk
            if req.computed == req.prompt_tokens:
                req.finished_round = self.round_no
                node.running.remove(req)
                node.held.append(req)
                node.finished.append(req)
                completed.append(rid)
        return completed

    def _release(self, completed: list[str]) -> list[str]:
        """Transfers done this round (:func:`policykit.kernel.kv_back` for the next round:
        finished in round ``f``, released at the end of round ``max(f, f + release_rounds -
        1)``), their blocks freed."""
        node, out = self.node, []
        for req in list(node.held):
            delay = req.release_rounds
            if delay is None or req.finished_round is None:
                continue
            if kernel.kv_back(req.finished_round, delay, self.round_no + 1):
                node.held.remove(req)
                node.give_back(req)
                out.append(req.id)
        return out
