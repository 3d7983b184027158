"""The one module that calls into torch's CUDA caching-allocator internals.

Policies, the watermark and the memory planner talk to an :class:`AllocatorFacade`; only
:class:`TorchAllocator` here touches ``torch.cuda`` and the private setter/getter. Two reasons:
the private API moves between torch releases (the setter lives in ``torch._C`` since the
accelerator-generic allocator config, and the old ``torch.cuda.memory._set_allocator_settings``
is a deprecated wrapper that emits a ``FutureWarning``), and tests can inject a fake facade and
exercise every branch of a policy on a machine without a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import torch

from policykit.errors import PolicykitError
from policykit.memory.allocator_settings import backend_of, env_settings


class AllocatorUnavailable(PolicykitError):
    """A device-only query (free memory, say) was made where torch sees no CUDA device."""


class AllocatorFacade(Protocol):
    """What policykit needs from a caching allocator; see :class:`TorchAllocator`."""

    def is_available(self) -> bool:
        """A CUDA (or ROCm) device is usable."""

    def backend(self) -> str:
        """``native`` for torch's caching allocator, else e.g. ``cudaMallocAsync``."""

    def settings(self) -> str:
        """The current setting string, in ``PYTORCH_CUDA_ALLOC_CONF`` syntax."""

    def set_settings(self, text: str) -> None:
        """Replace the settings with ``text`` (torch resets every key ``text`` leaves out)."""

    def memory_stats(self) -> Mapping[str, Any]:
        """``torch.cuda.memory_stats()``: flat counters, empty before CUDA is initialised."""

    def mem_get_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes on the current device, as the driver sees them."""

    def empty_cache(self) -> None:
        """Return fully free cached segments (or, with expandable segments, pages) to the driver."""

    def reset_peak_stats(self) -> None:
        """Restart ``allocated_bytes.all.peak`` from the current allocation (for measuring)."""

    def mempool_users(self) -> tuple[str, ...]:
        """Components that declared they allocate in a ``torch.cuda.MemPool`` (symm-mem...)."""


class TorchAllocator:
    """The real facade over the installed torch build."""

    def __init__(self) -> None:
        self._mempool_users: list[str] = []

    def is_available(self) -> bool:
        return torch.cuda.is_available()

    def backend(self) -> str:
        if self.is_available():
            return torch.cuda.memory.get_allocator_backend()
        # CPU builds have no backend query; the setting string is what would select one
        return backend_of(self.settings())

    def settings(self) -> str:
        getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
        if getter is not None:
            return getter()
        # older torch: no getter, so read what torch itself read at start-up
        return env_settings()[1]

    def set_settings(self, text: str) -> None:
        setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
        if setter is not None:
            setter(text)
        else:
            torch.cuda.memory._set_allocator_settings(text)

    def memory_stats(self) -> Mapping[str, Any]:
        return torch.cuda.memory_stats()

    def mem_get_info(self) -> tuple[int, int]:
        if not self.is_available():
            raise AllocatorUnavailable(
                f"Free device memory was asked for, but this torch build sees no CUDA device "
                f"(torch {torch.__version__}). Run on a machine with a GPU, or estimate instead."
            )
        free, total = torch.cuda.mem_get_info()
        return int(free), int(total)

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def reset_peak_stats(self) -> None:
        torch.cuda.reset_peak_memory_stats()

    def declare_mempool_use(self, component: str) -> None:
        """Record that ``component`` allocates inside a ``torch.cuda.MemPool`` in this process.

        torch refuses MemPool allocations on expandable segments, so a policy that would switch
        them on must know; there is no torch query that tells MemPools from CUDA-graph pools.
        """
        if component not in self._mempool_users:
            self._mempool_users.append(component)

    def mempool_users(self) -> tuple[str, ...]:
        return tuple(self._mempool_users)


_TORCH_ALLOCATOR = TorchAllocator()


def torch_allocator() -> TorchAllocator:
    """The process's facade: one object, because the allocator settings are process-global."""
    return _TORCH_ALLOCATOR
