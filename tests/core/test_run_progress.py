"""Progress of long runs: log lines once a run lasts, nothing for a short one, every request
counted once whether it finishes, is failed or is refused."""

from __future__ import annotations

import io

from policykit.run_progress import RunProgress
from policykit.scenario import build_node, parse_scenario
from policykit.scheduler import Scheduler
from tests.core.scale_scenario import COMBO, scale_scenario


def _run(registry, data, **kw):
    sc = parse_scenario(data)
    node = build_node(sc)
    sched = Scheduler(node, registry.resolve(COMBO, config=sc.config))
    log = io.StringIO()
    with RunProgress(node, stream=log, **kw) as progress:
        result = sched.run(on_round=progress.on_round)
    return progress, result, log.getvalue().splitlines()


def test_a_long_run_logs_lines_and_a_last_one(registry):
    progress, result, lines = _run(registry, scale_scenario(400), interval=0.0)
    assert progress.done == progress.total == len(result.completed) == 400
    assert len(lines) > 2 and "ETA" in lines[0] and "round" in lines[0]
    assert lines[-1].startswith("simulate: requests: 400/400 done")


def test_a_short_run_writes_nothing(registry):
    _, _, lines = _run(registry, scale_scenario(16))
    assert lines == []


def test_refused_requests_count_as_done(registry):
    data = scale_scenario(16)
    data["requests"][3]["prompt_tokens"] = 70_000  # larger than the pool: refused on arrival
    data["requests"][3].pop("host_prefix_tokens", None)
    progress, result, _ = _run(registry, data, interval=0.0)
    assert len(result.rejected) == 1 and progress.done == progress.total == 16
