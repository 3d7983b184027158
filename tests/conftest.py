"""Shared test configuration: hypothesis profiles and small helpers."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

#: CI runs a fixed set of examples (derandomized): a red CI is then reproducible here, and a
#: green one does not depend on the draw; the dev profile keeps exploring new examples
settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=50, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(autouse=True)
def _own_verdict_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch) -> None:
    """Each test starts with an empty verdict cache of its own (``check`` stores verdicts under
    ``$POLICYKIT_CACHE_DIR``, docs/spec.md): a test checks what it asks for, whatever ran
    before it, and never writes into the user's cache."""
    monkeypatch.setenv("POLICYKIT_CACHE_DIR", str(tmp_path_factory.mktemp("verdict-cache")))
