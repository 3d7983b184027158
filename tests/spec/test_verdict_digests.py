"""``check --all`` gives the verdicts it gave before the checker's node rules moved into the kernel.

The digests in ``tests/spec/data`` were recorded (:mod:`policykit.spec.digest`) from the
checker as it stood before that refactor. A change that keeps the semantics keeps every row's
verdict hash. A counterexample hash may move where a formula was rewritten into an equivalent
one (z3 then starts its search elsewhere); such a move is recorded in the data file's
``moved`` with its reason (``python -m policykit.spec.digest CHECK.json RECORDED.json --moved
WHY``), and the exports test replays every counterexample. The digests depend on z3's search,
so they are compared only under the z3 release they were recorded with. The sliding-window
digest (``check --all --sliding-window 4096 --rounds 3 --requests 2``, about 10 minutes on 2
cores) is compared on demand: docs/spec.md, "Verdict digests".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import z3
from click.testing import CliRunner

from policykit.cli import main
from policykit.fairness import OVERTAKING
from policykit.spec.digest import additions, differences, digest

DATA = Path(__file__).parent / "data"
#: properties added after the digests were recorded: their rows are additions, not moves
ADDED_PROPERTIES = {OVERTAKING}


def _recorded(name: str) -> dict:
    recorded = json.loads((DATA / name).read_text())
    if recorded["device"] != f"CPU (z3 {z3.get_version_string()})":
        pytest.skip(f"digests recorded under {recorded['device']}, not this z3")
    return recorded["rows"]


@pytest.mark.slow
def test_check_all_keeps_its_recorded_verdicts(tmp_path: Path) -> None:
    expected = _recorded("check-all.digest.json")
    out = tmp_path / "check.json"
    result = CliRunner().invoke(main, ["check", "--all", "--json", "--out", str(out)])
    assert result.exit_code in (1, 3), result.output  # violations and unknowns are expected
    found = digest(json.loads(out.read_text()))
    for part in ("verdict", "counterexample"):
        moved = differences(expected, found, part)
        assert not moved, f"{len(moved)} {part}s moved, e.g. {moved[:5]}"
    assert set(additions(expected, found)) <= ADDED_PROPERTIES


@pytest.mark.slow
def test_the_sliding_window_rows_that_once_moved_keep_their_recorded_digest(
    tmp_path: Path,
) -> None:
    """The two combos whose sliding-window rows moved when the between-round rules went into the
    kernel (a model handed the kernel ``Sym`` values, and z3 got the reflected comparison): a
    minute of the sliding-window digest, so the fast way to notice such a move again."""
    expected = _recorded("check-all-swa.digest.json")
    combos = ["sglang/sglang/none", "sglang/sglang/page"]
    out = tmp_path / "check.json"
    args = ["check", "--sliding-window", "4096", "--rounds", "3", "--requests", "2"]
    for combo in combos:
        args += ["--combo", combo]
    result = CliRunner().invoke(main, [*args, "--json", "--out", str(out)])
    assert result.exit_code in (1, 3), result.output
    found = digest(json.loads(out.read_text()))
    mine = {k: v for k, v in expected.items() if k.split(" | ")[0] in combos}
    assert len(mine) == 14 and len(found) == 14 + 2  # and a bounded-overtaking row each
    assert set(additions(mine, found)) == ADDED_PROPERTIES
    for part in ("verdict", "counterexample"):
        moved = differences(mine, found, part)
        assert not moved, f"{len(moved)} {part}s moved: {moved}"
