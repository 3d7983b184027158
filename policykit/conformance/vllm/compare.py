"""Conformance: policykit's node that preempts, under vLLM's combo, against vLLM's scheduler.

One side is policykit's own model (:mod:`policykit.preempting`, deciding with the combo of
:func:`vllm_combo`), the other vLLM 0.33.0's real v1 ``Scheduler`` driven by :func:`.drive`.
Each brings its node to the scenario's round-1 state with its own code, replaying the one
history :mod:`policykit.preempting_layout` writes down, and they are compared round by
round: the tokens scheduled per request (and their order), the preemptions, the prefills that
finished, the KV released, and the blocks in use after scheduling; then the requests left
unfinished.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from policykit.conformance.vllm.driver import drive, max_num_seqs
from policykit.conformance.vllm.engine import SchedulerKnobs
from policykit.conformance.vllm.record import StepRecord
from policykit.preempting import Step
from policykit.preempting_layout import filler_tokens
from policykit.preempting_scenario import prepare, run
from policykit.registry import builtin_registry, format_combo
from policykit.scenario import Scenario, parse_scenario

#: rounds each side may run; a livelock would run this long on both
MAX_ROUNDS = 2_000
#: the fields compared each round, in the order a difference is reported
FIELDS = ("scheduled", "preempted", "completed", "released", "blocks_used")


def vllm_combo(knobs: SchedulerKnobs) -> str:
    """The combo that decides as vLLM 0.33.0 configured with ``knobs``."""
    admission = "vllm" if knobs.scheduler_reserve_full_isl else "vllm-no-reserve"
    threshold = knobs.long_prefill_token_threshold
    chunking = f"vllm-threshold:{threshold}" if threshold else "vllm"
    return format_combo(
        {
            "admission": admission,
            "chunking": chunking,
            "alignment": "none",
            "queue": "fcfs",
            "preemption": "vllm",
        }
    )


@dataclass
class VllmComparison:
    """One scenario's outcome: identical, or the differences found."""

    scenario: str
    combo: str
    knobs: SchedulerKnobs
    rounds: int = 0
    preemptions: int = 0
    differences: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.differences

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "status": "identical" if self.identical else "different",
            "combo": self.combo,
            "knobs": asdict(self.knobs),
            "rounds": self.rounds,
            "preemptions": self.preemptions,
            "differences": self.differences,
        }


def model_steps(
    scenario: Scenario, knobs: SchedulerKnobs, max_rounds: int, combo_text: str | None = None
) -> list[Step]:
    """policykit's side: the scenario on its node that preempts, under ``combo_text`` (by
    default :func:`vllm_combo`, the combo that decides as vLLM configured with ``knobs``)."""
    combo = builtin_registry().resolve(combo_text or vllm_combo(knobs))
    sched, _ = prepare(scenario, combo, max_running=max_num_seqs(scenario, knobs))
    return run(sched, len(scenario.requests), max_rounds)


def _row(step: Step | StepRecord) -> dict[str, Any]:
    return {
        "scheduled": list(step.scheduled.items()),
        "preempted": list(step.preempted),
        "completed": list(step.completed),
        "released": list(step.released),
        "blocks_used": step.blocks_used,
    }


def conform(
    scenario: Scenario,
    knobs: SchedulerKnobs | None = None,
    *,
    max_rounds: int = MAX_ROUNDS,
    combo: str | None = None,
    scheduler_cls: type | None = None,
) -> VllmComparison:
    """Both sides on ``scenario``; every round's first differing field, and the run lengths.

    ``combo`` runs policykit's side under another combo than vLLM's, and ``scheduler_cls``
    drives a subclass of vLLM's scheduler that decides by it (the policykit plugin)."""
    knobs = knobs or SchedulerKnobs()
    combo = combo or vllm_combo(knobs)
    ours = model_steps(scenario, knobs, max_rounds, combo)
    theirs = drive(scenario, knobs, max_rounds=max_rounds, scheduler_cls=scheduler_cls)
    verdict = VllmComparison(scenario.name, combo, knobs, rounds=len(theirs.steps))
    verdict.preemptions = len(theirs.preemptions())
    for mine, real in zip(ours, theirs.steps, strict=False):
        a, b = _row(mine), _row(real)
        for name in FIELDS:
            if a[name] != b[name]:
                verdict.differences.append(
                    f"round {real.round}: {name}: policykit {a[name]}, vllm {b[name]}"
                )
                break
    if len(ours) != len(theirs.steps):
        verdict.differences.append(
            f"policykit ran {len(ours)} round(s), vllm {len(theirs.steps)} "
            f"(vllm left unfinished: {theirs.unfinished or 'none'})"
        )
    return verdict


def random_knobs(rng: random.Random, budget: int, longest: int) -> SchedulerKnobs:
    """vLLM settings to compare under: the long-prefill threshold in 40% of them (vLLM
    refuses one above its ``max_model_len``, the longest prompt and one), full sequence
    reservation off in half (what makes a prefill node preempt most), and priority scheduling
    (with equal priorities) in a quarter."""
    threshold = rng.randint(1, min(budget, longest)) if rng.random() < 0.4 else 0
    return SchedulerKnobs(
        long_prefill_token_threshold=threshold,
        scheduler_reserve_full_isl=rng.random() >= 0.5,
        scheduling_policy="priority" if rng.random() < 0.25 else "fcfs",
    )


#: the block sizes random scenarios draw from: tiny ones (many blocks, fine eviction order) and
#: the sizes vLLM deployments run with
BLOCK_SIZES = (1, 4, 16, 32, 48, 64)


def random_scenario(rng: random.Random, index: int = 0) -> tuple[Scenario, SchedulerKnobs]:
    """A small random scenario vLLM's scheduler can run, and knobs to run it under: block sizes
    1 to 64, a pool from barely the longest prompt to roomy (tight pools preempt), device
    prefixes pinned and not (often several, whose warm-up order the layout fixes), cached
    filler that belongs to no request in 40% of them, a request already in progress in a
    fifth, arrivals over the first rounds, and every release timing."""
    page = rng.choice(BLOCK_SIZES)
    budget = rng.choice((page * rng.randint(2, 16), rng.randint(8, 256)))
    n = rng.randint(1, 7)
    prompts = [rng.randint(1, 24 * page) for _ in range(n)]
    going = rng.randrange(n) if rng.random() < 0.2 else None
    requests: list[dict[str, Any]] = []
    evictable_prefix = 0
    for i, prompt in enumerate(prompts):
        item: dict[str, Any] = {"id": f"r{i}", "prompt_tokens": prompt}
        device = 0
        if rng.random() < 0.25 and prompt > page:
            device = rng.randint(1, (prompt - 1) // page) * page
            item["device_prefix_tokens"] = device
            item["device_prefix_pinned"] = pinned = rng.random() < 0.3
            evictable_prefix += 0 if pinned else device
        if i == going and prompt - device >= 2:
            item["computed_tokens"] = rng.randint(device + 1, prompt - 1)
            item["chunked"] = True
        elif rng.random() < 0.4:
            item["arrival_round"] = rng.randint(1, 4)
        requests.append(item)
    longest = max(-(-p // page) for p in prompts)
    blocks = longest + rng.choice((0, 1, 2, longest, 2 * longest, sum(prompts) // page))
    room = max(0, blocks - evictable_prefix // page)
    filler = rng.randint(1, room) if room and rng.random() < 0.4 else 0
    data = {
        "name": f"random-{index}",
        "page_size": page,
        "chunked_prefill_size": budget,
        "kv_release_rounds": rng.choice((None, 1, 1, 2, 3)),
        "pool": {
            "free_tokens": (room - filler) * page,
            "evictable_tokens": evictable_prefix + filler * page,
        },
        "requests": requests,
    }
    scenario = parse_scenario(data, source=f"random scenario {index}")
    return scenario, random_knobs(rng, budget, max(prompts))


def coverage(runs: list[tuple[Scenario, SchedulerKnobs]], verdicts: list[VllmComparison]) -> dict:
    """How many of the compared scenarios exercise each mechanism the comparison is meant to
    cover: preemptions, vLLM's settings, and the layout's classes (filler, several device
    prefixes warmed under the threshold or without reservation, a request in progress), and
    how many ran with each block size."""

    def prefixes(sc: Scenario) -> int:
        return sum(bool(r.device_prefix_tokens) for r in sc.requests)

    sizes = Counter(sc.config.page_size for sc, _ in runs)
    return {
        "preemption": sum(v.preemptions > 0 for v in verdicts),
        "long_prefill_threshold": sum(k.long_prefill_token_threshold > 0 for _, k in runs),
        "reserve_full_isl_off": sum(not k.scheduler_reserve_full_isl for _, k in runs),
        "priority": sum(k.scheduling_policy == "priority" for _, k in runs),
        "device_prefix": sum(prefixes(sc) > 0 for sc, _ in runs),
        "filler": sum(filler_tokens(sc) > 0 for sc, _ in runs),
        "prefixes_under_threshold": sum(
            prefixes(sc) > 1 and k.long_prefill_token_threshold > 0 for sc, k in runs
        ),
        "prefixes_without_reservation": sum(
            prefixes(sc) > 1 and not k.scheduler_reserve_full_isl for sc, k in runs
        ),
        "in_progress": sum(any(r.chunked for r in sc.requests) for sc, _ in runs),
        "block_size": {str(size): sizes[size] for size in sorted(sizes)},
    }
