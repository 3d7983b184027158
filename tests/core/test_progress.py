"""The one progress helper: a bar only for a person at a terminal (never under ``--json``, in a
log or in CI), counts that add up, and a child's counts relayed into its parent's bar."""

from __future__ import annotations

import io
import sys

import pytest

from policykit.progress import RELAY_ENV, RELAY_PREFIX, ProgressBar, run_relayed


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def not_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv(RELAY_ENV, raising=False)


def _draw(stream: io.StringIO, **kw) -> str:
    with ProgressBar("check", 3, unit="combos", stream=stream, **kw) as bar:
        bar.describe("sglang/sglang/page")
        bar.advance()
    return stream.getvalue()


def test_a_terminal_gets_a_bar():
    assert "check" in _draw(Terminal())


def test_quiet_under_json_in_a_log_and_in_ci(monkeypatch):
    assert _draw(Terminal(), quiet=True) == ""
    assert _draw(io.StringIO()) == ""  # a log
    monkeypatch.setenv("CI", "true")
    assert _draw(Terminal()) == ""
    monkeypatch.setenv("CI", "0")  # a user who wants the bars back
    assert _draw(Terminal()) != ""


def test_counts():
    with ProgressBar("bench", 0, stream=io.StringIO()) as bar:
        assert (bar.done, bar.total, bar.current) == (0, 0, "")
        bar.total = 5
        bar.advance()
        bar.advance(2)
        bar.describe("reserve-tail/sglang/page")
        assert (bar.done, bar.total, bar.current) == (3, 5, "reserve-tail/sglang/page")
        bar.done = 5
        assert bar.done == bar.total == 5


def test_a_child_relays_its_counts_and_the_parent_takes_them(monkeypatch):
    monkeypatch.setenv(RELAY_ENV, "1")
    child = io.StringIO()
    with ProgressBar("check", 2, stream=child, quiet=True) as bar:  # relays even under --json
        bar.describe("a")
        bar.advance()
        bar.done = 1  # unchanged: not relayed again
        bar.describe("b")
        bar.advance()
    lines = child.getvalue().splitlines()
    assert len(lines) == 3 and all(line.startswith(RELAY_PREFIX) for line in lines)
    monkeypatch.delenv(RELAY_ENV)
    parent = ProgressBar("docs: check", 0, stream=io.StringIO())
    assert not parent.follow("some warning\n") and not parent.follow(RELAY_PREFIX + "{oops")
    for line, (done, now) in zip(lines, [(0, ""), (1, "a"), (2, "b")], strict=True):
        assert parent.follow(line)
        assert (parent.done, parent.total, parent.current) == (done, 2, now)


CHILD = """
import sys
from policykit.progress import ProgressBar
print("x" * 200_000)  # more than a pipe holds: stdout must drain while stderr is read
with ProgressBar("check", 4, quiet=True) as bar:
    print("a warning", file=sys.stderr)
    for i in range(4):
        bar.describe(f"combo {i}")
        bar.advance()
"""


def test_run_relayed_feeds_a_drawn_bar_and_keeps_the_rest():
    with ProgressBar("docs: check", 0, stream=Terminal()) as bar:
        proc = run_relayed([sys.executable, "-c", CHILD], bar)
    assert proc.returncode == 0 and len(proc.stdout) == 200_001
    assert proc.stderr == "a warning\n"
    assert (bar.done, bar.total, bar.current) == (4, 4, "combo 3")


def test_run_relayed_asks_nothing_of_a_child_when_no_bar_is_drawn():
    with ProgressBar("docs: check", 0, stream=io.StringIO()) as bar:
        proc = run_relayed([sys.executable, "-c", CHILD], bar)
    assert proc.returncode == 0 and proc.stderr == "a warning\n" and bar.done == 0
