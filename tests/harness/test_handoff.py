"""Finished KV goes to the decode side intact, and slots are freed only once it got there."""

from __future__ import annotations

import pytest
import torch

from policykit.harness.build import PrefixKV, build_workload_node
from policykit.harness.engine import ModelForward
from policykit.harness.handoff import DecodeHandoff
from policykit.harness.runner import from_workload, run_combo
from policykit.harness.workloads import RequestSpec, Workload, workload_config
from policykit.registry import PolicyRegistry
from policykit.scheduler import Scheduler

WORKLOAD = Workload(
    "two",
    "a chunked request and a host hit",
    pool_tokens=1024,
    config=workload_config(256, kv_release_rounds=1),
    requests=(
        RequestSpec("a", 600, 0),
        RequestSpec("b", 300, 0, prefix_group="h", prefix_tokens=256, host_prefix_tokens=256),
    ),
)


def test_decode_side_receives_the_dense_kv(store: PrefixKV, registry: PolicyRegistry) -> None:
    node = build_workload_node(WORKLOAD, store)
    handoff = DecodeHandoff(node, keep=True)
    Scheduler(node, registry.resolve(None), forward=ModelForward(store.model, handoff)).run()
    assert set(handoff.transfers) == {"a", "b"}
    for rid, tokens in WORKLOAD.tokens().items():
        got = handoff.received(rid)
        dense = store.model.dense(store.model.token_ids(tokens)).kv
        assert got.shape[2] == len(tokens)
        for layer, (k, v) in enumerate(dense):
            assert torch.allclose(got[layer, 0], k, rtol=1e-4, atol=1e-5)
            assert torch.allclose(got[layer, 1], v, rtol=1e-4, atol=1e-5)
    assert handoff.bytes_sent == got.element_size() * sum(
        h.buffer.numel() for h in handoff.transfers.values()
    )


def test_slots_stay_held_while_the_transfer_is_in_flight(
    store: PrefixKV, registry: PolicyRegistry
) -> None:
    node = build_workload_node(WORKLOAD, store)
    handoff = DecodeHandoff(node)
    forward = ModelForward(store.model, handoff)
    in_flight = {"a", "b"}
    node.transfer_done = lambda req: req.id not in in_flight
    scheduler = Scheduler(node, registry.resolve(None), forward=forward)
    for _ in range(8):
        scheduler.step()
    assert {r.id for r in node.held} == {"a", "b"}  # due by rounds, but not transferred
    held_free = node.pool.free_tokens
    in_flight.clear()
    scheduler.step()
    assert not node.held
    assert node.pool.free_tokens + node.cache.evictable_tokens > held_free


def test_cpu_transfer_completes_at_once(store: PrefixKV, registry: PolicyRegistry) -> None:
    row = run_combo(from_workload(WORKLOAD), registry.resolve(None), store).row
    assert row["status"] == "completed"
    tokens_sent = sum(r.prompt_tokens for r in WORKLOAD.requests)
    assert row["handoff_bytes"] == tokens_sent * store.model.preset.kv_bytes_per_token(4)


def test_torch_oom_marks_the_combo_crashed(
    store: PrefixKV, registry: PolicyRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = store.model
    real = model.forward
    calls = {"n": 0}

    def flaky(chunks, pool):
        calls["n"] += 1
        if calls["n"] == 2:
            try:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            except torch.OutOfMemoryError as exc:
                raise RuntimeError("engine step failed") from exc
        return real(chunks, pool)

    monkeypatch.setattr(model, "forward", flaky)
    row = run_combo(from_workload(WORKLOAD), registry.resolve(None), store).row
    assert row["status"] == "crashed"
    assert row["crash"]["kind"] == "torch" and row["crash"]["round"] == 2
    assert "engine step failed" in row["crash"]["message"]


def test_other_errors_are_not_swallowed(
    store: PrefixKV, registry: PolicyRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(chunks, pool):
        raise ValueError("a bug")

    monkeypatch.setattr(store.model, "forward", broken)
    with pytest.raises(ValueError, match="a bug"):
        run_combo(from_workload(WORKLOAD), registry.resolve(None), store)
