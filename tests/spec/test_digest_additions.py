"""The digest comparison tells rows a new property added from rows that moved."""

from __future__ import annotations

import json
from pathlib import Path

from policykit.spec.digest import additions, differences, digest, main

RECORDED = {"a | no-oom": {"verdict": "1", "counterexample": None}}
FOUND = {**RECORDED, "a | bounded-overtaking": {"verdict": "2", "counterexample": None}}


def test_an_added_row_is_not_a_move() -> None:
    assert differences(RECORDED, FOUND, "verdict") == []
    assert additions(RECORDED, FOUND) == {"bounded-overtaking": ["a | bounded-overtaking"]}
    assert differences(FOUND, RECORDED, "verdict") == ["a | bounded-overtaking"]  # a loss moves


def test_the_comparison_counts_additions_apart_and_passes(tmp_path: Path, capsys) -> None:
    check = {"verdicts": [{"combo": "a", "property": p, "verdict": "proved"} for p in
                          ("no-oom", "bounded-overtaking")]}  # fmt: skip
    (tmp_path / "check.json").write_text(json.dumps(check))
    recorded = {"rows": {k: v for k, v in digest(check).items() if "no-oom" in k}}
    (tmp_path / "rec.json").write_text(json.dumps(recorded))
    assert main([str(tmp_path / "check.json"), str(tmp_path / "rec.json")]) == 0
    out = capsys.readouterr().out
    assert "added: 1 rows of bounded-overtaking" in out
    assert "2 rows: 0 verdicts moved, 0 counterexamples moved, 1 added" in out
