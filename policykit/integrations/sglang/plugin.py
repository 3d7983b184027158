"""The entry point SGLang's ``load_plugins()`` runs: register policykit's hooks.

Registered in ``pyproject.toml`` under ``[project.entry-points."sglang.srt.plugins"]`` as
``policykit``. SGLang calls :func:`load` in every process that loads plugins (the engine's
main process, each scheduler, the detokenizer) and then applies the registered hooks; the hooks
only ever run in the scheduler, where ``PrefillAdder`` lives.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from policykit.errors import PolicykitError
from policykit.integrations.sglang import hooks, order, settings, startup
from policykit.registry import Combo

logger = logging.getLogger("policykit.sglang")

SCHEDULER_INIT = "sglang.srt.managers.scheduler.Scheduler.__init__"


def load() -> None:
    """Resolve the configured combo, if any, and register the decision hooks (no-op unless
    enabled).

    SGLang catches and logs an ``Exception`` raised by a plugin and serves on without it, which
    would silently run upstream's rules under a combo the user believes is active. A combo that
    does not resolve therefore raises :class:`SystemExit` with the reason: the process stops
    before serving.
    """
    if not settings.named_in_allow_list():
        logger.info(
            "policykit SGLang plugin installed but not enabled (SGLANG_PLUGINS does not name %r)",
            settings.PLUGIN_NAME,
        )
        return
    try:
        text = settings.configured_combo_text()
        combo = None if text is None else startup.resolve(text)[0]
    except startup.StartupRefused as exc:
        raise SystemExit(str(exc)) from None
    except PolicykitError as exc:
        raise SystemExit(str(startup.StartupRefused(" ".join(str(exc).split())))) from None
    # active from now on; the scheduler resolves it again over its server args, against its
    # page and chunk sizes (without a combo the hooks pass every call to SGLang until then)
    hooks.activate(combo)
    register()
    what = "the combo SGLang's server args amount to" if combo is None else combo
    logger.info("policykit SGLang plugin registered its hooks for %s", what)


def register() -> None:
    """Register every hook with SGLang's ``HookRegistry`` (applied by ``load_plugins``)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    register_decision_hooks()
    HookRegistry.register(SCHEDULER_INIT, startup.on_scheduler_ready, HookType.AFTER)


def register_decision_hooks() -> None:
    """The decision hooks alone, the queue order and ``PrefillAdder``'s three (what a driver
    without a ``Scheduler`` needs)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(order.ORDER, order.order_queue, HookType.AROUND)
    HookRegistry.register(hooks.RESUME, hooks.resume_chunked, HookType.AROUND)
    HookRegistry.register(hooks.SELECT, hooks.select_admission, HookType.AROUND)
    HookRegistry.register(hooks.COMMIT, hooks.commit_admission, HookType.AFTER)


#: every decision target, in the order the scheduler meets them in a round
DECISION_TARGETS = (order.ORDER, *hooks.DECISION_TARGETS)


def decision_methods() -> dict[tuple[type, str], Any]:
    """Each hooked method as its class holds it now, keyed by (class, name): what to put back
    with :func:`restore`."""
    from sglang.srt.managers import schedule_policy

    found = {}
    for target in DECISION_TARGETS:
        cls_name, name = target.rsplit(".", 2)[1:]
        cls = getattr(schedule_policy, cls_name)
        found[cls, name] = cls.__dict__[name]
    return found


def restore(methods: dict[tuple[type, str], Any]) -> None:
    """Put ``methods`` (from :func:`decision_methods`) back on their classes."""
    for (cls, name), method in methods.items():
        setattr(cls, name, method)


@contextmanager
def applied(combo: Combo) -> Iterator[None]:
    """The decision hooks applied in this process through SGLang's ``HookRegistry``, asking
    ``combo``; upstream's methods are put back on exit.

    For drivers that run ``PrefillAdder`` without a ``Scheduler`` (the conformance driver, the
    tests, the benchmark); an engine gets the same hooks from :func:`load`.
    """
    from sglang.srt.plugins.hook_registry import HookRegistry

    saved = decision_methods()
    HookRegistry.reset()
    register_decision_hooks()
    HookRegistry.apply_hooks()
    hooks.activate(combo)
    try:
        yield
    finally:
        restore(saved)
        HookRegistry.reset()
        hooks.activate(None)
