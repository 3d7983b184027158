"""Who waited on a trace replay (issue 33 item 4): TTFT by prompt-size class, the longest wait,
preemptions and recomputed tokens, for SGLang's node and for vLLM's node that preempts, in the
same row shape so the two compare figure for figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from policykit.harness.trace_fairness import SIZE_CLASSES, size_class

#: three requests at once: a short one, a mid-size one and a long one, sharing no block
TRACE = "".join(
    json.dumps({"timestamp": 0, "input_length": n, "output_length": 1, "hash_ids": ids}) + "\n"
    for n, ids in ((512, [1]), (3000, [2, 3, 4, 5, 6, 7]), (9000, list(range(10, 28))))
)
SGLANG = "reserve-tail/sglang/page"
PREFIX = "vllm-no-reserve/vllm-threshold:512/none/default/fcfs"
VLLM = f"{PREFIX}/vllm"
VICTIMS = [f"{PREFIX}/fewest-computed", f"{PREFIX}/least-progress"]


@pytest.mark.parametrize(
    ("tokens", "name"),
    [(1, "<1k"), (1023, "<1k"), (1024, "1k-8k"), (8192, "1k-8k"), (8193, ">8k")],
)
def test_size_classes_cover_every_prompt_once(tokens, name):
    assert size_class(tokens) == name
    assert [c[0] for c in SIZE_CLASSES] == ["<1k", "1k-8k", ">8k"]


def _bench(cli, trace: Path, *combos: str, pool: int = 16384, tier: str = "off"):
    args = ["bench", "--workload", str(trace), "--host-tier", tier, "--pool-tokens", str(pool)]
    args += ["--forward-requests", "0", "--json"]
    for combo in combos:
        args += ["--combo", combo]
    return cli(*args)


def test_both_nodes_report_who_waited_in_one_row_shape(cli, tmp_path):
    trace = tmp_path / "three.jsonl"
    trace.write_text(TRACE)
    res = _bench(cli, trace, SGLANG, VLLM, *VICTIMS)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["schema"] == "policykit.trace-bench/1" and doc["created"]
    assert "fairness" in doc["provenance"]
    rows = {r["combo"]: r for r in doc["combos"]}
    sglang, vllm = rows[SGLANG], rows[VLLM]
    assert vllm["node"] == "preempting" and "node" not in sglang
    assert set(vllm["fairness"]) == set(sglang["fairness"])
    for row in rows.values():
        f = row["fairness"]
        assert row["status"] == "completed"
        assert {k: v["completed"] for k, v in f["size_classes"].items()} == {
            "<1k": 1,
            "1k-8k": 1,
            ">8k": 1,
        }
        # the longest wait is a request's, and no TTFT is shorter than a wait before it
        assert f["max_wait"]["request"] in {"r0", "r1", "r2"}
        worst = max(c["ttft_s"]["max"] for c in f["size_classes"].values())
        assert 0 <= f["max_wait"]["seconds"] <= worst


def test_a_preemption_is_counted_with_what_it_made_the_node_compute_again(cli, tmp_path):
    """A pool that holds the long prompt but not all three at once: the threshold lets all
    three start, so someone is preempted; its full blocks survive in the prefix cache here, so
    it computes nothing again (what is recomputed is counted net of those hits)."""
    trace = tmp_path / "three.jsonl"
    trace.write_text(TRACE)
    res = _bench(cli, trace, VLLM, pool=9216)
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)["combos"]
    f = row["fairness"]
    assert f["preemptions"] >= 1 and f["preempted_requests"] >= 1
    assert f["recomputed_after_preemption_tokens"] == 0 and row["outcomes"]["cached_tokens"] > 0
    assert row["outcomes"]["requests"]["completed"] == 3


def test_a_combo_that_preempts_needs_the_host_tier_off(cli, tmp_path):
    trace = tmp_path / "three.jsonl"
    trace.write_text(TRACE)
    res = _bench(cli, trace, VLLM, tier="write-through")
    assert res.exit_code == 2 and "--host-tier off" in res.output
