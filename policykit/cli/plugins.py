"""``policykit plugins``: every loaded plugin, the distribution it came from, its hooks and the
policies it registered; the first thing to run when a policy is missing or behaves oddly."""

from __future__ import annotations

import importlib.metadata

import click
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from policykit.cli.common import echo_json, json_option, load_registry
from policykit.plugin_manager import PolicykitPluginManager
from policykit.registry import PolicyRegistry
from policykit.render import default_console


def plugin_rows(pm: PolicykitPluginManager, registry: PolicyRegistry) -> list[dict]:
    """One record per registered plugin, in registration order."""
    own_version = importlib.metadata.version("policykit")
    rows = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None:  # blocked with POLICYKIT_BLOCK_PLUGINS
            continue
        source = pm.source_of(plugin)
        built_in = source.distribution is None
        callers = pm.get_hookcallers(plugin) or []
        rows.append(
            {
                "plugin": name,
                "distribution": "policykit" if built_in else source.distribution,
                "version": own_version if built_in else source.version,
                "built_in": built_in,
                "hooks": sorted(caller.name for caller in callers),
                "policies": [
                    f"{e.kind}:{e.name}" for e in registry.entries() if e.source.plugin_name == name
                ],
            }
        )
    return rows


@click.command()
@json_option
def plugins(as_json: bool) -> None:
    """List every loaded plugin: distribution, version, hooks implemented, policies registered.

    Built-in policies come from policykit's own plugin modules. Skip an installed plugin with
    POLICYKIT_BLOCK_PLUGINS=NAME[,NAME...].
    """
    pm, registry = load_registry()
    rows = plugin_rows(pm, registry)
    if as_json:
        echo_json({"plugins": rows}, "policykit.plugins/1")
        return
    console = default_console()
    for row in rows:
        dist = f"{row['distribution']} {row['version']}"
        if row["built_in"]:
            dist += ", built-in"
        console.print(Text.assemble((row["plugin"], "bold"), f" ({dist})"))
        lines = [("hooks", ", ".join(h.removeprefix("policykit_") for h in row["hooks"]) or "-")]
        lines += _by_kind(row["policies"])
        table = Table(box=None, show_header=False, pad_edge=False)
        table.add_column("what", style="dim", no_wrap=True)
        table.add_column("names", overflow="fold")
        for what, names in lines:
            table.add_row(f"{what}:", names)
        console.print(Padding(table, (0, 0, 0, 2)))


def _by_kind(policies: list[str]) -> list[tuple[str, str]]:
    """``["admission:a", "admission:b"]`` -> ``[("admission", "a, b")]``."""
    kinds: dict[str, list[str]] = {}
    for item in policies:
        kind, _, name = item.partition(":")
        kinds.setdefault(kind, []).append(name)
    return [(kind, ", ".join(names)) for kind, names in kinds.items()]
