"""``bench`` and ``sweep`` run combos that preempt on the node that preempts, with real KV.

A preempted request is computed again on blocks the free queue may have handed to someone
else; a request that comes back and hits its surviving cached blocks reads the K/V they still
hold. If the block bookkeeping were wrong (a block reused while cached, a hit on a block whose
K/V was overwritten), the first-token logits would differ from the dense forward's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from policykit.cli import main
from policykit.executor.units import simulate_unit
from policykit.harness.build import PrefixKV
from policykit.harness.runner import from_scenario, from_workload, run_combo
from policykit.harness.workloads import RequestSpec, Workload, workload_config
from policykit.registry import PolicyRegistry
from policykit.scenario import build_node, load_scenario

REL = 1e-4
#: no full-sequence reservation and a 128-token threshold: running requests compete for blocks
THRESHOLD = "vllm-no-reserve/vllm-threshold:128/none/default/fcfs/vllm"

PREEMPTING = Workload(
    name="preempting",
    description="a 16-block pool that two long prompts and a shared prefix group fight over",
    pool_tokens=1024,
    config=workload_config(256, kv_release_rounds=1),
    requests=(
        RequestSpec("a", 700, 0),
        RequestSpec("b", 500, 0, prefix_group="sys", prefix_tokens=128, device_prefix_tokens=128),
        RequestSpec("c", 300, 1, prefix_group="cold", prefix_tokens=192),
        RequestSpec("d", 250, 6, prefix_group="cold", prefix_tokens=192),
        RequestSpec(
            "e",
            200,
            2,
            prefix_group="sys",
            prefix_tokens=128,
            device_prefix_tokens=128,
            device_prefix_pinned=True,
        ),
    ),
)


def _assert_dense(store: PrefixKV, tokens: dict, logits: dict[str, torch.Tensor]) -> None:
    model = store.model
    for rid, got in logits.items():
        ref = model.dense(model.token_ids(tokens[rid])).logits
        err = float((got - ref).abs().max() / ref.abs().max())
        assert err < REL, f"{rid} differs from the dense forward by {err:.2e}"


def test_a_preempted_request_recomputes_on_real_blocks_and_gets_the_dense_logits(
    registry: PolicyRegistry, store: PrefixKV
) -> None:
    seen: list = []
    run = run_combo(
        from_workload(PREEMPTING),
        registry.resolve(THRESHOLD),
        store,
        keep_logits=True,
        on_round=seen.append,
    )
    row = run.row
    assert row["status"] == "completed" and row["node"] == "preempting"
    assert len(run.logits) == 5
    _assert_dense(store, PREEMPTING.tokens(), run.logits)
    # c is preempted after computing 140 tokens; 2 of its cached blocks survive, so it comes
    # back with a 128-token hit and computes 12 tokens again
    assert row["preemptions"] == 1 and row["recomputed_after_preemption"] == 12
    back = [e for r in seen for e in r.plan.batch if e.request_id == "c" and e.cached]
    assert [(e.start, e.cached) for e in back] == [(128, 128)]
    # the shared prefixes: b and e hit the device prefix, d hits the blocks c computed
    hits = {e.request_id: e.cached for r in seen for e in r.plan.batch if e.cached}
    assert hits == {"b": 128, "e": 128, "c": 128, "d": 192}
    assert row["computed_tokens"] == sum(e.tokens for r in seen for e in r.plan.batch)
    assert row["ttft_s"]["p50"] is not None and row["prompt_tokens_per_s"] > 0
    assert len(row["kv_utilisation"]) == row["rounds"] and row["handoff_bytes"] is None


def test_a_scenario_file_runs_on_the_node_that_preempts(
    tmp_path: Path, registry: PolicyRegistry, store: PrefixKV
) -> None:
    path = tmp_path / "s.json"
    path.write_text(
        json.dumps(
            {
                "name": "paged",
                "page_size": 16,
                "chunked_prefill_size": 64,
                "pool": {"free_tokens": 128, "evictable_tokens": 32},
                "kv_release_rounds": 0,
                "requests": [
                    {"id": "A", "prompt_tokens": 120},
                    {"id": "B", "prompt_tokens": 120, "device_prefix_tokens": 32},
                    {"id": "C", "prompt_tokens": 40, "arrival_round": 2},
                ],
            }
        )
    )
    bench = from_scenario(path)
    combo = registry.resolve("vllm/vllm-threshold:32/none/default/fcfs/vllm")
    run = run_combo(bench, combo, store, keep_logits=True)
    assert run.row["status"] == "completed" and run.row["preemptions"] >= 1
    # the scenario's prompts, as its node lays them out
    prompts = {r.id: r.tokens for r in build_node(load_scenario(path)).requests.values()}
    _assert_dense(store, prompts, run.logits)


def _bench(*args: str):
    return CliRunner(env={"COLUMNS": "200"}).invoke(main, ["bench", *args])


FAST = ["--model", "tiny", "--device", "cpu", "--pool-tokens", "2048"]


def test_bench_shows_preemptions_beside_a_combo_that_never_preempts(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    both = f"{THRESHOLD};reserve-tail/sglang/page"
    result = _bench("--workload", "long-prompts", "--combos", both, *FAST, "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "preempt/recomp tok" in result.output
    paged, ledger = json.loads(out.read_text())["combos"]
    assert paged["node"] == "preempting" and paged["preemptions"] >= 1
    assert paged["recomputed_after_preemption"] >= 0 and "preemptions" not in ledger
    assert paged["status"] == ledger["status"] == "completed"
    assert paged["outcomes"]["computed_tokens"] == paged["computed_tokens"]


@pytest.mark.parametrize(
    ("workload", "words"),
    [
        (["mixed"], "host tier"),
        # a trace replays on the node that preempts, but without a host tier (vLLM has none)
        (["mooncake-conversation", "--requests", "4"], "--host-tier off"),
    ],
)
def test_inputs_a_node_that_preempts_cannot_run_are_refused_before_anything_runs(
    workload: list[str], words: str
) -> None:
    result = _bench("--workload", *workload, "--combo", THRESHOLD, *FAST)
    assert result.exit_code == 2, result.output
    assert words in result.output and "Traceback" not in result.output


def test_a_sweep_unit_runs_a_combo_that_preempts() -> None:
    scenario = {
        "name": "tight",
        "page_size": 16,
        "chunked_prefill_size": 64,
        "pool": {"free_tokens": 160},
        "kv_release_rounds": 0,
        "requests": [{"id": "A", "prompt_tokens": 120}, {"id": "B", "prompt_tokens": 120}],
    }
    combo = "vllm/vllm-threshold:32/none/default/fcfs/vllm"
    out = simulate_unit({"scenario": scenario, "combo": combo})
    assert out["node"] == "preempting" and out["oom"] is None
    assert out["completed"] == ["A", "B"] and out["preemptions"] == 1
    # B's 64 tokens are thrown away; 2 of its cached blocks survive, so 24 + 64 + ... again
    assert out["tokens"]["computed"] > 240 and out["tokens"]["cached"] == 32


def test_a_torch_out_of_memory_in_the_forward_is_a_crash_as_on_sglangs_node(
    monkeypatch: pytest.MonkeyPatch, registry: PolicyRegistry, store: PrefixKV
) -> None:
    from policykit.harness.engine import ModelForward

    calls = {"n": 0}
    real = ModelForward.run

    def run_then_oom(self, plan, pool, placed):
        calls["n"] += 1
        if calls["n"] > 3:  # after the prefix warm-up and a round or two
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(self, plan, pool, placed)

    monkeypatch.setattr(ModelForward, "run", run_then_oom)
    run = run_combo(from_workload(PREEMPTING), registry.resolve(THRESHOLD), store)
    row = run.row
    assert row["status"] == "crashed" and row["crash"]["kind"] == "torch"
    assert (
        row["crash"]["round"] == row["rounds"] and row["outcomes"]["crash_round"] == row["rounds"]
    )


def test_sweep_refuses_a_scenario_a_node_that_preempts_cannot_map_before_anything_runs() -> None:
    args = ["sweep", "--scenarios", "seed-abc", "--combo", THRESHOLD, "--workers", "1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "host tier" in result.output and "Traceback" not in result.output
