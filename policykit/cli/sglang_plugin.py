"""``policykit sglang-plugin --check``: can this machine's SGLang run the configured combo?"""

from __future__ import annotations

import datetime as dt
import sys

import click
from rich.console import Console
from rich.markup import escape

from policykit.cli.common import echo_json, json_option, named_combo
from policykit.config import EngineConfig
from policykit.errors import ComboError
from policykit.integrations.sglang import check, settings, startup
from policykit.integrations.sglang.check import Finding

EXIT_NOT_READY = 1


@click.command("sglang-plugin")
@click.option("--check", "do_check", is_flag=True, help="Run the readiness check (no GPU needed).")
@click.option(
    "--combo",
    default=None,
    help=f"Combo to check; default: ${settings.COMBO_ENV}, else the file ${settings.CONFIG_ENV}.",
)
@click.option(
    "--page-size", default=EngineConfig.page_size, show_default=True, type=click.IntRange(min=1)
)
@click.option(
    "--chunked-prefill-size",
    "--chunk-size",
    "chunked_prefill_size",
    default=EngineConfig.chunked_prefill_size,
    show_default=True,
    type=click.IntRange(min=1),
    help="SGLang's chunked_prefill_size, as `policykit check` takes it (same default; "
    "--chunk-size: its former name).",
)
@click.option("--prove/--no-prove", default=True, help="Run policykit check on the combo (z3).")
@json_option
def sglang_plugin(
    do_check: bool,
    combo: str | None,
    page_size: int,
    chunked_prefill_size: int,
    prove: bool,
    as_json: bool,
) -> None:
    """Check, without a GPU, that the installed SGLang is a supported version, that every hook
    target exists, and that the combo loads (and, with --prove, what policykit check proves).

    Exit code 0: ready; 1: not ready (a finding failed); 2: bad input.
    """
    if not do_check:
        raise ComboError("policykit sglang-plugin has one action: pass --check.")
    text = settings.combo_text() if combo is None else named_combo(combo)
    version = check.version_finding()
    # without SGLang every hook target is missing too: one finding says it, not six
    findings = [version, *check.target_findings()] if check.installed_version() else [version]
    config = EngineConfig(page_size, chunked_prefill_size)
    chosen, registry = _resolve(text, config)
    where = f"page size {page_size}, chunk size {chunked_prefill_size}"
    findings.append(Finding("combo", True, f"{chosen} loads and validates ({where})."))
    # not a failure: the engine runs, with SGLang's own waiting queue
    findings.append(Finding("queue", True, startup.queue_line(chosen).split(": ", 1)[1] + "."))
    proofs = startup.verdicts(chosen, registry, config) if prove else []
    ready = all(f.ok for f in findings)
    if as_json:
        echo_json(
            {
                "schema": "policykit.sglang-plugin-check/1",
                "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "ready": ready,
                "combo": chosen.as_dict(),
                "config": {"page_size": page_size, "chunked_prefill_size": chunked_prefill_size},
                "findings": [f.to_dict() for f in findings],
                "verdicts": [
                    {"property": v.property, "verdict": v.verdict, "label": v.label} for v in proofs
                ],
                # True when the queue's skip was taken out, as SGLang cannot take it
                "checked_as_sglang_runs": chosen.queue.skips_never_fitting,
            }
        )
    else:
        out = Console()
        for f in findings:
            mark = "[green]ok[/]" if f.ok else "[red]FAIL[/]"
            out.print(f"{mark}  {escape(f.name)}: {escape(f.detail)}", highlight=False)
        note = f" {startup.AS_SGLANG_RUNS}" if chosen.queue.skips_never_fitting else ""
        for v in proofs:
            out.print(f"      policykit check: {v.property} {v.label}{note}", highlight=False)
        out.print("ready" if ready else "[red]not ready[/]")
    if not ready:
        sys.exit(EXIT_NOT_READY)


def _resolve(text: str, config: EngineConfig) -> tuple:
    try:
        return startup.resolve(text, config)
    except startup.StartupRefused as exc:
        raise ComboError(str(exc)) from None
