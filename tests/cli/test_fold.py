"""Tables at 80 columns keep a number or a ``[start,end)`` range whole, and still fit (fold,
never crop) when even whole values cannot."""

from __future__ import annotations

import re


def test_ranges_are_not_folded_mid_value_at_80_columns(cli):
    out = cli("simulate", "seed-incident-1keim", columns=80)
    assert "[86784,89280)" in out.output and "[89280,94024)" in out.output
    assert not re.search(r"\[\d+,\d+\s*\n", out.output)
    assert max(len(line) for line in out.output.splitlines()) <= 80


def test_too_narrow_for_whole_values_folds_rather_than_crops(cli):
    out = cli("simulate", "seed-incident-1keim", columns=50)
    lines = out.output.splitlines()
    assert max(len(line) for line in lines) <= 50
    assert "after" in out.output  # the last column is still there, folded
