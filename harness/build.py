"""Lay a workload out on a prefill node whose pool holds real KV.

The core builds the *bookkeeping* (pages, radix cache, host entries); this module makes the
memory behind it real: every prefix a workload says is already cached on the device or held on
the host gets the K/V a dense forward of the model gives for those tokens. A request that later
hits that prefix therefore attends to exactly what it would have computed itself, which is what
the logits-equivalence test relies on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from policykit.harness.model import Decoder, LayerKV
from policykit.harness.workloads import Workload, WorkloadError
from policykit.node import PrefillNode
from policykit.pages import pages_for
from policykit.pool import TokenPool
from policykit.request import Request, State


class PrefixKV:
    """Dense-forward KV of token prefixes, computed once per workload and shared by every combo.

    KV of positions ``[0, n)`` depends only on the first ``n`` tokens (causal attention), so a
    prefix's KV is the dense forward of the prefix alone. Device prefixes are kept on the device
    (each combo's fresh pool is filled from them); host runs are kept only as host copies, in
    pinned memory on CUDA so that a load-back is a DMA, not a pageable copy.
    """

    def __init__(self, model: Decoder) -> None:
        self.model = model
        self._dense: dict[tuple[int, ...], LayerKV] = {}
        self._host: dict[tuple[tuple[int, ...], int], LayerKV] = {}

    def dense(self, tokens: Sequence[int]) -> LayerKV:
        key = tuple(tokens)
        if key not in self._dense:
            self._dense[key] = self.model.dense(self.model.token_ids(key)).kv
        return self._dense[key]

    def host(self, tokens: Sequence[int], start: int) -> LayerKV:
        """Host-tier copy of the KV of ``tokens[start:]``."""
        key = (tuple(tokens), start)
        if key not in self._host:
            pin = self.model.device.type == "cuda"
            dense = self._dense.get(key[0]) or self.model.dense(self.model.token_ids(key[0])).kv
            self._host[key] = [
                (_to_host(k[start:], pin), _to_host(v[start:], pin)) for k, v in dense
            ]
        return self._host[key]


def _to_host(t: torch.Tensor, pin: bool) -> torch.Tensor:
    host = t.to("cpu", copy=True)
    return host.pin_memory() if pin else host


def attach_kv(pool: TokenPool, model: Decoder) -> None:
    """Give a bookkeeping-only pool (a scenario's) the K/V buffers of ``model``."""
    if pool.k:
        return
    layout = model.layout
    shape = (pool.total_tokens, layout.kv_heads, layout.head_dim)
    pool.k = [
        torch.zeros(shape, dtype=layout.dtype, device=pool.device) for _ in range(layout.layers)
    ]
    pool.v = [torch.zeros_like(k) for k in pool.k]


def fill_kv(node: PrefillNode, store: PrefixKV) -> None:
    """Write real KV behind every device-resident prefix and host entry the requests can hit,
    and behind what an in-progress (chunked) request has already computed."""
    pool = node.pool
    for req in node.requests.values():
        cached, _, pages = node.cache.match(req.tokens)
        host = node.host.lookup(req.tokens, cached)
        on_device = req.seq_len if req.state is State.CHUNKED else cached
        if on_device:
            table = req.pages if req.state is State.CHUNKED else pages
            slots = pool.slots(table, 0, on_device)
            for layer, (k, v) in enumerate(store.dense(req.tokens[:on_device])):
                pool.k[layer][slots] = k
                pool.v[layer][slots] = v
        if host is not None and host.kv is None:  # from where the host holds KV
            host.kv = store.host(req.tokens[: host.end], getattr(host, "held_from", host.start))


def build_workload_node(
    workload: Workload, store: PrefixKV, *, with_kv: bool = True
) -> PrefillNode:
    """A fresh node for ``workload``: pool with the model's KV buffers, resident prefixes in the
    radix cache (pinned ones locked) and the host tier, and every request queued.

    ``with_kv=False`` skips computing the resident prefixes' KV: the layout and every decision
    are the same, only the values are not (for timing the planner and the forward alone).
    """
    node = lay_out_workload(workload, store.model.device, store.model.layout)
    if with_kv:
        fill_kv(node, store)
    return node


def lay_out_workload(workload: Workload, device: Any = "cpu", layout: Any = None) -> PrefillNode:
    """``workload`` on a fresh node with no model: the pool (KV buffers only where ``layout``
    is given), the resident prefixes and the host tier laid out, every request queued. What
    ``simulate --workload`` runs; :func:`build_workload_node` adds the model's KV."""
    page = workload.config.page_size
    pool = TokenPool(workload.pool_tokens, page, device=device, layout=layout)
    node = PrefillNode(workload.config, pool)
    tokens = workload.tokens()
    for spec in workload.requests:
        toks = tokens[spec.id]
        device = spec.device_prefix_tokens
        if device:
            prefix = toks[:device]
            matched, _, _ = node.cache.match(prefix)
            if matched < device:
                need = pages_for(device - matched, page)
                if need > pool.free_pages:
                    raise WorkloadError(
                        f"Workload {workload.name!r}: the device-resident prefixes do not fit "
                        f"the {pool.total_tokens}-token pool; raise --pool-tokens."
                    )
                table = torch.cat([node.cache.match(prefix)[2], pool.alloc(need)])
                node.cache.insert(prefix, table)
            if spec.device_prefix_pinned:
                node.cache.pin(node.cache.match(prefix)[1])  # locked for good by others
        if spec.host_prefix_tokens:
            end = device + spec.host_prefix_tokens
            if node.host.lookup(toks[:end], device) is None:
                node.host.put(toks[:end], device)
        node.add(Request(spec.id, toks, arrival_round=spec.arrival_round))
    return node
