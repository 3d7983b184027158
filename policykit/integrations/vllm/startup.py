"""Start-up of the vLLM scheduler class: resolve the combo against the engine, log its proofs.

Runs once, in the scheduler's constructor, in vLLM's engine-core process, before anything is
served. A vLLM release :data:`policykit.engines.RELEASES` does not list (unless
``POLICYKIT_ASSUME_VLLM`` names one to run it as), a listed release's unmodelled behaviour that
matters under the engine's settings for a combo that claims vLLM's decisions, a combo that does
not resolve, that would not preempt (vLLM's scheduler always can), or whose preemption victim
vLLM's ``--scheduling-policy`` cannot carry out raises :class:`StartupRefused`: vLLM's engine
core fails to start with that paragraph.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from policykit import engines
from policykit.config import EngineConfig
from policykit.errors import PolicykitError
from policykit.integrations.vllm.settings import (
    VLLM_COMBO,
    combo_text,
    derived_combo,
    engine_settings,
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


def release_of(
    installed: str | None = None, environ: Mapping[str, str] | None = None
) -> engines.Resolved:
    """The running vLLM's entry in :data:`policykit.engines.RELEASES` (or the one
    ``POLICYKIT_ASSUME_VLLM`` names, said in a warning): another release's ``schedule()`` may
    ask the decision points elsewhere, or decide inline what a policy here would answer, so an
    unlisted one is refused (:class:`StartupRefused`)."""
    if installed is None:
        import vllm

        installed = str(getattr(vllm, "__version__", None) or engines.installed_version("vllm"))
    try:
        used = engines.resolve("vllm", installed, environ)
    except engines.UnsupportedVersion as exc:
        raise StartupRefused(str(exc)) from None
    if used.assumption:
        logger.warning("policykit vLLM scheduler: %s", used.assumption)
    return used


def refuse_unmodelled(
    used: engines.Resolved, settings: Mapping[str, Any], combo: Combo | None
) -> None:
    """Raise :class:`StartupRefused` where ``combo`` (None: vLLM's own decisions) claims vLLM's
    decisions and a behaviour of the running release that no combo expresses matters under the
    engine's ``settings`` (:func:`policykit.engines.unmodelled_refusal`)."""
    if combo is not None and not engines.claims(combo.as_dict()):
        return
    name = "vLLM's own decisions" if combo is None else str(combo)
    refusal = engines.unmodelled_refusal(used, settings, name)
    if refusal is not None:
        raise StartupRefused(refusal)


def start(scheduler: Any) -> Combo:
    """Resolve the configured combo for ``scheduler`` and log what runs and what is proved."""
    route_logs()
    used = release_of()
    settings = engine_settings(scheduler.vllm_config)
    try:
        text = combo_text(scheduler.vllm_config.additional_config)
        if text is None:  # before the derivation, which may refuse a setting less clearly
            refuse_unmodelled(used, settings, None)
        derived = derived_combo(scheduler.vllm_config)
    except PolicykitError as exc:
        raise StartupRefused(" ".join(str(exc).split())) from None
    config = engine_config(scheduler)
    policy = scheduler.scheduler_config.policy
    combo, registry = resolve(text, config, derived, policy)
    refuse_unmodelled(used, settings, combo)
    own = f"vLLM's own decisions under this engine's configuration: {format_combo(derived)}"
    origin = own if text is None else f"configured as {text!r} over {own}"
    logger.info(
        "policykit vLLM scheduler active with %s on vLLM %s (%s; %s)",
        combo,
        used.installed,
        origin,
        config,
    )
    if startup_check_enabled():
        for line in check_lines(combo, registry, config):
            logger.info(line)
    return combo
