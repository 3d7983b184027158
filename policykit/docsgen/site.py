"""``policykit docs`` end to end: gather results, write the generated pages, build the site.

Results come from ``--results DIR``, or, without it, from running the result-producing commands
that this installation has (``check``, ``bench``; see :data:`PRODUCERS`). The generated folder
is wiped and rewritten on every run, so a page for a policy that was uninstalled disappears;
to make that safe the folder carries a marker file and a folder without it is never wiped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from policykit.docsgen.cli_reference import write_cli_page
from policykit.docsgen.comparisons import write_comparisons
from policykit.docsgen.concepts import write_concept_tables
from policykit.docsgen.markdown import Provenance
from policykit.docsgen.policies import write_policies_page
from policykit.docsgen.results import (
    Results,
    ResultsError,
    load_results_dir,
    load_results_file,
    now_utc,
)
from policykit.docsgen.views import write_plugin_reference
from policykit.errors import PolicykitError
from policykit.registry import PolicyRegistry

MARKER = ".policykit-generated"


class DocsError(PolicykitError):
    """The docs could not be generated or built (bad paths, a failing producer, mkdocs)."""


@dataclass(frozen=True)
class Producer:
    """A command whose ``--json`` output the comparison pages read (schema: provisional)."""

    command: str
    args: tuple[str, ...]
    #: the JSON arrives on stdout (else the command writes the file named by ``{out}``)
    stdout: bool
    #: exit codes that still mean "results written" (a violation or a crash is a result)
    ok_codes: tuple[int, ...]


PRODUCERS: tuple[Producer, ...] = (
    Producer("check", ("check", "--all", "--json"), stdout=True, ok_codes=(0, 1, 3, 4)),
    Producer(
        "bench",
        (
            "bench",
            "--workload",
            "host-hit-heavy",
            "--all",
            "--device",
            "cpu",
            "--model",
            "tiny",
            "--out",
            "{out}",
        ),
        stdout=False,
        ok_codes=(0, 1),
    ),
)


@dataclass
class DocsReport:
    out: Path
    pages: list[Path] = field(default_factory=list)
    results: list[tuple[str, str]] = field(default_factory=list)  #: (file, kind)
    ran: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  #: (command, reason)
    site: Path | None = None

    def to_dict(self) -> dict:
        return {
            "out": str(self.out),
            "pages": [str(p) for p in self.pages],
            "results": [{"file": f, "kind": k} for f, k in self.results],
            "ran": self.ran,
            "skipped": [{"command": c, "reason": r} for c, r in self.skipped],
            "site": None if self.site is None else str(self.site),
        }


def docs_dir_of(config: Path) -> Path:
    """The ``docs_dir`` a mkdocs config names (default ``docs``), as an absolute path."""
    from mkdocs.utils.yaml import yaml_load

    try:
        with config.open(encoding="utf-8") as fh:
            data = yaml_load(fh) or {}
    except OSError as exc:
        raise DocsError(f"Cannot read the mkdocs config {str(config)!r}: {exc.strerror}.") from None
    return (config.parent / data.get("docs_dir", "docs")).resolve()


def prepare_out(out: Path) -> None:
    """Empty ``out`` for regeneration, refusing a non-empty folder we did not create."""
    if out.exists():
        if not (out / MARKER).exists() and any(out.iterdir()):
            raise DocsError(
                f"The output folder {str(out)!r} is not empty and was not written by `policykit "
                "docs` (no marker file); choose an empty or generated folder."
            )
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / MARKER).write_text("written by `policykit docs`; wiped on every run\n")


def run_producers(folder: Path, report: DocsReport) -> list[Results]:
    """Run each registered producer command, keeping its JSON under ``folder``."""
    from policykit.cli import COMMANDS

    folder.mkdir(parents=True, exist_ok=True)
    results: list[Results] = []
    for producer in PRODUCERS:
        if producer.command not in COMMANDS:
            report.skipped.append(
                (producer.command, f"`policykit {producer.command}` is not installed here")
            )
            continue
        target = folder / f"{producer.command}.json"
        args = [a.replace("{out}", str(target)) for a in producer.args]
        proc = subprocess.run(
            [sys.executable, "-c", "from policykit.cli import main; main()", *args],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode not in producer.ok_codes:
            raise DocsError(
                f"`policykit {' '.join(args)}` exited with code {proc.returncode}: "
                f"{proc.stderr.strip()[-800:] or proc.stdout.strip()[-800:]}"
            )
        if producer.stdout:
            target.write_text(proc.stdout, encoding="utf-8")
        try:
            results.extend(load_results_file(target))
        except ResultsError as exc:
            raise DocsError(
                f"`policykit {producer.command}` wrote results docs cannot read: {exc}"
            ) from None
        report.ran.append(producer.command)
    return results


def generate(
    registry: PolicyRegistry, out: Path, results: list[Results], report: DocsReport
) -> None:
    """Write every generated page into ``out`` (already prepared)."""
    here = Provenance(
        device="CPU",
        model=None,
        date=now_utc(),
        produced_by="`policykit docs` from the plugin registry of this environment",
        verb="Generated",
    )
    report.pages.append(write_policies_page(registry, out, here))
    report.pages.append(write_cli_page(out))
    report.pages.extend(write_concept_tables(registry, out))
    report.pages.extend(write_plugin_reference(out))
    report.pages.extend(write_comparisons(registry, results, out))


def build_site(config: Path, site: Path) -> None:
    """``mkdocs build --strict``, run in the config's folder (snippet paths are relative to it)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(config),
            "-d",
            str(site),
        ],
        cwd=config.parent,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise DocsError(
            f"`mkdocs build --strict` failed (exit {proc.returncode}): "
            f"{(proc.stderr or proc.stdout).strip()[-1500:]}"
        )


def make_docs(
    registry: PolicyRegistry,
    *,
    config: Path,
    out: Path | None = None,
    results_dir: Path | None = None,
    site: Path | None = None,
    build: bool = True,
) -> DocsReport:
    config = config.resolve()
    if not config.is_file():
        raise DocsError(f"There is no mkdocs config at {str(config)!r}; pass --config.")
    expected = docs_dir_of(config) / "generated"
    out = (out or expected).resolve()
    if build and out != expected:
        raise DocsError(
            f"The site's pages include the generated ones from {str(expected)!r}; writing them to "
            f"{str(out)!r} and building would show stale pages. Use --no-build with --out."
        )
    report = DocsReport(out)
    prepare_out(out)
    if results_dir is not None:
        results = load_results_dir(results_dir)
    else:
        results = run_producers(out / "results", report)
    report.results = [(str(r.source), r.kind) for r in results]
    generate(registry, out, results, report)
    if build:
        report.site = (site or config.parent / "site").resolve()
        build_site(config, report.site)
    return report
