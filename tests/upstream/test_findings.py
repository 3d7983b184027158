"""Findings of ``policykit check`` on the upstream-faithful combo, confirmed on upstream's code.

``no-starvation`` is violated for ``sglang/sglang/none`` with SGLang 0.5.23's ``fcfs`` queue.
The counterexample the checker exports is driven through upstream's real ``PrefillAdder``
(``policykit.upstream``): upstream never schedules the request policykit says starves, and the
two sides agree round by round.
"""

from __future__ import annotations

from policykit.scenario import parse_scenario
from policykit.spec.checker import CheckOptions, check_combo
from policykit.spec.model import ModelConfig
from policykit.upstream.conformance import UPSTREAM_COMBO, conform
from policykit.upstream.sglang import drive


def test_the_starvation_counterexample_starves_upstream_too(upstream, registry):
    combo = registry.resolve(UPSTREAM_COMBO)
    options = CheckOptions(properties=("no-starvation",))
    (verdict,) = check_combo(combo, ModelConfig(64, 4096), options)
    assert verdict.verdict == "violated"
    cx = verdict.counterexample
    starving = cx.failure.request
    scenario = parse_scenario(cx.scenario, source="the counterexample")
    theirs = drive(scenario, max_rounds=20)
    scheduled = {e.request_id for r in theirs.rounds for e in r.plan.entries}
    assert starving not in scheduled and starving in theirs.pending
    assert conform(scenario).identical
