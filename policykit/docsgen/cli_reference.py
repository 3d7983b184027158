"""The CLI reference page, generated from the click commands themselves.

Commands are listed from :data:`policykit.cli.COMMANDS`, so a command another module adds
appears here with the help text it actually prints.
"""

from __future__ import annotations

from pathlib import Path

import click

from policykit.docsgen.markdown import GENERATED_BANNER, fence

#: the help is rendered at this width, independent of the terminal that builds the docs
HELP_WIDTH = 100


def command_help(command: click.Command, name: str, parent: click.Context | None = None) -> str:
    ctx = click.Context(
        command,
        info_name=name,
        parent=parent,
        terminal_width=HELP_WIDTH,
        max_content_width=HELP_WIDTH,
    )
    return command.get_help(ctx)


def cli_page() -> str:
    from policykit.cli import COMMANDS, EXIT_USAGE, main

    root = click.Context(main, info_name="policykit", terminal_width=HELP_WIDTH)
    parts = [
        GENERATED_BANNER,
        "# Command line\n\n",
        "Every command accepts `--json` and prints one JSON object with it. Errors caused by "
        f"input print one paragraph and exit with code {EXIT_USAGE}; other exit codes are listed "
        "per command.\n\n",
        fence(command_help(main, "policykit"), "text"),
        "\n",
    ]
    for name in sorted(COMMANDS):
        command = main.get_command(root, name)
        if command is None:
            continue
        parts.append(f"## `policykit {name}`\n\n")
        parts.append(fence(command_help(command, name, root), "text") + "\n")
    return "".join(parts)


def write_cli_page(out: Path) -> Path:
    path = out / "cli.md"
    path.write_text(cli_page(), encoding="utf-8")
    return path
