"""Start-up of the vLLM scheduler class: resolve the combo against the engine, log its proofs.

Runs once, in the scheduler's constructor, in vLLM's engine-core process, before anything is
served. A combo that does not resolve, that would not preempt (vLLM's scheduler always can),
or whose preemption victim vLLM's ``--scheduling-policy`` cannot carry out raises
:class:`StartupRefused`: vLLM's engine core fails to start with that paragraph.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from policykit.config import EngineConfig
from policykit.errors import PolicykitError
from policykit.integrations.vllm.settings import (
    SUPPORTED_VERSIONS,
    VLLM_COMBO,
    combo_text,
    derived_combo,
    startup_check_enabled,
)
from policykit.registry import Combo, PolicyRegistry, format_combo, registry_from

logger = logging.getLogger("policykit.vllm")
#: the victim vLLM's ``--scheduling-policy priority`` path takes inline
PRIORITY_VICTIM = "vllm-priority"


class StartupRefused(RuntimeError):
    """The configured combo cannot run in this vLLM engine; the message says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"policykit vLLM scheduler refuses to start: {reason}")


def engine_config(scheduler: Any) -> EngineConfig:
    """The engine facts policies validate against: vLLM's block size and step token budget."""
    return EngineConfig(
        page_size=int(scheduler.block_size),
        chunked_prefill_size=int(scheduler.scheduler_config.max_num_batched_tokens),
    )


def resolve(
    text: str | None,
    config: EngineConfig | None = None,
    derived: Mapping[str, str] = VLLM_COMBO,
    scheduling_policy: str = "fcfs",
) -> tuple[Combo, PolicyRegistry]:
    """The combo ``text`` names over ``derived`` (vLLM's own decisions under the engine's
    configuration, ``settings.derived_combo``), from every installed policykit plugin
    (third-party included); refused where vLLM's ``scheduling_policy`` cannot carry it out."""
    try:
        registry = registry_from()
        combo = registry.resolve(derived, text, config=config)
    except PolicykitError as exc:
        raise StartupRefused(" ".join(str(exc).split())) from None
    if not combo.preempts:
        raise StartupRefused(
            f"the combo {combo} names the preemption policy {combo.preemption.spec!r}, which "
            "never preempts (SGLang's node), but vLLM's scheduler preempts a running request "
            "whenever a chunk cannot be allocated; name one that preempts (preemption="
            f"{derived['preemption']}, the default here)."
        )
    refuse_contradiction(combo, scheduling_policy)
    return combo, registry


def refuse_contradiction(combo: Combo, scheduling_policy: str) -> None:
    """Raise :class:`StartupRefused` where ``combo``'s victim is one vLLM's preemption path under
    ``--scheduling-policy scheduling_policy`` cannot take."""
    victim = combo.preemption.name
    if scheduling_policy == "priority" and victim != PRIORITY_VICTIM:
        raise StartupRefused(
            f"the combo {combo} names the preemption policy {combo.preemption.spec!r}, but this "
            "engine runs --scheduling-policy priority, whose preemption path picks its victim "
            "inline (max(self.running, key=(priority, arrival_time))) and gives back the "
            "budget of a victim scheduled earlier in the step; policykit cannot carry out "
            f"another choice there. Name preemption={PRIORITY_VICTIM} (the default here), or "
            "start vLLM with --scheduling-policy fcfs to choose the victim."
        )
    if scheduling_policy != "priority" and victim == PRIORITY_VICTIM:
        raise StartupRefused(
            f"the combo {combo} names the preemption policy {PRIORITY_VICTIM!r}, but this "
            f"engine runs --scheduling-policy {scheduling_policy}, whose preemption path takes "
            "its victim from running[-1] and can only take back a request after the one that "
            "needs the room; a priority victim scheduled earlier in the step would need the "
            "priority path's give-back. Start vLLM with --scheduling-policy priority for "
            "priority victims, or name preemption=vllm (the default here)."
        )


def check_lines(combo: Combo, registry: PolicyRegistry, config: EngineConfig) -> list[str]:
    """``policykit check``'s verdicts for ``combo`` on ``config``, one line per property (a
    property the checker refuses says why on its line)."""
    from policykit.spec.checkable import check_or_refuse
    from policykit.spec.checker import CheckOptions

    verdicts = check_or_refuse(combo, config, CheckOptions(), registry.sources(combo))
    return [
        f"policykit check: {combo}: {v.property} {v.label}" + (f": {v.note}" if v.note else "")
        for v in verdicts
    ]


def route_logs() -> None:
    """vLLM logs through a handler of its own on its ``vllm`` logger and leaves the root logger
    bare, so policykit's lines would be dropped (INFO) or printed without vLLM's format.
    Where nothing above ``policykit.vllm`` handles them, they go through vLLM's handler."""
    if logger.hasHandlers():
        return
    for handler in logging.getLogger("vllm").handlers:
        logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)


def warn_unchecked_version(installed: str | None = None) -> bool:
    """Say (a warning, once per engine) when the installed vLLM is none of the releases the
    decision points were checked on: its ``schedule()`` may ask them elsewhere, or decide
    something inline a policy here still answers. True when it warned."""
    if installed is None:
        import vllm

        installed = str(getattr(vllm, "__version__", "unknown"))
    if installed in SUPPORTED_VERSIONS:
        return False
    logger.warning(
        "policykit vLLM scheduler: vLLM %s is not a release its decision points were checked "
        "on (%s); the policies may decide where that release decides otherwise",
        installed,
        ", ".join(SUPPORTED_VERSIONS),
    )
    return True


def start(scheduler: Any) -> Combo:
    """Resolve the configured combo for ``scheduler`` and log what runs and what is proved."""
    route_logs()
    try:
        text = combo_text(scheduler.vllm_config.additional_config)
        derived = derived_combo(scheduler.vllm_config)
    except PolicykitError as exc:
        raise StartupRefused(" ".join(str(exc).split())) from None
    config = engine_config(scheduler)
    policy = scheduler.scheduler_config.policy
    combo, registry = resolve(text, config, derived, policy)
    own = f"vLLM's own decisions under this engine's configuration: {format_combo(derived)}"
    origin = own if text is None else f"configured as {text!r} over {own}"
    logger.info("policykit vLLM scheduler active with %s (%s; %s)", combo, origin, config)
    warn_unchecked_version()
    if startup_check_enabled():
        for line in check_lines(combo, registry, config):
            logger.info(line)
    return combo
