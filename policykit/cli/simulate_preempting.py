"""``policykit simulate`` for a combo that preempts: the scenario on vLLM's kind of node.

The rounds are :class:`~policykit.preempting.Step` records (what ``policykit conformance vllm``
compares with vLLM's own scheduler), so the table and the JSON differ from the ledger node's:
no ledger, but preemptions and blocks. A node that preempts never runs out of memory; its
failure is a request that never completes (preempted again and again, or admitted and then
stalled), which exits 3 as ``simulate`` does for the ledger node; one that completes but waited
more than ``--starvation-rounds`` rounds in a row (for its first chunk, or after a preemption
or a deferral) is starved and exits 5, as there.
"""

from __future__ import annotations

import sys
from dataclasses import asdict

import torch
from rich.table import Table
from rich.text import Text

from policykit.cli.common import echo_json
from policykit.cli.simulate_outcome import EXIT_STARVED, print_starved
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
    bounds: tuple[int, int],
    as_json: bool,
    device: torch.device,
) -> None:
    """Run ``sc`` under ``combo`` on a node that preempts (its block pool on ``device``), print
    it, and exit. ``bounds``: the most rounds to run, and the rounds a request may wait in a
    row before it counts as starved."""
    max_rounds, starvation_rounds = bounds
    sched, _ = prepare(sc, combo, pm=pm, device=device)
    try:
        steps = run(sched, len(sc.requests), max_rounds)
        fault = None
    except PolicyError as err:
        steps, fault = [], " ".join(str(err).split())
    finished = {r.id: r.finished_round for r in sched.node.finished}
    unfinished = [r.id for r in sc.requests if r.id not in finished]
    preemptions = sum(len(s.preempted) for s in steps)
    arrivals = {r.id: r.arrival_round for r in sc.requests}
    starved = longest_waits(steps, arrivals, finished, starvation_rounds)
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
                "starved": [{"id": k, "waited_rounds": v} for k, v in starved.items()],
                "starvation_rounds": starvation_rounds,
                "policy_fault": fault,
            },
            "policykit.simulate.preempting/1",
        )
    else:
        console = default_console()
        console.print(_table(steps, f"{sc.name} — {combo}"))
        for rid, waited in starved.items():
            console.print(f"starved:   {rid} waited {waited} rounds", style="yellow")
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
        print_starved(starved, starvation_rounds, console)
    if fault is not None:
        sys.exit(EXIT_POLICY_FAULT)
    if unfinished:
        sys.exit(EXIT_NEVER_COMPLETES)
    sys.exit(EXIT_STARVED if starved else 0)


def longest_waits(
    steps: list[Step], arrivals: dict[str, int], finished: dict[str, int | None], bound: int
) -> dict[str, int]:
    """Requests that went more than ``bound`` rounds in a row without a chunk between arriving
    and finishing (waiting for their first chunk, waiting again after a preemption, or
    deferred), with that longest run; one still unfinished counts to the last step, as the
    ledger node counts a request still waiting (``Scheduler.starved``). On this node a request
    can wait many times, so each stretch counts, not only the first."""
    last_served = {rid: max(at, 1) - 1 for rid, at in arrivals.items()}
    longest: dict[str, int] = dict.fromkeys(arrivals, 0)
    for step in steps:
        for rid in step.scheduled:
            longest[rid] = max(longest[rid], step.round - last_served[rid] - 1)
            last_served[rid] = step.round
    end = steps[-1].round if steps else 0
    for rid, at in arrivals.items():
        if finished.get(rid) is None and end >= max(at, 1):
            longest[rid] = max(longest[rid], end - last_served[rid] - 1)
    return {rid: waited for rid, waited in longest.items() if waited > bound}


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
