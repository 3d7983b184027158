"""Tests of the watermark policy, through policykit's own registry and scheduler."""

from policykit import AdmitView, EngineConfig
from policykit.plugin_manager import make_plugin_manager
from policykit.registry import PolicyRegistry
from policykit.scenario import build_node, parse_scenario
from policykit.scheduler import Scheduler

CONFIG = EngineConfig(page_size=64, chunked_prefill_size=4096)


def registry() -> PolicyRegistry:
    return PolicyRegistry.from_plugins(make_plugin_manager())


def view(remaining: int, rem_total: int) -> AdmitView:
    return AdmitView(
        prompt_tokens=remaining,
        remaining_tokens=remaining,
        host_prefix_tokens=0,
        first_tokens=1,
        page_size=64,
        rem_total_tokens=rem_total,
        cur_rem_tokens=rem_total,
    )


def test_registered_through_the_entry_point():
    entry = registry().entry("admission", "watermark")
    assert entry.source.distribution == "policykit-example-policy"


def test_keeps_the_watermark_free():
    policy = registry().make("admission", "watermark:1000", CONFIG)
    # 1000 rounds up to 1024; the request needs 1024 + 1 + 64 = 1089
    assert policy.admit(view(remaining=1000, rem_total=1089 + 1024))
    assert not policy.admit(view(remaining=1000, rem_total=1089 + 1023))


def test_the_seed_abc_example_completes_without_oom():
    scenario = parse_scenario(
        {
            "page_size": 64,
            "chunked_prefill_size": 4096,
            "pool": {"free_tokens": 12032},
            "requests": [
                {"id": "A", "prompt_tokens": 1088},
                {"id": "B", "prompt_tokens": 8000},
                {"id": "C", "prompt_tokens": 6128, "host_prefix_tokens": 6000},
            ],
        }
    )
    combo = registry().resolve("admission=watermark:1024,alignment=checkpoint:256")
    result = Scheduler(build_node(scenario), combo).run()
    assert result.oom is None
    assert "B" in result.completed
