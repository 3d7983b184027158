"""The scheduler's forward step: run the model over a committed plan, then hand KV off.

The scheduler calls this after :meth:`PrefillNode.commit` (a node that preempts, once its step's
blocks are allocated: :mod:`policykit.harness.preempting_bench`), so every chunk's slots exist. The
forward reads each request's prefix from the pool and writes the chunk's K/V into its new
slots; requests whose final chunk ran get their last-position logits and start their hand-off.
It also counts what a benchmark reports: tokens, FLOPs (from the preset's shapes) and forward
time, synchronised on CUDA so that the time is the device's and not the launch queue's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from policykit.harness.handoff import DecodeHandoff
from policykit.harness.model import Chunk, Decoder
from policykit.node import PrefillNode
from policykit.plan import Entry, Plan
from policykit.pool import TokenPool


@dataclass
class ForwardStats:
    rounds: int = 0
    tokens: int = 0
    flops: int = 0
    seconds: float = 0.0
    #: per request: the round its first token (last-position logits) was produced
    first_token_round: dict[str, int] = field(default_factory=dict)


class ModelForward:
    """``Scheduler(forward=...)``: one model forward per round over the plan's batch."""

    def __init__(
        self, model: Decoder, handoff: DecodeHandoff | None, *, keep_logits: bool = False
    ) -> None:
        self.model = model
        self.handoff = handoff
        self.keep_logits = keep_logits
        self.logits: dict[str, torch.Tensor] = {}
        self.stats = ForwardStats()

    def __call__(self, plan: Plan, node: PrefillNode) -> None:
        requests = [node.requests[entry.request_id] for entry in plan.batch]
        sampled = self.run(plan, node.pool, [(r.tokens, r.pages) for r in requests])
        if self.handoff is not None:
            for entry in sampled:
                self.handoff.send(node.requests[entry.request_id])

    def run(
        self, plan: Plan, pool: TokenPool, placed: Sequence[tuple[Sequence[int], torch.Tensor]]
    ) -> list[Entry]:
        """The forward over ``plan``'s batch, whatever node planned it: ``placed`` gives, per
        batch entry, the request's tokens and the pages of ``pool`` its sequence lies on.
        Returns the entries whose first token (last-position logits) this forward produced."""
        model, preset = self.model, self.model.preset
        batch = plan.batch
        chunks = []
        flops = 0
        for entry, (tokens, pages) in zip(batch, placed, strict=True):
            ids = model.token_ids(tokens[entry.start : entry.end])
            slots = pool.slots(pages, 0, entry.end)
            sample = entry.kind.finishes
            chunks.append(Chunk(ids, entry.start, slots, sample))
            flops += preset.chunk_flops(entry.start, entry.end, sampled=int(sample))
        t0 = time.perf_counter()
        logits = model.forward(chunks, pool)
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
        stats = self.stats
        stats.seconds += time.perf_counter() - t0
        stats.rounds += 1
        stats.tokens += sum(e.tokens for e in batch)
        stats.flops += flops
        sampled = []
        for entry, out in zip(batch, logits, strict=True):
            if out is None:
                continue
            stats.first_token_round[entry.request_id] = plan.round
            if self.keep_logits:
                self.logits[entry.request_id] = out.cpu()
            sampled.append(entry)
        return sampled
