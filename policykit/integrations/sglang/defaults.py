"""The combo SGLang's own server args amount to: what the plugin runs for the kinds nobody names.

A plugin enabled without ``POLICYKIT_COMBO`` should change nothing, so it runs the policies
that decide as SGLang 0.5.23 does under the server args the scheduler was started with; a
combo that names some kinds overrides those kinds only (as the vLLM scheduler class takes
vLLM's own decisions for the kinds its setting leaves out). Where SGLang's settings decide in a
way no built-in policy reproduces (``--schedule-policy lof``, priority scheduling, an alignment
SGLang needs for its kernels), the plugin refuses to start rather than run something close.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from policykit.config import EngineConfig

#: SGLang 0.5.23's ``--schedule-policy`` values that a built-in queue policy orders alike
QUEUES = {"fcfs": "fcfs", "lpm": "lpm"}
#: what SGLang 0.5.23 decides whatever its server args: the kinds no server arg changes
SGLANG_OWN = {
    "admission": "sglang",
    "chunking": "sglang",
    "allocator-phase": "default",
    "preemption": "none",
}
#: the kinds whose hooks hand every call to SGLang when chunked prefill is off
CHUNKED_KINDS = ("admission", "chunking", "alignment")


@dataclass(frozen=True)
class ServerArgCombo:
    """The combo a scheduler's server args amount to, kind by kind, and what they rule out."""

    #: kind -> policy spec, for each kind a built-in reproduces
    combo: dict[str, str]
    #: kind -> why no built-in reproduces SGLang there (a combo must name that kind)
    unexpressible: dict[str, str] = field(default_factory=dict)
    #: why no combo at all can run as SGLang is configured (None: some can)
    refused: str | None = None
    #: the server args read, for the start-up log
    read: dict[str, Any] = field(default_factory=dict)
    config: EngineConfig = field(default_factory=EngineConfig)


def _arg(scheduler: Any, name: str) -> Any:
    try:
        return getattr(scheduler, name)
    except AttributeError:
        raise LookupError(
            f"SGLang's Scheduler has no attribute {name!r}, which SGLang 0.5.23 sets from its "
            "server args; this SGLang is not the release the plugin was written against"
        ) from None


def from_server_args(scheduler: Any) -> ServerArgCombo:
    """The combo SGLang's server args amount to, read off a constructed ``Scheduler``.

    The scheduler holds its server args as ``PrefillAdder`` and ``SchedulePolicy`` receive
    them (SGLang normalises a few first); the fields read, and what each decides:

    * ``schedule_policy`` (``--schedule-policy``): the queue; ``fcfs`` and ``lpm`` are built-in
      queue policies of those names, any other is unexpressible (``lof`` sorts on the
      unclipped ``max_new_tokens`` a policy does not see, ``random``, ``dfs-weight``, ``hrrn``,
      ``shortest-prefill-first`` and ``routing-key`` on state a policy does not see);
    * ``disable_radix_cache`` (``--disable-radix-cache``): SGLang runs ``lpm`` as ``fcfs``
      without a radix tree (``SchedulePolicy._validate_and_adjust_policy``), and so does this;
    * ``enable_priority_scheduling`` (``--enable-priority-scheduling``): SGLang orders by
      request priority and preempts for it, which no combo runs: refused;
    * ``truncation_align_size`` (from ``--enable-deterministic-inference`` with its attention
      backend, or a DSA or Mamba model): where SGLang's kernels need chunk ends aligned, and
      the plugin's alignment policy would replace that alignment: refused when set;
    * ``page_size`` (``--page-size``) and ``chunked_prefill_size`` (``--chunked-prefill-size``,
      ``None`` when chunked prefill is off): the engine the policies validate against and the
      start-up proof runs on; with chunked prefill off the decision hooks hand every call to
      SGLang, so only the queue is the combo's;
    * ``is_hybrid_swa`` and ``sliding_window_size``: the sliding window of that engine.

    Raises :class:`LookupError` naming a field this scheduler lacks.
    """
    policy = str(_arg(scheduler, "schedule_policy"))
    no_radix = bool(_arg(scheduler, "disable_radix_cache"))
    priority = bool(_arg(scheduler, "enable_priority_scheduling"))
    align = _arg(scheduler, "truncation_align_size")
    chunk = _arg(scheduler, "chunked_prefill_size")
    page = int(_arg(scheduler, "page_size"))
    window = None
    if getattr(scheduler, "is_hybrid_swa", False):
        window = int(_arg(scheduler, "sliding_window_size"))
    config = EngineConfig(
        page_size=page,
        chunked_prefill_size=int(chunk) if chunk and chunk > 0 else 0,
        sliding_window=window,
    )
    read = {
        "schedule_policy": policy,
        "disable_radix_cache": no_radix,
        "enable_priority_scheduling": priority,
        "truncation_align_size": align,
        "page_size": page,
        "chunked_prefill_size": chunk,
    }
    combo = {**SGLANG_OWN, "alignment": "none"}
    unexpressible = {}
    queue = "fcfs" if no_radix and policy == "lpm" else QUEUES.get(policy)
    if queue is None:
        unexpressible["queue"] = (
            f"SGLang's --schedule-policy {policy} orders the waiting queue in a way no built-in "
            f"queue policy does (built-ins: {', '.join(sorted(QUEUES))})"
        )
    else:
        combo["queue"] = queue
    return ServerArgCombo(combo, unexpressible, _refusal(priority, align), read, config)


def _refusal(priority: bool, align: Any) -> str | None:
    if priority:
        return (
            "SGLang runs with --enable-priority-scheduling, which orders the waiting queue by "
            "request priority and preempts running requests for it; a policykit queue policy "
            "would replace that order and SGLang's node under policykit does not preempt, so no "
            "combo runs as this engine is configured; start SGLang without priority scheduling"
        )
    if align is not None:
        return (
            f"SGLang truncates chunks to multiples of {align} tokens here "
            "(truncation_align_size: deterministic inference, or a DSA or Mamba model's "
            "kernels need it), and the plugin's alignment policy would replace that alignment; "
            "no built-in reproduces it (SGLang aligns only a new request's cut and refuses a "
            "cut that aligns to nothing), so the plugin does not run on this engine"
        )
    return None


def contradiction(derived: ServerArgCombo, named: Mapping[str, str]) -> str | None:
    """Why the kinds ``named`` by a combo cannot act as SGLang is configured, or None."""
    if derived.refused is not None:
        return derived.refused
    for kind, reason in derived.unexpressible.items():
        if kind not in named:
            return (
                f"{reason}; name a {kind} policy in the combo (it then replaces SGLang's order) "
                f"or start SGLang with --schedule-policy {' or '.join(sorted(QUEUES))}"
            )
    if derived.config.chunked_prefill_size == 0:
        inert = [k for k in CHUNKED_KINDS if k in named and named[k] != derived.combo.get(k)]
        if inert:
            return (
                f"the combo names {', '.join(f'{k}={named[k]}' for k in inert)}, but SGLang runs "
                "with chunked prefill off (--chunked-prefill-size -1), where the plugin hands "
                "every admission and chunk decision to SGLang, so those policies would never "
                "decide; enable chunked prefill or leave those kinds out"
            )
    return None
