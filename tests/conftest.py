"""Shared test configuration: hypothesis profiles and small helpers."""

from __future__ import annotations

import os

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
