"""Benchmarks (run with ``--benchmark-enable``): one planning round vs one forward round.

No timing is asserted. The scheduler share and its extrapolation to an 8B model at 8k-token
chunks are attached to the benchmark's ``extra_info`` and printed (``-s``): planning time is
measured here; the 8B forward time is the round's FLOPs (from the preset's shapes) divided by
the H200's bf16 dense peak at the 50% MFU target.
"""

from __future__ import annotations

import time

import pytest

from policykit.harness.build import PrefixKV, build_workload_node
from policykit.harness.metrics import H200_BF16_DENSE_TFLOPS
from policykit.harness.model import Chunk
from policykit.harness.presets import get_preset
from policykit.harness.workloads import generate
from policykit.node import PrefillNode
from policykit.plan import Plan
from policykit.planner import Planner
from policykit.registry import PolicyRegistry

POOL = 32768  # chunk budget 8192: the 8k-token chunk of the target


@pytest.fixture(scope="module")
def rounds(store: PrefixKV, registry: PolicyRegistry) -> tuple[Planner, PrefillNode, Plan]:
    """host-hit-heavy's first round at an 8192-token chunk budget: six waiting requests, host
    lookups, four admissions. Planning runs on an uncommitted node (so it can be repeated), the
    forward on a second node where the same plan was committed. Prefix KV values are skipped:
    they change neither a decision nor the time."""
    workload = generate("host-hit-heavy", POOL)
    combo = registry.resolve("admission=sglang,alignment=checkpoint:256")
    planning = build_workload_node(workload, store, with_kv=False)
    planning.arrive(1)
    planner = Planner(planning, combo)
    committed = build_workload_node(workload, store, with_kv=False)
    committed.arrive(1)
    plan = Planner(committed, combo).plan(1)
    committed.commit(plan)
    return planner, committed, plan


def _chunks(node: PrefillNode, plan: Plan, store: PrefixKV) -> list[Chunk]:
    model = store.model
    out = []
    for e in plan.batch:
        req = node.requests[e.request_id]
        slots = node.pool.slots(req.pages, 0, e.end)
        out.append(Chunk(model.token_ids(req.tokens[e.start : e.end]), e.start, slots, True))
    return out


def test_planning_round(benchmark, rounds) -> None:
    planner, _, plan = rounds
    replanned = benchmark(planner.plan, 1)
    assert replanned == plan and len(plan.batch) >= 3 and plan.rejected  # real admission work


def test_forward_round(benchmark, rounds, store: PrefixKV) -> None:
    _, node, plan = rounds
    chunks = _chunks(node, plan, store)
    assert sum(c.end - c.start for c in chunks) == sum(e.tokens for e in plan.batch) >= 4096
    logits = benchmark(store.model.forward, chunks, node.pool)
    assert all(x is not None for x in logits)


def _median(fn, repeat: int = 15) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def test_scheduler_share(benchmark, rounds, store: PrefixKV) -> None:
    planner, node, plan = rounds
    chunks = _chunks(node, plan, store)
    plan_s = _median(lambda: planner.plan(1))
    forward_s = _median(lambda: store.model.forward(chunks, node.pool), repeat=5)
    big = get_preset("llama3-8b")
    flops = sum(big.chunk_flops(e.start, e.end, sampled=int(e.kind.finishes)) for e in plan.batch)
    forward_8b_s = flops / (0.5 * H200_BF16_DENSE_TFLOPS * 1e12)
    info = {
        "batch_tokens": sum(e.tokens for e in plan.batch),
        "plan_ms": plan_s * 1e3,
        "tiny_forward_ms": forward_s * 1e3,
        "tiny_scheduler_share": plan_s / (plan_s + forward_s),
        "llama8b_round_tflop": flops / 1e12,
        "llama8b_forward_ms_at_50pct_mfu": forward_8b_s * 1e3,
        "llama8b_planning_share": plan_s / (plan_s + forward_8b_s),
    }
    benchmark.extra_info.update(info)
    print("\n" + "\n".join(f"{k}: {v:.4g}" for k, v in info.items()))
    benchmark(planner.plan, 1)
    assert info["llama8b_round_tflop"] > 0
