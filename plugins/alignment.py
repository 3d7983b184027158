"""Built-in alignment policies: where a non-final chunk may end.

Alignment only ever moves an end *back*, and never to the chunk's start: a chunk that would
vanish keeps a page-aligned end instead, or its original end if even that is the start (the
64-token chunk of docs/incidents.md#truncated-tail is such a fallback).
"""

from __future__ import annotations

from policykit.config import EngineConfig
from policykit.hookspecs import hookimpl
from policykit.policy import AlignmentPolicy, AlignView, Parameter


def _page_end(v: AlignView) -> int:
    end = v.end // v.page_size * v.page_size
    if end <= v.start:
        return v.end
    return end


class NoAlignment(AlignmentPolicy):
    """Chunk ends where the budget put it.

    SGLang 0.5.23: a new request's truncation is already a whole number of pages (the chunking
    policy floors it), and a resumed chunk is ``min(remaining, budget)`` with no floor
    (``add_chunked_req``). Pages stay correct either way: the allocator fills a partly used
    last page before taking a new one.
    """

    name = "none"

    def align_end(self, v: AlignView) -> int:
        return v.end


class PageAlignment(AlignmentPolicy):
    """Every non-final chunk ends on a page boundary, a resumed one included.

    Not SGLang's behaviour: SGLang 0.5.23 floors only a new request's truncation to pages
    (which ``chunking=sglang`` already does) and resumes with no floor; use ``none`` to
    reproduce it. ``page`` is a policykit choice that keeps every chunk end page-aligned.
    """

    name = "page"

    def align_end(self, v: AlignView) -> int:
        return _page_end(v)


class CheckpointAlignment(AlignmentPolicy):
    """Chunk ends on a multiple of N tokens, where a linear-attention state checkpoint exists.

    FlashKDA checkpoints the recurrent state every 256 tokens; a chunk ending between
    checkpoints would leave a state nobody can resume from. With ``admission=sglang`` this is
    the fork of docs/incidents.md#truncated-tail (SGLang with checkpoint alignment), not SGLang
    itself. N must be a multiple of the page size, so every checkpoint is also a page
    boundary.
    """

    name = "checkpoint"
    parameter = Parameter("size", "checkpoint interval in tokens (a multiple of the page size)")

    def validate(self, config: EngineConfig) -> None:
        if self.arg <= 0 or self.arg % config.page_size:
            raise ValueError(
                f"checkpoint:{self.arg} is not a positive multiple of the page size "
                f"{config.page_size}"
            )

    def align_end(self, v: AlignView) -> int:
        end = v.end // self.arg * self.arg
        if end <= v.start:
            return _page_end(v)
        return end


class TruncationAlignment(AlignmentPolicy):
    """Chunk *length* is a multiple of N tokens (SGLang's ``truncation_align_size``).

    Deterministic attention kernels split work by a fixed size; chunking on that size keeps
    results bit-identical across batch compositions.
    """

    name = "truncation"
    parameter = Parameter(
        "size", "split size in tokens that every non-final chunk is a multiple of"
    )

    def validate(self, config: EngineConfig) -> None:
        if self.arg <= 0:
            raise ValueError(f"truncation:{self.arg} must be a positive number of tokens")

    def align_end(self, v: AlignView) -> int:
        length = (v.end - v.start) // self.arg * self.arg
        if length <= 0:
            return _page_end(v)
        return v.start + length


@hookimpl
def policykit_register_policies(register):
    register(NoAlignment)
    register(PageAlignment)
    register(CheckpointAlignment)
    register(TruncationAlignment)
