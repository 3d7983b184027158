from __future__ import annotations

import pytest

from policykit.plugin_manager import make_plugin_manager
from policykit.registry import PolicyRegistry


@pytest.fixture
def registry() -> PolicyRegistry:
    return PolicyRegistry.from_plugins(make_plugin_manager(entry_points=False))
