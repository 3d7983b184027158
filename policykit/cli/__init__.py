"""The ``policykit`` command line.

Each command lives in its own module and is imported only when invoked, so ``policykit
policies`` does not pay for z3 or the model. Every command accepts ``--json``. Errors caused by
input (:class:`~policykit.errors.PolicykitError`) print one paragraph and exit with code 2.
"""

from __future__ import annotations

import importlib
import sys

import click

from policykit.errors import PolicykitError

#: command name -> "module:attribute"
COMMANDS: dict[str, str] = {
    "bench": "policykit.cli.bench:bench",
    "check": "policykit.cli.check:check",
    "conformance": "policykit.cli.conformance:conformance",
    "docs": "policykit.cli.docs:docs",
    "plan-memory": "policykit.cli.plan_memory:plan_memory",
    "policies": "policykit.cli.policies:policies",
    "sglang-plugin": "policykit.cli.sglang_plugin:sglang_plugin",
    "simulate": "policykit.cli.simulate:simulate",
    "sweep": "policykit.cli.sweep:sweep",
}

EXIT_USAGE = 2


class LazyGroup(click.Group):
    """A group whose commands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except PolicykitError as exc:
            fail(str(exc))


def fail(message: str, code: int = EXIT_USAGE) -> None:
    """Print a one-paragraph error and exit (no traceback)."""
    click.echo(f"Error: {' '.join(message.split())}", err=True)
    sys.exit(code)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="policykit")
def main() -> None:
    """Pluggable, formally checked prefill scheduling policies for LLM serving engines."""
