"""The run tables of the Concepts pages, produced by real scheduler runs at docs-build time.

Each :class:`ConceptRun` becomes ``generated/concepts/<slug>.md``; the hand-written concept
pages pull them in with ``--8<--`` (pymdownx.snippets). The incident page also shows the literal
terminal output of ``policykit simulate``, captured by invoking the command itself.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from click.testing import CliRunner

from policykit.docsgen.cli_reference import CommandLine
from policykit.docsgen.markdown import GENERATED_BANNER, fence
from policykit.docsgen.replay import replay, rounds_markdown, scenario_from
from policykit.docsgen.results import now_utc
from policykit.registry import PolicyRegistry

#: docs-owned scenario of the hybrid-SWA resume (docs/incidents.md#swa-resume); the
#: truncated-tail ones are bundled
HYBRID_SWA = Path(__file__).with_name("scenarios") / "hybrid-swa.json"
#: wide enough that rich does not fold the round table of ``simulate``
TERMINAL_COLUMNS = "150"


@dataclass(frozen=True)
class ConceptRun:
    slug: str
    scenario: str
    combo: str
    #: also capture the terminal output of ``policykit simulate`` for this run
    show_cli: bool = False


CONCEPT_RUNS: tuple[ConceptRun, ...] = (
    ConceptRun("abc-sglang-page", "seed-abc", "admission=sglang,alignment=page"),
    ConceptRun("abc-sglang-checkpoint", "seed-abc", "admission=sglang,alignment=checkpoint:256"),
    ConceptRun(
        "abc-reserve-tail-checkpoint", "seed-abc", "admission=reserve-tail,alignment=checkpoint:256"
    ),
    ConceptRun(
        "1keim-sglang",
        "seed-incident-1keim",
        "admission=sglang,chunking=sglang,alignment=checkpoint:256",
        show_cli=True,
    ),
    ConceptRun(
        "1keim-reserve-tail",
        "seed-incident-1keim",
        "admission=reserve-tail,chunking=sglang,alignment=checkpoint:256",
        show_cli=True,
    ),
    ConceptRun("swa-pre-fix", str(HYBRID_SWA), "chunking=sglang-pre-swa-fix"),
    ConceptRun("swa-swa-reserve", str(HYBRID_SWA), "chunking=swa-reserve"),
    ConceptRun("swa-sglang", str(HYBRID_SWA), "chunking=sglang"),
)


def simulate_cli_output(cli: CommandLine, scenario: str, combo: str) -> tuple[str, str]:
    """The command line and what ``policykit simulate`` prints for it (exit code appended)."""
    args = ["simulate", scenario, "--combo", combo]
    result = CliRunner().invoke(cli.group, args, env={"COLUMNS": TERMINAL_COLUMNS})
    if result.exit_code not in (0, 1):
        raise RuntimeError(f"policykit {shlex.join(args)} failed: {result.output}")
    shown = scenario if not Path(scenario).is_absolute() else Path(scenario).name
    command = "policykit " + shlex.join(["simulate", shown, "--combo", combo])
    lines = [line.rstrip() for line in result.output.rstrip().splitlines()]
    return command, "\n".join(lines) + f"\n$ echo $?\n{result.exit_code}"


def write_concept_tables(registry: PolicyRegistry, out: Path, cli: CommandLine) -> list[Path]:
    """Write one page fragment per :data:`CONCEPT_RUNS` entry under ``out/concepts``."""
    folder = out / "concepts"
    folder.mkdir(parents=True, exist_ok=True)
    stamp = f"Simulated on CPU (scheduler only, no model) by `policykit docs`, {now_utc()}."
    written = []
    for run in CONCEPT_RUNS:
        scenario = scenario_from(run.scenario)
        done = replay(scenario, run.combo, registry)
        text = (
            GENERATED_BANNER
            + f"`--combo {run.combo}` · <small>{stamp}</small>\n\n"
            + rounds_markdown(done)
        )
        if run.show_cli:
            command, output = simulate_cli_output(cli, run.scenario, run.combo)
            text += (
                f'\n??? example "The same run in the terminal: `{command}`"\n'
                + "\n".join(
                    "    " + line
                    for line in fence(f"$ {command}\n{output}", "console").splitlines()
                )
                + "\n"
            )
        path = folder / f"{run.slug}.md"
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
