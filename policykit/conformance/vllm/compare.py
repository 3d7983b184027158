"""Conformance: policykit's node that preempts, under vLLM's combo, against vLLM's scheduler.

One side is policykit's own model (:mod:`policykit.preempting`, deciding with the combo of
:func:`vllm_combo`), the other vLLM 0.33.0's real v1 ``Scheduler`` driven by :func:`.drive`.
Both lay the scenario out alike (:mod:`policykit.preempting_scenario`) and are compared round by
round: the tokens scheduled per request (and their order), the preemptions, the prefills that
finished, the KV released, and the blocks in use after scheduling; then the requests left
unfinished.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

from policykit.config import EngineConfig
from policykit.conformance.vllm.driver import drive, max_num_seqs
from policykit.conformance.vllm.engine import SchedulerKnobs
from policykit.conformance.vllm.record import StepRecord
from policykit.preempting import Step
from policykit.preempting_scenario import prepare, run
from policykit.registry import builtin_registry, format_combo
from policykit.scenario import RequestSpec, Scenario

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
class Verdict:
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
) -> Verdict:
    """Both sides on ``scenario``; every round's first differing field, and the run lengths.

    ``combo`` runs policykit's side under another combo than vLLM's, and ``scheduler_cls``
    drives a subclass of vLLM's scheduler that decides by it (the policykit plugin)."""
    knobs = knobs or SchedulerKnobs()
    combo = combo or vllm_combo(knobs)
    ours = model_steps(scenario, knobs, max_rounds, combo)
    theirs = drive(scenario, knobs, max_rounds=max_rounds, scheduler_cls=scheduler_cls)
    verdict = Verdict(scenario.name, combo, knobs, rounds=len(theirs.steps))
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


def random_scenario(rng: random.Random, index: int = 0) -> tuple[Scenario, SchedulerKnobs]:
    """A small random scenario vLLM's scheduler can run, and knobs to run it under: block sizes
    1 to 16, a pool from barely the longest prompt to roomy (tight pools preempt), device
    prefixes pinned and not, arrivals over the first rounds, and every release timing."""
    page = rng.choice((1, 4, 16))
    budget = rng.choice((page * rng.randint(2, 16), rng.randint(8, 256)))
    n = rng.randint(1, 7)
    prompts = [rng.randint(1, 24 * page) for _ in range(n)]
    requests: list[RequestSpec] = []
    evictable_prefix = pinned_blocks = 0
    for i, prompt in enumerate(prompts):
        device, pinned = 0, False
        if rng.random() < 0.25 and prompt > page:
            device = rng.randint(1, (prompt - 1) // page) * page
            pinned = rng.random() < 0.3
        if device and not pinned:
            evictable_prefix += device
        pinned_blocks += device // page if pinned else 0
        arrival = rng.randint(1, 4) if rng.random() < 0.4 else 0
        requests.append(RequestSpec(f"r{i}", prompt, device, pinned, 0, arrival))
    longest = max(-(-p // page) for p in prompts)
    blocks = longest + rng.choice((0, 1, 2, longest, 2 * longest, sum(prompts) // page))
    free = max(0, blocks * page - evictable_prefix)
    config = EngineConfig(
        page_size=page,
        chunked_prefill_size=budget,
        kv_release_rounds=rng.choice((None, 1, 1, 2, 3)),
    )
    scenario = Scenario(
        config=config,
        free_tokens=free,
        evictable_tokens=evictable_prefix,
        requests=tuple(requests),
        name=f"random-{index}",
    )
    return scenario, random_knobs(rng, budget, max(prompts))
