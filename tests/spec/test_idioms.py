"""Everyday Python is proved where its meaning is exact, and nothing unsafe is proved on the way.

Each idiom of ``idiom_policies`` comes once in a safe policy (proved, unbounded) and once in an
unsafe one (it OOMs the scheduler, or is not a pure function): violated or refused. The
refusals name the author's file and line; the checker notices a module constant that changes.
"""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest
from click.testing import CliRunner

from policykit.cli import main
from policykit.config import EngineConfig
from policykit.errors import PluginError
from policykit.pages import ceil_paged
from policykit.plugin_manager import PluginSource, make_plugin_manager
from policykit.policy import AdmissionPolicy, AdmitView
from policykit.registry import PolicyRegistry
from policykit.spec import crossval
from policykit.spec.checker import CheckOptions, check_combo
from policykit.spec.solver import QUERY_RLIMIT
from policykit.spec.symbolic import SymbolicEvaluationError
from tests.spec import idiom_policies as idioms

CONFIG = EngineConfig(page_size=64, chunked_prefill_size=4096)
SOURCE = "acme-idioms 1.0"


@pytest.fixture(scope="module")
def plugins():
    pm = make_plugin_manager(entry_points=False)
    pm.register_source(idioms, PluginSource("acme-idioms", "acme-idioms", "1.0"))
    return pm


@pytest.fixture(scope="module")
def acme(plugins) -> PolicyRegistry:
    return PolicyRegistry.from_plugins(plugins)


def _verdicts(registry: PolicyRegistry, name: str, props: tuple[str, ...]) -> dict[str, str]:
    combo = registry.resolve(f"admission={name},chunking=sglang,alignment=page")
    options = CheckOptions(rounds=2, requests=2, properties=props, rlimit=12 * QUERY_RLIMIT)
    try:
        verdicts = check_combo(combo, CONFIG, options, {"admission": SOURCE})
    except SymbolicEvaluationError as exc:
        return {p: f"refused: {exc}" for p in props}
    return {v.property: f"{v.verdict} {v.bound}" for v in verdicts}


@pytest.mark.parametrize("cls", idioms.SAFE, ids=lambda c: c.name)
def test_a_safe_policy_in_everyday_python_is_proved(acme, cls) -> None:
    verdicts = _verdicts(acme, cls.name, ("no-oom", "admitted-completes"))
    assert set(verdicts.values()) == {"proved unbounded"}, verdicts


#: unsafe variants whose counterexample takes the bounded search seconds (a loop's lifted
#: function has a path per trip): the slow tier checks them
SLOW_UNSAFE = (idioms.PowerOfTwoDown, idioms.HalvingOvershoot)


@pytest.mark.parametrize(
    "cls",
    [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_UNSAFE else c for c in idioms.UNSAFE],
    ids=lambda c: c.name,
)
def test_the_unsafe_variant_of_each_idiom_is_never_proved(acme, cls) -> None:
    (verdict,) = _verdicts(acme, cls.name, ("no-oom",)).values()
    assert verdict.startswith(("violated", "refused")), verdict


@pytest.mark.parametrize(
    ("name", "construct"),
    [
        ("idiom-ceil-float", "true division '/' by 64.0"),
        ("idiom-ceil-huge", "may reach 2**53"),
        ("idiom-rebound", "global SLACK_PAGES"),
        ("idiom-mutated", "'SHARED_LIMITS' of tests.spec.idiom_policies changed"),
        ("idiom-cached-clock", "module 'time'"),
        ("idiom-cached-flag", "does not tell True from 1"),
        ("idiom-cache-probe", "turns a value into text (an f-string)"),
        ("idiom-loop-unbounded", "does not bound it to at most 64 values"),
        ("idiom-mask-wrong", "uses '&' with the mask -65, which is not linear arithmetic"),
        ("idiom-shift-symbolic", "a symbolic value as a shift count (<<)"),
        ("idiom-while-unbounded", "a loop whose bound the checker cannot see"),
    ],
)
def test_an_inexact_or_impure_idiom_is_refused_with_its_reason(acme, name, construct) -> None:
    (verdict,) = _verdicts(acme, name, ("no-oom",)).values()
    assert verdict.startswith("refused"), verdict
    assert f"'{name}'" in verdict and SOURCE in verdict and construct in verdict
    if name != "idiom-mutated":  # found after the run, not at a line
        assert "idiom_policies.py:" in verdict


@pytest.mark.slow
def test_the_memorable_idioms_are_violated_not_refused(acme) -> None:
    """The unsafe variants that the checker understands get a counterexample."""
    understood = (idioms.FloorDiv, idioms.NegNegMisplaced, idioms.AnyFlag, idioms.MaxOfBudgets)
    shifts = (idioms.ShiftPagesUnits, idioms.MaskPagesHost, idioms.EngineHelpersUnits)
    loops = (idioms.WhileCounterHost, idioms.WhileConstantShort, idioms.HalvingOvershoot)
    python = (idioms.DivmodHost, idioms.ReduceMax, idioms.UnpackingSwapped, idioms.AbsBudget)
    more = (*shifts, *loops, idioms.DoublingShort, idioms.PowerOfTwoDown, *python)
    more = (*more, idioms.EarlyReturnsSmall)
    for cls in (*understood, idioms.ShortLoop, idioms.ViewLoopShort, *more):
        assert _verdicts(acme, cls.name, ("no-oom",))["no-oom"].startswith("violated"), cls


def test_a_constant_rebound_between_checks_is_checked_anew(acme, monkeypatch) -> None:
    """The lifted policy is cached per process: a rebinding must not reuse the old reading."""
    assert _verdicts(acme, "idiom-constants", ("no-oom",))["no-oom"] == "proved unbounded"
    monkeypatch.setattr(idioms, "HEADROOM_PAGES", -1000)
    assert _verdicts(acme, "idiom-constants", ("no-oom",))["no-oom"].startswith("violated")


def test_a_frozen_record_mutated_between_checks_is_checked_anew(acme) -> None:
    assert _verdicts(acme, "idiom-constants", ("no-oom",))["no-oom"] == "proved unbounded"
    was = idioms.LIMITS.headroom_pages
    object.__setattr__(idioms.LIMITS, "headroom_pages", -1000)
    try:
        assert _verdicts(acme, "idiom-constants", ("no-oom",))["no-oom"].startswith("violated")
    finally:
        object.__setattr__(idioms.LIMITS, "headroom_pages", was)


def test_a_constant_rebound_during_a_check_is_refused(acme, monkeypatch) -> None:
    """Another plugin rebinding the constant while the checker runs (here: when the checker
    makes its second instance) refuses the check instead of mixing two readings."""
    make_fresh = crossval._fresh

    def rebinding(*args):
        monkeypatch.setattr(idioms, "HEADROOM_PAGES", 5)
        return make_fresh(*args)

    monkeypatch.setattr(crossval, "_fresh", rebinding)
    (verdict,) = _verdicts(acme, "idiom-constants", ("no-oom",)).values()
    assert verdict.startswith("refused") and "'HEADROOM_PAGES'" in verdict, verdict


def test_a_cached_helper_runs_uncached_and_its_cache_is_left_alone(acme) -> None:
    wrapper = idioms.paged_need
    assert _verdicts(acme, "idiom-cached", ("no-oom",))["no-oom"] == "proved unbounded"
    assert idioms.paged_need is wrapper and isinstance(wrapper, functools._lru_cache_wrapper)
    assert wrapper(65, 64, 1) == 193  # still a working cache of ints


def test_check_on_the_command_line_proves_and_refuses_registered_idioms(plugins) -> None:
    args = ["check", "--rounds", "2", "--requests", "2", "--jobs", "1", "--json"]
    for combo in ("idiom-ceil", "idiom-floor", "idiom-ceil-huge"):
        # the skipping queue, so that no-starvation is about the policy (fcfs starves anyway)
        args += ["--combo", f"{combo}/sglang/page/default/fcfs-skip"]
    result = CliRunner().invoke(main, args, obj={"pm": plugins})
    rows = json.loads(result.stdout)["verdicts"]
    verdicts: dict[str, set[str]] = {}
    for row in rows:
        verdicts.setdefault(row["combo"].split("/")[0], set()).add(row["verdict"])
    no_oom = {r["combo"].split("/")[0]: r["verdict"] for r in rows if r["property"] == "no-oom"}
    assert verdicts["idiom-ceil"] == {"proved"}
    assert no_oom["idiom-floor"] == "violated"
    assert verdicts["idiom-ceil-huge"] == {"refused"}
    assert result.exit_code == 1, result.output  # a violation wins over a refusal


# -- errors point at the author's code -------------------------------------------------------
class NoTail(AdmissionPolicy):
    """An admission policy whose author forgot ``tail_reserve``."""

    name = "no-tail"

    def admit(self, v: AdmitView) -> bool:
        return v.remaining_tokens + 64 <= v.rem_total_tokens


class LibraryDivision(AdmissionPolicy):
    """Divides by a symbolic value inside policykit's own helper (arguments swapped)."""

    name = "library-division"

    def admit(self, v: AdmitView) -> bool:
        paged = ceil_paged(v.page_size, v.remaining_tokens)
        return paged <= v.rem_total_tokens

    def tail_reserve(self, v) -> int:
        return v.tail_tokens + v.page_size


def test_a_policy_missing_a_method_is_refused_at_registration_naming_its_class() -> None:
    registry = PolicyRegistry()
    with pytest.raises(PluginError) as err:
        registry.add(NoTail, PluginSource("acme", "acme", "1.0"))
    text = str(err.value)
    assert "NoTail (" in text and "test_idioms.py:" in text
    assert "must implement tail_reserve" in text and "policykit/policy.py" not in text


def test_a_policy_missing_a_method_is_refused_by_the_checker_naming_its_class(registry):
    combo = dataclasses.replace(registry.resolve("admission=reserve-tail"), admission=NoTail())
    with pytest.raises(crossval.PolicyRefused, match=r"NoTail \(.*test_idioms.py:\d+\) must"):
        crossval.check_policies(combo, EngineConfig(64, 4096))
    with pytest.raises(NotImplementedError, match=r"NoTail .* must implement tail_reserve"):
        NoTail().tail_reserve(None)  # type: ignore[arg-type]


def test_a_refusal_inside_a_helper_is_reported_at_the_policy_line(registry) -> None:
    """The breach is in the helper's ``//`` by a symbol; the line given first is the
    policy's own call, the helper's beside it."""
    combo = dataclasses.replace(
        registry.resolve("admission=reserve-tail"), admission=LibraryDivision()
    )
    with pytest.raises(SymbolicEvaluationError) as err:
        crossval.check_policies(combo, EngineConfig(64, 4096))
    text = " ".join(str(err.value).split())
    first = text.index("test_idioms.py:")
    assert "inside ceil_paged() at" in text and first < text.index("pages.py:"), text


class AnswersInWords(AdmissionPolicy):
    """Answers admission with a string: no term holds it."""

    name = "answers-in-words"

    def admit(self, v: AdmitView) -> bool:
        return "yes" if v.remaining_tokens > 0 else "no"  # type: ignore[return-value]

    def tail_reserve(self, v) -> int:
        return 0


def test_an_answer_of_the_wrong_type_is_reported_where_the_method_is_defined(registry) -> None:
    """The bad values meet after the policy returned, in the checker's caller; the refusal
    names the method's own file and line, not that caller (a CLI helper, a worker's
    ``<string>``)."""
    combo = dataclasses.replace(
        registry.resolve("admission=reserve-tail"), admission=AnswersInWords()
    )
    with pytest.raises(SymbolicEvaluationError) as err:
        crossval.check_policies(combo, EngineConfig(64, 4096))
    text = " ".join(str(err.value).split())
    line = AnswersInWords.admit.__code__.co_firstlineno
    assert "its admit() returned" in text and f"test_idioms.py:{line}" in text, text
    assert "<string>" not in text and "common.py" not in text
