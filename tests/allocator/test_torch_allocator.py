"""The real facade against the installed torch build (runs on the CPU build too)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch

from policykit.memory.allocator import AllocatorUnavailable, TorchAllocator, torch_allocator
from policykit.memory.allocator_settings import (
    backend_of,
    env_settings,
    expandable_enabled,
    split_settings,
    with_expandable,
)

needs_setter = pytest.mark.skipif(
    not hasattr(torch._C, "_accelerator_setAllocatorSettings"),
    reason="this torch has no accelerator allocator-settings API",
)


@pytest.fixture
def facade():
    real = torch_allocator()
    saved = real.settings()
    yield real
    real.set_settings(saved)


@needs_setter
def test_settings_round_trip_through_torch(facade):
    text = "max_split_size_mb:256,roundup_power2_divisions:[256:1,512:2,>:4]"
    facade.set_settings(with_expandable(text, True))
    assert facade.settings() == f"{text},expandable_segments:True"
    facade.set_settings(with_expandable(facade.settings(), False))
    assert facade.settings() == f"{text},expandable_segments:False"


@needs_setter
@pytest.mark.parametrize("word", ["true", "1", "on"])
def test_torch_rejects_booleans_other_than_True_False(facade, word):
    with pytest.raises(ValueError, match="Expected 'True' or 'False'"):
        facade.set_settings(f"expandable_segments:{word}")


@needs_setter
def test_setting_a_string_replaces_every_key_it_leaves_out(facade):
    facade.set_settings("max_split_size_mb:256,expandable_segments:False")
    facade.set_settings("expandable_segments:True")
    assert "max_split_size_mb" not in facade.settings()  # why with_expandable rebuilds


def test_deprecated_setter_warns(facade):
    with pytest.warns(FutureWarning, match="deprecated"):
        torch.cuda.memory._set_allocator_settings("expandable_segments:False")


def test_no_future_warning_from_the_facade(facade):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        facade.set_settings("expandable_segments:False")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_cpu_build_reads_and_refuses_cleanly():
    real = TorchAllocator()
    assert dict(real.memory_stats()) == {}  # not initialised: empty, never an error
    assert real.backend() == backend_of(real.settings())
    real.empty_cache()
    with pytest.raises(AllocatorUnavailable, match="no CUDA device"):
        real.mem_get_info()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64", "PYTORCH_ALLOC_CONF": "x:1"},
            "max_split_size_mb:64",
        ),
        ({"PYTORCH_HIP_ALLOC_CONF": "a:1", "PYTORCH_ALLOC_CONF": "b:2"}, "a:1"),
        ({"PYTORCH_CUDA_ALLOC_CONF": "", "PYTORCH_ALLOC_CONF": "b:2"}, ""),  # present wins
    ],
)
def test_env_precedence_matches_torch(env, expected):
    """Each case starts a fresh interpreter: torch reads the variables once, at import."""
    assert env_settings(env)[1] == expected
    if not hasattr(torch._C, "_accelerator_getAllocatorSettings"):
        pytest.skip("this torch has no settings getter to compare with")
    clean = {k: v for k, v in os.environ.items() if "ALLOC_CONF" not in k}
    out = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch._C._accelerator_getAllocatorSettings())"],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == expected


def test_env_fallbacks_without_torch():
    assert env_settings({"PYTORCH_ALLOC_CONF": "x:1"}) == ("PYTORCH_ALLOC_CONF", "x:1")
    assert env_settings({}) == (None, "")


def test_split_keeps_bracketed_values_and_order():
    text = "roundup_power2_divisions:[256:1,512:2,>:4], backend:native ,expandable_segments:True"
    assert split_settings(text) == [
        ("roundup_power2_divisions", "[256:1,512:2,>:4]"),
        ("backend", "native"),
        ("expandable_segments", "True"),
    ]
    assert expandable_enabled(text)
    assert not expandable_enabled(with_expandable(text, False))
    assert with_expandable("", True) == "expandable_segments:True"
