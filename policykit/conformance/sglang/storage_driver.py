"""SGLang 0.5.23's scheduler *and* storage, round by round, from a policykit scenario.

:class:`StorageDriver` decides as :class:`~policykit.conformance.sglang.driver.UpstreamDriver`
does (upstream's ``SchedulePolicy`` and ``PrefillAdder``), but nothing it commits goes
through policykit: the adder matches, locks and loads back on SGLang's own radix tree
(:mod:`policykit.conformance.sglang.storage`), and the round is committed the way the
scheduler's ``alloc_for_extend`` commits a prefill batch (request rows, then one extend
allocation that evicts when the pool is short). The in-progress request is checkpointed into
the tree before each round (``checkpoint_kv_cache``, as ``stash_chunked_request`` does), and a
finished request's KV goes back through ``release_kv_cache`` once its transfer is due.
"""

from __future__ import annotations

import io
import logging
from array import array
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from typing import Any

import torch

from policykit.conformance.sglang.driver import UpstreamDriver, UpstreamRun, load
from policykit.conformance.sglang.storage import OWNER_FILLER, Storage
from policykit.kernel import INT_LOGIC, kv_back, kv_due
from policykit.pages import extend_pages, pages_for
from policykit.plan import Plan
from policykit.request import Request
from policykit.scenario import _ID_STRIDE, Scenario, build_node
from policykit.swa_cache import window_start


@contextmanager
def _quiet() -> Iterator[None]:
    """SGLang logs an out-of-memory and prints its whole tree; the run reports it instead."""
    logger = logging.getLogger("sglang.srt.mem_cache.allocation")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with redirect_stdout(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)


def owner_of(token: int, ids: list[str]) -> str:
    """The request (or the filler) a scenario token belongs to."""
    index = token // _ID_STRIDE
    return OWNER_FILLER if index == 0 else ids[index - 1]


class StorageDriver(UpstreamDriver):
    """Upstream's decisions on upstream's storage (see the module docstring)."""

    def __init__(self, scenario: Scenario, schedule_policy: str = "fcfs") -> None:
        self.up = self._load()
        self.scenario = scenario
        #: read for the scenario's requests (tokens, arrival) and its config, never committed to
        self.node = build_node(scenario)
        self.requests: dict[str, Request] = dict(self.node.requests)
        self.ids = [r.id for r in scenario.requests]
        self.storage = Storage(self.up, scenario, list(self.requests.values()))
        self.cache = self.storage.tree
        self.allocator = self.storage.allocator
        self.reqs = {rid: self._req(q) for rid, q in self.requests.items()}
        self.schedule = self.up["schedule_policy"].SchedulePolicy(
            schedule_policy, self.cache, False, False, False
        )
        self.waiting: list[Any] = []
        self.future = sorted(
            (q for q in self.requests.values() if not self._spec(q.id).chunked),
            key=lambda q: q.arrival_round,
        )
        self.held: list[tuple[Any, int]] = []
        self.state: dict[str, str] = {rid: "future" for rid in self.requests}
        #: device prefix each request was admitted with (what the storage view names as its)
        self.admitted_prefix: dict[str, int] = {}
        self.chunked: Any = None
        self.can_run: list[Any] = []
        for spec in scenario.requests:
            if spec.chunked:
                self._start_in_progress(self.reqs[spec.id], spec.computed_tokens)

    def _req(self, q: Request) -> Any:
        params = self.up["SamplingParams"](max_new_tokens=1)  # a PD prefill node: first token
        req = self.up["schedule_batch"].Req(q.id, "", array("q", q.tokens), params)
        req.last_node = self.cache.root_node_handle()
        return req

    @staticmethod
    def _load() -> dict[str, Any]:
        return load()

    def _spec(self, rid: str) -> Any:
        return next(s for s in self.scenario.requests if s.id == rid)

    def _start_in_progress(self, req: Any, computed: int) -> None:
        """A request in progress since before round 1, as the scheduler leaves one after a
        chunk: its matched prefix locked, its own KV in its row, ready to be checkpointed."""
        st = self.storage
        req.init_next_round_input(self.cache)
        cached = req.prefix_len
        self.admitted_prefix[req.rid] = cached
        req.lock = self.cache.lock(req.last_node)
        prefix = self.cache.prefix_device_indices(req)
        own = computed - cached
        # Its KV before the last window is out of the window: kept by the full pool only.
        swa_from = window_start(computed, st.window, st.page)
        slots = st.alloc_seq(prefix, own, swa_from)
        if st.window is not None and swa_from > cached:
            req.kv.set_evicted_seqlen(self.up["storage"]["ComponentType"].SWA, swa_from)
        (row,) = self.up["storage"]["allocation"].alloc_req_slots(st.req_to_token, [req], None)
        st.req_to_token.write((row, slice(0, cached)), prefix)
        st.req_to_token.write((row, slice(cached, computed)), slots)
        st.note(slots, self.requests[req.rid].tokens[cached:computed])
        req.kv.kv_allocated_len = req.kv.kv_committed_len = computed
        req.extend_end = computed
        self.chunked = req
        self.state[req.rid] = "chunked"

    # -- the round loop ------------------------------------------------------------------
    def run(self, max_rounds: int = 10_000, idle_rounds: int = 0) -> UpstreamRun:
        """Round by round until nothing can change any more, then ``idle_rounds`` more (a
        reproducer shows with them that nothing does), or ``max_rounds``."""
        run = UpstreamRun()
        round_no = idle = 0
        while round_no < max_rounds:
            round_no += 1
            self._release_due(round_no)
            self._arrive(round_no)
            if self.cache.cache_controller is not None:
                # acknowledge last round's load-backs (their locks go), as the scheduler
                # does first in ``get_next_batch_to_run``
                self.cache.check_hicache_events()
            if self.chunked is not None:
                self.up["storage"]["common"].checkpoint_kv_cache(self.chunked, self.cache)
            record = self.round(round_no)
            run.rounds.append(record)
            oom = self._commit(record.plan)
            if oom is not None:
                run.oom = (round_no, oom, "full")
                run.stopped_by = "oom"
                break
            self._after_forward(record.plan, round_no)
            record.storage = self.storage_view()
            never = self.scenario.config.kv_release_rounds is None
            releases_due = bool(self.held) and kv_due(INT_LOGIC, self.held[0][1], [], never)
            if record.plan.batch or self.future or releases_due:
                idle = 0
                continue
            idle += 1
            if idle > idle_rounds:
                break
        else:
            run.stopped_by = "max_rounds"
        run.completed = [rid for rid, s in self.state.items() if s in ("held", "done")]
        run.pending = [
            rid for rid, s in self.state.items() if s in ("waiting", "chunked", "future")
        ]
        return run

    def _release_due(self, round_no: int) -> None:
        delay = self.scenario.config.kv_release_rounds
        release = self.up["storage"]["common"].release_kv_cache
        while delay is not None and self.held and kv_back(self.held[0][1], delay, round_no):
            req, _ = self.held.pop(0)
            release(req, self.cache, checkpoint=True)
            self.state[req.rid] = "done"

    def _arrive(self, round_no: int) -> None:
        """Arrivals join the waiting queue in arrival order; a prompt larger than the whole
        pool is refused at the door (as policykit's node refuses it)."""
        pool_pages = self.storage.full_size() // self.storage.page
        while self.future and self.future[0].arrival_round <= round_no:
            q = self.future.pop(0)
            if pages_for(q.prompt_tokens, self.storage.page) > pool_pages:
                self.state[q.id] = "rejected"
            else:
                self.state[q.id] = "waiting"
                self.waiting.append(self.reqs[q.id])
        self.waiting = [r for r in self.waiting if self.state[r.rid] == "waiting"]

    def _after_admission(self, adder: Any) -> None:
        """The adder's locks and load-backs are the storage's own: they stay."""
        self.can_run = list(adder.can_run_list)
        self.pending_chunked = adder.new_chunked_req
        for req in self.can_run:
            if req is self.chunked:
                continue
            self.admitted_prefix[req.rid] = req.prefix_len - req.host_loaded_length
            if req.host_loaded_length:  # slots HiCache's load-back took, to name them
                slots = self.cache.prefix_device_indices(req)
                self.storage.note(slots, self.requests[req.rid].tokens[: slots.numel()])

    def _commit(self, plan: Plan) -> str | None:
        """``alloc_for_extend`` for the round's batch: request rows, then one extend
        allocation (evicting first when the pool is short). Returns the request the pool could
        not hold (the first whose running total of pages is over), or None."""
        reqs = self.can_run
        if not reqs:
            return None
        if self.cache.cache_controller is not None:
            self.cache.ready_to_load_host_cache()  # the batch's load-backs start
        st, alloc = self.storage, self.up["storage"]["allocation"]
        prefixes = [
            st.req_to_token.req_to_token[r.kv.req_pool_idx, : r.prefix_len].to(torch.int64)
            if r.kv.holds_kv
            else self.cache.prefix_device_indices(r)
            for r in reqs
        ]
        rows = alloc.alloc_req_slots(st.req_to_token, reqs, self.cache)
        prefix_lens = torch.tensor([r.prefix_len for r in reqs], dtype=torch.int64)
        seq_lens = torch.tensor([r.extend_end for r in reqs], dtype=torch.int64)
        extend = int((seq_lens - prefix_lens).sum())
        try:
            with _quiet():
                if st.page == 1:
                    out = alloc.alloc_token_slots(self.cache, extend)
                else:
                    last = [p[-1:] if len(p) else torch.full((1,), -1) for p in prefixes]
                    out = alloc.alloc_paged_token_slots_extend(
                        self.cache,
                        prefix_lens,
                        prefix_lens,
                        seq_lens,
                        seq_lens,
                        torch.cat(last),
                        extend,
                    )
        except RuntimeError:  # SGLang's "Prefill out of memory"
            return self._first_over(reqs)
        at = 0
        for req, row, prefix in zip(reqs, rows, prefixes, strict=True):
            n = req.extend_end - req.prefix_len
            st.req_to_token.write((row, slice(0, req.prefix_len)), prefix)
            st.req_to_token.write((row, slice(req.prefix_len, req.extend_end)), out[at : at + n])
            st.note(
                out[at : at + n], self.requests[req.rid].tokens[req.prefix_len : req.extend_end]
            )
            req.kv.kv_allocated_len = req.kv.kv_committed_len = req.extend_end
            at += n
        return None

    def _first_over(self, reqs: list[Any]) -> str | None:
        free = self.allocator.available_size() // self.storage.page
        total = 0
        for r in reqs:
            total += extend_pages(r.extend_end, r.prefix_len, self.storage.page)
            if total > free:
                return r.rid
        return None

    def _after_forward(self, plan: Plan, round_no: int) -> None:
        finish = self.up["schedule_batch"].FINISH_LENGTH
        for e in plan.batch:
            req = self.reqs[e.request_id]
            if e.kind.finishes:
                req.finished_reason = finish(length=1)
                self.held.append((req, round_no))
                self.state[req.rid] = "held"
                if req is self.chunked:
                    self.chunked = None
            elif self.state[req.rid] == "waiting":
                self.state[req.rid] = "chunked"
        self.waiting = [r for r in self.waiting if self.state[r.rid] == "waiting"]
        if self.pending_chunked is not None:
            self.chunked = self.pending_chunked

    # -- what the storage holds ------------------------------------------------------------
    def storage_view(self) -> dict[str, Any]:
        return storage_view_of(
            self.storage.free_tokens(),
            self.storage.evictable_tokens(),
            self.storage.cached_tokens(),
            self.ids,
            {rid: self.admitted_prefix.get(rid) for rid, s in self.state.items() if s != "done"},
        )


def storage_view_of(
    free: int, evictable: int, cached: list[int], ids: list[str], live: dict[str, int | None]
) -> dict[str, Any]:
    """The storage after a commit, as both sides can say it: free and evictable tokens, and how
    many tokens of each owner's the device cache holds. A request not yet released is counted
    up to the device prefix it was admitted with (SGLang checkpoints a chunked request's
    progress into its tree, policykit keeps it with the request; both lock it)."""
    counts: Counter[str] = Counter()
    for token in cached:
        owner = owner_of(token, ids)
        if owner in live:
            limit = live[owner]
            position = token % _ID_STRIDE
            if limit is not None and position >= limit:
                continue
        counts[owner] += 1
    return {"free": free, "evictable": evictable, "cached": dict(sorted(counts.items()))}


def drive_storage(scenario: Scenario, max_rounds: int, schedule_policy: str) -> UpstreamRun:
    """Run ``scenario`` through upstream's scheduler on upstream's storage (HiCache's host
    tier for its host prefixes, with hybrid SWA or without)."""
    return StorageDriver(scenario, schedule_policy).run(max_rounds)
