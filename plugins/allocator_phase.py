"""Built-in allocator-phase policies.

``default`` leaves torch alone. ``expandable`` and ``phased-expandable`` switch torch's caching
allocator to expandable segments (page-granular reclamation,
docs/incidents.md#allocator-fragmentation); they differ in *when*.
Both reach torch only through an :class:`~policykit.memory.allocator.AllocatorFacade`, given to the
constructor (tests pass a fake one; the registry builds them with the real one).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from policykit.hookspecs import hookimpl
from policykit.memory.allocator import AllocatorFacade, torch_allocator
from policykit.memory.expandable import ExpandableSwitch
from policykit.policy import AllocatorPhasePolicy


class DefaultAllocator(AllocatorPhasePolicy):
    """Leave the torch caching allocator as configured by the environment, in every phase."""

    name = "default"


class _SwitchingPolicy(AllocatorPhasePolicy):
    """Shared plumbing: one :class:`ExpandableSwitch` over an injected facade."""

    def __init__(self, arg: Any = None, *, facade: AllocatorFacade | None = None) -> None:
        super().__init__(arg)
        self.switch = ExpandableSwitch(facade if facade is not None else torch_allocator())

    @contextmanager
    def static_allocations(self) -> Iterator[None]:
        with self.switch.non_expandable():
            yield


class ExpandableFromStart(_SwitchingPolicy):
    """Expandable segments from the first allocation on (like PYTORCH_CUDA_ALLOC_CONF).

    Simple, and it also reclaims fragmentation during initialisation, but every static buffer
    (weights, KV pool, communication buffers) then lives in CUDA VMM memory. That is unsafe
    for buffers registered for RDMA, for ``torch.cuda.MemPool`` allocations (torch refuses
    them) and for tensors shared through CUDA IPC. Use ``phased-expandable`` on such nodes.
    """

    name = "expandable"

    def on_init(self) -> None:
        self.switch.enable()

    def on_serving(self) -> None:
        self.switch.enable()  # no-op if on_init already decided


class PhasedExpandable(_SwitchingPolicy):
    """Default allocator during init, expandable segments from the serving loop on.

    Static buffers (weights, KV pool, RDMA registrations, CUDA-graph pools) are all allocated
    during initialisation, never fragment, and some cannot live in VMM memory; the serving
    loop's activations fragment and have no such constraint. So the switch happens at the
    init -> serving boundary, after ``empty_cache()``. Late static buffers go in
    ``static_allocations()``. Skipped, with the reason logged once, when the backend is not
    native, expandable segments are already on, a MemPool is in use, or the set call fails.
    """

    name = "phased-expandable"

    def on_serving(self) -> None:
        self.switch.enable()


@hookimpl
def policykit_register_policies(register):
    register(DefaultAllocator)
    register(ExpandableFromStart)
    register(PhasedExpandable)
