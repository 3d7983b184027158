"""Visible bounds: a verdict names the engine configuration and the bounds it holds for.

A policy that is unsafe only on pools larger than the default cap (2^18 tokens) is "proved" by
the bounded search under that cap, and violated once ``--pool-cap`` lets the search see such a
pool: the cap is part of the verdict, not a hidden constant.
"""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

from policykit.cli import main
from policykit.config import EngineConfig
from policykit.hookspecs import hookimpl
from policykit.plugin_manager import PluginSource, make_plugin_manager
from policykit.plugins.admission import ReserveTailAdmission
from policykit.plugins.chunking import SGLangChunking
from policykit.policy import AdmitView, ChunkView
from policykit.registry import PolicyRegistry
from policykit.spec.bmc import Bounds
from policykit.spec.checker import CheckOptions, check_combo

#: above this many free tokens the policies below stop counting
BIG = 300_000


class BigPoolAdmission(ReserveTailAdmission):
    """Admits anything when the pool looks huge."""

    name = "big-pool-admission"

    def admit(self, v: AdmitView) -> bool:
        if v.rem_total_tokens > BIG:
            return True
        return super().admit(v)


class BigPoolChunking(SGLangChunking):
    """Computes a new request whole when the pool looks huge, whatever it costs."""

    name = "big-pool-chunking"

    def new_chunk(self, v: ChunkView) -> int:
        if v.rem_total_tokens > BIG:
            return v.remaining_tokens
        return super().new_chunk(v)


@hookimpl
def policykit_register_policies(register):
    register(BigPoolAdmission)
    register(BigPoolChunking)


COMBO = "admission=big-pool-admission,chunking=big-pool-chunking,alignment=page"
CONFIG = EngineConfig(page_size=64, chunked_prefill_size=4096)


@pytest.fixture(scope="module")
def registry() -> PolicyRegistry:
    pm = make_plugin_manager(entry_points=False)
    pm.register_source(sys.modules[__name__], PluginSource("big-pool", "big-pool", "1.0"))
    return PolicyRegistry.from_plugins(pm)


def _no_oom(registry, cap: int):
    options = CheckOptions(
        rounds=1, requests=2, properties=("no-oom",), bounds=Bounds(max_pool_tokens=cap)
    )
    (verdict,) = check_combo(registry.resolve(COMBO), CONFIG, options)
    return verdict


def test_a_bounded_proof_names_its_pool_cap(registry) -> None:
    v = _no_oom(registry, 1 << 18)
    assert (v.verdict, v.bound) == ("proved", "K=1,N=2")
    assert v.bounds == {"rounds": 1, "requests": 2, "pool_cap_tokens": 1 << 18, "granule": 64}
    assert v.config == {
        "page_size": 64,
        "chunked_prefill_size": 4096,
        "sliding_window": None,
        "max_prefill_tokens": None,
    }
    data = v.to_dict()
    assert data["bounds"]["pool_cap_tokens"] == 1 << 18 and data["config"] == v.config


def test_a_larger_pool_cap_finds_the_violation(registry) -> None:
    v = _no_oom(registry, 1 << 19)
    assert v.verdict == "violated"
    pool = v.counterexample.scenario["pool"]
    assert pool["free_tokens"] + pool["evictable_tokens"] > BIG
    assert v.counterexample.failure is not None and v.counterexample.failure.kind == "oom"


def test_an_unbounded_proof_has_no_bounds_but_names_its_configuration(registry) -> None:
    options = CheckOptions(properties=("no-oom",))
    combo = registry.resolve("admission=reserve-tail,chunking=sglang,alignment=page")
    (v,) = check_combo(combo, CONFIG, options)
    assert (v.verdict, v.bound, v.bounds) == ("proved", "unbounded", None)
    assert v.config["page_size"] == 64


def test_check_takes_the_configuration_from_a_scenario(tmp_path) -> None:
    scenario = {
        "page_size": 16,
        "chunked_prefill_size": 512,
        "pool": {"free_tokens": 4096, "evictable_tokens": 1024},
        "requests": [{"id": "A", "prompt_tokens": 100}],
    }
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(scenario))
    combo = "admission=reserve-tail,chunking=sglang,alignment=page,queue=fcfs-skip"  # all proved
    out = CliRunner().invoke(main, ["check", "--combo", combo, "--config", str(path), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["config"]["page_size"] == 16
    assert data["config"]["chunked_prefill_size"] == 512
    assert data["config"]["pool_cap_tokens"] == 5120
    assert {v["config"]["page_size"] for v in data["verdicts"]} == {16}


def test_check_refuses_a_scenario_and_an_explicit_page_size_together() -> None:
    out = CliRunner().invoke(main, ["check", "--config", "seed-abc", "--page-size", "16"])
    assert out.exit_code == 2
    assert "not both" in out.output and "Traceback" not in out.output
