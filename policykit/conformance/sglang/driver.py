"""Drive SGLang 0.5.23's real prefill scheduler from a policykit scenario.

The decisions are upstream's own code: ``Req``, ``PrefillAdder`` (``add_chunked_req``,
``add_one_req``, ``budget_state``) and the prefill budgets (``PrefillBudget``,
``SWAPrefillBudget``), called round by round in the order of
``Scheduler._get_new_batch_prefill_raw``: the waiting queue sorted by upstream's
``SchedulePolicy.calc_priority`` (``fcfs`` unless told otherwise), the in-progress chunked
request, then the waiting queue in that order until the adder says stop.

Storage: conformance runs
:class:`~policykit.conformance.sglang.storage_driver.StorageDriver`, SGLang's own radix tree
(with its SWA component under hybrid SWA), allocators and allocation path
(docs/conformance.md says which classes run and which are stand-ins). :class:`UpstreamDriver`
itself, kept for the benchmarks of upstream's decisions, answers storage questions from a
policykit :class:`~policykit.node.PrefillNode` (:class:`CountingAllocator` and
:class:`CountingPrefixCache` are thin subclasses of upstream's base classes whose counts are
read from the node), on plain pools only.
"""

from __future__ import annotations

import contextlib
import warnings
from array import array
from dataclasses import dataclass, field
from typing import Any

from policykit import engines
from policykit.conformance.sglang import broken_import, gpu_stubs, storage
from policykit.errors import PolicykitError, PrefillOutOfMemory
from policykit.host_tier import LOAD_BACK_THRESHOLD
from policykit.node import PrefillNode
from policykit.plan import Entry, EntryKind, LedgerMark, Plan, Rejection
from policykit.request import Request, State
from policykit.scenario import Scenario, build_node

INSTALL_HINT = (
    f"install it with: {engines.written_against('sglang').install} (SGLang's own dependencies "
    "are GPU builds; the extra installs only the small pure-Python ones its scheduler modules "
    "import)"
)


class UpstreamUnavailable(PolicykitError):
    """SGLang is not installed, or not the version this driver speaks to, or the extra's
    packages are missing (tests skip on it)."""


class UpstreamBroken(PolicykitError):
    """SGLang is installed at the supported version with its packages, but its scheduler
    modules fail to import: a broken install, which tests fail on instead of skipping."""


@dataclass
class UpstreamRound:
    """One round as upstream decided it, in the shape of policykit's round records."""

    plan: Plan
    #: every ``AddReqResult`` upstream returned this round, in call order: (request, verdict)
    verdicts: list[tuple[str, str]] = field(default_factory=list)
    #: the storage after the round's commit (:func:`storage_view`), when it was SGLang's own
    storage: dict[str, Any] | None = None


@dataclass
class UpstreamRun:
    rounds: list[UpstreamRound] = field(default_factory=list)
    #: (round, request, pool) of the out-of-memory that ended the run, if one did
    oom: tuple[int, str | None, str] | None = None
    completed: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    stopped_by: str = "idle"


# --- loading upstream --------------------------------------------------------------------------
_UPSTREAM: dict[str, Any] = {}


def load() -> dict[str, Any]:
    """Import SGLang's scheduler modules (GPU-only imports stubbed), once per process.

    Raises :class:`UpstreamUnavailable` with an install hint when SGLang is missing or another
    version, :class:`UpstreamBroken` naming the packages involved when its import fails
    otherwise. Publishes SGLang's default server configuration (its own test fixture for that,
    ``override_server_args``), which its scheduler reads for flags such as the schedule policy.
    """
    if _UPSTREAM:
        return _UPSTREAM
    found = _installed_version()
    _import_real_xgrammar()
    gpu_stubs.install()
    try:
        modules = _import_scheduler()
    except ImportError as exc:
        raise UpstreamUnavailable(
            f"SGLang {found} is installed but its scheduler does not import ({exc}); "
            f"{INSTALL_HINT}."
        ) from None
    except Exception as exc:  # SGLang's import runs code too (its patches of transformers)
        raise UpstreamBroken(broken_import.describe(found, exc, INSTALL_HINT)) from None
    get_context = modules.pop("get_context")
    context = get_context()
    if not context.is_config_namespace_published("schedule"):
        context.override_server_args().install()
    _UPSTREAM.update(modules)
    _UPSTREAM.update(_storage_classes(_UPSTREAM))
    _UPSTREAM["storage"] = storage.storage_classes(_UPSTREAM)
    return _UPSTREAM


def _installed_version() -> str:
    """SGLang's installed version; :class:`UpstreamUnavailable` unless it is a listed one
    (:data:`policykit.engines.RELEASES`) or ``POLICYKIT_ASSUME_SGLANG`` names one."""
    return release().installed


def release() -> engines.Resolved:
    """The installed SGLang's entry in :data:`policykit.engines.RELEASES` (or the one
    ``POLICYKIT_ASSUME_SGLANG`` names); :class:`UpstreamUnavailable` when there is none."""
    found = engines.installed_version("sglang")
    if found is None:
        raise UpstreamUnavailable(f"SGLang is not installed; {INSTALL_HINT}.")
    try:
        return engines.resolve("sglang", found)
    except engines.UnsupportedVersion as exc:
        raise UpstreamUnavailable(f"{exc} This driver: {INSTALL_HINT}.") from None


def _import_scheduler() -> dict[str, Any]:
    """The SGLang modules and names the drivers use, imported (their import-time warnings,
    about the GPU packages stubbed, silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sglang.srt.managers import schedule_batch, schedule_policy
        from sglang.srt.mem_cache import base_prefix_cache
        from sglang.srt.mem_cache.allocator import base as allocator_base
        from sglang.srt.mem_cache.allocator import swa as allocator_swa
        from sglang.srt.runtime_context import get_context
        from sglang.srt.sampling.sampling_params import SamplingParams
    return {
        "schedule_batch": schedule_batch,
        "schedule_policy": schedule_policy,
        "base_prefix_cache": base_prefix_cache,
        "allocator_base": allocator_base,
        "allocator_swa": allocator_swa,
        "SamplingParams": SamplingParams,
        "get_context": get_context,
    }


def _import_real_xgrammar() -> None:
    """Import xgrammar, when installed (the vllm extra brings it), before the stubs go in.

    SGLang's parsers import it (and tolerate its absence), and it needs the real ``tvm_ffi``,
    which the stubs answer for SGLang's kernels: imported after them, it fails with an
    AttributeError instead of an ImportError. Imported first, it keeps the real one.
    """
    with contextlib.suppress(ImportError):
        import xgrammar  # noqa: F401


def _storage_classes(up: dict[str, Any]) -> dict[str, type]:
    """Subclasses of upstream's storage base classes, counting on a policykit node."""
    return {**_counting_allocators(up), "CountingPrefixCache": _counting_prefix_cache(up)}


def _counting_allocators(up: dict[str, Any]) -> dict[str, type]:
    """Upstream's allocator interfaces over a policykit node's pools (counts only)."""

    #: upstream's class, imported at run time (SGLang has no types)
    base: Any = up["allocator_base"].BaseTokenToKVPoolAllocator

    class CountingAllocator(base):
        """The full KV pool as a free-token count (``PrefillBudget`` reads nothing else)."""

        def __init__(self, node: PrefillNode) -> None:
            self.node = node
            self.size = node.pool.total_tokens
            self.page_size = node.config.page_size
            self.free_group = None

        #: tokens a host load-back took at admission that the node allocates when it commits
        pending_load = 0

        def available_size(self) -> int:
            return self.node.pool.free_tokens - self.pending_load

        def clear(self) -> None:
            raise NotImplementedError("storage is the policykit node's")

        def alloc(self, need_size: int) -> Any:
            raise NotImplementedError("the policykit node allocates the committed batch")

        def free(self, free_index: Any) -> None:
            raise NotImplementedError("the policykit node frees")

    return {"CountingAllocator": CountingAllocator}


def _counted_load_back(cache: Any, tokens: int) -> int:
    """HiCache's load-back on a policykit node, in tokens loaded: a hit under its threshold is
    recomputed (0); else device memory is taken now, evicting cached prefixes if the free pool
    is short."""
    allocator = cache.token_to_kv_pool_allocator
    if tokens < LOAD_BACK_THRESHOLD:
        return 0
    short = tokens - allocator.available_size()
    if short > 0:
        cache.node.cache.evict(short)
        if allocator.available_size() < tokens:
            return 0
    allocator.pending_load += tokens
    return tokens


def _counting_prefix_cache(up: dict[str, Any]) -> type:
    """Upstream's prefix-cache interface over a policykit node's cache and host tier."""
    bpc = up["base_prefix_cache"]

    base: Any = bpc.BasePrefixCache  # upstream's class, imported at run time

    class CountingPrefixCache(base):
        """The policykit node's prefix cache behind upstream's prefix-cache interface."""

        #: prefix caching is on (upstream's schedule policies turn cache-aware orders off
        #: for a cache without this)
        disable = False

        def __init__(self, node: PrefillNode, allocator: Any, window: int | None) -> None:
            self.node = node
            self.token_to_kv_pool_allocator = allocator
            self.root_node = node.cache.root
            self.sliding_window_size = window
            self.page_size = node.config.page_size

        def supports_mamba(self) -> bool:
            return False

        def supports_prefix_sharing(self) -> bool:
            return True

        def reset(self) -> None:
            raise NotImplementedError

        def match_prefix(self, params: Any) -> Any:
            req = self.node.requests[params.req.rid]
            matched, last, _ = self.node.cache.match(req.tokens)
            host = self.node.host.lookup(req.tokens, matched)
            page = self.node.config.page_size
            # The host tier is a radix tree of whole pages, like the device one.
            hit = 0 if host is None else (host.end - matched) // page * page
            return bpc.MatchResult(matched, last, last, last, host_hit_length=hit)

        def touch_prefix(self, key: Any) -> None:
            """Upstream's refresh of waiting prefixes (``_touch_waiting_prefixes``), on the
            node's cache: a match touches what it passes."""
            self.node.cache.match(tuple(key.raw_token_ids()))

        def init_load_back(self, params: Any) -> Any:
            return (_counted_load_back(self, params.host_hit_length), params.req.last_node)

        def checkpoint(self, req: Any, *, up_to: int, **kwargs: Any) -> None:
            raise NotImplementedError("the policykit node keeps in-progress KV")

        def evict(self, params: Any) -> Any:
            raise NotImplementedError("the policykit node evicts at commit")

        def inc_lock_ref(self, node: Any) -> Any:
            self.node.cache.lock(node)
            return bpc.IncLockRefResult()

        def dec_lock_ref(self, node: Any, params: Any = None) -> Any:
            self.node.cache.unlock(node)
            return bpc.DecLockRefResult()

        def evictable_size(self) -> int:
            return self.node.cache.evictable_tokens

        def full_evictable_size(self) -> int:
            return self.node.cache.evictable_tokens

    return CountingPrefixCache


# --- the scenario's side -----------------------------------------------------------------------
@dataclass
class _Admissions:
    """What one round admitted so far, in the shape of a policykit plan."""

    entries: list[Entry] = field(default_factory=list)
    marks: list[LedgerMark] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    #: every ``AddReqResult`` upstream returned, in call order: (request, verdict)
    verdicts: list[tuple[str, str]] = field(default_factory=list)

    def mark(self, adder: Any, rid: str) -> None:
        """The ledger right after ``rid`` was placed."""
        self.marks.append(
            LedgerMark(
                rid,
                int(adder.rem_total_tokens),
                int(adder.cur_rem_tokens),
                int(adder.rem_chunk_tokens),
            )
        )


class UpstreamDriver:
    """Runs one scenario through upstream's scheduler, round by round.

    ``schedule_policy`` is SGLang's ``--schedule-policy`` (``fcfs``, ``lpm``, ...): upstream's
    ``SchedulePolicy`` sorts the waiting queue with it every round, as the scheduler does.
    """

    def __init__(self, scenario: Scenario, schedule_policy: str = "fcfs") -> None:
        self.up = load()
        self.scenario = scenario
        if scenario.config.sliding_window is not None:
            raise ValueError(
                "UpstreamDriver runs plain pools only; a hybrid-SWA scenario runs on SGLang's "
                "own SWA storage (storage_driver.StorageDriver)."
            )
        self.node = build_node(scenario)
        node = self.node
        self.allocator = self.up["CountingAllocator"](node)
        self.cache = self.up["CountingPrefixCache"](node, self.allocator, None)
        self.reqs: dict[str, Any] = {rid: self._req(q) for rid, q in node.requests.items()}
        self.schedule = self.up["schedule_policy"].SchedulePolicy(
            schedule_policy, self.cache, False, False, False
        )
        #: upstream's waiting queue: arrived requests, appended as they arrive, sorted in place
        self.waiting: list[Any] = []
        self.chunked: Any = None
        if node.chunked is not None:
            # In progress since before round 1: its computed tokens are its prefix now.
            self.chunked = self.reqs[node.chunked.id]
            self.chunked.prefix_len = node.chunked.seq_len
            self.chunked.last_node = node.chunked.prefix_node

    def _req(self, q: Request) -> Any:
        params = self.up["SamplingParams"](max_new_tokens=1)  # a PD prefill node: first token
        req = self.up["schedule_batch"].Req(q.id, "", array("q", q.tokens), params)
        req.last_node = self.cache.root_node
        return req

    def run(self, max_rounds: int = 10_000) -> UpstreamRun:
        run, node = UpstreamRun(), self.node
        round_no = 0
        while round_no < max_rounds:
            round_no += 1
            node.release_due(round_no)
            node.arrive(round_no)
            self.enqueue()
            record = self.round(round_no)
            run.rounds.append(record)
            try:
                node.commit(record.plan)
            except PrefillOutOfMemory as err:
                run.oom = (round_no, err.request, err.pool)
                run.stopped_by = "oom"
                break
            self._advance(record.plan)
            if not record.plan.batch and not node.future and not node.pending_releases():
                break
        else:
            run.stopped_by = "max_rounds"
        finals = (State.HELD, State.DONE)
        run.completed = [q.id for q in node.requests.values() if q.state in finals]
        waiting = (State.WAITING, State.CHUNKED, State.FUTURE)
        run.pending = [q.id for q in node.requests.values() if q.state in waiting]
        return run

    def round(self, round_no: int) -> UpstreamRound:
        """Upstream's ``_get_new_batch_prefill_raw`` for one round (nothing running)."""
        # upstream sorts (hooks included) before it builds the round's adder
        self.schedule.calc_priority(self.waiting)
        adder = self._adder()
        baseline = int(adder.rem_total_tokens)
        out = _Admissions()
        if self.chunked is not None:
            self._add_chunked(adder, out)
        stop = self._add_waiting(adder, out)
        self._after_admission(adder)
        plan = Plan(
            round=round_no,
            entries=tuple(out.entries),
            rejected=tuple(out.rejected),
            marks=tuple(out.marks),
            stop=stop,
            baseline=baseline,
        )
        return UpstreamRound(plan, out.verdicts)

    def _adder(self) -> Any:
        """The round's ``PrefillAdder``, as the scheduler builds it on a prefill node."""
        cfg = self.node.config
        return self.up["schedule_policy"].PrefillAdder(
            cfg.page_size,
            self.cache,
            self.allocator,
            None,  # a prefill node decodes nothing: no running batch
            1.0,
            cfg.max_prefill_tokens if cfg.max_prefill_tokens is not None else 1 << 62,
            cfg.chunked_prefill_size,
        )

    def _add_chunked(self, adder: Any, out: _Admissions) -> None:
        """The in-progress request's next chunk (``add_chunked_req``), or its deferral."""
        req = self.chunked
        start = req.prefix_len
        req.init_next_round_input()
        left = adder.add_chunked_req(req)
        if any(r is req for r in adder.can_run_list):
            kind = EntryKind.RESUMED if left is not None else EntryKind.FINAL
            out.entries.append(Entry(req.rid, start, req.extend_end, kind))
            out.mark(adder, req.rid)
        else:
            out.entries.append(Entry(req.rid, start, start, EntryKind.DEFERRED))

    def _add_waiting(self, adder: Any, out: _Admissions) -> str | None:
        """The waiting queue in its sorted order until the adder says stop (``add_one_req``);
        returns the verdict that stopped admission, if one did."""
        AddReqResult = self.up["schedule_policy"].AddReqResult
        queue = self.waiting
        for at, req in enumerate(queue):
            if adder.budget_state() == AddReqResult.OTHER:
                return "OTHER"
            state_before = adder.budget_state()
            req.init_next_round_input(self.cache)
            res = adder.add_one_req(
                req, has_chunked_req=self.chunked is not None, truncation_align_size=None
            )
            out.verdicts.append((req.rid, res.name))
            admitted = bool(adder.can_run_list) and adder.can_run_list[-1] is req
            if admitted:
                kind = EntryKind.TRUNCATED if adder.new_chunked_req is req else EntryKind.WHOLE
                loaded = req.host_loaded_length
                cached = req.prefix_len - loaded
                out.entries.append(
                    Entry(req.rid, req.prefix_len, req.extend_end, kind, cached, loaded)
                )
                out.mark(adder, req.rid)
            elif state_before == AddReqResult.CONTINUE:
                # Refused on its own merits (not because the budget was already spent).
                out.rejected.append(Rejection(req.rid, res.name))
            if res != AddReqResult.CONTINUE:
                # An admitted request's verdict only stops someone if someone is left.
                return res.name if not admitted or at + 1 < len(queue) else None
        return None

    def _after_admission(self, adder: Any) -> None:
        # The adder's locks were accounting; the node takes the real ones when it commits.
        for req in adder.can_run_list:
            if getattr(req, "lock", None) is not None and req is not self.chunked:
                self.cache.unlock(req.lock)
                req.lock = None
        self.pending_chunked = adder.new_chunked_req
        # the node allocates the load-backs when it commits
        self.allocator.pending_load = 0

    def enqueue(self) -> None:
        """Bring upstream's waiting queue up to date with the node's: what has left it (admitted,
        rejected, failed) dropped, new arrivals appended in arrival order, as the scheduler's
        queue is. Called before each round, after the round's arrivals."""
        waiting = [q.id for q in self.node.waiting]
        present = set(waiting)
        self.waiting = [req for req in self.waiting if req.rid in present]
        queued = {req.rid for req in self.waiting}
        self.waiting += [self.reqs[rid] for rid in waiting if rid not in queued]

    def _advance(self, plan: Plan) -> None:
        """After a committed round: the computed tokens become the requests' prefixes (what
        upstream's ``checkpoint_kv_cache`` does), and the new chunked request takes over."""
        finished_chunk = False
        for e in plan.batch:
            req = self.reqs[e.request_id]
            req.prefix_len = e.end
            if req is self.chunked and e.kind.finishes:
                finished_chunk = True
        if finished_chunk:
            self.chunked = None
        if self.pending_chunked is not None:
            if self.chunked is not None:
                raise PolicykitError(
                    f"upstream admitted a second chunked request ({self.pending_chunked.rid!r}) "
                    f"while {self.chunked.rid!r} is in progress; its scheduler asserts against "
                    "this"
                )
            self.chunked = self.pending_chunked
            self.chunked.last_node = self.node.requests[self.chunked.rid].prefix_node
