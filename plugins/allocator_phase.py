"""Built-in allocator-phase policies."""

from __future__ import annotations

from policykit.hookspecs import hookimpl
from policykit.policy import AllocatorPhasePolicy


class DefaultAllocator(AllocatorPhasePolicy):
    """Leave the torch caching allocator as configured by the environment, in every phase."""

    name = "default"


@hookimpl
def policykit_register_policies(register):
    register(DefaultAllocator)
