"""Progress of long runs: every request counted once whether it finishes, is failed or is
refused, and nothing written where no person watches (a log)."""

from __future__ import annotations

import io

from policykit.run_progress import RunProgress
from policykit.scenario import build_node, parse_scenario
from policykit.scheduler import Scheduler
from tests.core.scale_scenario import COMBO, scale_scenario


def _run(registry, data):
    sc = parse_scenario(data)
    node = build_node(sc)
    sched = Scheduler(node, registry.resolve(COMBO, config=sc.config))
    log = io.StringIO()
    with RunProgress(node, stream=log) as progress:
        result = sched.run(on_round=progress.on_round)
    return progress, result, log.getvalue()


def test_every_request_is_counted_once_and_a_log_gets_nothing(registry):
    progress, result, written = _run(registry, scale_scenario(400))
    assert progress.done == progress.total == len(result.completed) == 400
    assert progress.rounds == len(result.rounds)
    assert progress.bar.current == f"round {progress.rounds}"
    assert written == ""


def test_refused_requests_count_as_done(registry):
    data = scale_scenario(16)
    data["requests"][3]["prompt_tokens"] = 70_000  # larger than the pool: refused on arrival
    data["requests"][3].pop("host_prefix_tokens", None)
    progress, result, _ = _run(registry, data)
    assert len(result.rejected) == 1 and progress.done == progress.total == 16
