"""Code cites the incidents by their docs page (docs/incidents.md), not by the numbers of
internal write-ups readers do not have ("seed 000" ... "seed 004")."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("policykit", "plugins", "spec", "harness")
#: "seed 000", "seeds 003 and 004", "Seed 002's": a write-up's number (the bundled scenario
#: names ``seed-abc`` and ``seed-incident-1keim`` are not citations)
CITATION = re.compile(r"\bseeds? 0\d\d", re.IGNORECASE)
#: files whose owners rewrite their citations after issue 22's merge; the test fails once a
#: file here is clean, so that the list only shrinks
NOT_YET: dict[str, int] = {}


def citations() -> dict[str, int]:
    found = {}
    for folder in FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            count = len(CITATION.findall(path.read_text(encoding="utf-8")))
            if count:
                found[path.relative_to(REPO).as_posix()] = count
    return found


def test_the_pattern_finds_citations_and_not_scenario_names():
    assert CITATION.findall("the seed 000 fix; seeds 003 and 004; Seed 002's exception") == [
        "seed 000",
        "seeds 003",
        "Seed 002",
    ]
    assert not CITATION.findall("policykit simulate seed-incident-1keim; seed=0")


def test_code_cites_docs_pages_not_write_ups():
    found = citations()
    new = {f: n for f, n in found.items() if n > NOT_YET.get(f, 0)}
    assert not new, f"cite docs/incidents.md#<section> instead of the write-up's number: {new}"
    done = sorted(f for f in NOT_YET if f not in found)
    assert not done, f"no citations left in {done}: remove them from NOT_YET"
