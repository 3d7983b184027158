"""Start-up of the vLLM scheduler class: resolve the combo against the engine, log its proofs.

Runs once, in the scheduler's constructor, in vLLM's engine-core process, before anything is
served. A combo that does not resolve, or that would not preempt (vLLM's scheduler always
can), raises :class:`StartupRefused`: vLLM's engine core fails to start with that paragraph.
"""

from __future__ import annotations

import logging
from typing import Any

from policykit.config import EngineConfig
from policykit.errors import PolicykitError
from policykit.integrations.vllm.settings import VLLM_COMBO, combo_text, startup_check_enabled
from policykit.registry import Combo, PolicyRegistry, registry_from

logger = logging.getLogger("policykit.vllm")


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


def resolve(text: str | None, config: EngineConfig | None = None) -> tuple[Combo, PolicyRegistry]:
    """The combo ``text`` names over vLLM's own (``settings.VLLM_COMBO``), from every installed
    policykit plugin (third-party included)."""
    try:
        registry = registry_from()
        combo = registry.resolve(VLLM_COMBO, text, config=config)
    except PolicykitError as exc:
        raise StartupRefused(" ".join(str(exc).split())) from None
    if not combo.preempts:
        raise StartupRefused(
            f"the combo {combo} names the preemption policy {combo.preemption.spec!r}, which "
            "never preempts (SGLang's node), but vLLM's scheduler preempts a running request "
            "whenever a chunk cannot be allocated; name one that preempts (preemption=vllm, "
            "the default here)."
        )
    return combo, registry


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


def start(scheduler: Any) -> Combo:
    """Resolve the configured combo for ``scheduler`` and log what runs and what is proved."""
    route_logs()
    try:
        text = combo_text(scheduler.vllm_config.additional_config)
    except PolicykitError as exc:
        raise StartupRefused(" ".join(str(exc).split())) from None
    config = engine_config(scheduler)
    combo, registry = resolve(text, config)
    origin = "vLLM's own decisions" if text is None else f"configured as {text!r}"
    logger.info("policykit vLLM scheduler active with %s (%s; %s)", combo, origin, config)
    if scheduler.scheduler_config.policy != "fcfs":
        logger.warning(
            "policykit vLLM scheduler: the combo's queue policy %r and preemption policy %r "
            "replace --scheduling-policy %s (request priorities are not read)",
            combo.queue.spec,
            combo.preemption.spec,
            scheduler.scheduler_config.policy,
        )
    if startup_check_enabled():
        for line in check_lines(combo, registry, config):
            logger.info(line)
    return combo
