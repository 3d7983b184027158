"""Running a finding's reproducer on the installed engine, and what came of it.

The reproducers import their engine, so this module imports them only when asked
(:func:`run`), and an engine that is not installed (or not one the driver speaks to) comes back
as an :class:`Outcome` that says so instead of an error: listing the findings never needs an
engine, and running one on a machine without it is an answer, not a failure.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from policykit import engines
from policykit.errors import PolicykitError
from policykit.findings.catalog import Finding

REPRO = "policykit.findings.repro"


@dataclass
class Outcome:
    """One reproducer run: whether it ran, on which release, and what the engine showed."""

    finding: str
    engine: str
    installed: str | None
    ran: bool
    #: the engine showed the failure (None when nothing ran)
    shows_failure: bool | None = None
    #: the reproducer's report, every figure read from the engine's objects
    lines: list[str] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    #: why nothing ran
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "finding": self.finding,
            "engine": self.engine,
            "installed": self.installed,
            "ran": self.ran,
            "shows_failure": self.shows_failure,
            "reason": self.reason or None,
            "report": self.lines,
            "steps": self.steps,
            "state": self.state,
        }


def _absent(finding: Finding, installed: str | None, why: str) -> Outcome:
    hint = engines.written_against(finding.engine).install
    reason = f"engine not installed: {why} (install it with {hint})"
    return Outcome(finding.id, finding.engine, installed, ran=False, reason=reason)


def run(finding: Finding) -> Outcome:
    """Run ``finding``'s reproducer on the installed engine."""
    installed = engines.installed_version(finding.engine)
    name = engines.NAMES[finding.engine]
    if installed is None:
        return _absent(finding, None, f"{name} is not installed here")
    module_name, scenario = finding.reproducer
    try:
        module = importlib.import_module(f"{REPRO}.{module_name}")
        result = module.reproduce(scenario)
    except ImportError as exc:
        return _absent(finding, installed, f"{name} {installed} does not import ({exc})")
    except PolicykitError as exc:  # the SGLang driver's "not installed / not supported"
        return _absent(finding, installed, " ".join(str(exc).split()))
    return Outcome(
        finding.id,
        finding.engine,
        installed,
        ran=True,
        shows_failure=bool(module.failed(result)),
        lines=list(module.report(result)),
        steps=list(result.steps),
        state=dict(result.state),
    )
