"""The ``policykit`` command line.

Each command lives in its own module and is imported only when invoked, so ``policykit
policies`` does not pay for z3 or the model. Every command accepts ``--json`` (a flag: one JSON
document on stdout, with ``schema`` and ``created``). Errors caused by input
(:class:`~policykit.errors.PolicykitError`, or a usage error) print one paragraph and exit with
code 2; under ``--json`` that paragraph is a JSON document on stderr, the exit code unchanged.
"""

from __future__ import annotations

import importlib
import json
import sys

import click

from policykit.documents import stamped
from policykit.errors import PolicykitError

#: command name -> "module:attribute"
COMMANDS: dict[str, str] = {
    "bench": "policykit.cli.bench:bench",
    "check": "policykit.cli.check:check",
    "conformance": "policykit.cli.conformance:conformance",
    "plugins": "policykit.cli.plugins:plugins",
    "docs": "policykit.cli.docs:docs",
    "findings": "policykit.cli.findings:findings",
    "plan-memory": "policykit.cli.plan_memory:plan_memory",
    "policies": "policykit.cli.policies:policies",
    "sglang-plugin": "policykit.cli.sglang_plugin:sglang_plugin",
    "simulate": "policykit.cli.simulate:simulate",
    "sweep": "policykit.cli.sweep:sweep",
}

EXIT_USAGE = 2
_JSON_KEY = "policykit.json"


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

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # remembered before parsing, so that even a usage error can be reported as JSON
        ctx.meta[_JSON_KEY] = "--json" in args
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context):
        as_json = bool(ctx.meta.get(_JSON_KEY))
        try:
            return super().invoke(ctx)
        except PolicykitError as exc:
            fail(str(exc), as_json=as_json)
        except click.ClickException as exc:
            if not as_json:
                raise
            fail(exc.format_message(), exc.exit_code, as_json=True)


def fail(message: str, code: int = EXIT_USAGE, *, as_json: bool = False) -> None:
    """Print a one-paragraph error (a JSON document under ``--json``) and exit; no traceback."""
    text = " ".join(message.split())
    if as_json:
        error = {"error": text, "exit_code": code}
        click.echo(json.dumps(stamped(error, "policykit.error/1"), indent=2), err=True)
    else:
        click.echo(f"Error: {text}", err=True)
    sys.exit(code)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="policykit")
def main() -> None:
    """Pluggable, formally checked prefill scheduling policies for LLM serving engines."""
