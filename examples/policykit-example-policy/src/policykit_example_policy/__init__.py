"""A watermark admission policy for policykit: keep some KV slots unpromised.

Upstream admission lets a request in as long as its whole remaining prompt fits what the memory
ledger may still promise, so a busy node runs with its pool filled to the brim. Every slot
promised beyond the free ones is taken from the evictable prefix cache, and the in-progress
chunked request, which resumes with ``min(rem_chunk_tokens, rem_total_tokens)``, gets squeezed
into short chunks. vLLM's block manager keeps a *watermark* of free blocks for the same reason.
"""

from __future__ import annotations

import policykit
from policykit import AdmissionPolicy, AdmitView, EngineConfig, Parameter, TailView, ceil_paged


class WatermarkAdmission(AdmissionPolicy):
    """Reserve-tail admission that keeps a watermark of KV slots unpromised.

    A request enters only if, after its paged remaining prompt, its first token and a page of
    headroom, at least ``tokens`` slots (rounded up to whole pages) are still unpromised. The
    slack keeps part of the prefix cache resident and leaves the in-progress request room for
    full-size chunks. A truncated request's tail is reserved as with ``reserve-tail``, so the
    policy is at least as safe as that one; what it costs is admissions near a full pool.
    """

    name = "watermark"
    parameter = Parameter("tokens", "slots to keep unpromised after an admission (> 0)")
    #: the argument `policykit check --all` and the comparison pages enumerate this policy with
    samples = ("1024",)

    def validate(self, config: EngineConfig) -> None:
        if self.arg <= 0:
            raise ValueError(f"watermark:{self.arg} must keep a positive number of slots free")

    def admit(self, v: AdmitView) -> bool:
        need = ceil_paged(v.remaining_tokens, v.page_size) + v.first_tokens + v.page_size
        return need + ceil_paged(self.arg, v.page_size) <= v.rem_total_tokens

    def tail_reserve(self, v: TailView) -> int:
        return ceil_paged(v.tail_tokens, v.page_size) + v.first_tokens


@policykit.hookimpl
def policykit_register_policies(register):
    register(WatermarkAdmission)
