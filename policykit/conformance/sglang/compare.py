"""Conformance: policykit's upstream-faithful combo against SGLang's real scheduler.

Both sides run the same scenario on the same storage model (a policykit node); one decides
with policykit's planner and built-ins, the other with upstream's ``PrefillAdder``. The diff
compares, round by round, the batch (request, token range, kind), the ledger after each placed
request (``rem_total_tokens``, ``cur_rem_tokens``, ``rem_chunk_tokens``), the verdict that
stopped admission and the request it refused, and at the end the out-of-memory outcome and
which requests completed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

from policykit.conformance.sglang.driver import NotExpressible, UpstreamRun, drive
from policykit.plan import Plan
from policykit.plugin_manager import make_plugin_manager
from policykit.registry import PolicyRegistry
from policykit.scenario import RequestSpec, Scenario, build_node
from policykit.scheduler import RunResult, Scheduler


def upstream_combo(schedule_policy: str = "fcfs") -> str:
    """The upstream-faithful combo with the queue policy named like SGLang's
    ``--schedule-policy`` (``fcfs``: :data:`UPSTREAM_COMBO`)."""
    return f"admission=sglang,chunking=sglang,alignment=none,queue={schedule_policy}"


#: the combo that reproduces SGLang 0.5.23 (with its fcfs waiting queue: the head blocks)
UPSTREAM_COMBO = upstream_combo()

#: rounds each side may run; both stop at the same round when a scenario runs that long
MAX_ROUNDS = 5_000


@dataclass
class Verdict:
    """The outcome of one scenario: identical, different (with the differences), or not
    expressible (with the reason)."""

    scenario: str
    differences: list[str] = field(default_factory=list)
    not_expressible: str | None = None
    rounds: int = 0

    @property
    def identical(self) -> bool:
        return self.not_expressible is None and not self.differences

    def to_dict(self) -> dict[str, Any]:
        status = (
            "not-expressible"
            if self.not_expressible
            else ("identical" if not self.differences else "different")
        )
        return {
            "scenario": self.scenario,
            "status": status,
            "rounds": self.rounds,
            "differences": self.differences,
            "not_expressible": self.not_expressible,
        }


_REGISTRY: list[PolicyRegistry] = []


def _registry() -> PolicyRegistry:
    if not _REGISTRY:
        _REGISTRY.append(PolicyRegistry.from_plugins(make_plugin_manager(entry_points=False)))
    return _REGISTRY[0]


def run_policykit(
    scenario: Scenario, combo: str = UPSTREAM_COMBO, max_rounds: int = MAX_ROUNDS
) -> RunResult:
    """policykit's run of ``scenario`` as upstream runs it: the ``fcfs`` queue (its head
    blocks it) unless ``combo`` names another, and a stuck in-progress request not failed."""
    node = build_node(scenario)
    chosen = _registry().resolve({"queue": "fcfs"}, combo, config=scenario.config.engine)
    return Scheduler(node, chosen, fail_stuck=False).run(max_rounds)


def _round_view(plan: Plan) -> dict[str, Any]:
    return {
        "batch": [(e.request_id, e.start, e.end, e.kind.value) for e in plan.entries],
        "ledger": [
            (m.request_id, m.rem_total_tokens, m.cur_rem_tokens, m.rem_chunk_tokens)
            for m in plan.marks
        ],
        "stop": plan.stop,
        "refused": [(r.request_id, r.verdict) for r in plan.rejected],
    }


def diff(ours: RunResult, theirs: UpstreamRun) -> list[str]:
    """Every difference between the two runs, as one readable line each."""
    out: list[str] = []
    for i in range(max(len(ours.rounds), len(theirs.rounds))):
        if i >= len(ours.rounds) or i >= len(theirs.rounds):
            side = "policykit" if i >= len(ours.rounds) else "upstream"
            out.append(
                f"round {i + 1}: only {'upstream' if side == 'policykit' else 'policykit'} ran it"
            )
            break
        a, b = _round_view(ours.rounds[i].plan), _round_view(theirs.rounds[i].plan)
        for key in ("batch", "ledger", "stop", "refused"):
            if a[key] != b[key]:
                out.append(f"round {i + 1} {key}: policykit {a[key]} != upstream {b[key]}")
    mine = None if ours.oom is None else (ours.oom.round, ours.oom.request, ours.oom.pool)
    if mine != theirs.oom:
        out.append(f"out of memory: policykit {mine} != upstream {theirs.oom}")
    if sorted(ours.completed) != sorted(theirs.completed):
        out.append(
            f"completed: policykit {sorted(ours.completed)} != upstream {sorted(theirs.completed)}"
        )
    return out


def conform(
    scenario: Scenario,
    combo: str = UPSTREAM_COMBO,
    max_rounds: int = MAX_ROUNDS,
    schedule_policy: str = "fcfs",
) -> Verdict:
    """Run ``scenario`` on both sides (at most ``max_rounds`` rounds each) and compare;
    upstream sorts its queue with ``schedule_policy`` (its ``--schedule-policy``)."""
    theirs = drive(scenario, max_rounds, schedule_policy)
    if isinstance(theirs, NotExpressible):
        return Verdict(scenario.name, not_expressible=theirs.reason)
    ours = run_policykit(scenario, combo, max_rounds)
    return Verdict(scenario.name, diff(ours, theirs), rounds=len(theirs.rounds))


# --- random scenarios --------------------------------------------------------------------------
def random_scenario(
    rng: random.Random, index: int = 0, *, hybrid_swa: bool | None = None
) -> Scenario:
    """A small random scenario over the inputs both sides understand: page sizes 1/16/64, a
    tight or roomy pool, unpinned and pinned device prefixes, host prefixes of any length, an
    in-progress request,
    arrivals, releases, ``max_prefill_tokens``, and hybrid SWA (in a quarter of them, or as
    ``hybrid_swa`` says)."""
    page = rng.choice((1, 16, 64))
    chunk = rng.choice((page * rng.randint(4, 64), rng.randint(64, 4096), 2048, 8192))
    n = rng.randint(1, 6)
    prompts = [rng.randint(1, 6000) for _ in range(n)]
    requests: list[RequestSpec] = []
    evictable_prefix = 0
    chunked_at = rng.randrange(n) if rng.random() < 0.3 else None
    for i, prompt in enumerate(prompts):
        device = 0
        pinned = False
        if rng.random() < 0.3 and prompt > page:
            device = rng.randint(0, (prompt - 1) // page) * page
            pinned = device > 0 and rng.random() < 0.3
        host = 0
        if rng.random() < 0.25 and prompt - device > 1:
            host = rng.randint(1, min(prompt - device - 1, 3000))
        computed, chunked, arrival = 0, False, 0
        if i == chunked_at and prompt - device - host > 1:
            computed = rng.randint(device + host + 1, prompt - 1)
            chunked = True
        elif rng.random() < 0.3:
            arrival = rng.randint(1, 4)
        if device and not pinned:
            evictable_prefix += device
        requests.append(
            RequestSpec(f"r{i}", prompt, device, pinned, host, arrival, computed, chunked)
        )
    scale = rng.choice((0.2, 0.5, 1.0, 2.0))
    free = max(page, int(sum(prompts) * scale * rng.random()) // page * page)
    evictable = evictable_prefix + rng.randint(0, 3) * page * rng.randint(0, 32)
    swa_free = window = None
    if hybrid_swa if hybrid_swa is not None else rng.random() < 0.25:
        requests = [replace(r, host_prefix_tokens=0) for r in requests]
        window = rng.choice((128, 512, 4096))
        swa_free = max(page, rng.randint(0, 8000))
    return Scenario(
        page_size=page,
        chunked_prefill_size=chunk,
        free_tokens=free,
        evictable_tokens=evictable,
        requests=tuple(requests),
        name=f"random-{index}",
        max_prefill_tokens=rng.choice((None, None, rng.randint(1, 16384))),
        kv_release_rounds=rng.choice((None, 0, 1, 2)),
        swa_free_tokens=swa_free,
        sliding_window=window,
    )
