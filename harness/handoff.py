"""KV hand-off to the decode node: copy out, and free the slots only once the copy is done.

On a PD-disaggregated prefill node a finished request's KV must reach the decode node before
its slots can be reused; until then it is *held*, which is why memory runs out long after
admission looked fine. Here the decode node's receive buffer is host memory: after a request's
final chunk its KV is gathered from the pool and copied to a pinned host buffer on a side CUDA
stream, and an event marks completion. The node's release waits for that event as well as for
``kv_release_rounds``; on the CPU the copy is synchronous.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from policykit.node import PrefillNode
from policykit.request import Request


@dataclass
class Transfer:
    request_id: str
    tokens: int
    #: ``[layers, 2, tokens, kv_heads, head_dim]`` on the host (kept only when asked to)
    buffer: torch.Tensor | None
    event: torch.cuda.Event | None

    def done(self) -> bool:
        return self.event is None or self.event.query()


class DecodeHandoff:
    """Copies finished requests' KV out of the pool and tells the node when a copy landed."""

    def __init__(self, node: PrefillNode, *, keep: bool = False) -> None:
        self.node = node
        self.keep = keep
        self.transfers: dict[str, Transfer] = {}
        self.bytes_sent = 0
        cuda = node.pool.device.type == "cuda"
        self._stream = torch.cuda.Stream(node.pool.device) if cuda else None
        node.transfer_done = self.transfer_done

    def send(self, req: Request) -> None:
        """Start copying ``req``'s KV (positions ``[0, seq_len)``) to the host."""
        pool = self.node.pool
        slots = pool.slots(req.pages, 0, req.seq_len)
        k0 = pool.k[0]
        shape = (len(pool.k), 2, req.seq_len, *k0.shape[1:])
        buffer = torch.empty(shape, dtype=k0.dtype, pin_memory=self._stream is not None)
        event = None
        if self._stream is None:
            for layer, (k, v) in enumerate(zip(pool.k, pool.v, strict=True)):
                buffer[layer, 0] = k[slots]
                buffer[layer, 1] = v[slots]
        else:
            self._stream.wait_stream(torch.cuda.current_stream(pool.device))
            slots.record_stream(self._stream)
            with torch.cuda.stream(self._stream):
                for layer, (k, v) in enumerate(zip(pool.k, pool.v, strict=True)):
                    buffer[layer, 0].copy_(k[slots], non_blocking=True)
                    buffer[layer, 1].copy_(v[slots], non_blocking=True)
                event = torch.cuda.Event()
                event.record(self._stream)
        self.bytes_sent += buffer.numel() * buffer.element_size()
        # the buffer must outlive the copy; it is dropped once done unless ``keep``
        self.transfers[req.id] = Transfer(req.id, req.seq_len, buffer, event)

    def transfer_done(self, req: Request) -> bool:
        """Whether ``req``'s KV has reached the decode side, so its slots may be freed.

        When the node has nothing else to do this round, wait for the copy instead of spinning
        through empty rounds (an engine would block on the transfer queue the same way).
        """
        transfer = self.transfers.get(req.id)
        if transfer is None:
            return True
        if not transfer.done() and not self.node.waiting and self.node.chunked is None:
            assert transfer.event is not None
            transfer.event.synchronize()
        finished = transfer.done()
        if finished and not self.keep:
            transfer.buffer = None
        return finished

    def received(self, request_id: str) -> torch.Tensor:
        """The KV the decode node received for ``request_id`` (needs ``keep=True``)."""
        transfer = self.transfers[request_id]
        if transfer.event is not None:
            transfer.event.synchronize()
        if transfer.buffer is None:
            raise KeyError(f"{request_id}: hand-off buffers are kept only with keep=True")
        return transfer.buffer
