"""``check`` survives a policy it cannot reason about: that combo is ``refused`` with the reason,
every other combo still gets its verdict, on each executor path."""

from __future__ import annotations

import json
import re
import sys
import textwrap

import pytest

import policykit
from policykit.plugin_manager import PluginSource, make_plugin_manager
from policykit.plugins.admission import ReserveTailAdmission, SGLangAdmission
from policykit.plugins.alignment import PageAlignment
from policykit.plugins.allocator_phase import DefaultAllocator
from policykit.plugins.chunking import SGLangChunking
from policykit.plugins.queue import FcfsQueue
from policykit.plugins.vllm_preemption import NoPreemption

FLOAT_RATIO = '''
import policykit

class FloatRatio(policykit.AdmissionPolicy):
    """Uses a float ratio: cannot be checked symbolically."""
    name = "float-ratio"
    def admit(self, v):
        return v.remaining_tokens / v.page_size < v.rem_total_tokens
    def tail_reserve(self, v):
        return 0

@policykit.hookimpl
def policykit_register_policies(register):
    register(FloatRatio)
'''


class FewBuiltIns:
    """A small registry, so that ``check --all`` stays fast: three combos (one queue, the
    default, so that the queue does not multiply them, and no preemption policy that
    preempts, which would add the combos of vLLM's node)."""

    @policykit.hookimpl
    def policykit_register_policies(self, register):
        for cls in (SGLangAdmission, ReserveTailAdmission, SGLangChunking, PageAlignment):
            register(cls)
        register(DefaultAllocator)
        register(FcfsQueue)
        register(NoPreemption)


@pytest.fixture
def float_plugin(tmp_path, monkeypatch):
    """The float-using policy installed as a distribution with an entry point."""
    (tmp_path / "floaty_policy.py").write_text(textwrap.dedent(FLOAT_RATIO))
    dist = tmp_path / "floaty_policy-0.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: floaty-policy\nVersion: 0.3\n")
    (dist / "entry_points.txt").write_text("[policykit]\nfloaty = floaty_policy\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("floaty_policy", None)


def _small_pm():
    pm = make_plugin_manager(entry_points=False, environ={"POLICYKIT_BLOCK_PLUGINS": ",".join(
        f"policykit.plugins.{m}" for m in ("admission", "chunking", "alignment",
                                           "allocator_phase", "queue", "vllm",
                                           "vllm_preemption"))})  # fmt: skip
    pm.register(FewBuiltIns(), name="few-built-ins")
    import floaty_policy

    pm.register_source(floaty_policy, PluginSource("floaty", "floaty-policy", "0.3"))
    return pm


def _verdicts(doc: dict) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for v in doc["verdicts"]:
        out.setdefault(v["combo"], set()).add(v["verdict"])
    return out


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_check_all_completes_with_the_float_policy_refused(cli, float_plugin, jobs):
    res = cli("check", "--all", "--json", "--jobs", jobs, pm=_small_pm())
    doc = json.loads(res.stdout)
    # a refusal is exit code 2 unless something is violated (1 takes precedence)
    assert res.exit_code == (1 if doc["summary"]["violated"] else 2), res.output
    by_combo = _verdicts(doc)
    # reserve-tail violates only no-starvation, on the account of SGLang's fcfs queue
    assert by_combo == {
        "sglang/sglang/page": by_combo["sglang/sglang/page"],
        "reserve-tail/sglang/page": {"proved", "violated"},
        "float-ratio/sglang/page": {"refused"},
    }
    assert by_combo["sglang/sglang/page"] <= {"proved", "violated"}
    notes = {v["note"] for v in doc["verdicts"] if v["verdict"] == "refused"}
    (note,) = notes
    assert "float-ratio" in note and "floaty-policy 0.3" in note and "floaty_policy.py" in note
    assert doc["summary"]["refused"] == len([v for v in doc["verdicts"] if v["combo"] ==
                                             "float-ratio/sglang/page"])  # fmt: skip


def test_text_output_says_refused_why_and_ends_with_a_summary(cli, float_plugin):
    res = cli("check", "--all", "--jobs", "1", pm=_small_pm(), columns=80)
    assert res.exit_code in (1, 2), res.output
    lines = res.stdout.strip().splitlines()
    assert re.match(r"3 combos: \d+ proved \(\d+ unbounded\), \d+ violated, 0 unknown, 7 refused",
                    lines[-1]), lines[-1]  # fmt: skip
    assert "refused (float-ratio/sglang/page)" in res.stdout
    assert "…" not in res.stdout


def test_refused_alone_exits_2(cli, float_plugin):
    res = cli("check", "--combo", "float-ratio/sglang/page", pm=_small_pm())
    assert res.exit_code == 2, res.output


@pytest.mark.slow
def test_local_executor_returns_refused_rows(cli, float_plugin):
    """Spawned workers load the installed plugin themselves (entry point)."""
    res = cli(
        "check", "--executor", "local", "--jobs", "2", "--json",
        "--combo", "float-ratio/sglang/page",
        "--combo", "reserve-tail/sglang/page/default/fcfs-skip",
    )  # fmt: skip
    assert res.exit_code == 2, res.output
    by_combo = _verdicts(json.loads(res.stdout))
    assert by_combo == {
        "float-ratio/sglang/page": {"refused"},
        "reserve-tail/sglang/page/default/fcfs-skip": {"proved"},
    }


def test_simulate_warns_but_runs(cli, float_plugin):
    res = cli("simulate", "seed-abc", "--combo", "admission=float-ratio")
    assert res.exit_code in (0, 1), res.output
    assert res.stderr.startswith("Warning: float-ratio/sglang/page is not checkable")
    assert "completed:" in res.stdout


def test_checkable_is_none_for_every_built_in():
    from policykit.config import EngineConfig
    from policykit.registry import registry_from
    from policykit.spec import checkable

    registry = registry_from(make_plugin_manager(entry_points=False))
    for engine in (EngineConfig(64, 4096), EngineConfig(64, 4096, sliding_window=4096)):
        for combo in registry.all_combos(engine):
            assert checkable(combo, engine) is None, str(combo)


class PageBound:
    """A third-party admission policy that refuses engines with pages under 128 tokens."""

    @policykit.hookimpl
    def policykit_register_policies(self, register):
        class BigPagesOnly(policykit.AdmissionPolicy):
            name = "big-pages-only"

            def validate(self, config):
                if config.page_size < 128:
                    raise ValueError(
                        f"it needs pages of 128 tokens or more, not {config.page_size}"
                    )

            def admit(self, v):
                return True

            def tail_reserve(self, v):
                return 0

        register(BigPagesOnly)


def test_a_combo_whose_policy_refuses_the_engine_gets_its_row_and_the_list_goes_on(cli):
    pm = make_plugin_manager(entry_points=False)
    pm.register(PageBound(), name="page-bound")
    res = cli(
        "check", "--json", "--jobs", "1",
        "--combos", "big-pages-only/sglang/page;reserve-tail/sglang/page/default/fcfs-skip",
        pm=pm,
    )  # fmt: skip
    assert res.exit_code == 2, res.output
    doc = json.loads(res.stdout)
    assert _verdicts(doc) == {
        "big-pages-only/sglang/page": {"refused"},
        "reserve-tail/sglang/page/default/fcfs-skip": {"proved"},
    }
    (row,) = [v for v in doc["verdicts"] if v["verdict"] == "refused"]
    assert "big-pages-only" in row["note"] and "128 tokens or more, not 64" in row["note"]
    assert row["config"]["page_size"] == 64


def test_a_misspelt_combo_in_a_list_is_still_bad_input(cli):
    res = cli("check", "--combos", "no-such-policy/sglang/page;sglang/sglang/page")
    assert res.exit_code == 2
    assert "There is no admission policy named 'no-such-policy'" in " ".join(res.output.split())
    assert "proved" not in res.output


class BrokenMembers:
    """Third-party policies that break the check of their own combo in ways the checker does
    not model: a ``validate`` that raises something other than ValueError, and an ``admit``
    that ends the process checking it."""

    @policykit.hookimpl
    def policykit_register_policies(self, register):
        class BadValidate(policykit.AdmissionPolicy):
            name = "bad-validate"

            def validate(self, config):
                raise TypeError("compares the config with a str")

            def admit(self, v):
                return True

            def tail_reserve(self, v):
                return 0

        class ExitsProcess(BadValidate):
            name = "exits-process"

            def validate(self, config):
                return None

            def admit(self, v):
                raise SystemExit(3)

        register(BadValidate)
        register(ExitsProcess)


@pytest.mark.parametrize(
    ("member", "said"),
    [
        ("bad-validate", "validate() at "),
        ("exits-process", "died without a result"),
    ],
)
def test_a_failing_member_of_a_list_gets_its_own_refused_row(cli, member, said):
    """The rest of the list is checked, and the exit code is the worst verdict's: 2 for a
    refusal beside proofs (1 would win over it, 3 would not)."""
    pm = make_plugin_manager(entry_points=False)
    pm.register(BrokenMembers(), name="broken-members")
    ok = "reserve-tail/sglang/page/default/fcfs-skip"
    res = cli("check", "--json", "--jobs", "1", "--combos", f"{member}/sglang/page;{ok}", pm=pm)
    assert res.exit_code == 2, res.output
    doc = json.loads(res.stdout)
    assert _verdicts(doc) == {f"{member}/sglang/page": {"refused"}, ok: {"proved"}}
    (row,) = [v for v in doc["verdicts"] if v["verdict"] == "refused"]
    assert said in row["note"], row["note"]
    if member == "bad-validate":
        assert f"module {__name__}" in row["note"]
        assert "TypeError: compares the config with a str" in row["note"]
