"""``policykit docs``: regenerate the generated pages, then build the site with mkdocs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from policykit.cli.common import echo_json, json_option, load_registry, ray_address_option
from policykit.interpreter import python_argv

if TYPE_CHECKING:
    from policykit.docsgen.cli_reference import CommandLine

_PATH = click.Path(path_type=Path)


def command_line() -> CommandLine:
    """This command line, handed to docs generation (which does not import the CLI)."""
    from policykit.cli import EXIT_USAGE, main
    from policykit.docsgen.cli_reference import CommandLine

    argv = tuple(python_argv("-c", "from policykit.cli import main; main()"))
    return CommandLine(main, EXIT_USAGE, argv)


@click.command()
@click.option(
    "--results",
    "results_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Folder of check/bench results (*.json) to reuse, e.g. docs/generated/results of an "
    "earlier run. Without it, runs `check --all` and the CPU harness.",
)
@click.option(
    "--out",
    type=_PATH,
    default=None,
    help="Where the pages go. In a docs project: the generated folder [default: "
    "DOCS_DIR/generated; another one needs --no-build]. Elsewhere: the folder that receives "
    "the whole site project from the packaged config [default: ./policykit-docs].",
)
@click.option(
    "--config",
    type=_PATH,
    default=None,
    help="mkdocs config [default: ./mkdocs.yml; without one, the config packaged with "
    "policykit, unpacked into --out].",
)
@click.option("--site", type=_PATH, default=None, help="Built site [default: site/ by the config].")
@click.option(
    "--build/--no-build", default=True, show_default=True, help="Run mkdocs build --strict."
)
@click.option(
    "--workloads",
    default=None,
    help="Comma-separated production traces the comparison page leads with [default: "
    "mooncake-conversation]; 'none' for none. Bundled names or trace files.",
)
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="Where the traces' load sweep runs: a local process pool or a Ray cluster.",
)
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Local workers.")
@ray_address_option
@json_option
def docs(
    results_dir: Path | None,
    out: Path | None,
    config: Path | None,
    site: Path | None,
    build: bool,
    workloads: str | None,
    executor: str,
    workers: int | None,
    ray_address: str | None,
    as_json: bool,
) -> None:
    """Regenerate the policy reference, CLI reference, concept tables and comparison pages,
    then build the site offline with ``mkdocs build --strict``.

    Works from any folder: in a policykit checkout it builds the project's site; elsewhere
    (a plugin author's project) it builds a site of this environment's policies from the
    config packaged with policykit. Pages are written aside and swapped in only when
    everything succeeded, so a failed run keeps the previous pages and site. On a terminal a bar
    per step shows what runs, how far it is and the ETA (check --all: its combos).

    Results files are read through a per-kind adapter (check, bench); their provisional shape is
    on the docs' "Results files" page. Exit code 0: built; 2: bad input or a failed build.
    """
    from policykit.docsgen.site import TRACE_WORKLOADS, make_docs

    _, registry = load_registry()
    traces = TRACE_WORKLOADS if workloads is None else _workloads(workloads)
    report = make_docs(
        registry,
        cli=command_line(),
        config=config,
        out=out,
        results_dir=results_dir,
        site=site,
        build=build,
        workloads=traces,
        executor={"executor": executor, "workers": workers, "ray_address": ray_address},
        quiet=as_json,
    )
    if as_json:
        echo_json(report.to_dict())
        return
    for command, reason in report.skipped:
        click.echo(f"skipped {command}: {reason}")
    for command in report.ran:
        click.echo(f"ran policykit {command}")
    for note in report.notes:
        click.echo(f"note: {note}")
    click.echo(f"wrote {len(report.pages)} generated files to {report.out}")
    if report.site is not None:
        click.echo(f"built the site in {report.site}; open {report.site / 'index.html'}")


def _workloads(text: str) -> tuple[str, ...]:
    """``--workloads a,b``: each a bundled trace or a trace file; ``none`` for none."""
    from policykit.errors import PolicykitError
    from policykit.harness.trace_formats import is_trace_workload

    names = tuple(w.strip() for w in text.split(",") if w.strip())
    if names == ("none",):
        return ()
    bad = [n for n in names if not is_trace_workload(n)]
    if bad or not names:
        raise PolicykitError(
            f"--workloads {text!r}: {', '.join(map(repr, bad)) or 'nothing'} is not a production "
            "trace; give bundled names (mooncake-conversation, mooncake-synthetic, azure-code, "
            "azure-conv) or Mooncake/Azure trace files, comma-separated, or 'none'."
        )
    return names
