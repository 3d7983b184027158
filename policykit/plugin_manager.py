"""Building the plugin manager: built-ins, then installed plugins, minus the blocked ones.

There is no global manager. Each caller (the CLI, a test, the spec) builds its own with
:func:`make_plugin_manager` and passes it on, so a test that registers a plugin never leaks it
into another test.

Third-party plugins are modules or objects published under the ``policykit`` entry-point
group::

    [project.entry-points.policykit]
    my_policies = "my_package.policies"

``POLICYKIT_BLOCK_PLUGINS`` (comma-separated entry-point names, or built-in names such as
``policykit.plugins.chunking``) keeps plugins from loading at all.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from dataclasses import dataclass

import pluggy

from policykit import hookspecs
from policykit.errors import PluginError
from policykit.interpreter import shadowed_by

ENTRY_POINT_GROUP = "policykit"
BLOCK_ENV = "POLICYKIT_BLOCK_PLUGINS"
#: the built-in policies, loaded by module name as entry points load third-party ones: the
#: plugins sit a layer above this module, which therefore does not import them
#: (tests/test_layers.py keeps this list equal to the modules in ``plugins/``)
BUILTIN_PLUGINS = (
    "policykit.plugins.admission",
    "policykit.plugins.chunking",
    "policykit.plugins.alignment",
    "policykit.plugins.allocator_phase",
    "policykit.plugins.queue",
    "policykit.plugins.vllm",
    "policykit.plugins.vllm_preemption",
    "policykit.plugins.recompute_preemption",
)


@dataclass(frozen=True)
class PluginSource:
    """Where a plugin came from, for listings and error messages."""

    plugin_name: str
    distribution: str | None = None
    version: str | None = None

    def __str__(self) -> str:
        if self.distribution is None:
            return "built-in"
        return f"{self.distribution} {self.version}" if self.version else self.distribution


class PolicykitPluginManager(pluggy.PluginManager):
    """A pluggy manager that remembers which distribution each plugin came from."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT)
        self.add_hookspecs(hookspecs)
        self.sources: dict[str, PluginSource] = {}

    def source_of(self, plugin: object) -> PluginSource:
        name = self.get_name(plugin) or repr(plugin)
        return self.sources.get(name, PluginSource(name, "registered at run time", ""))

    def register_source(self, plugin: object, source: PluginSource) -> None:
        self.register(plugin, name=source.plugin_name)
        self.sources[source.plugin_name] = source


def blocked_names(environ: dict[str, str] | None = None) -> set[str]:
    raw = (os.environ if environ is None else environ).get(BLOCK_ENV, "")
    return {name.strip() for name in raw.split(",") if name.strip()}


def make_plugin_manager(
    *, entry_points: bool = True, environ: dict[str, str] | None = None
) -> PolicykitPluginManager:
    """A manager with the built-in policies and (by default) every installed plugin.

    Refuses first where the imported ``policykit`` is a folder that shadows the install
    (:func:`~policykit.interpreter.shadowed_by`): every entry point loads plugins before it
    decides anything, and the built-ins would fail on it with a bare ``ImportError``."""
    shadow = shadowed_by()
    if shadow is not None:
        raise PluginError(shadow)
    pm = PolicykitPluginManager()
    blocked = blocked_names(environ)
    for name in blocked:
        pm.set_blocked(name)
    for name in BUILTIN_PLUGINS:
        if name not in blocked:
            pm.register_source(importlib.import_module(name), PluginSource(name))
    if entry_points:
        _load_entry_points(pm, blocked)
    return pm


def _load_entry_points(pm: PolicykitPluginManager, blocked: set[str]) -> None:
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in blocked or pm.get_plugin(ep.name) is not None:
            continue
        dist = ep.dist
        source = PluginSource(
            ep.name,
            dist.metadata["Name"] if dist else "unknown distribution",
            dist.version if dist else "?",
        )
        try:
            plugin = ep.load()
        except Exception as exc:
            raise PluginError(
                f"The policykit plugin {ep.name!r} (entry point {ep.value!r} from {source}) "
                f"failed to import: {type(exc).__name__}: {exc}. Fix or uninstall that "
                f"distribution, or skip it with {BLOCK_ENV}={ep.name}."
            ) from exc
        try:
            pm.register_source(plugin, source)
        except (ValueError, pluggy.PluginValidationError) as exc:
            raise PluginError(
                f"The policykit plugin {ep.name!r} from {source} could not be registered: "
                f"{exc}. Skip it with {BLOCK_ENV}={ep.name}."
            ) from exc
