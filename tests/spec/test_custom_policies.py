"""A user's own policy gets the same treatment as the built-ins, with no z3 in the plugin."""

from __future__ import annotations

from pathlib import Path

import pytest

from policykit.config import EngineConfig
from policykit.plugin_manager import PluginSource, make_plugin_manager
from policykit.registry import PolicyRegistry
from policykit.spec.checker import CheckOptions, check_combo
from policykit.spec.solver import QUERY_RLIMIT
from policykit.spec.symbolic import SymbolicEvaluationError
from tests.spec import custom_policies

CONFIG = EngineConfig(page_size=64, chunked_prefill_size=4096)


@pytest.fixture(scope="module")
def registry() -> PolicyRegistry:
    pm = make_plugin_manager(entry_points=False)
    pm.register_source(custom_policies, PluginSource("acme-policies", "acme-policies", "1.0"))
    return PolicyRegistry.from_plugins(pm)


def _check(registry, admission: str, props: tuple[str, ...]) -> dict:
    combo = registry.resolve(f"admission={admission},chunking=sglang,alignment=page")
    options = CheckOptions(rounds=3, requests=3, properties=props, rlimit=12 * QUERY_RLIMIT)
    return {v.property: v for v in check_combo(combo, CONFIG, options)}


def test_the_plugin_has_no_z3() -> None:
    source = Path(custom_policies.__file__).read_text(encoding="utf-8")
    assert "z3" not in source and "policykit.spec" not in source


def test_an_admission_that_ignores_load_back_memory_is_violated(registry) -> None:
    v = _check(registry, "compute-only", ("no-oom",))
    assert v["no-oom"].verdict == "violated"
    assert v["no-oom"].counterexample.rounds[-1].oom == "full"


def test_a_safe_custom_admission_is_proved(registry) -> None:
    v = _check(registry, "paged-reserve", ("no-oom", "admitted-completes"))
    assert {(x.verdict, x.bound) for x in v.values()} == {("proved", "unbounded")}


def test_a_truncation_that_leaves_budget_loses_the_implicit_protection(registry) -> None:
    """``sglang`` admission is proved safe with page-aligned truncation only because the
    truncation spends the whole budget; one that leaves half of it lets a later request of the
    same round take the tail, and the checker finds that."""
    combo = registry.resolve("admission=sglang,chunking=half-budget,alignment=page")
    options = CheckOptions(rounds=3, requests=3, properties=("admitted-completes",))
    (verdict,) = check_combo(combo, CONFIG, options)
    assert verdict.verdict == "violated"
    kinds = [row.kind for row in verdict.counterexample.rounds[0].rows]
    assert "truncated" in kinds and kinds.index("truncated") < len(kinds) - 1


def test_an_unsupported_policy_gets_a_message_naming_it_and_its_line(registry) -> None:
    combo = registry.resolve("admission=float-ratio,chunking=sglang,alignment=page")
    with pytest.raises(SymbolicEvaluationError) as err:
        check_combo(combo, CONFIG, CheckOptions(rounds=1, requests=1), {"admission": "acme 1.0"})
    text = str(err.value)
    assert "'float-ratio'" in text and "acme 1.0" in text
    assert "custom_policies.py:" in text and "true division" in text
