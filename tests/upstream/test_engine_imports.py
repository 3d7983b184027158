"""The engines' scheduler modules import, in a fresh interpreter, as the conformance commands
import them.

Every other upstream test skips when its engine does not load, so an install whose SGLang or
vLLM is present but broken (issue #31: transformers 5.25.0 made SGLang 0.5.23's import raise a
``TypeError``) would pass the suite with hundreds of skips. These tests skip only when the
engine's distribution is absent or another release than the one policykit drives; when it is
there, its scheduler must import, and the failure is printed whole. Each runs in its own
interpreter because an import that already happened in the test process (another test's, a
plugin's) would hide one that fails from scratch.
"""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version

import pytest

#: what ``policykit conformance sglang|vllm`` calls before it runs a scenario
LOADERS = {
    "sglang": ("0.5.23", "from policykit.conformance.sglang.driver import load; load()"),
    "vllm": ("0.33.0", "from policykit.conformance.vllm import load; load()"),
}


@pytest.mark.slow
@pytest.mark.parametrize("engine", sorted(LOADERS))
def test_the_engines_scheduler_imports_as_the_conformance_does(engine: str) -> None:
    wanted, code = LOADERS[engine]
    try:
        found = version(engine)
    except PackageNotFoundError:
        pytest.skip(f"{engine} is not installed")
    if found != wanted:
        pytest.skip(f"{engine} {found} is installed; policykit drives {engine} {wanted}")
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, (
        f"{engine} {found} is installed but its scheduler does not import:\n{run.stderr}"
    )
