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

from policykit.errors import PolicykitError
from policykit.integrations.sglang import hooks, settings, startup
from policykit.registry import Combo

logger = logging.getLogger("policykit.sglang")

SCHEDULER_INIT = "sglang.srt.managers.scheduler.Scheduler.__init__"


def load() -> None:
    """Resolve the configured combo and register the decision hooks (no-op unless enabled).

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
        combo, _ = startup.resolve(settings.combo_text())
    except startup.StartupRefused as exc:
        raise SystemExit(str(exc)) from None
    except PolicykitError as exc:
        raise SystemExit(str(startup.StartupRefused(" ".join(str(exc).split())))) from None
    # active from now on; the scheduler re-validates it against its page and chunk sizes
    hooks.activate(combo)
    register()
    logger.info("policykit SGLang plugin registered its hooks for %s", combo)


def register() -> None:
    """Register every hook with SGLang's ``HookRegistry`` (applied by ``load_plugins``)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    register_decision_hooks()
    HookRegistry.register(SCHEDULER_INIT, startup.on_scheduler_ready, HookType.AFTER)


def register_decision_hooks() -> None:
    """The three ``PrefillAdder`` hooks alone (what a driver without a ``Scheduler`` needs)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(hooks.RESUME, hooks.resume_chunked, HookType.AROUND)
    HookRegistry.register(hooks.SELECT, hooks.select_admission, HookType.AROUND)
    HookRegistry.register(hooks.COMMIT, hooks.commit_admission, HookType.AFTER)


DECISION_METHODS = ("_select_prefill_admission", "_commit_prefill_admission", "add_chunked_req")


@contextmanager
def applied(combo: Combo) -> Iterator[None]:
    """The decision hooks applied in this process through SGLang's ``HookRegistry``, asking
    ``combo``; upstream's methods are put back on exit.

    For drivers that run ``PrefillAdder`` without a ``Scheduler`` (the conformance driver, the
    tests, the benchmark); an engine gets the same hooks from :func:`load`.
    """
    from sglang.srt.managers.schedule_policy import PrefillAdder
    from sglang.srt.plugins.hook_registry import HookRegistry

    saved = {name: PrefillAdder.__dict__[name] for name in DECISION_METHODS}
    HookRegistry.reset()
    register_decision_hooks()
    HookRegistry.apply_hooks()
    hooks.activate(combo)
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(PrefillAdder, name, method)
        HookRegistry.reset()
        hooks.activate(None)
