"""Named workloads are seeded, sized to the pool, and have the shape their name promises."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from policykit.harness.build import PrefixKV
from policykit.harness.runner import from_workload, resolve_input, run_combo
from policykit.harness.workloads import (
    GENERATORS,
    RequestSpec,
    Workload,
    WorkloadError,
    generate,
    load_trace,
    workload_config,
)
from policykit.registry import PolicyRegistry


@pytest.mark.parametrize("name", sorted(GENERATORS))
@pytest.mark.parametrize("pool", [8192, 65536])
def test_generators_fit_the_pool(name: str, pool: int) -> None:
    w = generate(name, pool, seed=1)
    assert w.pool_tokens == pool and w.config.page_size == 64
    assert w.requests
    for r in w.requests:
        assert 0 < r.prompt_tokens <= pool, r
        assert r.device_prefix_tokens % 64 == 0
        assert r.device_prefix_tokens + r.host_prefix_tokens < r.prompt_tokens
    assert generate(name, pool, seed=1) == w


def test_seeds_change_the_requests() -> None:
    assert generate("mixed", 8192, seed=1) != generate("mixed", 8192, seed=2)


def test_prefix_groups_share_tokens() -> None:
    w = generate("shared-prefix", 8192)
    tokens = w.tokens()
    by_group: dict[str, list[tuple[int, ...]]] = {}
    for r in w.requests:
        by_group.setdefault(r.prefix_group, []).append(tokens[r.id][: r.prefix_tokens])
    for prefixes in by_group.values():
        assert len(set(prefixes)) == 1
    firsts = {p[0][0] for p in by_group.values()}
    assert len(firsts) == len(by_group)  # groups do not share tokens with each other
    suffixes = [tokens[r.id][r.prefix_tokens :] for r in w.requests]
    assert len({s[0] for s in suffixes}) == len(suffixes)


def test_host_hit_heavy_is_seed_000_shaped() -> None:
    w = generate("host-hit-heavy", 8192)
    hits = [r for r in w.requests if r.host_prefix_tokens]
    assert len(hits) >= 12
    for r in hits:
        assert r.prompt_tokens - r.host_prefix_tokens <= 192  # fits the checkpoint gap
        assert r.host_prefix_tokens >= 0.4 * 8192 - 64


def test_host_hit_heavy_crashes_unsafe_and_completes_safe(
    registry: PolicyRegistry, store: PrefixKV
) -> None:
    """The acceptance criterion, on the real model at the smallest supported pool."""
    bench = from_workload(generate("host-hit-heavy", 2048))
    unsafe = registry.resolve("admission=sglang,chunking=sglang,alignment=checkpoint:256")
    row = run_combo(bench, unsafe, store).row
    assert row["status"] == "crashed" and row["crash"]["kind"] == "full-pool"
    assert row["crash"]["round"] >= 2  # admitted fine, ran out of memory rounds later
    for chunking in ("sglang", "defer", "swa-reserve"):
        for align in ("page", "checkpoint:256", "truncation:192"):
            combo = registry.resolve(
                f"admission=reserve-tail,chunking={chunking},alignment={align}"
            )
            row = run_combo(bench, combo, store).row
            assert row["status"] == "completed", (combo, row["crash"])
            assert row["requests"]["completed"] == len(bench.arrivals)


def test_seed_incident_crashes_like_production(registry: PolicyRegistry, store: PrefixKV) -> None:
    bench = from_workload(generate("seed-incident", 8192))
    unsafe = registry.resolve("admission=sglang,chunking=sglang,alignment=checkpoint:256")
    row = run_combo(bench, unsafe, store).row
    assert row["crash"] is not None and row["crash"]["request"] == "1keim"
    safe = registry.resolve("admission=reserve-tail,chunking=sglang,alignment=checkpoint:256")
    assert run_combo(bench, safe, store).row["crash"] is None


def test_unknown_workload_and_small_pool() -> None:
    with pytest.raises(WorkloadError, match="no workload named 'nope'"):
        generate("nope", 8192)
    with pytest.raises(WorkloadError, match="smaller than one 64-token page"):
        generate("mixed", 63)
    with pytest.raises(WorkloadError, match="at least 8192"):
        generate("seed-incident", 4096)


def test_bundled_scenarios_resolve() -> None:
    bench = resolve_input("seed-abc", 8192)
    assert set(bench.arrivals) == {"A", "B", "C"}


# --- traces ----------------------------------------------------------------------------------
def write(tmp_path: Path, lines: list) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_trace_round_trip(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        [
            {"format": "policykit-trace", "version": 1, "name": "mine", "kv_release_rounds": 1},
            {"id": "a", "arrival_round": 2, "prompt_tokens": 300},
            {
                "id": "b",
                "prompt_tokens": 500,
                "prefix_group": "sys",
                "prefix_tokens": 256,
                "device_prefix_tokens": 256,
            },
            {
                "id": "c",
                "arrival_round": 1,
                "prompt_tokens": 900,
                "prefix_group": "sys",
                "prefix_tokens": 256,
                "host_prefix_tokens": 600,
            },
        ],
    )
    w = load_trace(path, 4096)
    assert w.name == "mine" and w.config.kv_release_rounds == 1
    assert [r.id for r in w.requests] == ["b", "c", "a"]  # by arrival
    t = w.tokens()
    assert t["b"][:256] == t["c"][:256] and t["b"][256] != t["c"][256]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({"id": "x", "prompt_tokens": -5}, "'prompt_tokens' must be at least 1, got -5"),
        ({"id": "x", "prompt_tokens": 50, "arrival_round": -1}, "'arrival_round' must be at least"),
        ({"id": "x", "prompt_tokens": 500, "host_prefix_tokens": -64}, "at least 0, got -64"),
        ({"id": "x"}, "missing the required field 'prompt_tokens'"),
        ({"id": "x", "prompt_tokens": 5, "colour": 1}, "unknown field"),
        ({"id": "x", "prompt_tokens": 500, "device_prefix_tokens": 100}, "whole number"),
        ({"id": "x", "prompt_tokens": 500, "host_prefix_tokens": 500}, "at least one token"),
        ({"id": "x", "prompt_tokens": 500, "prefix_tokens": 20}, "needs a 'prefix_group'"),
        ({"id": "", "prompt_tokens": 5}, "non-empty string"),
        ({"id": "x", "prompt_tokens": 5.5}, "must be an integer"),
    ],
)
def test_bad_trace_lines(tmp_path: Path, line: dict, message: str) -> None:
    path = write(tmp_path, [{"id": "ok", "prompt_tokens": 10}, line])
    with pytest.raises(WorkloadError, match="line 2") as err:
        load_trace(path, 4096)
    assert message in str(err.value)


def test_bad_trace_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(WorkloadError, match="not valid JSON"):
        load_trace(bad, 4096)
    with pytest.raises(WorkloadError, match="Cannot read"):
        load_trace(tmp_path / "missing.jsonl", 4096)
    empty = write(tmp_path, [{"format": "policykit-trace", "version": 1}])
    with pytest.raises(WorkloadError, match="no requests"):
        load_trace(empty, 4096)
    dup = write(tmp_path, [{"id": "a", "prompt_tokens": 5}, {"id": "a", "prompt_tokens": 6}])
    with pytest.raises(WorkloadError, match="repeats"):
        load_trace(dup, 4096)
    late = write(tmp_path, [{"id": "a", "prompt_tokens": 5}, {"format": "policykit-trace"}])
    with pytest.raises(WorkloadError, match="first line"):
        load_trace(late, 4096)
    wrong = write(tmp_path, [{"format": "other", "version": 1}])
    with pytest.raises(WorkloadError, match="policykit-trace"):
        load_trace(wrong, 4096)


def test_a_request_failed_by_a_policy_fault_is_counted(store: PrefixKV) -> None:
    """A policy that raises on one prompt fails that request; the row says so, and the others
    are still served (the run is not reported as clean by leaving it out)."""
    from tests.reliability.faults import _Picky, registry_with_misbehaving

    bench = from_workload(
        Workload(
            name="one-bad",
            description="one prompt the admission policy raises on",
            pool_tokens=1024,
            config=workload_config(256),
            requests=(
                RequestSpec("ok1", 100, 0),
                RequestSpec("bad", _Picky.BAD_PROMPT, 0),
                RequestSpec("ok2", 120, 1),
            ),
        )
    )
    combo = registry_with_misbehaving().resolve("admission=raising")
    row = run_combo(bench, combo, store).row
    assert row["requests"]["failed"] == 1
    assert row["requests"]["completed"] == 2
    assert row["requests"]["starved"] == 0
