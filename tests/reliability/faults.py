"""Things that break on demand: an allocator, a host-tier copy, policies that misbehave."""

from __future__ import annotations

import torch

from policykit.errors import PrefillOutOfMemory
from policykit.node import PrefillNode
from policykit.plugin_manager import PluginSource, make_plugin_manager
from policykit.policy import AdmissionPolicy, AlignmentPolicy, ChunkingPolicy, Parameter
from policykit.pool import TokenPool
from policykit.registry import PolicyRegistry


class FlakyPool(TokenPool):
    """A pool whose ``n``-th next ``alloc`` call fails (counting from 1), once.

    ``error`` is raised as is; ``None`` means the pool reports itself out of memory, as a
    device allocator would when something outside the scheduler took the memory.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._countdown: int | None = None
        self._error: BaseException | None = None
        self.calls = 0

    def fail_on(self, n: int, error: BaseException | None = None) -> None:
        self._countdown, self._error = n, error

    def alloc(self, num_pages: int, *, tokens: int | None = None, evictable: int = 0):
        self.calls += 1
        if self._countdown is not None:
            self._countdown -= 1
            if self._countdown == 0:
                self._countdown = None
                if self._error is not None:
                    raise self._error
                raise PrefillOutOfMemory(
                    tokens=num_pages * self.page_size if tokens is None else tokens,
                    available=0,
                    evictable=evictable,
                    pool=self.name,
                )
        return super().alloc(num_pages, tokens=tokens, evictable=evictable)


class BrokenHostCopyNode(PrefillNode):
    """A node whose host-to-device copy fails for the requests in ``broken`` (a bad host
    buffer, a failed DMA): the copy raises after the pages were allocated."""

    def __init__(self, *args, broken: tuple[tuple[int, ...], ...] = (), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.broken = set(broken)
        #: per host entry (by id), the slots its last load-back wrote and the KV it wrote
        self.copied: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def copy_from_host(self, host, pages: torch.Tensor, start: int, n: int) -> None:
        if host.head + host.run in self.broken:
            raise RuntimeError("host buffer unreadable (injected)")
        super().copy_from_host(host, pages, start, n)
        slots = self.pool.slots(pages, start, start + n)
        self.copied[id(host)] = (slots, self.pool.k[0][slots].clone())


# --- misbehaving policies ------------------------------------------------------------------
class _Picky:
    """Misbehaves only for prompts of ``BAD_PROMPT`` tokens, so the others can be served."""

    BAD_PROMPT = 77


class RaisingAdmission(AdmissionPolicy):
    """Raises while deciding on one prompt length."""

    name = "raising"

    def admit(self, v):
        if v.prompt_tokens == _Picky.BAD_PROMPT:
            raise ZeroDivisionError("division by zero")
        return v.remaining_tokens + v.first_tokens + v.page_size < v.rem_total_tokens

    def tail_reserve(self, v):
        return v.tail_tokens + v.first_tokens


class NonBoolAdmission(RaisingAdmission):
    """Answers "yes" instead of True for one prompt length."""

    name = "non-bool"

    def admit(self, v):
        if v.prompt_tokens == _Picky.BAD_PROMPT:
            return "yes"
        return super().admit(v)


class NegativeTailAdmission(RaisingAdmission):
    """Reserves a negative tail: would hand memory back that nobody freed."""

    name = "negative-tail"

    def tail_reserve(self, v):
        return -v.tail_tokens


class BadChunking(ChunkingPolicy):
    """Returns ``self.arg``'s nonsense for one prompt length's new chunk and for every resume."""

    name = "bad"
    parameter = Parameter("mode", "negative, beyond, float, none or bool", parse=str)

    def _bad(self, v):
        return {
            "negative": -v.page_size,
            "beyond": v.remaining_tokens + 1,
            "float": float(v.remaining_tokens),
            "none": None,
            "bool": True,
        }[self.arg]

    def new_chunk(self, v):
        if v.remaining_tokens == _Picky.BAD_PROMPT:
            return self._bad(v)
        if -(-v.remaining_tokens // v.page_size) * v.page_size <= v.rem_chunk_tokens:
            return v.remaining_tokens
        return v.rem_chunk_tokens // v.page_size * v.page_size

    def resume_chunk(self, v):
        return self._bad(v)


class BackwardsAlignment(AlignmentPolicy):
    """Moves a chunk's end before its start."""

    name = "backwards"

    def align_end(self, v):
        return v.start - 1


MISBEHAVING = (
    RaisingAdmission,
    NonBoolAdmission,
    NegativeTailAdmission,
    BadChunking,
    BackwardsAlignment,
)
#: where the misbehaving policies claim to come from: errors must name it
SOURCE = PluginSource("bad_policies", "misbehaving-policies", "0.0.1")


def registry_with_misbehaving() -> PolicyRegistry:
    """The built-in policies plus the misbehaving ones, registered as a third-party plugin."""
    registry = PolicyRegistry.from_plugins(make_plugin_manager(entry_points=False))
    for cls in MISBEHAVING:
        registry.add(cls, SOURCE)
    return registry
