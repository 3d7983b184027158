"""How a ``simulate`` run ends: run to its end, its exit code and the red line that says a policy
failed it.

Shared by ``simulate SCENARIO`` and ``simulate --workload`` (:mod:`.simulate_workload`), which
report a run the same way whatever it replayed.
"""

from __future__ import annotations

from rich.text import Text

from policykit.errors import PolicyError
from policykit.run_progress import RunProgress
from policykit.scheduler import RunResult, Scheduler

EXIT_OOM = 1
EXIT_NEVER_COMPLETES = 3
EXIT_POLICY_FAULT = 4
#: a request waited more than ``--starvation-rounds`` rounds, or more than ``--overtaking``
#: later arrivals were admitted ahead of it (the run itself may have ended well)
EXIT_STARVED = 5


def print_faults(result: RunResult, console) -> None:
    """One red line under the summary saying a policy fault failed the run (the reasons are on
    the ``failed:`` lines above): a CI log shows why ``simulate`` exited non-zero."""
    if not result.policy_faults:
        return
    who = [r for r in result.policy_faults if r != "*"]
    said = f"a policy failed {', '.join(who)} (reasons above)" if who else ""
    stopped = result.policy_faults.get("*")
    if stopped is not None:
        said += ("; " if said else "") + f"a policy stopped the run: {stopped}"
    console.print(Text(f"Policy fault (exit {EXIT_POLICY_FAULT}): {said}.", style="bold red"))


def print_starved(starved: dict[str, int], bound: int, console) -> None:
    """One red line saying which requests waited past ``--starvation-rounds`` and that the run
    fails for it (each is also on its own ``starved:`` line): a starved request fails a CI gate
    even when everything completed in the end."""
    if not starved:
        return
    who = ", ".join(f"{rid} ({waited} rounds)" for rid, waited in starved.items())
    console.print(
        Text(
            f"Starved (exit {EXIT_STARVED}): {who} waited more than {bound} rounds "
            "(--starvation-rounds).",
            style="bold red",
        )
    )


def print_overtaken(result: RunResult, console) -> None:
    """One ``overtaken:`` line per request passed over by more later arrivals than
    ``--overtaking`` allows, and one red line saying the run fails for it (exit 5, as a
    starved request: both are a fairness gate, issue 33)."""
    if not result.overtaken:
        return
    for o in result.overtaken.values():
        console.print(
            Text(f"overtaken: {o.request} by {len(o.by)} later arrivals: {o.message}", "yellow")
        )
    who = ", ".join(f"{o.request} ({len(o.by)})" for o in result.overtaken.values())
    console.print(
        Text(
            f"Overtaken (exit {EXIT_STARVED}): {who} passed over by more than "
            f"{result.overtaking_bound} later arrivals (--overtaking).",
            style="bold red",
        )
    )


def exit_code(result: RunResult) -> int:
    """:func:`code_of` a run; a request overtaken beyond the bound counts as starved."""
    stuck = result.never_completes is not None or result.starvation is not None
    starved = bool(result.starved) or bool(result.overtaken)
    return code_of(result.oom is not None, bool(result.policy_faults), stuck, starved=starved)


def code_of(oom: bool, policy_fault: bool, stuck: bool, *, starved: bool = False) -> int:
    """1 for an OOM (the worse failure, and the one that ends a run), else 4 for a policy
    fault (a broken plugin must not pass a CI gate), else 3 for an admitted request that can
    never complete or a waiting request that starves forever (``stuck``), else 5 for a request
    that waited more than ``--starvation-rounds`` rounds (``starved``: served late, or still
    waiting when the run stopped), else 0. The bound is a fairness gate: a queue that serves
    everything eventually can still starve one request for the whole run (issue 33)."""
    if oom:
        return EXIT_OOM
    if policy_fault:
        return EXIT_POLICY_FAULT
    if stuck:
        return EXIT_NEVER_COMPLETES
    return EXIT_STARVED if starved else 0


def run_to_end(sched: Scheduler, max_rounds: int, *, quiet: bool) -> RunResult:
    """Run ``sched`` with a progress bar on a terminal (none where ``quiet``: ``--json``). A
    policy fault that names no request stops the run: it is reported as the run's
    (``policy_faults["*"]``), not as bad input."""
    try:
        with RunProgress(sched.node, quiet=quiet) as progress:
            return sched.run(max_rounds=max_rounds, on_round=progress.on_round)
    except PolicyError as err:
        result = sched.result
        result.policy_faults["*"] = " ".join(str(err).split())
        result.stopped_by = "policy-fault"
        return result
