"""Start-up of the SGLang plugin: resolve the combo, validate it against the engine, log its proofs.

The combo is resolved twice: at plugin load (:func:`resolve`, no engine facts yet), so that an
unknown policy name stops the process at once; and after ``Scheduler.__init__``
(:func:`on_scheduler_ready`), against the page size and chunk size the scheduler runs with,
before its event loop serves anything. Either failure raises :class:`StartupRefused`, which
SGLang's scheduler process reports and which makes the engine exit.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from typing import Any

from policykit.config import EngineConfig
from policykit.errors import PolicykitError
from policykit.integrations.sglang import hooks, settings
from policykit.registry import Combo, PolicyRegistry, registry_from

logger = logging.getLogger("policykit.sglang")


class StartupRefused(RuntimeError):
    """The configured combo cannot run on this engine; the message says why, in one paragraph."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"policykit SGLang plugin refuses to start: {reason}")


def resolve(text: str, config: EngineConfig | None = None) -> tuple[Combo, PolicyRegistry]:
    """The combo ``text`` names, from every installed policykit plugin (third-party included)."""
    try:
        registry = registry_from()
        return registry.resolve(text, config=config), registry
    except PolicykitError as exc:
        raise StartupRefused(" ".join(str(exc).split())) from None


def engine_config(scheduler: Any) -> EngineConfig:
    """The engine facts policies validate against, read off a constructed ``Scheduler``
    (``max_prefill_tokens`` is left out: the start-up check is the default ``policykit
    check``, which has none)."""
    chunk = scheduler.chunked_prefill_size
    window = None
    if getattr(scheduler, "is_hybrid_swa", False):
        window = int(scheduler.sliding_window_size)
    return EngineConfig(
        page_size=int(scheduler.page_size),
        chunked_prefill_size=int(chunk) if chunk and chunk > 0 else 0,
        sliding_window=window,
    )


def checkable(config: EngineConfig) -> bool:
    """Whether the checker models this engine (a single paged pool with chunked prefill)."""
    return not config.hybrid_swa and config.chunked_prefill_size > 0


def as_sglang_runs(combo: Combo) -> Combo:
    """``combo`` as SGLang runs it: a queue policy that skips a request that can never fit is
    checked without the skip, since SGLang's scheduler loop stops at any refused request.

    The same policy object, its class swapped for a subclass that declares
    ``skips_never_fitting = False``: same order, same arguments, so a verdict logged in the
    engine is about what the engine does (``fcfs-skip`` is checked as ``fcfs``)."""
    queue = combo.queue
    if not queue.skips_never_fitting:
        return combo
    cls = type(queue)
    blocking = type(
        cls.__name__,
        (cls,),
        {"skips_never_fitting": False, "__module__": cls.__module__, "__doc__": cls.__doc__},
    )
    engine_queue = copy.copy(queue)
    engine_queue.__class__ = blocking
    return dataclasses.replace(combo, queue=engine_queue)


#: appended to a start-up verdict that was checked with the skip taken out
AS_SGLANG_RUNS = "(checked as SGLang runs the queue, where a refused request stops the round)"


def verdicts(combo: Combo, registry: PolicyRegistry, config: EngineConfig) -> list[Any]:
    """``policykit check``'s verdicts for ``combo`` as SGLang runs it (:func:`as_sglang_runs`)
    on ``config`` (default bounds and timeout)."""
    from policykit.spec.checker import CheckOptions, check_combo

    engine = as_sglang_runs(combo)
    return check_combo(engine, config, CheckOptions(), registry.sources(engine))


def check_lines(combo: Combo, registry: PolicyRegistry, config: EngineConfig) -> list[str]:
    """The start-up log: one line per property."""
    if not checkable(config):
        return [f"policykit check: {combo}: not checked (hybrid SWA or chunked prefill off)"]
    note = f" {AS_SGLANG_RUNS}" if combo.queue.skips_never_fitting else ""
    return [
        f"policykit check: {combo}: {v.property} {v.label}{note}"
        for v in verdicts(combo, registry, config)
    ]


def queue_line(combo: Combo) -> str:
    """What the combo's queue policy does in the engine: its order, but never a skip."""
    queue = combo.queue
    line = f"policykit SGLang plugin: the queue policy {queue.spec!r} orders the waiting queue"
    if not queue.skips_never_fitting:
        return line
    return (
        f"{line}, but does not skip a request that can never fit: in SGLang a refused request "
        "stops the round, so such a request at the head blocks the queue (as fcfs does)"
    )


def on_scheduler_ready(result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``Scheduler.__init__``: validate against the engine, log the proofs, activate."""
    try:
        text = settings.combo_text()
    except PolicykitError as exc:
        raise StartupRefused(" ".join(str(exc).split())) from None
    config = engine_config(scheduler)
    combo, registry = resolve(text, config)
    hooks.activate(combo)
    logger.info("policykit SGLang plugin active with %s (%s)", combo, config)
    # the head-of-line skip is the one queue decision the engine cannot take
    level = logging.WARNING if combo.queue.skips_never_fitting else logging.INFO
    logger.log(level, queue_line(combo))
    if settings.startup_check_enabled():
        for line in check_lines(combo, registry, config):
            logger.info(line)
