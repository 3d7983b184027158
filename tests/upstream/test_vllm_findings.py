"""Findings of ``policykit check`` on vLLM's own combos, confirmed on vLLM 0.33.0's scheduler.

Each combo that decides as vLLM configured with some knobs (``compare.vllm_combo``) is checked;
every counterexample is driven through vLLM's real v1 ``Scheduler`` on a CPU
(``policykit.conformance.vllm``): vLLM does what the checker says (the request the checker
blames is admitted and never completes, or is never admitted), and policykit's node that
preempts and vLLM agree round by round on it. Skips cleanly without vLLM.

With ``scheduler_reserve_full_isl=False`` (``vllm-no-reserve``) ``admitted-completes`` is
violated: a request enters on its first chunk while another's KV is held for good, its next
chunk does not fit, it preempts itself and, back with its cached blocks, never fits again. With
the long-prefill threshold it is violated even with reservation on: the threshold lets a short
request in beside a long one that fitted whole when it entered; the short one finishes and holds
its KV for good, and the long one no longer fits. With vLLM's default (reservation on, no
threshold) both properties are proved unbounded (by induction).
"""

from __future__ import annotations

import pytest

from policykit.config import EngineConfig
from policykit.scenario import parse_scenario
from policykit.spec.checkable import check_or_refuse
from policykit.spec.checker import CheckOptions

#: vLLM's knobs -> the verdict of admitted-completes on its combo (no-starvation: proved)
KNOBS = [
    ({}, "proved"),
    ({"long_prefill_token_threshold": 256}, "violated"),
    ({"scheduler_reserve_full_isl": False}, "violated"),
    ({"scheduler_reserve_full_isl": False, "long_prefill_token_threshold": 256}, "violated"),
]


@pytest.fixture(scope="module")
def vllm_side(vllm_oracle):
    from policykit.conformance.vllm import SchedulerKnobs, compare, drive

    return SchedulerKnobs, compare, drive


@pytest.mark.parametrize(
    ("knobs", "expected"),
    KNOBS,
    ids=[",".join(f"{a}={b}" for a, b in k.items()) or "default" for k, _ in KNOBS],
)
def test_every_verdict_on_a_vllm_combo_holds_on_vllm(vllm_side, registry, knobs, expected):
    SchedulerKnobs, compare, drive = vllm_side
    settings = SchedulerKnobs(**knobs)
    combo = registry.resolve(compare.vllm_combo(settings), config=EngineConfig())
    verdicts = {v.property: v for v in check_or_refuse(combo, EngineConfig(), CheckOptions())}
    assert verdicts["admitted-completes"].verdict == expected
    assert verdicts["no-starvation"].verdict == "proved"
    for v in verdicts.values():
        if v.verdict != "violated":
            continue
        cx = v.counterexample
        scenario = parse_scenario(cx.scenario, source="the counterexample")
        trace = drive(scenario, settings, max_rounds=50)
        blamed = cx.failure.request
        scheduled = {rid for s in trace.steps for rid in s.scheduled}
        assert blamed in scheduled and blamed in trace.unfinished
        assert any(rid == blamed for _, rid in trace.preemptions())
        assert compare.conform(scenario, settings).differences == []


#: combos vLLM has no knob for (other chunkings, alignments, SGLang's admissions), each with the
#: property ``check`` refutes on it (docs/spec.md, combos that preempt): their counterexamples
#: are driven through vLLM's scheduler with the policykit plugin deciding
PLUGGED = [
    ("vllm/vllm/truncation:192/default/fcfs/vllm", "admitted-completes"),
    ("sglang/sglang/none/default/fcfs/vllm", "no-starvation"),
    ("reserve-tail/vllm/page/default/lpm/vllm", "no-starvation"),
]


@pytest.mark.parametrize(("text", "prop"), PLUGGED, ids=[t for t, _ in PLUGGED])
def test_a_violation_on_a_combo_vllm_runs_only_through_the_plugin_holds_there(
    vllm_side, registry, monkeypatch, text, prop
):
    """The same counterexample, on vLLM's real scheduler with ``--scheduler-cls`` policykit's:
    the request ``check`` blames is admitted and left unfinished, or never admitted, there too,
    and the plugged scheduler decides as policykit's node that preempts, step by step."""
    from policykit.integrations.vllm import PolicyAsyncScheduler

    SchedulerKnobs, compare, drive = vllm_side
    combo = registry.resolve(text, config=EngineConfig())
    verdicts = {v.property: v for v in check_or_refuse(combo, EngineConfig(), CheckOptions())}
    verdict = verdicts[prop]
    assert verdict.verdict == "violated"
    cx = verdict.counterexample
    scenario = parse_scenario(cx.scenario, source="the counterexample")
    monkeypatch.setenv("POLICYKIT_COMBO", text)
    monkeypatch.setenv("POLICYKIT_STARTUP_CHECK", "0")
    knobs = SchedulerKnobs()
    trace = drive(scenario, knobs, max_rounds=50, scheduler_cls=PolicyAsyncScheduler)
    blamed = cx.failure.request
    scheduled = {rid for s in trace.steps for rid in s.scheduled}
    assert blamed in trace.unfinished
    assert (blamed in scheduled) == (prop == "admitted-completes")
    plugged = compare.conform(scenario, knobs, combo=text, scheduler_cls=PolicyAsyncScheduler)
    assert plugged.differences == []
