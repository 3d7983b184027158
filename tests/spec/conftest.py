"""Shared fixtures for the spec tests: one registry for the whole session."""

from __future__ import annotations

import pytest
import z3

from policykit.plugin_manager import make_plugin_manager
from policykit.registry import PolicyRegistry


@pytest.fixture(scope="session")
def registry() -> PolicyRegistry:
    return PolicyRegistry.from_plugins(make_plugin_manager(entry_points=False))


@pytest.fixture(autouse=True)
def fresh_z3_context():
    """Each test starts from a new z3 context.

    z3's Python API keeps every term in one process-wide context, and what earlier checks left
    there changes how later ones search: before queries ran as restarts over a portfolio
    (``policykit.spec.solver``), the seed 001 proof took about a second in a fresh process and
    over five minutes right after the seed 000 check in the same one (now 0.4 s either way).
    A test's verdict and its time must still not depend on which tests ran before it.
    """
    z3.z3._main_ctx = z3.Context()
    yield
