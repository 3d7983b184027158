"""Production traces: the loaders, hash_ids as shared prefixes, the clock, grouping."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from policykit.config import EngineConfig
from policykit.harness.presets import get_preset
from policykit.harness.roofline import GPUS
from policykit.harness.trace_formats import (
    BUNDLED,
    is_trace_workload,
    load_bundled,
    load_trace_file,
)
from policykit.harness.trace_groups import (
    behaviour_key,
    group_identical,
    replay_grouped,
    skip_twins,
    unit_groups,
)
from policykit.harness.trace_host import BlockHostStore
from policykit.harness.trace_replay import ReplayConfig, TraceClock, replay, replay_shadowed
from policykit.harness.traces import BLOCK_TOKENS, BlockTokens, Trace, TraceRequest
from policykit.harness.workloads import WorkloadError
from policykit.pool import TokenPool
from policykit.prefix_cache import PrefixCache

LLAMA = get_preset("llama3-8b")


def _mooncake(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _row(ts: int, n: int, blocks: list[int], out: int = 10) -> dict:
    return {"timestamp": ts, "input_length": n, "output_length": out, "hash_ids": blocks}


# --- loaders ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_every_bundled_trace_loads_with_its_row_count(name: str) -> None:
    trace = load_bundled(name)
    expected = {
        "mooncake-conversation": 12_031,
        "mooncake-synthetic": 3_993,
        "azure-code": 8_819,
        "azure-conv": 19_366,
    }[name]
    assert len(trace.requests) == expected
    assert trace.citation
    arrivals = [r.arrival_s for r in trace.requests]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0


def test_mooncake_conversation_reuse_is_the_published_36_6_percent() -> None:
    assert load_bundled("mooncake-conversation").reusable_block_share() == pytest.approx(
        0.366, abs=0.0005
    )


def test_azure_traces_have_no_prefixes_and_invent_none() -> None:
    trace = load_bundled("azure-code").head(500)
    assert not trace.has_prefixes
    blocks = [b for r in trace.requests for b in r.blocks]
    assert len(blocks) == len(set(blocks))
    assert trace.reusable_block_share() == 0.0


def test_mooncake_file_plain_and_gzip(tmp_path: Path) -> None:
    rows = [_row(0, 700, [0, 1]), _row(1500, 600, [0, 2])]
    plain = _mooncake(tmp_path / "t.jsonl", rows)
    packed = tmp_path / "t.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    for path in (plain, packed):
        assert is_trace_workload(str(path))
        trace = load_trace_file(path)
        assert trace.format == "mooncake" and trace.has_prefixes
        assert [r.arrival_s for r in trace.requests] == [0.0, 1.5]
        assert trace.requests[1].blocks == (0, 2)


def test_azure_csv_times_are_seconds_from_the_first(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,4808,10\n"
        "2023-11-16 18:17:04.0319600,3180,8\n",
        encoding="utf-8",
    )
    trace = load_trace_file(path)
    assert trace.format == "azure" and not trace.has_prefixes
    assert trace.requests[1].arrival_s == pytest.approx(0.052, abs=1e-6)
    assert [r.prompt_tokens for r in trace.requests] == [4808, 3180]


def test_a_policykit_trace_is_not_a_timed_trace(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "a", "prompt_tokens": 100}\n', encoding="utf-8")
    assert not is_trace_workload(str(path))


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"timestamp": 0, "input_length": 700, "output_length": 1}\n', "hash_ids"),
        ('{"input_length": 700, "output_length": 1, "hash_ids": [0, 1]}\n', "timestamp"),
        (
            '{"timestamp": 0, "input_length": 700, "output_length": 1, "hash_ids": [0]}\n',
            "2 blocks",
        ),
        ('{"timestamp": 0, "input_length": "x", "output_length": 1, "hash_ids": [0]}\n', "integer"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [-1]}\n', "non-neg"),
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.9,5\n", "GeneratedTokens"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,1\n", "TIMESTAMP"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9,five,1\n", "integers"),
        ("hello\n", "Cannot tell the format"),
    ],
)
def test_bad_trace_input_names_the_problem(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(WorkloadError, match=words):
        load_trace_file(path)


def test_a_hash_id_must_mean_one_prefix(tmp_path: Path) -> None:
    path = _mooncake(tmp_path / "t.jsonl", [_row(0, 700, [0, 1]), _row(1, 700, [2, 1])])
    with pytest.raises(WorkloadError, match="same prefix everywhere"):
        load_trace_file(path)


def test_bench_refuses_a_bad_trace_with_exit_2(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from policykit.cli import main

    path = _mooncake(tmp_path / "t.jsonl", [_row(0, 700, [0])])
    result = CliRunner().invoke(main, ["bench", "--workload", str(path), "--device", "cpu"])
    assert result.exit_code == 2
    assert "hash_ids" in result.output and "Traceback" not in result.output


# --- hash_ids -> shared prefixes -----------------------------------------------------------------
def test_block_tokens_share_exactly_the_shared_blocks() -> None:
    a = BlockTokens((7, 8, 9), 1200)
    b = BlockTokens((7, 8, 4), 1100)
    assert len(a) == 1200 and a[0] == 7 * BLOCK_TOKENS and a[513] == 8 * BLOCK_TOKENS + 1
    assert a[: 2 * BLOCK_TOKENS] == b[: 2 * BLOCK_TOKENS]
    assert a[2 * BLOCK_TOKENS] != b[2 * BLOCK_TOKENS]
    assert tuple(a) == a[:] and len(tuple(a)) == 1200
    assert a[500:530] == tuple(range(7 * 512 + 500, 7 * 512 + 512)) + tuple(
        range(8 * 512, 8 * 512 + 18)
    )


def test_the_radix_cache_matches_the_shared_blocks_only() -> None:
    pool = TokenPool(8192, 64)
    cache = PrefixCache(pool)
    first = BlockTokens((1, 2, 3), 1536)
    cache.insert(first, pool.alloc(24))
    assert cache.match(BlockTokens((1, 2, 5), 1536))[0] == 1024
    assert cache.match(BlockTokens((9, 2, 3), 1536))[0] == 0


def test_the_host_store_holds_what_was_computed() -> None:
    store = BlockHostStore(BLOCK_TOKENS)
    assert store  # empty, but still the node's host tier
    store.computed((1, 2, 3), 1100)  # blocks 1 and 2 whole, 3 partial
    run = store.lookup(BlockTokens((1, 2, 7), 1500), 512)
    assert run is not None and (run.start, run.end) == (512, 1024)
    assert store.lookup(BlockTokens((4, 2), 1000), 0) is None
    assert store.loadable(BlockTokens((1, 2, 7), 1500), 0, 64) == 1024


# --- the clock ----------------------------------------------------------------------------------
def _trace(rows: list[tuple[float, int, tuple[int, ...]]]) -> Trace:
    requests = tuple(TraceRequest(f"r{i}", t, n, 1, b) for i, (t, n, b) in enumerate(rows))
    return Trace("t", "test", "test", "mooncake", requests, has_prefixes=True)


def test_the_clock_releases_requests_when_their_time_has_come() -> None:
    clock = TraceClock(_trace([(0.0, 64, (0,)), (1.0, 64, (1,)), (3.0, 64, (2,))]), 1.0)
    assert [r.id for r in clock.due()] == ["r0"]
    clock.advance(0.5)
    assert clock.due() == []
    clock.wait_for_next()
    assert clock.now == 1.0 and [r.id for r in clock.due()] == ["r1"]
    half = TraceClock(_trace([(0.0, 64, (0,)), (3.0, 64, (2,))]), 0.5)
    half.wait_for_next()
    half.due()
    half.wait_for_next()
    assert half.now == 1.5


def _config(pool: int = 16384, scale: float = 1.0, **kw) -> ReplayConfig:
    engine = EngineConfig(page_size=64, chunked_prefill_size=2048, kv_release_rounds=2)
    return ReplayConfig(pool, engine, LLAMA, GPUS["H200"], time_scale=scale, **kw)


def test_a_replay_is_deterministic_and_covers_every_request(registry) -> None:
    trace = load_bundled("mooncake-conversation").head(40)
    combo = registry.resolve("sglang/sglang/page")
    config = _config(pool=262_144)
    one, two = replay(trace, combo, config), replay(trace, combo, config)
    one.pop("scheduler_seconds"), two.pop("scheduler_seconds")
    assert one == two
    req = one["outcomes"]["requests"]
    assert req["total"] == 40 and req["completed"] + req["rejected"] == 40
    assert one["predicted"]["seconds"] > 0
    assert one["outcomes"]["ttft_rounds"]["p50"] >= 1


def test_shared_blocks_are_hits_and_the_host_store_loads_them_back(registry) -> None:
    # r2 repeats r0's first two blocks a minute later; r1 needs r0's cached pages meanwhile,
    # so only the host store still has them
    rows = [(0.0, 1100, (0, 1, 2)), (0.0, 2000, (5, 6, 7, 8)), (60.0, 1100, (0, 1, 9))]
    combo = registry.resolve("sglang/sglang/page")
    cold = replay(_trace(rows), combo, _config(pool=2304, host_tier="off"))
    warm = replay(_trace(rows), combo, _config(pool=2304))
    assert cold["outcomes"]["load_back_tokens"] == 0
    assert cold["outcomes"]["recomputed_tokens"] == 1024
    assert warm["outcomes"]["load_back_tokens"] == 1024
    assert warm["outcomes"]["recomputed_tokens"] == 0
    roomy = replay(_trace(rows), combo, _config(pool=8192, host_tier="off"))
    assert roomy["outcomes"]["cached_tokens"] == 1024


def test_compressing_time_raises_the_wait(registry) -> None:
    trace = load_bundled("mooncake-conversation").head(60)
    combo = registry.resolve("sglang/sglang/page")
    slow = replay(trace, combo, _config(pool=262_144, scale=4.0))
    fast = replay(trace, combo, _config(pool=262_144, scale=0.05))
    assert fast["outcomes"]["ttft_rounds"]["p99"] > slow["outcomes"]["ttft_rounds"]["p99"]
    assert fast["predicted"]["ttft_s"]["p99"] > slow["predicted"]["ttft_s"]["p99"]


# --- grouping -----------------------------------------------------------------------------------
def test_identical_combos_share_one_group() -> None:
    base = {"status": "completed", "crash": None, "outcomes": {"rounds": 3}, "predicted": {}}
    rows = [
        {**base, "combo": "a", "scheduler_seconds": 1.0},
        {**base, "combo": "b", "scheduler_seconds": 9.0},  # wall time is not behaviour
        {**base, "combo": "c", "outcomes": {"rounds": 4}},
    ]
    groups = group_identical(rows)
    assert [g["combos"] for g in groups] == [["a", "b"], ["c"]]


def test_fcfs_follows_fcfs_skip_and_a_sorting_queue_leads_alone(registry) -> None:
    combos = [
        registry.resolve(c)
        for c in (
            "sglang/sglang/page",
            "sglang/sglang/page/default/lpm",
            "sglang/sglang/page/default/fcfs-skip",
            "sglang/sglang/checkpoint:256",
        )
    ]
    groups = [(str(a), [str(f) for f in b]) for a, b in skip_twins(combos)]
    assert groups == [
        ("sglang/sglang/page/default/lpm", []),
        ("sglang/sglang/page/default/fcfs-skip", ["sglang/sglang/page"]),
        ("sglang/sglang/checkpoint:256", []),  # its skip twin is not among the combos
    ]


@pytest.mark.parametrize("prompt, shared", [(1000, True), (2240, False)])
def test_fcfs_carries_fcfs_skips_replay_only_when_nothing_was_skipped(
    registry, prompt: int, shared: bool
) -> None:
    """A 2,240-token prompt never fits a 2,304-token pool under ``sglang`` admission:
    ``fcfs-skip`` rejects it for good, ``fcfs`` blocks behind it, so ``fcfs`` replays alone."""
    trace = _trace([(0.0, prompt, (0, 1, 2, 3, 4)), (0.0, 100, (9,))])
    fcfs, skip = (
        registry.resolve(f"sglang/sglang/page/default/{q}") for q in ("fcfs", "fcfs-skip")
    )
    config = _config(pool=2304)
    replayed: list[str] = []

    def one(combo, shadows, _done):
        replayed.append(str(combo))
        return replay_shadowed(trace, combo, config, shadows)

    rows = replay_grouped([fcfs, skip], one)
    assert [r["combo"] for r in rows] == [str(fcfs), str(skip)]
    assert ("same_replay_as" in rows[0]) is shared
    assert replayed == [str(skip)] if shared else [str(skip), str(fcfs)]
    own = replay(trace, fcfs, config)  # what fcfs does on its own, either way
    assert behaviour_key(rows[0]) == behaviour_key(own)
    assert (behaviour_key(own) == behaviour_key(rows[1])) is shared


@pytest.mark.slow
def test_shadowed_rows_are_the_rows_each_combo_replays_alone(registry) -> None:
    """Every combo of the docs' settings on a slice that fills the pool: the rows that carry
    another's replay (shadows, skip twins) are exactly what replaying each alone gives, and
    both kinds of sharing happen, as do combos that replay alone."""
    trace = load_bundled("mooncake-conversation").head(150)
    config = _config(pool=65_536)
    combos = list(registry.all_combos(config.engine))
    rows: list[dict] = []
    for names in unit_groups(combos):
        unit = [registry.resolve(n) for n in names]
        rows += replay_grouped(
            unit, lambda c, shadows, _: replay_shadowed(trace, c, config, shadows)
        )
    by_name = {r["combo"]: r for r in rows}
    assert sorted(by_name) == sorted(str(c) for c in combos)
    for combo in combos:
        assert behaviour_key(by_name[str(combo)]) == behaviour_key(replay(trace, combo, config))
    why = [r["same_replay_as"]["why"] for r in rows if "same_replay_as" in r]
    assert any(w.startswith("planned every round") for w in why)
    assert any(w.startswith("its queue differs") for w in why)
    assert len(why) < len(rows) - 2  # the slice tells several behaviours apart


# --- the command and the prepared GPU script ----------------------------------------------------
def test_bench_on_a_trace_slice_writes_the_trace_document(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from policykit.cli import main

    out = tmp_path / "t.json"
    args = ["bench", "--workload", "mooncake-conversation", "--requests", "12", "--device", "cpu"]
    args += ["--combo", "sglang/sglang/page", "--combo", "sglang/sglang/checkpoint:256"]
    args += ["--pool-tokens", "65536", "--forward-requests", "1", "--out", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["schema"] == "policykit.trace-bench/1" and doc["created"]
    assert doc["trace"]["requests"] == 12 and doc["replay"]["pool_source"].startswith("given")
    assert "first 1 requests" in doc["provenance"]["forward"]
    for row in doc["combos"]:
        assert row["outcomes"]["requests"]["total"] == 12
        assert row["forward"]["matches_scheduler_replay"] is True
    assert sum(g["size"] for g in doc["groups"]) == 2


def test_trace_options_are_refused_for_a_round_based_workload() -> None:
    from click.testing import CliRunner

    from policykit.cli import main

    args = ["bench", "--workload", "mixed", "--device", "cpu", "--time-scale", "0.5"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "--time-scale" in result.output


def test_the_default_pool_is_plan_memory_on_the_gpu() -> None:
    from policykit.harness.trace_bench import planned_pool

    plan = planned_pool(LLAMA, GPUS["H200"])
    assert plan["pool_tokens"] == 849_920 and plan["chunked_prefill_size"] == 8192
    assert "plan-memory" in plan["source"]


def test_gpu_trace_dry_run_matches_the_scheduler_replay(tmp_path: Path) -> None:
    from policykit.harness import gpu_trace

    out = tmp_path / "gpu.json"
    assert gpu_trace.main(["--dry-run", "--combo", "sglang/sglang/page", "--json", str(out)]) == 0
    run = json.loads(out.read_text())["runs"][0]
    assert run["requests"] == gpu_trace.DRY_RUN_REQUESTS and run["matches_scheduler_replay"]
    assert run["computed_tokens"] > 0 and run["flops"] > 0
