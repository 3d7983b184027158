"""SGLang 0.5.23's own storage, built on a CPU from a policykit scenario.

What runs for real: the radix tree SGLang 0.5.23 builds by default (``UnifiedRadixCache`` with
its compiled tree core, the ``FULL`` component: prefix match, ``lock``/``unlock``, LRU eviction,
``checkpoint``, ``insert``; with hybrid SWA also the ``SWA`` component), the KV allocators
(``TokenToKVPoolAllocator`` for one-token pages, ``PagedTokenToKVPoolAllocator`` with its torch
``alloc_extend`` path otherwise, and with hybrid SWA ``SWATokenToKVPoolAllocator`` over a real
``SWAKVPool`` of one tiny head per layer), the ``ReqToTokenPool`` rows, and the scheduler's
allocation path around them (``alloc_req_slots``, ``alloc_token_slots`` /
``alloc_paged_token_slots_extend``, which evict when a pool is short, ``checkpoint_kv_cache``,
``release_kv_cache``).

What is a stand-in, and why (docs/conformance.md lists the same):

* **HiCache's copies.** Scenarios with host prefixes run SGLang's own host tier
  (:mod:`policykit.conformance.sglang.hicache`: ``init_hicache``, the real controller and host
  pools, with hybrid SWA a sliding-window host pool and the SWA component's window backups),
  with the device/host copies and the pinning of host memory left out.
* **Host runs with hybrid SWA.** A host run is laid out as its request would have left it
  backed up: with all of its sliding-window KV where that fits the sliding-window pool, else
  with only its last window (:func:`~policykit.swa_cache.window_start`, the rest freed as the
  request ran). One whose last window alone does not fit is not expressible (the scenario
  says so rather than run).
* **The hybrid-SWA layout.** A cached device prefix keeps sliding-window KV for its last
  window only, the filler none (:func:`~policykit.swa_cache.window_start`), and the
  sliding-window pool is sized so that what is left free is the scenario's
  ``swa_free_tokens`` (:func:`~policykit.scenario.swa_pool_tokens`), as policykit's node does.
* **Recency.** The tree core keeps its own access counter, so no wall clock is involved.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

import torch

from policykit.conformance.sglang import hicache
from policykit.pages import pages_for
from policykit.request import Request
from policykit.scenario import Scenario, pool_tokens, swa_pool_tokens
from policykit.swa_cache import window_start

#: a request's tokens are ``(i + 1) * stride + position`` (see ``policykit.scenario``); the
#: filler's are below the first stride
OWNER_FILLER = "(filler)"


_NO_SLOTS = torch.empty((0,), dtype=torch.int64)


def host_runs(scenario: Scenario) -> list[tuple[int, int, int]]:
    """The host runs SGLang's host tier holds: ``(request index, device prefix, host run)``
    for each request with a host run of at least one whole page (HiCache's nodes are whole
    pages), leaving out prompts larger than the pool (refused at the door, never matched)."""
    page, pool_pages = scenario.config.page_size, pool_tokens(scenario) // scenario.config.page_size
    runs = []
    for i, spec in enumerate(scenario.requests):
        host = spec.host_prefix_tokens // page * page
        if host and -(-spec.prompt_tokens // page) <= pool_pages:
            runs.append((i, spec.device_prefix_tokens, host))
    return runs


class NotExpressible(Exception):
    """The scenario cannot be laid out on SGLang's own storage (the message says why)."""


def storage_classes(up: dict[str, Any]) -> dict[str, Any]:
    """The real storage classes, and the host-tier stand-in subclassing the real tree."""
    from sglang.srt.mem_cache import allocation, common
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import (
        EvictParams,
        InsertParams,
        MatchPrefixParams,
    )
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    class QuietRadixCache(UnifiedRadixCache):
        """The real tree (with HiCache's host tier attached when a scenario has host
        prefixes), silent on an out-of-memory."""

        def pretty_print(self) -> None:
            """SGLang dumps the whole tree on an out-of-memory (from the compiled core, past
            ``sys.stdout``); the conformance run reports the out-of-memory instead."""

    return {
        "allocation": allocation,
        "common": common,
        "EvictParams": EvictParams,
        "InsertParams": InsertParams,
        "MatchPrefixParams": MatchPrefixParams,
        "RadixKey": RadixKey,
        "TokenToKVPoolAllocator": TokenToKVPoolAllocator,
        "PagedTokenToKVPoolAllocator": PagedTokenToKVPoolAllocator,
        "SWATokenToKVPoolAllocator": SWATokenToKVPoolAllocator,
        "SWAKVPool": SWAKVPool,
        "ReqToTokenPool": ReqToTokenPool,
        "CacheInitParams": CacheInitParams,
        "ComponentType": ComponentType,
        "QuietRadixCache": QuietRadixCache,
    }


def _refuse_unfit_host_runs(scenario: Scenario, runs: list[tuple[int, int, int]]) -> None:
    """HiCache backs up what was on the device: at least the last window of a host run (with
    its prefix, whole pages) must have fit the sliding-window pool for its window backups to
    exist (:func:`~policykit.conformance.sglang.hicache.lay_out_host_run`). Raises
    :class:`NotExpressible`."""
    cfg = scenario.config
    page, swa_pool = cfg.page_size, swa_pool_tokens(scenario)
    for i, device, host in runs:
        live = device + host - window_start(device + host, cfg.sliding_window, page)
        if pages_for(live, page) * page > swa_pool:
            raise NotExpressible(
                f"the last window of request {scenario.requests[i].id}'s host run (with its "
                f"device prefix, {live} tokens in whole pages) is more than the sliding-window "
                f"pool ({swa_pool} tokens): SGLang's HiCache could not have backed its "
                "sliding-window KV up"
            )


class Storage:
    """One scenario's pool, tree and request rows in SGLang's own classes, laid out as
    :func:`policykit.scenario.build_node` lays out policykit's node (device prefixes in
    listing order, pinned ones locked for good, then the anonymous filler)."""

    def __init__(
        self,
        up: dict[str, Any],
        scenario: Scenario,
        requests: list[Request],
    ) -> None:
        s = up["storage"]
        self.s = s
        page = scenario.config.page_size
        self.page = page
        self.window = scenario.config.sliding_window
        #: the sliding-window pool's slots (hybrid SWA)
        self.swa_pool_total = swa_pool_tokens(scenario) if self.window is not None else 0
        #: (request index, device prefix, host run in whole pages) laid out on SGLang's host tier
        self.host_runs = host_runs(scenario)
        if self.window is not None:
            _refuse_unfit_host_runs(scenario, self.host_runs)
        self.allocator = self._allocator(scenario)
        longest = max((r.prompt_tokens for r in requests), default=1)
        self.req_to_token = s["ReqToTokenPool"](len(requests) + 1, longest + page, "cpu", False)
        components: tuple[Any, ...] = (s["ComponentType"].FULL,)
        if self.window is not None:
            components += (s["ComponentType"].SWA,)
        params = s["CacheInitParams"](
            disable=False,
            req_to_token_pool=self.req_to_token,
            token_to_kv_pool_allocator=self.allocator,
            page_size=page,
            sliding_window_size=self.window,
            tree_components=components,
        )
        self.tree = s["QuietRadixCache"](params)
        #: slot -> token whose KV it holds (to name what the tree holds and what it evicted)
        self.token_of: dict[int, int] = {}
        if self.host_runs:
            needed = hicache.host_tokens_needed([(d, h) for _, d, h in self.host_runs])
            mirrored = pool_tokens(scenario)
            if self.window is not None:
                mirrored = min(mirrored, swa_pool_tokens(scenario))
            hicache.attach(self.tree, params, needed, mirrored)
            for i, device, host in self.host_runs:
                hicache.lay_out_host_run(self, requests[i].tokens, device, host)
        self._lay_out(scenario, requests)

    def _allocator(self, scenario: Scenario) -> Any:
        """The KV allocator SGLang builds for the scenario's pool: plain or paged, and with
        hybrid SWA the two-pool ``SWATokenToKVPoolAllocator`` over a real ``SWAKVPool``
        (one head of one dimension per layer: the scheduler reads slot counts only)."""
        s, page, total = self.s, scenario.config.page_size, pool_tokens(scenario)
        if self.window is None:
            kv = hicache.device_kv_pool(total, page) if self.host_runs else None
            if page == 1:
                return s["TokenToKVPoolAllocator"](total, torch.int64, "cpu", kv, False)
            allocator = s["PagedTokenToKVPoolAllocator"](total, page, torch.int64, "cpu", kv, False)
            allocator.use_triton_kernels = False  # its torch path: no GPU kernel
            return allocator
        swa_total = swa_pool_tokens(scenario)  # as policykit's node sizes it
        kv = s["SWAKVPool"](
            size=total,
            size_swa=swa_total,
            page_size=page,
            dtype=torch.bfloat16,
            head_num=1,
            head_dim=1,
            swa_attention_layer_ids=[0],
            full_attention_layer_ids=[1],
            device="cpu",
        )
        allocator = s["SWATokenToKVPoolAllocator"](
            total, swa_total, page, torch.int64, "cpu", kv, False
        )
        if page > 1:
            allocator.full_attn_allocator.use_triton_kernels = False
            allocator.swa_attn_allocator.use_triton_kernels = False
        return allocator

    def alloc_seq(self, prefix: torch.Tensor, tokens: int, swa_from: int = 0) -> torch.Tensor:
        """Slots for ``tokens`` more tokens of a sequence whose slots so far are ``prefix``,
        paired with sliding-window slots only from position ``swa_from`` on (the KV before it
        is out of the window: freed, or never kept). The layout is sized to fit."""
        done = int(prefix.numel())
        head = max(0, min(swa_from, done + tokens) - done) if self.window is not None else 0
        parts = []
        if head:
            parts.append(self.allocator.full_attn_allocator.alloc(head))
        if tokens - head:
            so_far = torch.cat([prefix, *parts]) if parts else prefix
            parts.append(self.alloc_after(so_far, tokens - head))
        assert all(p is not None for p in parts), "the scenario's pool is laid out to fit"
        return torch.cat(parts) if parts else _NO_SLOTS

    def alloc_after(self, prefix: torch.Tensor, tokens: int) -> Any:
        """Slots for ``tokens`` more tokens of a sequence whose slots so far are ``prefix``,
        both pools paired with hybrid SWA."""
        if self.page == 1:
            return self.allocator.alloc(tokens)
        done = int(prefix.numel())
        prefix_lens = torch.tensor([done], dtype=torch.int64)
        seq_lens = torch.tensor([done + tokens], dtype=torch.int64)
        last = prefix[-1:] if done else torch.full((1,), -1, dtype=torch.int64)
        return self.allocator.alloc_extend(
            prefix_lens, prefix_lens, seq_lens, seq_lens, last, tokens
        )

    def _insert(self, tokens: Sequence[int], swa_from: int = 0) -> Any:
        """Put ``tokens`` into the tree on fresh slots, their sliding-window KV only from
        ``swa_from`` on (what lies before is a tombstone, as a request's out-of-window KV
        is); returns the node that ends them."""
        key = self.s["RadixKey"](array("q", tokens))
        slots = self.alloc_seq(_NO_SLOTS, len(tokens), swa_from)
        self.note(slots, tokens)
        params = self.s["InsertParams"](key=key, value=slots)
        if self.window is not None and swa_from:
            params.set_evicted_seqlen(self.s["ComponentType"].SWA, swa_from)
        self.tree.insert(params)
        match = self.s["MatchPrefixParams"](key=key)
        return self.tree.match_prefix(match).last_device_node

    def _lay_out(self, scenario: Scenario, requests: list[Request]) -> None:
        for spec, req in zip(scenario.requests, requests, strict=True):
            if spec.device_prefix_tokens:
                n = spec.device_prefix_tokens
                last = self._insert(req.tokens[:n], window_start(n, self.window, self.page))
                if spec.device_prefix_pinned:
                    self.tree.lock(last)  # held by requests outside the scenario, for good
        filler = scenario.evictable_tokens - sum(
            s.device_prefix_tokens for s in scenario.requests if not s.device_prefix_pinned
        )
        if filler:
            # no request matches the filler: its sliding-window KV is gone
            self._insert(tuple(range(filler)), filler)

    def note(self, slots: torch.Tensor, tokens: Sequence[int]) -> None:
        """Record which token's KV each of ``slots`` holds."""
        for slot, token in zip(slots.tolist(), tokens, strict=True):
            self.token_of[slot] = token

    # -- what the storage holds ----------------------------------------------------------
    def full_size(self) -> int:
        """Slots of the full KV pool."""
        return int(self.allocator.size_full if self.window is not None else self.allocator.size)

    def free_tokens(self) -> int:
        """Free slots of the full KV pool."""
        if self.window is not None:
            return int(self.allocator.full_available_size())
        return int(self.allocator.available_size())

    def swa_free_tokens(self) -> int | None:
        """Free plus evictable slots of the sliding-window pool (hybrid SWA), what SGLang's
        ``SWAPrefillBudget`` starts a round from; None without hybrid SWA."""
        if self.window is None:
            return None
        return int(self.allocator.swa_available_size() + self.tree.swa_evictable_size())

    def evictable_tokens(self) -> int:
        return int(self.tree.evictable_size())

    def cached_tokens(self) -> list[int]:
        """Every token whose KV the tree holds on the device."""
        values = self.tree.all_values_flatten()
        return [self.token_of[s] for s in values.tolist()]
