"""``policykit conformance sglang`` when SGLang is installed but its import fails.

SGLang 0.5.23 goes in with ``--no-deps``, so pip never holds the packages beside it to SGLang's
pins; transformers 5.25.0 broke its import with a ``TypeError`` (issue #31). The command must
refuse in one paragraph naming the packages involved and what to install, never print a
traceback. The failing import is simulated here, from a module that passes for transformers'
own, so these tests run without SGLang.
"""

from __future__ import annotations

import json
import types

import pytest
from click.testing import CliRunner
from packaging.requirements import Requirement

from policykit.cli import main
from policykit.conformance.sglang import broken_import, driver, gpu_stubs

#: raises as transformers 5.25.0's llama module did under SGLang 0.5.23's import
FAILING_SOURCE = """
def apply_rotary_pos_emb(q, k, cos, sin):
    return q

def import_llama():
    apply_rotary_pos_emb(object)
"""


def _module_of(dist_module: str) -> types.ModuleType:
    """A module named ``dist_module`` (so that its frames pass for that package's own)."""
    module = types.ModuleType(dist_module)
    exec(compile(FAILING_SOURCE, f"<{dist_module}>", "exec"), module.__dict__)
    return module


def _raised(dist_module: str) -> BaseException:
    try:
        _module_of(dist_module).import_llama()
    except TypeError as exc:
        return exc
    raise AssertionError("the simulated import did not fail")


def test_the_paragraph_names_the_package_sglangs_pin_and_the_install(monkeypatch):
    # click is installed everywhere policykit is: a real distribution with a real version
    from importlib.metadata import version

    monkeypatch.setattr(
        broken_import, "declared", lambda dist="sglang": {"click": Requirement("click==0.0.1")}
    )
    text = broken_import.describe("0.5.23", _raised("click.fake_llama"), "HINT")
    assert text.startswith("SGLang 0.5.23 is installed but its scheduler modules fail to import")
    assert "TypeError: apply_rotary_pos_emb() missing 3 required positional arguments" in text
    assert f"click {version('click')} (SGLang 0.5.23 declares ==0.0.1)" in text
    assert text.endswith("install the versions SGLang 0.5.23 declares: pip install 'click==0.0.1'.")
    assert "\n" not in text and "HINT" not in text


def test_without_a_version_outside_sglangs_pins_it_gives_the_install_hint(monkeypatch):
    from importlib.metadata import version

    held = Requirement(f"click=={version('click')}")
    monkeypatch.setattr(broken_import, "declared", lambda dist="sglang": {"click": held})
    text = broken_import.describe("0.5.23", _raised("click.fake_llama"), "HINT")
    assert "pip install 'click" not in text and text.endswith("; HINT.")


def _break_the_import(monkeypatch: pytest.MonkeyPatch) -> None:
    """``driver.load`` as on a machine with SGLang 0.5.23 whose import raises the TypeError."""
    monkeypatch.setattr(driver, "_UPSTREAM", {})
    monkeypatch.setattr(driver, "_installed_version", lambda: "0.5.23")
    monkeypatch.setattr(gpu_stubs, "install", lambda: None)
    monkeypatch.setattr(driver, "_import_real_xgrammar", lambda: None)

    def failing_import() -> dict:
        _module_of("click.fake_llama").import_llama()
        return {}

    monkeypatch.setattr(driver, "_import_scheduler", failing_import)
    monkeypatch.setattr(
        broken_import, "declared", lambda dist="sglang": {"click": Requirement("click==0.0.1")}
    )


def test_conformance_sglang_refuses_in_one_paragraph_with_exit_2(monkeypatch):
    _break_the_import(monkeypatch)
    result = CliRunner().invoke(main, ["conformance", "sglang", "--random", "2", "--seed", "3"])
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith("Error: SGLang 0.5.23 is installed but its scheduler modules")
    assert "pip install 'click==0.0.1'" in lines[0]


def test_under_json_the_refusal_is_a_json_document_on_stderr(monkeypatch):
    _break_the_import(monkeypatch)
    result = CliRunner().invoke(main, ["conformance", "sglang", "--random", "2", "--json"])
    assert result.exit_code == 2 and result.stdout == ""
    error = json.loads(result.stderr)
    assert error["exit_code"] == 2 and error["schema"] == "policykit.error/1"
    assert "TypeError: apply_rotary_pos_emb()" in error["error"]
