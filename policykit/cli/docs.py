"""``policykit docs``: regenerate the generated pages, then build the site with mkdocs."""

from __future__ import annotations

from pathlib import Path

import click

from policykit.cli.common import echo_json, json_option, load_registry

_PATH = click.Path(path_type=Path)


@click.command()
@click.option(
    "--results",
    "results_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Folder of check/bench results (*.json). Without it, runs the installed ones.",
)
@click.option(
    "--out", type=_PATH, default=None, help="Generated pages [default: DOCS_DIR/generated]."
)
@click.option(
    "--config", type=_PATH, default=Path("mkdocs.yml"), show_default=True, help="mkdocs config."
)
@click.option("--site", type=_PATH, default=None, help="Built site [default: site/ by the config].")
@click.option(
    "--build/--no-build", default=True, show_default=True, help="Run mkdocs build --strict."
)
@json_option
def docs(
    results_dir: Path | None,
    out: Path | None,
    config: Path,
    site: Path | None,
    build: bool,
    as_json: bool,
) -> None:
    """Regenerate the policy reference, CLI reference, concept tables and comparison pages,
    then build the site offline with ``mkdocs build --strict``.

    Results files are read through a per-kind adapter (check, bench); their provisional shape is
    on the docs' "Results files" page. Exit code 0: built; 2: bad input or a failed build.
    """
    from policykit.docsgen.site import make_docs

    _, registry = load_registry()
    report = make_docs(
        registry, config=config, out=out, results_dir=results_dir, site=site, build=build
    )
    if as_json:
        echo_json(report.to_dict())
        return
    for command, reason in report.skipped:
        click.echo(f"skipped {command}: {reason}")
    for command in report.ran:
        click.echo(f"ran policykit {command}")
    click.echo(f"wrote {len(report.pages)} generated files to {report.out}")
    if report.site is not None:
        click.echo(f"built the site in {report.site}")
