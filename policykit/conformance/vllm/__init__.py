"""vLLM 0.33.0's real v1 ``Scheduler``, driven on a CPU as a prefill-only node.

The oracle the vLLM conformance check will compare policykit against: :func:`drive` runs a
policykit scenario through vLLM's own scheduler, block pool and prefix cache, and returns a
:class:`Trace` of its decisions round by round. See docs/conformance-vllm.md.
"""

from policykit.conformance.vllm.driver import drive
from policykit.conformance.vllm.engine import SchedulerKnobs, VllmUnavailable, load
from policykit.conformance.vllm.record import SCHEMA, StepRecord, Trace

__all__ = ["SCHEMA", "SchedulerKnobs", "StepRecord", "Trace", "VllmUnavailable", "drive", "load"]
