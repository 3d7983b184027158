"""Benchmark: one vLLM ``schedule()`` (the real v1 scheduler on a CPU) with and without the plugin.

Run with ``pytest tests/upstream/test_vllm_plugin_bench.py --benchmark-enable -s``. Both sides are
``AsyncScheduler`` (vLLM's default class) against the plugin's ``PolicyAsyncScheduler`` under
vLLM's own combo, each with its own state in the same process, kept steady: prompts of about
1000 tokens under an 8192-token step budget, so a step admits eight whole and chunks the ninth;
after each step the finished prefills are released and the waiting queue is topped back up to
1, 64 or 4096 requests. Only ``schedule()`` is timed. The target is the plugin at most 1.2x.

``test_schedule_one_step`` gives pytest-benchmark's rows, one side after the other;
``test_plugin_over_vllm`` alternates the sides every few steps, so a shared machine's load falls
on both alike, and prints each side's median CPU time per step and their ratio.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import time
from typing import Any

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("the policykit[vllm] extra is not installed", allow_module_level=True)

from policykit.conformance.vllm import driver
from policykit.conformance.vllm.engine import (
    SchedulerKnobs,
    VllmUnavailable,
    build_scheduler,
    load,
)

SIZES = [1, 64, 4096]
PAGE = 16
BUDGET = 8192


@pytest.fixture(scope="module", autouse=True)
def _vllm() -> None:
    try:
        load()
    except VllmUnavailable as exc:
        pytest.skip(str(exc))
    os.environ["POLICYKIT_STARTUP_CHECK"] = "0"
    os.environ.pop("POLICYKIT_COMBO", None)


class Stepper:
    """One scheduler kept at ``waiting`` queued requests, step after step."""

    def __init__(self, cls: type, waiting: int) -> None:
        self.sched = build_scheduler(
            block_size=PAGE,
            num_blocks=2048,
            budget=BUDGET,
            max_model_len=2048,
            max_num_seqs=256,
            knobs=SchedulerKnobs(),
            scheduler_cls=cls,
        )
        self.hasher = driver._block_hasher(PAGE)
        self.waiting = waiting
        self.added = 0
        self.output: Any = None
        self.top_up()

    def top_up(self) -> None:
        while len(self.sched.waiting) < self.waiting:
            self.added += 1
            length = 1000 + self.added % 97
            tokens = driver._prompt(self.added, length)
            rid = f"r{self.added}"
            self.sched.add_request(
                driver._make_request(rid, tokens, self.hasher, float(self.added))
            )

    def schedule(self) -> None:
        self.output = self.sched.schedule()

    def finish(self) -> None:
        """What the model runner and the engine do between two steps: the finished prefills
        sample their token and give their KV back; new requests arrive. Once per step."""
        out, sched = self.output, self.sched
        if out is None:
            return
        self.output = None
        ids = list(out.num_scheduled_tokens)
        done = driver._prefills_done(sched, ids)
        sched.update_from_output(out, driver._runner_output(sched, ids, done, done))
        self.top_up()

    def step(self) -> None:
        self.schedule()
        self.finish()


def _classes() -> tuple[type, type]:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from policykit.integrations.vllm import PolicyAsyncScheduler

    return AsyncScheduler, PolicyAsyncScheduler


@pytest.mark.parametrize("waiting", SIZES)
@pytest.mark.parametrize("side", ["vllm", "plugin"])
def test_schedule_one_step(benchmark, waiting, side):
    if waiting > 64 and not benchmark.enabled:
        pytest.skip("filling a 4096-request queue takes seconds: run with --benchmark-enable")
    benchmark.group = f"vllm schedule(), {waiting} waiting"
    own, plugin = _classes()
    stepper = Stepper(plugin if side == "plugin" else own, waiting)
    for _ in range(3):
        stepper.step()
    benchmark.pedantic(stepper.schedule, setup=stepper.finish, rounds=200)
    assert stepper.output.num_scheduled_tokens


@pytest.mark.parametrize("waiting", SIZES)
def test_plugin_over_vllm(benchmark, waiting):
    if not benchmark.enabled:
        pytest.skip("a benchmark: run with --benchmark-enable")
    own, plugin = _classes()
    sides = {False: Stepper(own, waiting), True: Stepper(plugin, waiting)}
    times: dict[bool, list[float]] = {False: [], True: []}
    blocks, per_block = 200, 5
    for block in range(blocks):
        for use_plugin in (block % 2 == 0, block % 2 == 1):
            stepper = sides[use_plugin]
            stepper.step()  # warm this side's code and data again
            for _ in range(per_block):
                start = time.thread_time()
                stepper.schedule()
                times[use_plugin].append(time.thread_time() - start)
                stepper.finish()
    vllm_alone, with_plugin = statistics.median(times[False]), statistics.median(times[True])
    steps = [s.sched.get_request_counts() for s in sides.values()]
    assert steps[0] == steps[1]  # both sides decided alike throughout
    print(
        f"\nvllm schedule(), {waiting} waiting: vLLM {vllm_alone * 1e6:.1f} us, plugin "
        f"{with_plugin * 1e6:.1f} us (median CPU time of {blocks * per_block} steps each, "
        f"interleaved): {with_plugin / vllm_alone:.3f}x"
    )
