"""A minimal round driver: SGLang's real ``PrefillAdder`` plans a policykit node's rounds.

Written for the plugin's tests while the conformance driver (issue 13) was not yet on main.
Upstream's ``PrefillAdder`` and ``PrefillBudget`` are real; the request objects, the tree cache
and the allocator are small stand-ins that expose a policykit :class:`PrefillNode`'s state in
the shape ``PrefillAdder`` reads it (free pages, evictable prefix, locks, host load-backs).
:class:`UpstreamPlanner` replaces policykit's planner inside policykit's own
:class:`~policykit.scheduler.Scheduler`, so the node commits upstream's decisions to real
(torch) pools and an over-allocation surfaces as policykit's ``PrefillOutOfMemory``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from policykit.ledger import Ledger
from policykit.node import FIRST_TOKENS, PrefillNode
from policykit.plan import Entry, EntryKind, Plan, Rejection
from policykit.pool import pages_for
from policykit.request import Request


@dataclass(eq=False)
class StandInReq:
    """The fields of SGLang's ``Req`` that ``PrefillAdder`` reads on the plain path."""

    rid: str
    prompt: int
    prefix_len: int
    last_node: Any
    host_hit_length: int = 0
    extend_end: int = 0
    sampling_params: Any = field(
        default_factory=lambda: SimpleNamespace(max_new_tokens=FIRST_TOKENS, ignore_eos=False)
    )
    output_ids: list = field(default_factory=list)
    kv: Any = field(
        default_factory=lambda: SimpleNamespace(
            holds_mamba=False, req_pool_idx=None, cache_protected_len=0
        )
    )
    swa_host_hit_length: int = 0
    auxiliary_swa_host_hit_length: int = 0
    mamba_host_hit_length: int = 0
    retracted_stain: bool = False
    host_loaded_length: int = 0
    storage_hit_length: int = 0
    storage_hit_start: Any = None
    host_hit_is_storage: bool = False
    cache_request_handle: Any = None
    token_indices_to_pool: Any = None
    lock: Any = None

    @property
    def full_untruncated_fill_ids(self) -> range:
        return range(self.prompt)

    @property
    def extend_len(self) -> int:
        return self.extend_end - self.prefix_len

    @property
    def best_match_node(self) -> Any:
        return self.last_node

    def needs_host_load_back(self) -> bool:
        return self.host_hit_length > 0

    def materialized_host_hit_len(self) -> int:
        return self.host_loaded_length

    def fulfilled_storage_hit_len(self, prefix_len: int) -> int:
        return 0


class NodeTreeCache:
    """The node's prefix cache, as SGLang's tree-cache interface: locks take a path's unlocked
    pages out of the evictable total until released; load-backs allocate on the device."""

    disable = False
    buffer_pipeline = None
    linker = None

    def __init__(self, node: PrefillNode, allocator: NodeAllocator) -> None:
        self.node = node
        self.allocator = allocator
        self.locked: dict[int, int] = {}  # node id -> tokens it takes out of evictable

    def supports_mamba(self) -> bool:
        return False

    def supports_prefix_sharing(self) -> bool:
        return True

    def evictable_size(self) -> int:
        return self.node.cache.evictable_tokens - sum(self.locked.values())

    def lock(self, last_node: Any) -> list[int]:
        newly = [n for n in self.node.cache.unlocked_on_path(last_node) if n.id not in self.locked]
        for n in newly:
            self.locked[n.id] = len(n)
        return [n.id for n in newly]

    def unlock(self, handle: list[int]) -> None:
        for node_id in handle:
            self.locked.pop(node_id, None)

    def init_load_back(self, params: Any) -> tuple[int, Any]:
        tokens = params.host_hit_length
        self.allocator.loaded += pages_for(tokens, self.node.config.page_size) * (
            self.node.config.page_size
        )
        return tokens, params.best_match_node

    def load_back_is_cache_owned(self) -> bool:
        return False

    def discard_storage_prefetch_accounting(self, handle: Any) -> None: ...

    def finish_storage_prefetch_admission(self, handle: Any, **kwargs: Any) -> None: ...


class NodeAllocator:
    """Free pages of the node's pool, less what this round's load-backs took."""

    def __init__(self, node: PrefillNode) -> None:
        self.node = node
        self.page_size = node.config.page_size
        self.loaded = 0

    def available_size(self) -> int:
        return self.node.pool.free_tokens - self.loaded

    def create_prefill_budget(self, tree_cache: Any, *, num_mixed_decode_tokens: int = 0) -> Any:
        from sglang.srt.mem_cache.prefill_budget import PrefillBudget

        return PrefillBudget(self, tree_cache, num_mixed_decode_tokens=num_mixed_decode_tokens)

    def request_slot_reserve(self, *, has_req_pool_slot: bool, prefill_tokens: int = 0) -> int:
        return 0


class UpstreamPlanner:
    """Plans a round by running SGLang's ``get_new_batch_prefill`` admission loop (the part
    that drives ``PrefillAdder``) over the node's state; returns policykit's :class:`Plan`."""

    def __init__(self, node: PrefillNode, truncation_align_size: int | None = None) -> None:
        self.node = node
        self.truncation_align_size = truncation_align_size
        self.chunked: StandInReq | None = None

    def open_ledger(self) -> Ledger:
        cfg = self.node.config
        return Ledger(
            page_size=cfg.page_size,
            baseline=self.node.baseline,
            rem_chunk_tokens=cfg.chunked_prefill_size,
            rem_input_tokens=cfg.max_prefill_tokens,
        )

    def plan(self, round_no: int, ledger: Ledger | None = None) -> Plan:
        from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder

        node, cfg = self.node, self.node.config
        allocator = NodeAllocator(node)
        cache = NodeTreeCache(node, allocator)
        max_prefill = cfg.max_prefill_tokens or 1 << 40
        adder = PrefillAdder(
            cfg.page_size, cache, allocator, None, 1.0, max_prefill, cfg.chunked_prefill_size
        )
        entries: list[Entry] = []
        rejected: list[Rejection] = []
        stop: str | None = None
        in_progress: StandInReq | None = None
        if node.chunked is not None:
            req = node.chunked
            sreq = StandInReq(req.id, req.prompt_tokens, req.seq_len, node.cache.root)
            sreq.extend_end = sreq.prefix_len
            in_progress = adder.add_chunked_req(sreq)
            entries.append(self._resumed(sreq, adder))
        by_id: dict[str, StandInReq] = {}
        for req in node.waiting:
            if adder.budget_state() == AddReqResult.OTHER:
                stop = AddReqResult.OTHER.name
                break
            sreq = self._stand_in(req)
            by_id[req.id] = sreq
            res = adder.add_one_req(
                sreq,
                has_chunked_req=in_progress is not None,
                truncation_align_size=self.truncation_align_size,
            )
            if adder.can_run_list and adder.can_run_list[-1] is sreq:
                entries.append(self._new(req, sreq))
            else:
                rejected.append(Rejection(req.id, res.name))
            if res != AddReqResult.CONTINUE:
                stop = res.name
                break
        return Plan(
            round=round_no,
            entries=tuple(entries),
            rejected=tuple(rejected),
            stop=stop,
            baseline=node.baseline,
        )

    def _stand_in(self, req: Request) -> StandInReq:
        cached, last, _ = self.node.cache.match(req.tokens)
        host = self.node.host.lookup(req.tokens, cached)
        sreq = StandInReq(req.id, req.prompt_tokens, cached, last)
        sreq.host_hit_length = 0 if host is None else host.end - cached
        sreq.extend_end = cached
        return sreq

    @staticmethod
    def _resumed(sreq: StandInReq, adder: Any) -> Entry:
        if sreq not in adder.can_run_list:
            return Entry(sreq.rid, sreq.prefix_len, sreq.prefix_len, EntryKind.DEFERRED)
        kind = EntryKind.FINAL if sreq.extend_end == sreq.prompt else EntryKind.RESUMED
        return Entry(sreq.rid, sreq.prefix_len, sreq.extend_end, kind)

    @staticmethod
    def _new(req: Request, sreq: StandInReq) -> Entry:
        kind = EntryKind.WHOLE if sreq.extend_end == sreq.prompt else EntryKind.TRUNCATED
        cached = sreq.prefix_len - sreq.host_loaded_length
        return Entry(
            req.id, sreq.prefix_len, sreq.extend_end, kind, cached, sreq.host_loaded_length
        )


def random_scenario(rng: Any, index: int) -> dict[str, Any]:
    """A random single-pool scenario (JSON form): pool size, chunk size and a few requests with
    device prefixes, host prefixes and staggered arrivals; host hits are page-aligned, as
    SGLang's host tier stores whole pages."""
    page = rng.choice((1, 16, 64))
    chunk = page * rng.randint(4, 64)
    free = page * rng.randint(8, 400)
    requests = []
    for i in range(rng.randint(1, 6)):
        prompt = rng.randint(1, 3 * chunk)
        device = page * rng.randint(0, prompt // page) if rng.random() < 0.3 else 0
        host = 0
        if rng.random() < 0.25:
            host = page * rng.randint(0, max(0, (prompt - device) // page))
        if device + host >= prompt:
            device = host = 0
        requests.append(
            {
                "id": f"r{i}",
                "prompt_tokens": prompt,
                "device_prefix_tokens": device,
                "host_prefix_tokens": host,
                "arrival_round": rng.randint(0, 3),
            }
        )
    return {
        "name": f"random-{index}",
        "page_size": page,
        "chunked_prefill_size": chunk,
        "pool": {"free_tokens": free, "evictable_tokens": page * rng.randint(0, 20)},
        "kv_release_rounds": rng.choice((None, 1, 2)),
        "requests": requests,
    }


DECISION_METHODS = ("_select_prefill_admission", "_commit_prefill_admission", "add_chunked_req")


@contextmanager
def plugin_active(combo: Any) -> Iterator[None]:
    """The plugin's decision hooks applied to the real ``PrefillAdder`` through SGLang's
    ``HookRegistry``, asking ``combo``; upstream's methods are restored afterwards."""
    from sglang.srt.managers.schedule_policy import PrefillAdder
    from sglang.srt.plugins.hook_registry import HookRegistry

    from policykit.integrations.sglang import hooks, plugin

    saved = {name: PrefillAdder.__dict__[name] for name in DECISION_METHODS}
    HookRegistry.reset()
    plugin.register_decision_hooks()
    HookRegistry.apply_hooks()
    hooks.activate(combo)
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(PrefillAdder, name, method)
        HookRegistry.reset()
        hooks.activate(None)


@contextmanager
def published_config() -> Iterator[None]:
    """SGLang's default server configuration, published the way its own unit tests do (the
    adder reads the schedule and exec namespaces), restored afterwards."""
    from sglang.srt.runtime_context import _CONTEXT

    with _CONTEXT.override_server_args():
        yield
