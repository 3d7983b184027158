"""The CLI reference page, generated from the click commands themselves.

Commands are listed from the command group ``policykit docs`` hands in (a
:class:`CommandLine`), so a command another module adds appears here with the help text it
actually prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from policykit.docsgen.markdown import GENERATED_BANNER, fence

#: the help is rendered at this width, independent of the terminal that builds the docs
HELP_WIDTH = 100


@dataclass(frozen=True)
class CommandLine:
    """The ``policykit`` command line, as docs generation sees it.

    The CLI sits a layer above docs generation (``policykit docs`` calls into this package),
    so docs generation never imports it: the command hands itself in instead
    (:func:`policykit.cli.docs.command_line`)."""

    group: click.Group
    #: the exit code of an input error, stated on the reference page
    exit_usage: int
    #: what runs the command line in a fresh interpreter, before the command's arguments
    argv: tuple[str, ...]

    def names(self) -> list[str]:
        """Every command's name, sorted (as ``policykit --help`` lists them)."""
        return self.group.list_commands(click.Context(self.group))


def command_help(command: click.Command, name: str, parent: click.Context | None = None) -> str:
    ctx = click.Context(
        command,
        info_name=name,
        parent=parent,
        terminal_width=HELP_WIDTH,
        max_content_width=HELP_WIDTH,
    )
    return command.get_help(ctx)


def cli_page(cli: CommandLine) -> str:
    main = cli.group
    root = click.Context(main, info_name="policykit", terminal_width=HELP_WIDTH)
    parts = [
        GENERATED_BANNER,
        "# Command line\n\n",
        "Every command accepts `--json` and prints one JSON object with it. Errors caused by "
        f"input print one paragraph and exit with code {cli.exit_usage}; other exit codes are "
        "listed per command.\n\n",
        fence(command_help(main, "policykit"), "text"),
        "\n",
    ]
    for name in cli.names():
        command = main.get_command(root, name)
        if command is None:
            continue
        parts.append(f"## `policykit {name}`\n\n")
        parts.append(fence(command_help(command, name, root), "text") + "\n")
    return "".join(parts)


def write_cli_page(out: Path, cli: CommandLine) -> Path:
    path = out / "cli.md"
    path.write_text(cli_page(cli), encoding="utf-8")
    return path
