"""Pieces shared by the commands: plugin loading with clean errors, JSON output."""

from __future__ import annotations

import json
from typing import Any

import click

from policykit.plugin_manager import PolicykitPluginManager, make_plugin_manager
from policykit.registry import PolicyRegistry


def load_registry() -> tuple[PolicykitPluginManager, PolicyRegistry]:
    """The plugin manager and registry for this invocation.

    A caller embedding the CLI (a test, a notebook) may pass its own manager as
    ``main(obj={"pm": pm})``; otherwise a fresh one with every installed plugin is built.
    Plugin errors surface as :class:`~policykit.errors.PluginError`.
    """
    ctx = click.get_current_context(silent=True)
    obj = ctx.find_root().obj if ctx is not None else None
    pm = obj.get("pm") if isinstance(obj, dict) else None
    if pm is None:
        pm = make_plugin_manager()
    return pm, PolicyRegistry.from_plugins(pm)


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")

#: where ``--executor ray`` connects; shared by every command that hands out units
ray_address_option = click.option(
    "--ray-address", default=None, help="Join this Ray cluster (e.g. auto) with --executor ray."
)
