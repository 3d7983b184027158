"""Pieces shared by the commands: plugin loading with clean errors, JSON output."""

from __future__ import annotations

import json
from typing import Any

import click

from policykit.plugin_manager import PolicykitPluginManager, make_plugin_manager
from policykit.registry import PolicyRegistry


def load_registry() -> tuple[PolicykitPluginManager, PolicyRegistry]:
    """Build the plugin manager and registry (plugin errors surface as PolicykitError)."""
    pm = make_plugin_manager()
    return pm, PolicyRegistry.from_plugins(pm)


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
