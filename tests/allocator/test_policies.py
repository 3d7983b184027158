"""Allocator-phase policies against a fake facade: the switch, every skip, the windows."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading

import pytest

from policykit.cli.common import load_registry
from policykit.plugins.allocator_phase import (
    DefaultAllocator,
    ExpandableFromStart,
    PhasedExpandable,
)

from .fakes import GIB, FakeAllocator

USER = (
    "max_split_size_mb:256,roundup_power2_divisions:[256:1,512:2,>:4],"
    "garbage_collection_threshold:0.6"
)


def test_registered_with_the_builtins():
    _, registry = load_registry()
    names = {e.name for e in registry.entries("allocator-phase")}
    assert {"default", "expandable", "phased-expandable"} <= names
    assert isinstance(registry.make("allocator-phase", "phased-expandable"), PhasedExpandable)


def test_default_never_touches_the_allocator():
    policy = DefaultAllocator()
    policy.on_init()
    policy.on_serving()
    with policy.static_allocations():
        pass


def test_phased_switches_once_at_the_boundary_after_empty_cache():
    fake = FakeAllocator(USER, stats={"reserved_bytes.all.current": 5 * GIB})
    policy = PhasedExpandable(facade=fake)
    policy.on_init()
    assert fake.calls == []  # init runs on the default allocator
    policy.on_serving()
    policy.on_serving()
    assert fake.calls == ["empty_cache", f"set:{USER},expandable_segments:True"]


def test_expandable_switches_at_init():
    fake = FakeAllocator()
    policy = ExpandableFromStart(facade=fake)
    policy.on_init()
    assert fake.expandable
    policy.on_serving()
    assert fake.sets() == [True]


def test_settings_preserved_except_the_one_key():
    fake = FakeAllocator("expandable_segments:False,max_split_size_mb:128")
    policy = PhasedExpandable(facade=fake)
    policy.on_serving()
    assert fake.settings() == "expandable_segments:True,max_split_size_mb:128"
    with policy.static_allocations():
        assert fake.settings() == "expandable_segments:False,max_split_size_mb:128"
    assert fake.settings() == "expandable_segments:True,max_split_size_mb:128"


@pytest.mark.parametrize(
    ("fake", "reason"),
    [
        (FakeAllocator(available=False), "no CUDA device"),
        (FakeAllocator(backend="cudaMallocAsync"), "cudaMallocAsync"),
        (FakeAllocator("expandable_segments:True"), "already on"),
        (FakeAllocator(mempool_users=("symm-mem",)), "MemPool is in use (by symm-mem)"),
        (FakeAllocator(fail_set=True), "Failed to enable"),
    ],
    ids=["no-cuda", "backend", "already-on", "mempool", "set-raises"],
)
def test_every_skip_keeps_the_default_and_logs_once(fake, reason, caplog):
    policy = PhasedExpandable(facade=fake)
    with caplog.at_level(logging.INFO, logger="policykit.memory.allocator"):
        policy.on_init()
        policy.on_serving()
        policy.on_serving()
        with policy.static_allocations():
            pass
    assert not policy.switch.enabled
    assert [c for c in fake.calls if c.startswith("set:")] == []
    hits = [r for r in caplog.records if reason in r.getMessage()]
    assert len(hits) == 1, caplog.text


def test_failing_set_leaves_the_default_settings():
    fake = FakeAllocator(USER, fail_set=True)
    policy = PhasedExpandable(facade=fake)
    policy.on_serving()
    assert fake.settings() == USER
    assert not fake.expandable


def test_window_restores_on_normal_exit_and_on_exception():
    fake = FakeAllocator()
    policy = PhasedExpandable(facade=fake)
    policy.on_serving()
    with policy.static_allocations():
        assert not fake.expandable
    assert fake.expandable
    with pytest.raises(ZeroDivisionError), policy.static_allocations():
        assert not fake.expandable
        _ = 1 / 0
    assert fake.expandable
    assert fake.sets() == [True, False, True, False, True]


def test_nested_windows_switch_back_only_when_the_last_closes():
    fake = FakeAllocator()
    policy = PhasedExpandable(facade=fake)
    policy.on_serving()
    with policy.static_allocations():
        with policy.static_allocations():
            assert not fake.expandable
        assert not fake.expandable
    assert fake.expandable
    assert fake.sets() == [True, False, True]


def test_switch_inside_an_open_window_waits_for_it_to_close():
    fake = FakeAllocator()
    policy = PhasedExpandable(facade=fake)
    with policy.static_allocations():
        policy.on_serving()
        assert not fake.expandable and policy.switch.enabled
    assert fake.calls == ["empty_cache", "set:expandable_segments:True"]


def test_windows_before_the_switch_change_nothing():
    fake = FakeAllocator()
    policy = PhasedExpandable(facade=fake)
    with policy.static_allocations():
        pass
    assert fake.calls == []


def test_concurrent_windows_and_a_switch_stay_well_nested():
    fake = FakeAllocator()
    policy = PhasedExpandable(facade=fake)
    start = threading.Barrier(9)
    inside: list[bool] = []

    def window_user() -> None:
        start.wait()
        for _ in range(200):
            with policy.static_allocations():
                inside.append(fake.expandable)

    def switcher() -> None:
        start.wait()
        policy.on_serving()

    threads = [threading.Thread(target=window_user) for _ in range(8)]
    threads.append(threading.Thread(target=switcher))
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    sets = fake.sets()
    assert sets[0] is True and sets[-1] is True
    assert all(a != b for a, b in itertools.pairwise(sets)), sets  # strictly alternating
    assert not any(inside)  # no window ever ran with expandable on
    assert fake.expandable
    assert fake.calls.count("empty_cache") == 1


def test_scheduler_calls_on_serving_once_before_the_first_round():
    from policykit.cli.simulate import resolve_scenario_path
    from policykit.scenario import build_node, load_scenario
    from policykit.scheduler import Scheduler

    sc = load_scenario(resolve_scenario_path("seed-abc"))
    _, registry = load_registry()
    combo = registry.resolve(sc.combo, None, config=sc.config)
    fake = FakeAllocator()
    phased = PhasedExpandable(facade=fake)
    combo = dataclasses.replace(combo, allocator_phase=phased)
    scheduler = Scheduler(build_node(sc), combo)
    scheduler.start_serving()
    assert fake.sets() == [True]
    scheduler.run()
    assert fake.sets() == [True]


def test_failure_to_switch_back_after_a_window_keeps_the_default(caplog):
    fake = FakeAllocator()
    policy = PhasedExpandable(facade=fake)
    policy.on_serving()
    with caplog.at_level(logging.WARNING, logger="policykit.memory.allocator"):
        with policy.static_allocations():
            fake.fail_set = True
        with policy.static_allocations():
            pass
    assert not fake.expandable and not policy.switch.enabled
    assert fake.sets() == [True, False]
    assert caplog.text.count("Failed to enable") == 1


def test_failure_to_switch_off_fails_the_window():
    fake = FakeAllocator()
    policy = PhasedExpandable(facade=fake)
    policy.on_serving()
    fake.fail_set = True
    with pytest.raises(RuntimeError), policy.static_allocations():
        pytest.fail("the window body must not run on expandable segments")
    fake.fail_set = False
    with policy.static_allocations():  # the depth counter was restored
        assert not fake.expandable
    assert fake.expandable
