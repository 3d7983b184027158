"""Compare two JUnit reports of the same SGLang tests, SGLang's side and the plugin's side.

``python -m tests.upstream.sglang_own.compare SGLANG.xml POLICYKIT.xml`` prints each side's
counts, then every test that passes on SGLang's side and not with the plugin, and exits 1 when
there is one. A test that fails on SGLang's side as well is listed apart: it does not run on
this SGLang (a test from another release, a GPU it needs), which says nothing about the plugin.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter


def outcomes(path: str) -> dict[str, str]:
    """``{class::name: passed|failed|skipped}`` for every test case in a JUnit report."""
    found = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            outcome = "failed"
        elif "skipped" in kinds:
            outcome = "skipped"
        else:
            outcome = "passed"
        found[f"{case.get('classname')}::{case.get('name')}"] = outcome
    return found


def report(sglang: dict[str, str], policykit: dict[str, str]) -> tuple[list[str], list[str]]:
    """The lines to print, and the tests that pass on SGLang's side but not with the plugin."""
    lines = []
    for side, found in (("sglang", sglang), ("policykit", policykit)):
        counts = Counter(found.values())
        lines.append(
            f"{side}: {counts['passed']} passed, {counts['failed']} failed, "
            f"{counts['skipped']} skipped"
        )
    broken = sorted(t for t, o in sglang.items() if o == "passed" and policykit.get(t) != "passed")
    elsewhere = sorted(t for t, o in sglang.items() if o == "failed")
    lines += [f"passes on SGLang's, not with the plugin: {t}" for t in broken]
    lines += [f"fails on SGLang's own side too (not run here): {t}" for t in elsewhere]
    return lines, broken


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m tests.upstream.sglang_own.compare SGLANG.xml POLICYKIT.xml")
        return 2
    lines, broken = report(outcomes(argv[0]), outcomes(argv[1]))
    print("\n".join(lines))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
