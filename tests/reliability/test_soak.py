"""Soak: many rounds of a busy node end with every slot accounted for and flat memory.

The short form runs in CI; the long form (a million rounds) with ``pytest -m soak``.
"""

from __future__ import annotations

import pytest

from .soak import run_soak

MiB = 1 << 20


def _assert_clean(report) -> None:
    assert report.ooms == 0
    assert report.leaked_pages == 0, f"{report.leaked_pages} pages leaked"
    assert report.served > report.rounds // 2, "the workload barely ran"
    assert report.rejected > 0, "the never-fits path was not exercised"


@pytest.mark.slow
def test_soak_short():
    report = run_soak(20_000, seed=1, sample_every=500, check_every=1000)
    _assert_clean(report)
    # A leak of one request per round would be >100 MiB here; allocator noise is a few MiB.
    assert report.rss_growth() < 16 * MiB, report.rss


@pytest.mark.soak
def test_soak_a_million_rounds():
    report = run_soak(1_000_000, seed=2, sample_every=10_000, check_every=50_000)
    _assert_clean(report)
    assert report.rss_growth() < 16 * MiB, report.rss
