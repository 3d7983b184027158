"""``policykit simulate`` for a combo that preempts: the scenario on vLLM's kind of node.

The rounds are :class:`~policykit.preempting.Step` records (what ``policykit conformance vllm``
compares with vLLM's own scheduler), so the table and the JSON differ from the ledger node's:
no ledger, but preemptions and blocks. A node that preempts never runs out of memory; its
failure is a request that never completes (preempted again and again, or admitted and then
stalled), which exits 3 as ``simulate`` does for the ledger node.
"""

from __future__ import annotations

import sys
from dataclasses import asdict

import torch
from rich.table import Table
from rich.text import Text

from policykit.cli.common import echo_json
from policykit.errors import PolicyError
from policykit.plugin_manager import PolicykitPluginManager
from policykit.preempting import Step
from policykit.preempting_scenario import prepare, run
from policykit.registry import Combo
from policykit.render import default_console
from policykit.scenario import Scenario

EXIT_NEVER_COMPLETES = 3
EXIT_POLICY_FAULT = 4


def simulate_preempting(
    sc: Scenario,
    combo: Combo,
    pm: PolicykitPluginManager,
    max_rounds: int,
    as_json: bool,
    device: torch.device,
) -> None:
    """Run ``sc`` under ``combo`` on a node that preempts (its block pool on ``device``), print
    it, and exit."""
    sched, _ = prepare(sc, combo, pm=pm, device=device)
    try:
        steps = run(sched, len(sc.requests), max_rounds)
        fault = None
    except PolicyError as err:
        steps, fault = [], " ".join(str(err).split())
    finished = {r.id: r.finished_round for r in sched.node.finished}
    unfinished = [r.id for r in sc.requests if r.id not in finished]
    preemptions = sum(len(s.preempted) for s in steps)
    if as_json:
        echo_json(
            {
                "scenario": sc.name,
                "combo": combo.as_dict(),
                "node": "preempting",
                "rounds": [asdict(s) for s in steps],
                "finished_round": finished,
                "unfinished": unfinished,
                "preemptions": preemptions,
                "policy_fault": fault,
            },
            "policykit.simulate.preempting/1",
        )
    else:
        console = default_console()
        console.print(_table(steps, f"{sc.name} — {combo}"))
        if fault is not None:
            console.print(Text(f"Policy fault (exit {EXIT_POLICY_FAULT}): {fault}", style="red"))
        elif unfinished:
            console.print(
                Text(
                    f"Never completed: {', '.join(unfinished)} after {len(steps)} rounds and "
                    f"{preemptions} preemption(s).",
                    style="bold red",
                )
            )
        else:
            console.print(
                Text(
                    f"All {len(finished)} requests completed in {len(steps)} rounds, "
                    f"{preemptions} preemption(s).",
                    style="bold green",
                )
            )
    if fault is not None:
        sys.exit(EXIT_POLICY_FAULT)
    sys.exit(EXIT_NEVER_COMPLETES if unfinished else 0)


def _table(steps: list[Step], title: str) -> Table:
    table = Table(title=title)
    for column in ("round", "scheduled", "preempted", "completed", "released", "blocks used"):
        table.add_column(column)
    for s in steps:
        table.add_row(
            str(s.round),
            " ".join(f"{rid}:{n}" for rid, n in s.scheduled.items()),
            " ".join(s.preempted),
            " ".join(s.completed),
            " ".join(s.released),
            f"{s.blocks_used}/{s.blocks_used + s.blocks_free}",
        )
    return table
