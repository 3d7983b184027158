"""SGLang 0.5.23's own HiCache host tier on a CPU, for scenarios with host prefixes.

``UnifiedRadixCache.init_hicache`` builds the real host stack, as ``--enable-hierarchical-cache``
does: a ``HostPoolGroup`` over an ``MHATokenToKVPoolHost`` (with hybrid SWA a second one for the
sliding-window pool, into which the ``SWA`` component backs up the nodes within a window of the
one backed up) and the ``HybridCacheController`` that backs nodes up
(``backup_node_for_write_back``), demotes backed-up leaves to host-only nodes on eviction,
matches the host (``host_hit_length``), loads back with its threshold (``load_back_threshold``,
10 tokens) under host and device locks, and acknowledges both (``writing_check``,
``loading_check``). Two things cannot run without a GPU, and are stood in
for here (docs/conformance.md lists them):

* the copies: :class:`NoCopyTransfers` takes the place of the controller's
  ``L2TransferEngine``, whose device-to-host and host-to-device copies are CUDA kernels on CUDA
  streams. It copies nothing and completes at once: nothing in scheduling reads KV data;
* pinned host memory: the host pool's buffer is allocated as plain CPU memory
  (:func:`_unpinned`), as registering it with CUDA needs a GPU.

Configuration (the scenario's, not SGLang's defaults): the host pool holds every host run the
scenario lays out (a scenario has no host capacity; policykit's host tier has none either), and
write-through is off (``write_through_threshold`` out of reach, as SGLang's own unit fixtures
set it): the host holds what the scenario says, and gains no copies during the run, which
policykit does not model (docs/conformance.md, known differences).
"""

from __future__ import annotations

import atexit
from array import array
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from policykit.pages import pages_for
from policykit.swa_cache import window_start

#: write-through never fires (SGLang's unit fixtures use the same value)
WRITE_THROUGH_OFF = 1 << 30


def _unpinned(
    dims: tuple[int, ...],
    dtype: torch.dtype,
    device: str,
    pin_memory: bool,
    allocator: Any = None,
    registration_granularity_bytes: int | None = None,
) -> torch.Tensor:
    """The host pool's buffer in plain CPU memory (SGLang pins and registers it with CUDA)."""
    return torch.empty(dims, dtype=dtype, device=device)


@contextmanager
def _unpinned_host_memory() -> Iterator[None]:
    from sglang.srt.mem_cache.pool_host import common

    funcs = common.ALLOC_MEMORY_FUNCS
    saved = funcs["cpu"]
    funcs["cpu"] = _unpinned
    try:
        yield
    finally:
        funcs["cpu"] = saved


def no_copy_transfers(io_backend: str) -> Any:
    """A :class:`NoCopyTransfers` (defined on first use: it subclasses SGLang's engine)."""
    from sglang.srt.mem_cache import l2_transfer

    class NoCopyTransfers(l2_transfer.L2TransferEngine):
        """SGLang's transfer engine with the copies left out: every transfer completes at
        once (its events are recorded on submission), so acknowledgements are ready at the
        next ``check_hicache_events``, as a finished copy is in SGLang."""

        def _done(self) -> Any:
            start, finish, timing = l2_transfer.make_timing_event_pair()
            start.record()
            finish.record()
            return l2_transfer.TransferCompletion(start, finish, timing)

        def submit_device_to_host(self, transfers: list[Any]) -> Any:
            return self._done()

        def submit_host_to_device(
            self,
            transfers: list[Any],
            *,
            transfer_layer_id_max: int,
            start_event: Any = None,
            on_layer_done: Any = None,
        ) -> Any:
            for layer in range(transfer_layer_id_max):
                if on_layer_done is not None:
                    on_layer_done(layer)
            return self._done()

    return NoCopyTransfers(io_backend)


def device_kv_pool(tokens: int, page: int) -> Any:
    """The device KV pool HiCache's host pool is built to mirror: a real
    ``MHATokenToKVPool`` of one layer of one head of one dimension (the scheduler reads slot
    counts only)."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    return MHATokenToKVPool(
        size=tokens,
        page_size=page,
        dtype=torch.bfloat16,
        head_num=1,
        head_dim=1,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )


def host_tokens_needed(runs: list[tuple[int, int]]) -> int:
    """Host slots the layout takes: each run's device prefix and host run (``(device,
    host)`` token counts), as HiCache backs a node's ancestors up before it."""
    return sum(device + host for device, host in runs)


def attach(tree: Any, params: Any, host_tokens: int, device_tokens: int) -> None:
    """``init_hicache`` on ``tree`` with host pools of at least ``host_tokens`` slots (and at
    least SGLang's default, twice the device pool), then the stand-ins above. One ratio sizes
    every host pool from its device pool, so ``device_tokens`` is the smallest device pool
    mirrored (with hybrid SWA, the sliding-window pool can be the smaller)."""
    from sglang.srt.runtime_context import get_memory

    ratio = max(2.0, -(-host_tokens // device_tokens) + 1.0)
    with (
        _unpinned_host_memory(),
        get_memory().override(
            hicache_io_backend="direct",
            hicache_mem_layout="layer_first",
            hicache_write_policy="write_through",
            hicache_ratio=ratio,
            hicache_size=0,
        ),
    ):
        tree.init_hicache(None, params)
    atexit.unregister(tree.shutdown)  # nothing to shut down; keeps each scenario collectable
    controller = tree.cache_controller
    controller.l2_transfer_engine = no_copy_transfers(controller.io_backend)
    tree.write_through_threshold = WRITE_THROUGH_OFF


def lay_out_host_run(storage: Any, tokens: Sequence[int], device: int, host: int) -> None:
    """Make ``tokens[device:device + host]`` a host-only node whose parent ``tokens[:device]``
    is backed up too: insert both on the device, back them up parent first (as HiCache's
    backups go; a backed-up child under a parent that is not panics the tree core on
    eviction), then evict them, which demotes both to the host. With hybrid SWA they carry
    all their sliding-window KV where it fits the sliding-window pool (as a request that ran
    them in one chunk holds it until its release), else only the last window of it, whole
    pages (:func:`~policykit.swa_cache.window_start`: the rest freed as a chunked request
    ran). Runs before anything else is laid out, so the device pool is empty and every node
    evicted is one of these."""
    s, tree = storage.s, storage.tree
    swa_from = 0
    if storage.window is not None and pages_for(device + host, storage.page) * storage.page > (
        storage.swa_pool_total
    ):
        swa_from = window_start(device + host, storage.window, storage.page)
    prefix = torch.empty((0,), dtype=torch.int64)
    for end in (device, device + host):
        if end == prefix.numel():
            continue
        key = s["RadixKey"](array("q", tokens[:end]))
        slots = storage.alloc_seq(prefix, end - prefix.numel(), min(swa_from, end))
        value = torch.cat([prefix, slots])
        params = s["InsertParams"](key=key, value=value, prev_prefix_len=prefix.numel())
        if min(swa_from, end):
            params.set_evicted_seqlen(s["ComponentType"].SWA, min(swa_from, end))
        tree.insert(params)
        prefix = value
    leaf = tree.match_prefix(s["MatchPrefixParams"](key=key)).last_device_node
    # the chain write-through backs up: every unbacked ancestor, parent first (an insert may
    # cut more nodes than the two inserted: hybrid SWA caps a new leaf at one window)
    for node in tree.tree_core.build_backup_kv_action(leaf).node_ids:
        if not tree.backup_node_for_write_back(node):
            raise AssertionError("the host pool is sized to hold every host run")
    tree.evict(s["EvictParams"](num_tokens=tree.evictable_size()))
