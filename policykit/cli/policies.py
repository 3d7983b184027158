"""``policykit policies``: every registered policy, by kind, with its source."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from policykit.cli.common import echo_json, json_option, load_registry
from policykit.policy import KINDS
from policykit.registry import DEFAULT_COMBO


@click.command()
@json_option
def policies(as_json: bool) -> None:
    """List every registered policy by kind, with its source and one-line doc."""
    _, registry = load_registry()
    rows = []
    for kind in KINDS:
        for entry in registry.entries(kind):
            param = entry.cls.parameter
            rows.append(
                {
                    "kind": kind,
                    "name": entry.name,
                    "parameter": None
                    if param is None
                    else {"name": param.name, "doc": param.doc, "required": param.required},
                    "default": DEFAULT_COMBO.get(kind) == entry.name,
                    "source": str(entry.source),
                    "plugin": entry.source.plugin_name,
                    "summary": entry.summary,
                }
            )
    if as_json:
        echo_json({"policies": rows})
        return
    table = Table(title="Registered policies", show_lines=False)
    for col in ("kind", "policy", "source", "what it does"):
        table.add_column(col, overflow="fold")
    for row in rows:
        name = row["name"] + (f":<{row['parameter']['name']}>" if row["parameter"] else "")
        if row["default"]:
            name += " (default)"
        table.add_row(row["kind"], name, row["source"], row["summary"])
    Console().print(table)
