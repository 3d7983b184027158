"""Shared fixtures: one tiny model and the policy registry, built once per session."""

from __future__ import annotations

import pytest
import torch

from policykit.harness.build import PrefixKV
from policykit.harness.model import Decoder
from policykit.harness.presets import get_preset
from policykit.harness.workloads import RequestSpec, Workload, workload_config
from policykit.registry import PolicyRegistry, registry_from


@pytest.fixture(scope="session", autouse=True)
def _one_cpu_thread():
    """The tiny model's ops are too small for intra-op threads; on a busy 2-core box OpenMP
    spin-waits made these tests ~4x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny() -> Decoder:
    return Decoder(get_preset("tiny"), "cpu", seed=0)


@pytest.fixture(scope="session")
def store(tiny: Decoder) -> PrefixKV:
    return PrefixKV(tiny)


@pytest.fixture(scope="session")
def registry() -> PolicyRegistry:
    return registry_from()


@pytest.fixture(scope="session")
def coverage_workload() -> Workload:
    """Small enough for every combination in seconds, and covering every way KV gets there:
    a chunked prompt, a device prefix hit, a host load-back, device + host together, and a
    prefix computed by one request and reused from the cache by a later one. ("both" comes
    before "host": as in SGLang, host's load-back at admission would evict the least recently
    used cached prefix, "both"'s, had "both" not locked it first.)"""
    return Workload(
        name="coverage",
        description="every KV path on a 1024-token pool",
        pool_tokens=1024,
        config=workload_config(256, kv_release_rounds=1),
        requests=(
            RequestSpec("long", 700, 0),
            RequestSpec(
                "dev", 210, 0, prefix_group="sys", prefix_tokens=128, device_prefix_tokens=128
            ),
            RequestSpec(
                "both",
                237,
                1,
                prefix_group="sys2",
                prefix_tokens=192,
                device_prefix_tokens=64,
                host_prefix_tokens=128,
            ),
            RequestSpec(
                "host", 370, 1, prefix_group="hist", prefix_tokens=320, host_prefix_tokens=320
            ),
            RequestSpec("cold1", 210, 2, prefix_group="cold", prefix_tokens=160),
            RequestSpec("cold2", 200, 8, prefix_group="cold", prefix_tokens=160),
        ),
    )
