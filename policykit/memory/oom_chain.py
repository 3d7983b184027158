"""Recognising a CUDA out-of-memory error wherever it sits in an exception chain.

A CUDA OOM rarely reaches the top of a serving loop as itself: a communication layer re-raises
it ``from`` its own error, a ``finally`` block raises while it propagates (it then hides in
``__context__``, even under ``raise ... from None``, which only sets ``__suppress_context__``),
or a task group wraps it in an ``ExceptionGroup``. The detector walks all three links, with a
depth cap and a cycle guard because chains can be long or loop back on themselves.

The simulated KV-pool OOM (:class:`~policykit.errors.PrefillOutOfMemory`) is *not* a CUDA OOM:
it comes from the token allocator, not from torch, and has a different remedy.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from policykit.memory.allocator import AllocatorFacade
from policykit.memory.watermark import read_watermark

MAX_DEPTH = 64
_OOM_MESSAGE = "CUDA out of memory"

log = logging.getLogger("policykit.memory.allocator")


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    # extensions and older code paths raise a plain RuntimeError with torch's message
    return isinstance(exc, RuntimeError) and _OOM_MESSAGE in str(exc)


def find_cuda_oom(exc: BaseException, max_depth: int = MAX_DEPTH) -> BaseException | None:
    """The first CUDA OOM reachable from ``exc`` (breadth first), or ``None``."""
    seen: set[int] = set()
    frontier: list[BaseException] = [exc]
    for _ in range(max_depth + 1):
        following: list[BaseException] = []
        for e in frontier:
            if id(e) in seen:
                continue
            seen.add(id(e))
            if _is_oom(e):
                return e
            links = [e.__cause__, e.__context__]
            if isinstance(e, BaseExceptionGroup):
                links.extend(e.exceptions)
            following.extend(x for x in links if x is not None)
        if not following:
            return None
        frontier = following
    return None


def report_cuda_oom(
    exc: BaseException,
    facade: AllocatorFacade,
    emit: Callable[[str], None] = log.error,
) -> bool:
    """If ``exc`` carries a CUDA OOM, emit the allocator watermark and return True."""
    oom = find_cuda_oom(exc)
    if oom is None:
        return False
    emit(f"CUDA out of memory ({type(oom).__name__}); {read_watermark(facade).format()}")
    return True


@contextmanager
def watermark_on_cuda_oom(
    facade: AllocatorFacade, emit: Callable[[str], None] = log.error
) -> Iterator[None]:
    """Run a block; if it raises with a CUDA OOM anywhere in the chain, log the watermark."""
    try:
        yield
    except BaseException as exc:
        report_cuda_oom(exc, facade, emit)
        raise
