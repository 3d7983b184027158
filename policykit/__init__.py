"""policykit: pluggable, formally checked prefill scheduling policies.

The public surface for plugin authors is small: the policy base classes and views, the
``hookimpl`` marker, and the ``ceil_paged`` helper.
"""

from policykit.config import EngineConfig
from policykit.hookspecs import hookimpl
from policykit.ledger import Budget
from policykit.pages import ceil_paged
from policykit.policy import (
    AdmissionPolicy,
    AdmitView,
    AlignmentPolicy,
    AlignView,
    AllocatorPhasePolicy,
    ChunkingPolicy,
    ChunkView,
    Parameter,
    Policy,
    PreemptionPolicy,
    PreemptView,
    QueuePolicy,
    QueueView,
    TailView,
)

__version__ = "0.1.0"

__all__ = [
    "AdmissionPolicy",
    "AdmitView",
    "AlignView",
    "AlignmentPolicy",
    "AllocatorPhasePolicy",
    "Budget",
    "ChunkView",
    "ChunkingPolicy",
    "EngineConfig",
    "Parameter",
    "Policy",
    "PreemptView",
    "PreemptionPolicy",
    "QueuePolicy",
    "QueueView",
    "TailView",
    "__version__",
    "ceil_paged",
    "hookimpl",
]
