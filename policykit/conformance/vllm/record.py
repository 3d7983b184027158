"""What the vLLM oracle records: one entry per round, JSON-able, for a later comparison.

The fields are the decisions policykit's vLLM rules will have to reproduce round by round: how
many tokens each request got (in vLLM's scheduling order), which requests were preempted, which
finished their prefill, whose held KV was released, and the block pool's occupancy right after
``schedule()`` allocated this round's blocks (before finished requests' frees).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from policykit import engines
from policykit.conformance.vllm.engine import SchedulerKnobs

SCHEMA = "policykit.conformance.vllm.trace/1"


@dataclass(frozen=True)
class StepRecord:
    round: int
    #: request id -> tokens scheduled this round, in the order vLLM scheduled them
    scheduled: dict[str, int]
    preempted: list[str]
    #: prefills that finished this round (vLLM status FINISHED_LENGTH_CAPPED after one token)
    completed: list[str]
    #: held requests whose blocks vLLM freed at the end of this round
    released: list[str]
    blocks_used: int
    blocks_free: int


@dataclass(frozen=True)
class Trace:
    scenario: str
    block_size: int
    #: usable blocks (vLLM's null block not counted)
    num_blocks: int
    budget: int
    knobs: SchedulerKnobs
    kv_release_rounds: int | None
    #: steps spent laying the scenario out before round 1 (filler, prefixes, the request in
    #: progress; not recorded)
    warmup_steps: int
    steps: list[StepRecord]
    finished_round: dict[str, int]
    #: requests still unfinished when ``max_rounds`` ran out (a livelock or starvation witness)
    unfinished: list[str]

    def preemptions(self) -> list[tuple[int, str]]:
        return [(s.round, rid) for s in self.steps for rid in s.preempted]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "vllm": engines.installed_version("vllm"),
            "scenario": self.scenario,
            "block_size": self.block_size,
            "num_blocks": self.num_blocks,
            "max_num_batched_tokens": self.budget,
            "knobs": asdict(self.knobs),
            "kv_release_rounds": self.kv_release_rounds,
            "warmup_steps": self.warmup_steps,
            "steps": [asdict(s) for s in self.steps],
            "finished_round": dict(self.finished_round),
            "unfinished": list(self.unfinished),
        }
