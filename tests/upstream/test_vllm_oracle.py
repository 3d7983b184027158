"""vLLM 0.33.0's real v1 scheduler, driven as a prefill-only node: hand-derived decisions.

Every expectation below is worked out from vLLM's scheduling rules with 16-token blocks (the
pool's sizes are in usable blocks; vLLM's null block is extra), and the comments show the
arithmetic. Skips cleanly when the ``vllm`` extra is not installed.
"""

from __future__ import annotations

import json

import pytest

from policykit.errors import ScenarioError
from policykit.scenario import parse_scenario


@pytest.fixture(scope="module")
def oracle(vllm_oracle):
    return vllm_oracle


def scenario(requests, *, pool=160, chunk=64, release=None, evictable=0):
    return parse_scenario(
        {
            "name": "oracle-test",
            "page_size": 16,
            "chunked_prefill_size": chunk,
            "pool": {"free_tokens": pool, "evictable_tokens": evictable},
            "kv_release_rounds": release,
            "requests": requests,
        }
    )


def rows(trace):
    return [(s.scheduled, s.preempted, s.completed, s.released, s.blocks_used) for s in trace.steps]


def test_chunking_full_sequence_reservation_and_release(oracle):
    # 10 blocks, budget 64. A=100 tokens (7 blocks), B=40 (3), C=30 (2) arrives in round 3.
    trace = oracle.drive(
        scenario(
            [
                {"id": "A", "prompt_tokens": 100},
                {"id": "B", "prompt_tokens": 40},
                {"id": "C", "prompt_tokens": 30, "arrival_round": 3},
            ],
            release=2,
        )
    )
    assert rows(trace) == [
        ({"A": 64}, [], [], [], 4),  # the budget is spent on A's first chunk
        ({"A": 36, "B": 28}, [], ["A"], [], 9),  # B's whole 3 blocks fit: admitted with 28
        # C needs 2 blocks for its whole prompt and 0 are free after B's last block: it waits
        ({"B": 12}, [], ["B"], ["A"], 10),
        ({"C": 30}, [], ["C"], ["B"], 5),  # A's 7 blocks came back at the end of round 3
        ({}, [], [], ["C"], 2),  # an idle round still delivers C's transfer
    ]
    assert trace.finished_round == {"A": 2, "B": 3, "C": 4}
    assert trace.unfinished == []


def test_a_run_cut_short_names_the_unfinished_requests(oracle):
    trace = oracle.drive(scenario([{"id": "A", "prompt_tokens": 100}]), max_rounds=1)
    assert [s.scheduled for s in trace.steps] == [{"A": 64}]
    assert trace.unfinished == ["A"]


def test_preemption_when_the_pool_cannot_hold_two_long_prompts(oracle):
    # 10 blocks, two 120-token prompts (8 blocks each), threshold 32: both run 32 a round
    trace = oracle.drive(
        scenario([{"id": "A", "prompt_tokens": 120}, {"id": "B", "prompt_tokens": 120}], release=0),
        oracle.SchedulerKnobs(long_prefill_token_threshold=32),
    )
    assert rows(trace) == [
        ({"A": 32, "B": 32}, [], [], [], 4),  # each fits whole (8 of 10 free) at admission
        ({"A": 32, "B": 32}, [], [], [], 8),
        # A takes the last 2 blocks; B cannot get 2, so vLLM preempts running[-1]: B itself
        ({"A": 32}, ["B"], [], [], 6),
        # B's 4 freed blocks stay cached; A's 2 new ones evict 2 of them. B does not fit whole
        ({"A": 24}, [], ["A"], ["A"], 8),
        # alone, B has no threshold; its 2 surviving cached blocks (32 tokens) are a prefix hit
        ({"B": 64}, [], [], [], 6),
        ({"B": 24}, [], ["B"], ["B"], 8),
    ]
    assert trace.preemptions() == [(3, "B")]


def test_long_prefill_threshold_is_off_for_a_lone_request(oracle):
    trace = oracle.drive(
        scenario([{"id": "A", "prompt_tokens": 100}], pool=320),
        oracle.SchedulerKnobs(long_prefill_token_threshold=32),
    )
    assert [s.scheduled for s in trace.steps] == [{"A": 64}, {"A": 36}]


def test_full_sequence_reservation_off_admits_on_the_first_chunk(oracle):
    # budget 48: A (120 tokens) takes 3 rounds; in round 3 B gets the 24 left over although
    # only 2 blocks are free and its whole prompt needs 8 -- reservation on would keep it out
    requests = [{"id": "A", "prompt_tokens": 120}, {"id": "B", "prompt_tokens": 120}]
    off = oracle.drive(
        scenario(requests, chunk=48, release=0),
        oracle.SchedulerKnobs(scheduler_reserve_full_isl=False),
    )
    assert [s.scheduled for s in off.steps][:3] == [{"A": 48}, {"A": 48}, {"A": 24, "B": 24}]
    assert off.steps[2].blocks_used == 10
    on = oracle.drive(scenario(requests, chunk=48, release=0))
    assert on.steps[2].scheduled == {"A": 24}


def test_device_prefixes_are_prefix_cache_hits(oracle):
    # 13 blocks: 10 free, A's 32-token prefix evictable (2), B's 16-token prefix pinned (1)
    trace = oracle.drive(
        scenario(
            [
                {"id": "A", "prompt_tokens": 100, "device_prefix_tokens": 32},
                {
                    "id": "B",
                    "prompt_tokens": 40,
                    "device_prefix_tokens": 16,
                    "device_prefix_pinned": True,
                },
            ],
            evictable=32,
        )
    )
    assert trace.num_blocks == 13
    # A computes 64 of its 68 uncached tokens: 6 blocks, plus the pinned owner's 1
    assert rows(trace) == [
        ({"A": 64}, [], [], [], 7),
        ({"A": 4, "B": 24}, [], ["A", "B"], [], 10),  # B shares its first block with the owner
    ]


def test_trace_is_json_with_a_schema(oracle):
    trace = oracle.drive(scenario([{"id": "A", "prompt_tokens": 20}]))
    data = json.loads(json.dumps(trace.to_json()))
    assert data["schema"] == oracle.SCHEMA
    assert data["created"]
    assert data["steps"][0]["scheduled"] == {"A": 20}


@pytest.mark.parametrize(
    ("extra", "pool", "word"),
    [
        ({"host_prefix_tokens": 16}, {}, "host tier"),
        ({}, {"swa_free_tokens": 64, "sliding_window": 32}, "hybrid SWA"),
    ],
)
def test_fields_without_a_vllm_meaning_are_refused(oracle, extra, pool, word):
    data = {
        "page_size": 16,
        "chunked_prefill_size": 64,
        "pool": {"free_tokens": 160, **pool},
        "requests": [{"id": "A", "prompt_tokens": 100, **extra}],
    }
    with pytest.raises(ScenarioError, match=word):
        oracle.drive(parse_scenario(data))
