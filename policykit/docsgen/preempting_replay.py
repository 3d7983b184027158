"""A counterexample of a combo that preempts, replayed on the node that preempts and rendered
as Markdown.

SGLang's node (:mod:`.replay`) has no preemption, so such a combo's counterexample is replayed
here, by the checker's own replay (:func:`policykit.spec.preempting_replay.replay`, the one
``policykit check`` decides a violation with): the page shows the run the verdict stands on,
not a second one that could disagree with it. Its rounds are vLLM's steps: the tokens each
request was scheduled, the requests preempted, and the blocks in use and free after scheduling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policykit.docsgen.markdown import esc, table
from policykit.registry import Combo
from policykit.spec.counterexample import Failure
from policykit.spec.preempting_replay import REPLAY_ROUNDS, Traced, replay

#: steps a page shows at least; a livelock runs to :data:`REPLAY_ROUNDS` and repeats itself
SHOWN_STEPS = 12


@dataclass(frozen=True)
class PreemptingReplay:
    """The replayed steps of one counterexample and the failure they end in (None: none)."""

    failure: Failure | None
    steps: tuple[Traced, ...]
    requests: tuple[str, ...]

    @property
    def unfinished(self) -> list[str]:
        done = {rid for s, _ in self.steps for rid in s.completed}
        return [rid for rid in self.requests if rid not in done]


def replay_preempting(
    scenario: dict[str, Any], combo: Combo, prop: str, blamed: str
) -> PreemptingReplay:
    """Replay ``scenario`` as ``policykit check`` did, on the request the checker blamed (any
    request where the results file does not name one)."""
    requests = tuple(str(r["id"]) for r in scenario.get("requests", []))
    failure, steps = replay(scenario, combo, prop, [blamed] if blamed else list(requests))
    return PreemptingReplay(failure, tuple(steps), requests)


def preempting_table(run: PreemptingReplay, *, failing_round: int | None = None) -> str:
    """One row per request a step touched (preempted, then scheduled, then released), the
    blocks after scheduling on the step's last row; ``failing_round`` is marked ``✗``."""
    shown = max(SHOWN_STEPS, failing_round or 0)
    rows: list[list[object]] = []
    for step, ends in run.steps[:shown]:
        first = len(rows)
        rows += [["", rid, "preempted", "-", "", "", ""] for rid in step.preempted]
        for rid, tokens in step.scheduled.items():
            kind = "final chunk" if rid in step.completed else "chunk"
            span = f"[{ends[rid] - tokens}, {ends[rid]})"
            rows.append(["", rid, kind, span, tokens, "", ""])
        rows += [["", rid, "KV released", "-", "", "", ""] for rid in step.released]
        if len(rows) == first:
            rows.append(["", "(nothing scheduled)", "", "", "", "", ""])
        rows[first][0] = f"**✗ {step.round}**" if step.round == failing_round else step.round
        rows[-1][5:] = [step.blocks_used, step.blocks_free]
    headers = ("step", "request", "event", "chunk [start, end)", "tokens", "blocks used", "free")
    text = table(headers, rows, right=(0, 3, 4, 5, 6))
    left = len(run.steps) - shown
    if left > 0:
        text += f"\n…and {left} more steps like these, to step {run.steps[-1][0].round}.\n"
    return text


def preempting_failure_markdown(run: PreemptingReplay, what: str) -> str:
    """How the replay ended, never as a success: a failure box naming the stranded request
    when it reproduced ``what``, a warning when it did not."""
    n = len(run.steps)
    stopped = (
        f"the node went idle after {n} step{'' if n == 1 else 's'}"
        if n < REPLAY_ROUNDS
        else f"still changing after {REPLAY_ROUNDS} steps"
    )
    lists = f"    unfinished: {esc(', '.join(run.unfinished) or '-')} ({stopped})\n"
    if run.failure is not None:
        f = run.failure
        return (
            f'!!! failure "{esc(what)}"\n    The replay ends in it: request {esc(f.request)} '
            f"{'never completes' if f.kind == 'never-completes' else 'starves'} "
            f"({esc(f.detail)}).\n\n{lists}"
        )
    return (
        '!!! warning "The replay did not reproduce the failure"\n    The node that preempts '
        "finished the run without the failure; the checker's model and the scheduler disagree "
        f"here, which is itself a finding to report.\n\n{lists}"
    )
