"""The observer hooks fire on the node that preempts as on SGLang's node, with the same
signatures: what a tracing plugin records matches the steps the node reports."""

from __future__ import annotations

import policykit
from policykit.ledger import Ledger
from policykit.plan import EntryKind
from policykit.plugin_manager import make_plugin_manager
from policykit.preempting_scenario import prepare, run
from policykit.registry import PolicyRegistry
from policykit.scenario import parse_scenario


class Recorder:
    """Every observer hook, as (hook, round, details)."""

    def __init__(self):
        self.events = []

    @policykit.hookimpl
    def policykit_round_start(self, round_no, ledger):
        assert isinstance(ledger, Ledger)
        self.events.append(("start", round_no, ledger.rem_total_tokens, ledger.rem_chunk_tokens))

    @policykit.hookimpl
    def policykit_admit(self, round_no, request_id, entry, ledger):
        self.events.append(("admit", round_no, request_id, entry, ledger.rem_chunk_tokens))

    @policykit.hookimpl
    def policykit_reject(self, round_no, request_id, verdict, ledger):
        self.events.append(("reject", round_no, request_id, verdict))

    @policykit.hookimpl
    def policykit_round_end(self, round_no, plan):
        self.events.append(("end", round_no, plan))

    @policykit.hookimpl
    def policykit_preempt(self, round_no, request_id, victim_id):
        self.events.append(("preempt", round_no, request_id, victim_id))

    @policykit.hookimpl
    def policykit_oom(self, round_no, error):
        self.events.append(("oom", round_no, error))

    def of(self, kind):
        return [e for e in self.events if e[0] == kind]


def _run(requests, combo, **pool):
    sc = parse_scenario(
        {
            "name": "hooks",
            "page_size": 16,
            "chunked_prefill_size": 64,
            "pool": {"free_tokens": 160, **pool},
            "kv_release_rounds": 0,
            "requests": requests,
        }
    )
    recorder = Recorder()
    pm = make_plugin_manager(entry_points=False)
    pm.register(recorder, name="recorder")
    registry = PolicyRegistry.from_plugins(pm)
    sched, _ = prepare(sc, registry.resolve(combo), pm=pm)
    return run(sched, len(requests)), recorder


def test_every_round_opens_admits_its_chunks_and_ends_with_its_plan():
    two = [{"id": "A", "prompt_tokens": 120}, {"id": "B", "prompt_tokens": 120}]
    steps, rec = _run(two, "vllm/vllm-threshold:32/none/default/fcfs/vllm")
    assert [e[1] for e in rec.of("start")] == [s.round for s in steps]
    assert rec.of("start")[0][2:] == (160, 64)  # 10 free blocks, the whole step budget
    assert [e[1] for e in rec.of("end")] == [s.round for s in steps]
    for step, (_, _, plan) in zip(steps, rec.of("end"), strict=True):
        assert {e.request_id: e.tokens for e in plan.batch} == step.scheduled
        admitted = [e[2] for e in rec.of("admit") if e[1] == step.round]
        assert admitted == list(step.scheduled) or step.preempted
    # round 1: A then B, each a new request's first chunk, the budget going down as they go
    first = [e for e in rec.of("admit") if e[1] == 1]
    assert [(e[2], e[3].kind, e[3].start, e[3].end, e[4]) for e in first] == [
        ("A", EntryKind.TRUNCATED, 0, 32, 32),
        ("B", EntryKind.TRUNCATED, 0, 32, 0),
    ]
    # round 3: B cannot get its blocks and is its own victim; A's last chunk is FINAL
    assert rec.of("preempt") == [("preempt", 3, "B", "B")]
    final = [e[3] for e in rec.of("admit") if e[2] == "A" and e[3].kind is EntryKind.FINAL]
    assert [(e.start, e.end) for e in final] == [(96, 120)]
    assert not rec.of("oom")


def test_the_request_that_stops_the_queue_is_rejected_with_its_reason():
    requests = [
        {"id": "A", "prompt_tokens": 150},
        {"id": "B", "prompt_tokens": 100, "arrival_round": 1},
    ]
    _, rec = _run(requests, "vllm/vllm/none/default/fcfs/vllm")
    # rounds 1-2: A's chunks use the whole budget, so B is not even looked at
    assert [e[2].stop for e in rec.of("end")[:2]] == ["OTHER", "OTHER"]
    assert not any(e[2].rejected for e in rec.of("end")[:2])
    # round 3: A's last 22 tokens leave budget, but A holds all 10 blocks: B does not fit
    assert rec.of("reject") == [("reject", 3, "B", "NO_TOKEN")]
    assert rec.of("end")[2][2].stop == "NO_TOKEN"
    assert rec.of("end")[2][2].rejected[0].request_id == "B"


def test_a_prefix_hit_is_the_entrys_cached_tokens():
    requests = [{"id": "A", "prompt_tokens": 100, "device_prefix_tokens": 32}]
    _, rec = _run(requests, "vllm/vllm/none/default/fcfs/vllm", evictable_tokens=32)
    entry = rec.of("admit")[0][3]
    assert (entry.start, entry.cached, entry.kind) == (32, 32, EntryKind.TRUNCATED)
    # the prefix owner's warm-up steps are not the scenario's: no hook saw them
    assert rec.of("start")[0][1] == 1 and len(rec.of("start")) == len(rec.of("end"))
