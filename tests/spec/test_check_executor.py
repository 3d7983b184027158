"""``policykit check --executor local``: the same verdicts as the in-process pool."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from policykit.cli import main

COMBOS = ["--combo", "admission=sglang,alignment=checkpoint:256"]


def verdicts(*extra: str) -> tuple[int, dict]:
    # a generous query timeout: both runs must reach the same verdicts however slow the box
    result = CliRunner().invoke(main, ["check", *COMBOS, "--json", "--timeout", "120", *extra])
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.slow
def test_check_on_the_local_executor_equals_the_pool():
    code, pooled = verdicts("--jobs", "1")
    code_units, units = verdicts("--executor", "local", "--jobs", "1")
    assert code == code_units == 1  # seed 000 is violated either way
    assert units["executor"]["name"] == "local"
    key = [(v["combo"], v["property"], v["verdict"]) for v in pooled["verdicts"]]
    assert [(v["combo"], v["property"], v["verdict"]) for v in units["verdicts"]] == key
    assert all(v["node"] for v in units["verdicts"])
