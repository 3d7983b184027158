"""Sound or refuse: adversarial third-party policies against the checker.

Every unsafe policy in ``adversarial_policies`` admits more than fits when the scheduler runs
it; a checker that misread it would say ``proved``. Each must be ``violated`` or refused. The
conservative ones use the same constructs correctly and must still be proved.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from policykit.config import EngineConfig
from policykit.plugin_manager import PluginSource, make_plugin_manager
from policykit.plugins.queue import FcfsQueue
from policykit.registry import PolicyRegistry
from policykit.spec.checker import CheckOptions, check_combo
from policykit.spec.crossval import PolicyRefused, check_policies
from policykit.spec.solver import QUERY_RLIMIT
from policykit.spec.symbolic import SymbolicEvaluationError
from tests.spec import adversarial_policies as adv

CONFIG = EngineConfig(page_size=64, chunked_prefill_size=4096)
OPTIONS = CheckOptions(rounds=2, requests=2, properties=("no-oom",), rlimit=12 * QUERY_RLIMIT)


@pytest.fixture(scope="module")
def adversarial() -> PolicyRegistry:
    pm = make_plugin_manager(entry_points=False)
    pm.register_source(adv, PluginSource("mallory", "mallory-policies", "6.6.6"))
    return PolicyRegistry.from_plugins(pm)


def _verdict(registry: PolicyRegistry, name: str) -> str:
    combo = registry.resolve(f"admission={name},chunking=sglang,alignment=page")
    try:
        (v,) = check_combo(combo, CONFIG, OPTIONS, {"admission": "mallory-policies 6.6.6"})
    except SymbolicEvaluationError as exc:
        return f"refused: {exc}"
    return v.verdict


@pytest.mark.parametrize("cls", adv.UNSAFE, ids=lambda c: c.name)
def test_an_unsafe_policy_is_never_proved(adversarial, cls) -> None:
    verdict = _verdict(adversarial, cls.name)
    assert verdict == "violated" or verdict.startswith("refused"), verdict


@pytest.mark.parametrize("cls", adv.SAFE, ids=lambda c: c.name)
def test_a_conservative_policy_with_the_same_constructs_is_proved(adversarial, cls) -> None:
    assert _verdict(adversarial, cls.name) == "proved"


@pytest.mark.parametrize(
    ("name", "construct"),
    [
        ("adv-try", "mixes a symbolic integer with a float"),
        ("adv-try-base", ".to_bytes"),
        ("adv-warmup", "writes state"),
        ("adv-module-state", "module-level list '_SEEN'"),
        ("adv-random", "random"),
        ("adv-clock", "module 'time'"),
        ("adv-environ", "'environ'"),
        ("adv-import", "imports 'random'"),
        ("adv-isinstance", "'isinstance'"),
        ("adv-type", "'type'"),
        ("adv-spin", "did not return within"),
    ],
)
def test_a_refusal_names_the_policy_its_distribution_the_line_and_the_construct(
    adversarial, name, construct
) -> None:
    verdict = _verdict(adversarial, name)
    assert verdict.startswith("refused"), verdict
    assert f"'{name}'" in verdict and "mallory-policies 6.6.6" in verdict
    assert "adversarial_policies.py:" in verdict and construct in verdict
    assert "\n" not in verdict


@pytest.mark.parametrize("name", ["adv-invert", "adv-eq-true", "adv-is-true"])
def test_python_bool_semantics_make_an_admit_everything_policy_violated(adversarial, name):
    """``~``, ``== True`` and ``is True`` on a comparison mean what Python says: these admit
    everything, and the checker finds the OOM (not a refusal: the code is understood)."""
    assert _verdict(adversarial, name) == "violated"


def test_an_identity_test_python_answers_differently_is_refused_with_the_view(adversarial):
    """``a is b`` on two view fields passes the guard; cross-validation finds a view where
    Python says True and the checker False, and prints it."""
    verdict = _verdict(adversarial, "adv-alias")
    assert verdict.startswith("refused"), verdict
    assert "returns True in Python but False under the checker" in verdict
    assert "AdmitView(" in verdict and "rem_total_tokens=" in verdict


def test_a_queue_declaration_computed_per_call_is_refused(registry) -> None:
    """``skips_never_fitting`` as a property could tell the planner one thing and the model
    another (here: skip only on every other read); the checker refuses to read it."""
    reads = itertools.count()

    class Flipping(FcfsQueue):
        name = "flipping"

        @property
        def skips_never_fitting(self) -> bool:  # type: ignore[override]
            return next(reads) % 2 == 0

    combo = dataclasses.replace(registry.resolve("admission=sglang"), queue=Flipping())
    with pytest.raises(PolicyRefused, match="skips_never_fitting"):
        check_policies(combo, EngineConfig(64, 4096))
