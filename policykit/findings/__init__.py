"""Findings upstream can act on: failures of an engine's own scheduler, each with a reproducer
on the engine's real classes, the releases it was checked on, the upstream threads it relates
to, and the combo that avoids it (docs/findings/). ``policykit findings`` lists and runs them."""

from policykit.findings.catalog import Avoid, Check, Finding, Thread, status, versions
from policykit.findings.entries import FINDINGS, find

__all__ = ["FINDINGS", "Avoid", "Check", "Finding", "Thread", "find", "status", "versions"]
