"""The findings upstream can act on, as data: one entry per failure of an engine's own scheduler.

Each finding was first a counterexample of ``policykit check`` on a model of the engine, then a
replay on the engine's classes; an upstream maintainer needs neither, only a reproducer on the
real engine and a plain statement of which releases it affects. So each entry holds the
reproducer (a module of :mod:`policykit.findings.repro` and a scenario name), the upstream
threads it relates to and how it differs from each, the combo that avoids it with the verdicts
``policykit check`` gives it, and one :class:`Check` per release the reproducer was run on.
Nothing here is inferred: a release without a recorded run is "not checked", and a finding a
newer release fixes keeps its entry with :attr:`Finding.fixed_in` set.
"""

from __future__ import annotations

from dataclasses import dataclass

from policykit import engines

#: the docs folder of the pages, one per finding plus an index
DOCS = "docs/findings"


@dataclass(frozen=True)
class Thread:
    """An upstream issue or pull request the finding relates to."""

    repo: str
    number: int
    kind: str  # "issue" or "PR"
    #: its title and state as read from the tracker ("" where we could not read it)
    title: str
    state: str
    #: how the finding differs from it, or why it is related
    difference: str

    @property
    def url(self) -> str:
        path = "pull" if self.kind == "PR" else "issues"
        return f"https://github.com/{self.repo}/{path}/{self.number}"


@dataclass(frozen=True)
class Check:
    """One run of the reproducer on one release."""

    version: str
    affected: bool
    date: str
    #: where it ran (the venv, the machine)
    where: str


@dataclass(frozen=True)
class Avoid:
    """The combo that avoids the finding, and what ``policykit check`` says of it."""

    combo: str
    #: the engine settings it stands for
    settings: str
    #: property -> verdict, as ``policykit check`` printed it
    verdicts: tuple[tuple[str, str], ...]
    command: str


@dataclass(frozen=True)
class Finding:
    id: str
    engine: str
    title: str
    #: what fails: the property of ``policykit check`` the engine violates, or in words
    failure: str
    #: one paragraph: what happens, in the engine's terms
    summary: str
    #: the engine settings under which it happens
    settings: str
    #: (module under policykit.findings.repro, scenario name)
    reproducer: tuple[str, str]
    #: what ``--run`` shows when the failure is there
    shows: str
    upstream: tuple[Thread, ...]
    avoid: Avoid | None
    #: why no combo is given, when none is
    no_avoid: str
    checks: tuple[Check, ...]
    #: the first release that no longer shows it, when one does
    fixed_in: str | None = None

    @property
    def page(self) -> str:
        return f"{DOCS}/{self.id}.md"

    def check(self, version: str) -> Check | None:
        return next((c for c in self.checks if c.version == version), None)


def status(finding: Finding, version: str) -> str:
    """``affected``, ``not affected``, ``fixed in X`` or ``not checked: engine absent`` for
    ``finding`` on ``version``: a recorded run decides; a release at or after
    :attr:`Finding.fixed_in` is ``fixed in X``; anything else was not run."""
    run = finding.check(version)
    if run is not None:
        return "affected" if run.affected else "not affected"
    if finding.fixed_in is not None and _key(version) >= _key(finding.fixed_in):
        return f"fixed in {finding.fixed_in}"
    return "not checked: engine absent"


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("+")[0].split(".") if p.isdigit())


def versions(finding: Finding) -> tuple[str, ...]:
    """The releases of its engine that :data:`policykit.engines.RELEASES` lists."""
    return engines.versions(finding.engine)
