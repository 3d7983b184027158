"""Why SGLang's scheduler modules failed to import, in one paragraph that says what to install.

SGLang 0.5.23 pins its dependencies exactly (``transformers==5.19.0``, ...), but policykit
installs it with ``--no-deps`` beside the few pure-Python packages its scheduler imports, so pip
never holds those packages to SGLang's pins. A release of one of them can then break SGLang's
import (transformers 5.25.0 did: a ``TypeError`` while SGLang patches it). A traceback through
two foreign packages tells the user nothing they can act on; :func:`describe` names the
installed distributions the failure ran through, what SGLang declares for each, and the
``pip install`` that puts SGLang's declared versions in.
"""

from __future__ import annotations

import importlib.metadata as metadata
import traceback

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion

#: distributions a failure's traceback always passes through, never the cause by themselves
_OWN = frozenset({"sglang", "policykit"})


def declared(dist: str = "sglang") -> dict[str, Requirement]:
    """``dist``'s own unconditional requirements (``Requires-Dist`` without an extra, markers
    evaluated for this machine), by canonical name."""
    try:
        lines = metadata.requires(dist) or []
    except metadata.PackageNotFoundError:
        return {}
    found: dict[str, Requirement] = {}
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            found[canonicalize_name(req.name)] = req
    return found


def involved(exc: BaseException) -> list[str]:
    """The installed distributions whose modules ``exc``'s traceback runs through, in call
    order, without SGLang and policykit (they are in every such traceback)."""
    owners = metadata.packages_distributions()
    names: list[str] = []
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        module = str(frame.f_globals.get("__name__", ""))
        for dist in owners.get(module.split(".")[0], ()):
            name = canonicalize_name(dist)
            if name not in _OWN and name not in names:
                names.append(name)
    return names


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _outside(req: Requirement, version: str) -> bool:
    try:
        return not req.specifier.contains(version, prereleases=True)
    except InvalidVersion:
        return True


def describe(sglang_version: str, exc: BaseException, install_hint: str) -> str:
    """The paragraph for an import of SGLang ``sglang_version`` that raised ``exc``."""
    error = " ".join(f"{type(exc).__name__}: {exc}".split())
    wants = declared()
    notes, pins = [], []
    for name in involved(exc):
        version = _installed(name)
        req = wants.get(name)
        if req is None:
            notes.append(f"{name} {version} (SGLang {sglang_version} does not declare it)")
            continue
        notes.append(f"{name} {version} (SGLang {sglang_version} declares {req.specifier})")
        if version is None or _outside(req, version):
            pins.append(f"{name}{req.specifier}")
    ran = f"; the failure ran through {', '.join(notes)}" if notes else ""
    if pins:
        quoted = " ".join(f"'{p}'" for p in pins)
        todo = f"install the versions SGLang {sglang_version} declares: pip install {quoted}"
    else:
        todo = install_hint
    return (
        f"SGLang {sglang_version} is installed but its scheduler modules fail to import "
        f"({error}){ran}; {todo}."
    )
