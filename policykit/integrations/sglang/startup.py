"""Start-up of the SGLang plugin: resolve the combo, validate it against the engine, log its proofs.

The combo is resolved twice: at plugin load (:func:`resolve`, no engine facts yet), so that an
unknown policy name stops the process at once; and after ``Scheduler.__init__``
(:func:`on_scheduler_ready`), over the combo SGLang's server args amount to (the kinds the
configured combo leaves out, all of them when none is configured) and against the page size
and chunk size the scheduler runs with, before its event loop serves anything. Either failure
raises :class:`StartupRefused`, which SGLang's scheduler process reports and which makes the
engine exit.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from policykit.config import EngineConfig
from policykit.errors import PolicykitError
from policykit.integrations.sglang import defaults, hooks, settings
from policykit.registry import Combo, PolicyRegistry, parse_combo, registry_from

logger = logging.getLogger("policykit.sglang")


class StartupRefused(RuntimeError):
    """The configured combo cannot run on this engine; the message says why, in one paragraph."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"policykit SGLang plugin refuses to start: {reason}")


#: SGLang 0.5.23 on its default server args: the base of a combo checked before the scheduler
#: (and its server args) exists
SGLANG_FCFS = {**defaults.SGLANG_OWN, "alignment": "none", "queue": "fcfs"}


def resolve(
    text: str | None, config: EngineConfig | None = None, base: Mapping[str, str] | None = None
) -> tuple[Combo, PolicyRegistry]:
    """The combo ``text`` names over ``base`` (the kinds it leaves out; SGLang's own decisions
    when None), from every installed policykit plugin (third-party included)."""
    try:
        registry = registry_from()
        combo = registry.resolve(base or SGLANG_FCFS, text, config=config)
    except PolicykitError as exc:
        raise StartupRefused(" ".join(str(exc).split())) from None
    if combo.preempts:
        raise StartupRefused(
            f"the combo {combo} names the preemption policy {combo.preemption.spec!r}, which "
            "preempts (vLLM's node), but SGLang's prefill node under the plugin never preempts; "
            "leave preemption out (none, SGLang's)."
        )
    return combo, registry


def server_arg_combo(scheduler: Any) -> defaults.ServerArgCombo:
    """:func:`defaults.from_server_args`, a field the scheduler lacks refused in one paragraph."""
    try:
        return defaults.from_server_args(scheduler)
    except LookupError as exc:
        raise StartupRefused(f"{exc.args[0]}.") from None


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
    from policykit.spec.checkable import check_sglang_node
    from policykit.spec.checker import CheckOptions

    engine = as_sglang_runs(combo)
    return check_sglang_node(engine, config, CheckOptions(), registry.sources(engine))


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


def engine_combo(scheduler: Any) -> tuple[Combo, PolicyRegistry, EngineConfig, str]:
    """The combo the scheduler runs: the configured one over what SGLang's server args amount
    to (:func:`defaults.from_server_args`), the engine facts it was validated against
    (``max_prefill_tokens`` left out: the start-up check is the default ``policykit check``,
    which has none), and where the parts came from, for the log. Refused when the server args
    leave a kind nobody names unexpressible, or contradict the kinds named."""
    try:
        text = settings.configured_combo_text()
        named = parse_combo(text) if text is not None else {}
    except PolicykitError as exc:
        raise StartupRefused(" ".join(str(exc).split())) from None
    derived = server_arg_combo(scheduler)
    if (reason := defaults.contradiction(derived, named)) is not None:
        raise StartupRefused(f"{reason}.")
    combo, registry = resolve(text, derived.config, derived.combo)
    args = ", ".join(f"{k}={v}" for k, v in derived.read.items())
    origin = f"SGLang's server args {args}" + (f"; configured {text!r}" if text else "")
    return combo, registry, derived.config, origin


def on_scheduler_ready(result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``Scheduler.__init__``: validate against the engine, log the proofs, activate."""
    combo, registry, config, origin = engine_combo(scheduler)
    hooks.activate(combo)
    logger.info("policykit SGLang plugin active with %s (%s; %s)", combo, origin, config)
    # the head-of-line skip is the one queue decision the engine cannot take
    level = logging.WARNING if combo.queue.skips_never_fitting else logging.INFO
    logger.log(level, queue_line(combo))
    if settings.startup_check_enabled():
        for line in check_lines(combo, registry, config):
            logger.info(line)
