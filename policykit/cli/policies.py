"""``policykit policies``: every registered policy, by kind, with its source."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table
from rich.text import Text

from policykit.cli.common import echo_json, json_option, load_registry
from policykit.policy import KINDS
from policykit.registry import DEFAULT_COMBO
from policykit.render import default_console, rest_text


@click.command()
@click.option("--verbose", "-v", is_flag=True, help="The whole docstring, not its first line.")
@json_option
def policies(verbose: bool, as_json: bool) -> None:
    """List every registered policy by kind, with its source and what it does.

    A name written `NAME:<x>` takes a parameter after a colon (checkpoint:256). Combine one
    policy per kind into a combo: ADMISSION/CHUNKING/ALIGNMENT[/ALLOCATOR-PHASE[/QUEUE]] (the
    queue defaults to fcfs, as in SGLang).
    """
    _, registry = load_registry()
    rows: list[dict[str, Any]] = []
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
                    "doc": entry.doc,
                }
            )
    if as_json:
        echo_json({"policies": rows}, "policykit.policies/1")
        return
    console = default_console()
    for kind in KINDS:
        table = Table(
            title=kind, title_justify="left", title_style="bold", box=None, show_header=False
        )
        table.add_column("policy", style="bold", no_wrap=True)
        table.add_column("what it does", overflow="fold")
        for row in (r for r in rows if r["kind"] == kind):
            name = row["name"] + (f":<{row['parameter']['name']}>" if row["parameter"] else "")
            if row["default"]:
                name += " (default)"
            text = rest_text(" ".join(row["doc"].split()) if verbose else row["summary"])
            if row["source"] != "built-in":
                text.append(f"  [{row['source']}]", style="dim")
            table.add_row(name, text)
        console.print(table)
        console.print()
    console.print(Text(f"combo: {'/'.join(KINDS[:3])}[/{KINDS[3]}]", style="dim"))
