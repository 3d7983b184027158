"""Conformance: policykit's upstream-faithful combo against SGLang's real scheduler.

Both sides run the same scenario: one on a policykit node, deciding with policykit's planner
and built-ins, the other on SGLang's own storage, deciding with upstream's ``PrefillAdder``
(:mod:`.storage_driver`). The diff
compares, round by round, the batch (request, token range, kind), the ledger after each placed
request (``rem_total_tokens``, ``cur_rem_tokens``, ``rem_chunk_tokens``), the verdict that
stopped admission and the request it refused, and at the end the out-of-memory outcome and
which requests completed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from policykit.config import EngineConfig
from policykit.conformance.sglang.driver import UpstreamRun
from policykit.conformance.sglang.run import drive
from policykit.conformance.sglang.storage import NotExpressible
from policykit.conformance.sglang.storage_driver import storage_view_of
from policykit.node import PrefillNode
from policykit.plan import Plan
from policykit.registry import builtin_registry
from policykit.request import State
from policykit.scenario import RequestSpec, Scenario, build_node
from policykit.scheduler import RoundRecord, RunResult, Scheduler


def upstream_combo(schedule_policy: str = "fcfs") -> str:
    """The upstream-faithful combo with the queue policy named like SGLang's
    ``--schedule-policy`` (``fcfs``: :data:`UPSTREAM_COMBO`)."""
    return f"admission=sglang,chunking=sglang,alignment=none,queue={schedule_policy}"


#: the combo that reproduces SGLang 0.5.23 (with its fcfs waiting queue: the head blocks)
UPSTREAM_COMBO = upstream_combo()

#: rounds each side may run; both stop at the same round when a scenario runs that long
MAX_ROUNDS = 5_000


@dataclass
class SglangComparison:
    """The outcome of one scenario: identical, or different (with the differences)."""

    scenario: str
    differences: list[str] = field(default_factory=list)
    rounds: int = 0
    #: an unpinned device prefix was evicted (at least in part) before its request was admitted
    evicted_prefix: bool = False
    #: why SGLang's storage cannot be in the scenario's state (then nothing was compared)
    not_expressible: str | None = None

    @property
    def identical(self) -> bool:
        return not self.differences and self.not_expressible is None

    @property
    def status(self) -> str:
        if self.not_expressible is not None:
            return "not expressible"
        return "identical" if not self.differences else "different"

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "status": self.status,
            "rounds": self.rounds,
            "differences": self.differences,
            "evicted_prefix": self.evicted_prefix,
            "not_expressible": self.not_expressible,
        }


def run_policykit(
    scenario: Scenario,
    combo: str = UPSTREAM_COMBO,
    max_rounds: int = MAX_ROUNDS,
    storage: list[dict[str, Any]] | None = None,
) -> RunResult:
    """policykit's run of ``scenario`` as upstream runs it: the ``fcfs`` queue (its head
    blocks it) unless ``combo`` names another, and a stuck in-progress request not failed.
    With ``storage``, each round's storage view (:func:`node_storage_view`) is appended."""
    node = build_node(scenario)
    chosen = builtin_registry().resolve({"queue": "fcfs"}, combo, config=scenario.config)
    ids = [r.id for r in scenario.requests]

    def on_round(record: RoundRecord) -> None:
        if storage is not None:
            storage.append(node_storage_view(node, ids))

    return Scheduler(node, chosen, fail_stuck=False).run(max_rounds, on_round=on_round)


def node_storage_view(node: PrefillNode, ids: list[str]) -> dict[str, Any]:
    """policykit's node in the shape of the SGLang driver's storage view."""
    live = {
        q.id: (q.cached_len if q.state in (State.CHUNKED, State.HELD) else None)
        for q in node.requests.values()
        if q.state is not State.DONE
    }
    cached = [t for n in _cache_nodes(node) for t in n.key]
    return storage_view_of(node.pool.free_tokens, node.cache.evictable_tokens, cached, ids, live)


def _cache_nodes(node: PrefillNode) -> list[Any]:
    stack, out = list(node.cache.root.children.values()), []
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(n.children.values())
    return out


#: what :func:`diff` compares each round, in this order (the first differing field is named)
ROUND_FIELDS = ("batch", "matched", "ledger", "stop", "refused")
#: the storage after each round's commit, compared when upstream's side ran on SGLang's storage
STORAGE_FIELDS = ("cached", "free", "evictable")


def _round_view(plan: Plan) -> dict[str, Any]:
    return {
        "batch": [(e.request_id, e.start, e.end, e.kind.value) for e in plan.entries],
        # what each new request matched on the device and loaded back from the host
        "matched": [(e.request_id, e.cached, e.load_back) for e in plan.entries if e.kind.is_new],
        "ledger": [
            (m.request_id, m.rem_total_tokens, m.cur_rem_tokens, m.rem_chunk_tokens)
            for m in plan.marks
        ],
        "stop": plan.stop,
        "refused": [(r.request_id, r.verdict) for r in plan.rejected],
    }


def diff(
    ours: RunResult, theirs: UpstreamRun, storage: list[dict[str, Any]] | None = None
) -> list[str]:
    """Every difference between the two runs, as one readable line each: per round the first
    differing field of :data:`ROUND_FIELDS`, then (with policykit's ``storage`` views and
    upstream's own storage) of :data:`STORAGE_FIELDS`."""
    out: list[str] = []
    for i in range(max(len(ours.rounds), len(theirs.rounds))):
        if i >= len(ours.rounds) or i >= len(theirs.rounds):
            side = "policykit" if i >= len(ours.rounds) else "upstream"
            out.append(
                f"round {i + 1}: only {'upstream' if side == 'policykit' else 'policykit'} ran it"
            )
            break
        a, b = _round_view(ours.rounds[i].plan), _round_view(theirs.rounds[i].plan)
        upstream_storage = theirs.rounds[i].storage
        keys: tuple[str, ...]
        if storage is not None and upstream_storage is not None and i < len(storage):
            a.update(storage[i])
            b.update(upstream_storage)
            keys = ROUND_FIELDS + STORAGE_FIELDS
        else:
            keys = ROUND_FIELDS
        for key in keys:
            if a[key] != b[key]:
                out.append(f"round {i + 1} {key}: policykit {a[key]} != upstream {b[key]}")
                break
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
    storage: bool = False,
) -> SglangComparison:
    """Run ``scenario`` on both sides (at most ``max_rounds`` rounds each) and compare;
    upstream sorts its queue with ``schedule_policy`` (its ``--schedule-policy``). With
    ``storage``, the storage after each commit is compared too (:data:`STORAGE_FIELDS`). A
    scenario SGLang's storage cannot be in is not compared, and the verdict says why."""
    try:
        theirs = drive(scenario, max_rounds, schedule_policy)
    except NotExpressible as exc:
        return SglangComparison(scenario.name, not_expressible=str(exc))
    views: list[dict[str, Any]] | None = [] if storage else None
    ours = run_policykit(scenario, combo, max_rounds, views)
    return SglangComparison(
        scenario.name,
        diff(ours, theirs, views),
        rounds=len(theirs.rounds),
        evicted_prefix=_evicted_prefix(scenario, theirs),
    )


def _evicted_prefix(scenario: Scenario, run: UpstreamRun) -> bool:
    """Whether upstream admitted a request with less of its unpinned device prefix than the
    scenario gave it (an eviction took it while the request waited)."""
    unpinned = {
        r.id: r.device_prefix_tokens
        for r in scenario.requests
        if r.device_prefix_tokens and not r.device_prefix_pinned and not r.chunked
    }
    return any(
        e.kind.is_new and e.request_id in unpinned and e.cached < unpinned[e.request_id]
        for rnd in run.rounds
        for e in rnd.plan.entries
    )


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
        window = rng.choice((128, 512, 4096))
        swa_free = max(page, rng.randint(0, 8000))
    config = EngineConfig(
        page_size=page,
        chunked_prefill_size=chunk,
        sliding_window=window,
        max_prefill_tokens=rng.choice((None, None, rng.randint(1, 16384))),
        kv_release_rounds=rng.choice((None, 0, 1, 2)),
    )
    return Scenario(
        config=config,
        free_tokens=free,
        evictable_tokens=evictable,
        requests=tuple(requests),
        name=f"random-{index}",
        swa_free_tokens=swa_free,
    )
