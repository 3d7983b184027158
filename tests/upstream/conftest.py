from __future__ import annotations

import pytest

from policykit.plugin_manager import make_plugin_manager
from policykit.registry import PolicyRegistry


@pytest.fixture(scope="module")
def upstream():
    """SGLang 0.5.23's scheduler modules, loaded once per module (skips without the extra)."""
    from policykit.conformance.sglang.driver import UpstreamUnavailable, load

    try:
        return load()
    except UpstreamUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def vllm_oracle():
    """``policykit.conformance.vllm`` with vLLM 0.33.0's scheduler loaded, once per module
    (skips without the extra)."""
    from policykit.conformance import vllm as oracle

    try:
        oracle.load()
    except oracle.VllmUnavailable as exc:
        pytest.skip(str(exc))
    return oracle


@pytest.fixture
def registry() -> PolicyRegistry:
    return PolicyRegistry.from_plugins(make_plugin_manager(entry_points=False))
