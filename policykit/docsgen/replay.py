"""Running a scenario under a combo, and rendering the run as Markdown.

The concept pages, the scenario-replay comparison and the counterexample traces all show a run
the same way: the round table of ``policykit simulate`` (one row per scheduling decision, like
the A/B/C table of docs/incidents.md#truncated-tail) followed by the outcome. They all get it
from here, from a real
:class:`~policykit.scheduler.Scheduler` run on CPU tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from policykit.docsgen.markdown import esc, fence, table
from policykit.plan import EntryKind
from policykit.registry import Combo, PolicyRegistry
from policykit.scenario import Scenario, build_node, load_scenario, parse_scenario
from policykit.scheduler import RoundRecord, RunResult, Scheduler

#: how many rounds a docs replay may take; the bundled scenarios settle in a handful
MAX_ROUNDS = 200


@dataclass(frozen=True)
class Replay:
    """One finished run, with the pool size needed to turn free slots into utilisation."""

    scenario: Scenario
    result: RunResult
    pool_tokens: int

    @property
    def pool_use_by_round(self) -> tuple[float, ...]:
        """Fraction of the KV pool in use after each round (the OOM round counts as full)."""
        out = []
        for record in self.result.rounds:
            if self.result.oom is not None and record.plan.round == self.result.oom.round:
                out.append(1.0)
            else:
                out.append(1.0 - record.free_tokens_after / self.pool_tokens)
        return tuple(out)

    @property
    def outcome(self) -> str:
        """One short phrase: how the run ended, every request accounted for (a failed or
        rejected one is named as such, not left out of "2/3 completed")."""
        r = self.result
        total = len(self.scenario.requests)
        if r.oom is not None:
            return f"OOM in round {r.oom.round}"
        parts = [f"{len(r.completed)}/{total} completed"]
        for count, word in (
            (len(r.failed), "failed"),
            (len(r.rejected), "rejected"),
            (len(r.pending), "pending"),
        ):
            if count:
                parts.append(f"{count} {word}")
        if r.never_completes is not None:
            parts.append(f"{r.never_completes.request} can never complete")
        if r.starvation is not None:
            parts.append(f"{r.starvation.request} starves")
        return ", ".join(parts) + f" in {len(r.rounds)} rounds"

    @property
    def failed(self) -> bool:
        """The run went wrong: an OOM, a failed request, or one that can never run."""
        r = self.result
        stuck = r.never_completes is not None or r.starvation is not None
        return r.oom is not None or bool(r.failed) or stuck

    @property
    def cell(self) -> str:
        """The outcome as a table cell: marked and bold when the run went wrong."""
        return f"**✗ {self.outcome}**" if self.failed else self.outcome


def scenario_from(source: str | Path | dict) -> Scenario:
    """A scenario from a bundled name, a path, or an already decoded JSON object."""
    if isinstance(source, dict):
        return parse_scenario(source, source="the exported counterexample")
    from policykit.scenario import resolve_scenario_path

    return load_scenario(resolve_scenario_path(str(source)))


def replay(
    scenario: Scenario,
    combo: Combo | str,
    registry: PolicyRegistry,
    *,
    max_rounds: int = MAX_ROUNDS,
) -> Replay:
    """Run ``scenario`` to its end (or ``max_rounds``) under ``combo`` on CPU tensors."""
    chosen = (
        combo
        if isinstance(combo, Combo)
        else registry.resolve(scenario.combo, combo, config=scenario.config)
    )
    node = build_node(scenario, device="cpu")
    result = Scheduler(node, chosen).run(max_rounds=max_rounds)
    return Replay(scenario, result, node.pool.total_tokens)


def rounds_markdown(run: Replay) -> str:
    """The round table of ``policykit simulate`` as a Markdown table, then the outcome."""
    return round_table(run) + "\n" + outcome_markdown(run)


def round_table(run: Replay, *, failing_round: int | None = None) -> str:
    """The round table alone; ``failing_round`` (where a checked property broke) is marked
    ``✗``. A hybrid-SWA run gets a column for the sliding-window pool's free slots after each
    round, since that pool, not the full one, is what its chunks run out of; an OOM is marked
    in the column of the pool that ran out."""
    result = run.result
    hybrid = any(r.swa_free_tokens_after is not None for r in result.rounds)
    rows: list[list[object]] = []
    for record in result.rounds:
        plan = record.plan
        marks = {m.request_id: m for m in plan.marks}
        first = len(rows)
        for entry in plan.entries:
            mark = marks.get(entry.request_id) if entry.kind is not EntryKind.DEFERRED else None
            rows.append(
                [
                    "",
                    entry.request_id,
                    f"[{entry.start}, {entry.end})" if entry.tokens else "-",
                    entry.tokens,
                    entry.kind.value,
                    entry.load_back or "",
                    "" if mark is None else mark.rem_total_tokens,
                    "" if mark is None else mark.cur_rem_tokens,
                ]
            )
        for rej in plan.rejected:
            rows.append(["", rej.request_id, "-", "", f"rejected {rej.verdict}", "", "", ""])
        if len(rows) == first:
            rows.append(["", "(nothing to do)", "", "", "", "", "", ""])
        rows[first][0] = f"**✗ {plan.round}**" if plan.round == failing_round else plan.round
        free = _free_after(record, result, hybrid)
        for row in rows[first:-1]:
            row.extend([""] * len(free))
        rows[-1].extend(free)
    headers = (
        "round",
        "request",
        "chunk [start, end)",
        "tokens",
        "kind",
        "load-back",
        "rem_total_tokens",
        "cur_rem_tokens",
        "free after",
    ) + (("sliding-window free after",) if hybrid else ())
    return table(headers, rows, right=(0, 2, 3, 5, 6, 7, 8, 9))


def _free_after(record: RoundRecord, result: RunResult, hybrid: bool) -> list[str | int | None]:
    """The free slots after a round, per pool; ``**OOM**`` for the pool that ran out (the
    other pool's cell is left empty: the round never happened)."""
    oom = result.oom
    pools = ("full", "swa") if hybrid else ("full",)
    if oom is not None and oom.round == record.plan.round:
        return ["**OOM**" if pool == oom.pool else "" for pool in pools]
    free: list[str | int | None] = [record.free_tokens_after, record.swa_free_tokens_after]
    return free[: len(pools)]


def shows_failure(run: Replay) -> bool:
    """Whether the run ended badly: an OOM, or a request admitted but never completed
    (pending, starved or failed when nothing could change any more)."""
    r = run.result
    return r.oom is not None or bool(r.pending or r.starved or r.failed)


def failure_markdown(run: Replay, what: str) -> str:
    """How a counterexample's replay ended, never as a success: a failure box when it
    reproduced the failure ``what``, a warning when it did not."""
    r = run.result
    lists = (
        f"    completed: {esc(', '.join(r.completed) or '-')} · "
        f"pending: {esc(', '.join(r.pending) or '-')} · "
        f"starved: {esc(', '.join(r.starved) or '-')} · "
        f"failed: {esc(', '.join(r.failed) or '-')}\n"
    )
    if r.oom is not None:
        return outcome_markdown(run)
    if shows_failure(run):
        return (
            f'!!! failure "{esc(what)}"\n    The replay stopped after {len(r.rounds)} rounds '
            f"(stopped: {r.stopped_by}) with requests that can no longer complete.\n\n{lists}"
        )
    return (
        '!!! warning "The replay did not reproduce the failure"\n    The scheduler ran '
        f"{len(r.rounds)} rounds (stopped: {r.stopped_by}) without an OOM and with every "
        "admitted request finished; the checker's model and the scheduler disagree here, "
        f"which is itself a finding to report.\n\n{lists}"
    )


def outcome_markdown(run: Replay) -> str:
    """An admonition with the verdict: the OOM message, or the completed/pending lists."""
    r = run.result
    lists = (
        f"    completed: {esc(', '.join(r.completed) or '-')} · "
        f"pending: {esc(', '.join(r.pending) or '-')}\n"
    )
    if r.oom is not None:
        who = f" while placing {r.oom.request}" if r.oom.request else ""
        body = "\n".join("    " + line for line in fence(r.oom.message, "text").splitlines())
        return f'!!! failure "OOM in round {r.oom.round}{who}"\n{body}\n\n{lists}'
    return f'!!! success "No OOM after {len(r.rounds)} rounds (stopped: {r.stopped_by})"\n{lists}'
