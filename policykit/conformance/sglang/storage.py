"""SGLang 0.5.23's own storage, built on a CPU from a policykit scenario.

What runs for real: the radix tree SGLang 0.5.23 builds by default (``UnifiedRadixCache`` with
its compiled tree core, the ``FULL`` component: prefix match, ``lock``/``unlock``, LRU eviction,
``checkpoint``, ``insert``), the KV allocators (``TokenToKVPoolAllocator`` for one-token pages,
``PagedTokenToKVPoolAllocator`` with its torch ``alloc_extend`` path otherwise), the
``ReqToTokenPool`` rows, and the scheduler's allocation path around them
(``alloc_req_slots``, ``alloc_token_slots`` / ``alloc_paged_token_slots_extend``, which evict
when the pool is short, ``checkpoint_kv_cache``, ``release_kv_cache``).

What is a stand-in, and why (docs/conformance.md lists the same):

* **HiCache's host tier.** 0.5.23 loads host KV back through a ``HybridCacheController`` that
  copies between pinned host memory and the device on CUDA streams. :class:`HostTierCache`
  keeps the scenario's host runs in a table, reports a hit as HiCache's ``match_prefix`` does
  (whole pages, right after the device match) and makes ``init_load_back`` take real device
  slots through the real allocation path (evicting when short) and insert them into the real
  tree, without copying KV. ``load_back_threshold`` (10 tokens) is applied as 0.5.23 does.
* **Recency.** The tree core keeps its own access counter, so no wall clock is involved.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any

import torch

from policykit.host_tier import LOAD_BACK_THRESHOLD
from policykit.request import Request
from policykit.scenario import Scenario, pool_tokens

#: a request's tokens are ``(i + 1) * stride + position`` (see ``policykit.scenario``); the
#: filler's are below the first stride
OWNER_FILLER = "(filler)"


@dataclass(frozen=True)
class HostRun:
    """A host-tier run of one request's tokens: ``[start, end)``."""

    start: int
    end: int


def storage_classes(up: dict[str, Any]) -> dict[str, Any]:
    """The real storage classes, and the host-tier stand-in subclassing the real tree."""
    from sglang.srt.mem_cache import allocation, common
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    class HostTierCache(UnifiedRadixCache):
        """The real tree, plus the host tier as a table (see the module docstring)."""

        host_runs: dict[str, HostRun]
        req_tokens: dict[str, tuple[int, ...]]
        #: :meth:`Storage.note`, to name the loaded slots
        note: Any

        def match_prefix(self, params: Any) -> Any:
            result = super().match_prefix(params)
            req = params.req
            run = None if req is None else self.host_runs.get(req.rid)
            if run is None or result.device_prefix_len != run.start:
                return result
            page = self.page_size
            hit = (run.end - run.start) // page * page
            return result._replace(host_hit_length=hit)

        def init_load_back(self, params: Any) -> Any:
            req, tokens = params.req, params.host_hit_length
            last = req.last_node
            if tokens < LOAD_BACK_THRESHOLD:
                return 0, last
            allocator = self.token_to_kv_pool_allocator
            common.evict_from_tree_cache(self, tokens)
            slots = allocator.alloc(tokens)
            if slots is None:
                return 0, last
            start = req.prefix_len
            prefix = self.prefix_device_indices(req)
            whole = self.req_tokens[req.rid][: start + tokens]
            self.note(slots, whole[start:])
            key = RadixKey(array("q", whole))
            # The prefix's slots are the tree's own already: not duplicates to free.
            value = torch.cat([prefix, slots])
            self.insert(InsertParams(key=key, value=value, prev_prefix_len=start))
            node = super().match_prefix(MatchPrefixParams(key=key)).last_device_node
            return tokens, node

        def load_back_is_cache_owned(self) -> bool:
            return True

        def pretty_print(self) -> None:
            """SGLang dumps the whole tree on an out-of-memory (from the compiled core, past
            ``sys.stdout``); the conformance run reports the out-of-memory instead."""

    return {
        "allocation": allocation,
        "common": common,
        "InsertParams": InsertParams,
        "MatchPrefixParams": MatchPrefixParams,
        "RadixKey": RadixKey,
        "TokenToKVPoolAllocator": TokenToKVPoolAllocator,
        "PagedTokenToKVPoolAllocator": PagedTokenToKVPoolAllocator,
        "ReqToTokenPool": ReqToTokenPool,
        "CacheInitParams": CacheInitParams,
        "ComponentType": ComponentType,
        "HostTierCache": HostTierCache,
    }


class Storage:
    """One scenario's pool, tree and request rows in SGLang's own classes, laid out as
    :func:`policykit.scenario.build_node` lays out policykit's node (device prefixes in
    listing order, pinned ones locked for good, then the anonymous filler)."""

    def __init__(self, up: dict[str, Any], scenario: Scenario, requests: list[Request]) -> None:
        s = up["storage"]
        self.s = s
        page = scenario.config.page_size
        self.page = page
        total = pool_tokens(scenario)
        if page == 1:
            self.allocator = s["TokenToKVPoolAllocator"](total, torch.int64, "cpu", None, False)
        else:
            self.allocator = s["PagedTokenToKVPoolAllocator"](
                total, page, torch.int64, "cpu", None, False
            )
            self.allocator.use_triton_kernels = False  # its torch path: no GPU kernel
        longest = max((r.prompt_tokens for r in requests), default=1)
        self.req_to_token = s["ReqToTokenPool"](len(requests) + 1, longest + page, "cpu", False)
        params = s["CacheInitParams"](
            disable=False,
            req_to_token_pool=self.req_to_token,
            token_to_kv_pool_allocator=self.allocator,
            page_size=page,
            tree_components=(s["ComponentType"].FULL,),
        )
        self.tree = s["HostTierCache"](params)
        self.tree.req_tokens = {r.id: r.tokens for r in requests}
        self.tree.host_runs = {}
        self.tree.note = self.note
        #: slot -> token whose KV it holds (to name what the tree holds and what it evicted)
        self.token_of: dict[int, int] = {}
        self._lay_out(scenario, requests)

    def _insert(self, tokens: tuple[int, ...]) -> Any:
        slots = self.allocator.alloc(len(tokens))
        assert slots is not None, "the scenario's pool is laid out to fit"
        self.note(slots, tokens)
        key = self.s["RadixKey"](array("q", tokens))
        self.tree.insert(self.s["InsertParams"](key=key, value=slots))
        match = self.s["MatchPrefixParams"](key=key)
        return self.tree.match_prefix(match).last_device_node

    def _lay_out(self, scenario: Scenario, requests: list[Request]) -> None:
        for spec, req in zip(scenario.requests, requests, strict=True):
            if spec.device_prefix_tokens:
                last = self._insert(req.tokens[: spec.device_prefix_tokens])
                if spec.device_prefix_pinned:
                    self.tree.lock(last)  # held by requests outside the scenario, for good
        filler = scenario.evictable_tokens - sum(
            s.device_prefix_tokens for s in scenario.requests if not s.device_prefix_pinned
        )
        if filler:
            self._insert(tuple(range(filler)))
        for spec in scenario.requests:
            if spec.host_prefix_tokens:
                start = spec.device_prefix_tokens
                self.tree.host_runs[spec.id] = HostRun(start, start + spec.host_prefix_tokens)

    def note(self, slots: torch.Tensor, tokens: tuple[int, ...] | list[int]) -> None:
        """Record which token's KV each of ``slots`` holds."""
        for slot, token in zip(slots.tolist(), tokens, strict=True):
            self.token_of[slot] = token

    # -- what the storage holds ----------------------------------------------------------
    def free_tokens(self) -> int:
        return int(self.allocator.available_size())

    def evictable_tokens(self) -> int:
        return int(self.tree.evictable_size())

    def cached_tokens(self) -> list[int]:
        """Every token whose KV the tree holds on the device."""
        values = self.tree.all_values_flatten()
        return [self.token_of[s] for s in values.tolist()]
