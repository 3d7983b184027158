"""Verdicts kept on disk, keyed by everything the encoding of a combo is made from.

A combo's verdicts are a function of its inputs: the checker's code and the z3 release that
builds and solves its formulas, the policies' code and state, the engine configuration, the
bounds and the resource budget. Every query is counted in z3 resource units and runs in a fresh
context, and every combo in a fresh process (:mod:`.solver`, :mod:`.isolation`), so the same
inputs give the same rows, counterexamples included; ``tests/spec/test_verdict_digests.py``
holds the checker to that. So a combo checked once need not be checked again while none of
those inputs changed, and two members of one run that share all of them are checked once.

The *key* is the SHA-256 of :func:`key_inputs`, a canonical JSON description of those inputs:
the source digest of every file of the checker's packages (``policykit``, ``policykit.spec``,
``policykit.plugins``: an edit anywhere in them misses, not just one that changes a formula),
each policy's class, the digest of its defining package's files, its state and where it was
registered from, the configuration and the options (the wall-clock ``deadline`` aside: a row
it cut short is never stored), z3's full version, Python's and policykit's. An entry stores
the description beside the rows, and a lookup compares it with the one asked for, so even a
hash collision cannot return another combo's rows.

Not stored: a combo with a ``refused`` row (a failure that may be the machine's: a killed
process, an unreadable file) and a combo any verdict of which the wall-clock safety net cut
short (it depends on the machine's speed). Where policies exist only in the calling process
(a plugin manager handed in by a test or a notebook), nothing is looked up or stored: their
behaviour may depend on that process's history, which no file records.

The cache directory is ``$POLICYKIT_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/policykit/check``
(``~/.cache/policykit/check``). Deleting it clears the cache; ``check --no-cache`` neither
reads nor writes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

import z3

from policykit.documents import stamped

if TYPE_CHECKING:
    from policykit.config import EngineConfig
    from policykit.registry import Combo
    from policykit.spec.checker import CheckOptions

SCHEMA = "policykit.check-cache/1"
Rows = list[dict[str, Any]]


def cache_dir() -> Path:
    """Where entries live: ``$POLICYKIT_CACHE_DIR``, else under ``$XDG_CACHE_HOME``."""
    given = os.environ.get("POLICYKIT_CACHE_DIR")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "policykit" / "check"


def _file_digest(paths: list[Path]) -> str:
    """SHA-256 over the files' relative names and contents, in sorted order."""
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(path.as_posix().encode() + b"\0")
        with contextlib.suppress(OSError):
            h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def _python_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*.py") if "__pycache__" not in p.parts]


@cache
def checker_digest() -> str:
    """The checker's code: every Python file of the packages that build, solve and replay a
    formula and of the built-in policies (an edit anywhere in them changes the key)."""
    # (found, not imported: the checker has no use for the built-ins' modules themselves)
    specs = [find_spec(name) for name in ("policykit", "policykit.spec", "policykit.plugins")]
    folders = {Path(p) for s in specs if s is not None for p in s.submodule_search_locations or []}
    return _file_digest([f for d in sorted(folders) for f in _python_files(d)])


@cache
def _package_digest(module_name: str) -> str:
    """The files of the top-level package ``module_name`` belongs to (or of the one module, if
    it is not in a package): a policy may call helpers anywhere in its distribution."""
    top = module_name.split(".")[0]
    module = sys.modules.get(top)
    paths = list(getattr(module, "__path__", []) or [])
    if paths:
        return _file_digest([f for d in paths for f in _python_files(Path(d))])
    origin = getattr(sys.modules.get(module_name), "__file__", None)
    if origin is None:
        raise LookupError(f"module {module_name} has no file")
    return _file_digest([Path(origin)])


def policy_inputs(policy: Any) -> dict[str, Any]:
    """What one policy contributes: its class, its package's code and its state."""
    cls = type(policy)
    state = sorted((k, repr(v)) for k, v in vars(policy).items() if k != "source")
    return {
        "kind": getattr(policy, "kind", None),
        "spec": getattr(policy, "spec", None),
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "file": Path(inspect.getfile(cls)).name,
        "code": _package_digest(cls.__module__),
        "state": state,
    }


def options_inputs(options: CheckOptions) -> dict[str, Any]:
    """The options as data, without the wall-clock ``deadline`` (see the module docstring)."""
    data = dataclasses.asdict(options)
    data.pop("deadline", None)
    return json.loads(json.dumps(data, sort_keys=True, default=repr))


def key_inputs(
    combo: Combo, config: EngineConfig, options: CheckOptions, sources: dict[str, str]
) -> dict[str, Any]:
    """The canonical description a key is the hash of (module docstring)."""
    try:
        version = metadata.version("policykit")
    except metadata.PackageNotFoundError:  # pragma: no cover - run from a bare checkout
        version = "unknown"
    inputs = {
        "schema": SCHEMA,
        "policykit": version,
        "checker": checker_digest(),
        "z3": z3.get_full_version(),
        "python": sys.version,
        "combo": str(combo),
        "policies": [policy_inputs(p) for p in combo.policies()],
        "sources": dict(sorted(sources.items())),
        "config": config.to_dict(),
        "options": options_inputs(options),
    }
    # as it reads back from an entry (tuples become lists), so a lookup can compare the two
    loaded: dict[str, Any] = json.loads(json.dumps(inputs, sort_keys=True))
    return loaded


def key_of(inputs: dict[str, Any]) -> str:
    """The SHA-256 of ``inputs`` as canonical JSON."""
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def storable(rows: Rows) -> bool:
    """Whether rows depend on nothing but the key's inputs (module docstring)."""
    from policykit.spec.checkable import REFUSED
    from policykit.spec.solver import WALL_CLOCK

    return bool(rows) and not any(
        r.get("verdict") == REFUSED
        or WALL_CLOCK in (r.get("note") or "")
        or WALL_CLOCK in (r.get("shortfall") or "")
        for r in rows
    )


@dataclass
class ProofCache:
    """Entries under ``folder``, one JSON file per key; counts what a run found and stored."""

    folder: Path
    hits: int = 0
    misses: int = 0
    stored: int = 0
    #: entries that could not be read or written (the run goes on without them)
    errors: list[str] = field(default_factory=list)

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str, inputs: dict[str, Any]) -> Rows | None:
        """The rows stored under ``key`` if its entry describes exactly ``inputs``."""
        try:
            entry = json.loads(self._path(key).read_text())
        except FileNotFoundError:
            self.misses += 1
            return None
        except (OSError, ValueError) as exc:
            self.errors.append(f"{self._path(key)}: {exc}")
            self.misses += 1
            return None
        if entry.get("schema") != SCHEMA or entry.get("inputs") != inputs:
            self.misses += 1
            return None
        self.hits += 1
        return list(entry["rows"])

    def put(self, key: str, inputs: dict[str, Any], rows: Rows) -> None:
        """Store ``rows`` under ``key`` (atomically: a reader never sees half an entry)."""
        if not storable(rows):
            return
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            text = json.dumps(stamped({"inputs": inputs, "rows": rows}, SCHEMA))
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            os.replace(tmp, path)
            self.stored += 1
        except OSError as exc:
            self.errors.append(f"{path}: {exc}")

    def summary(self) -> dict[str, Any]:
        """The document's ``cache`` block."""
        return {
            "dir": str(self.folder),
            "hits": self.hits,
            "misses": self.misses,
            "stored": self.stored,
            "errors": self.errors[:5],
        }


@dataclass
class Member:
    """One combo of a run: what it is checked as, and its key (None: checked, never stored)."""

    combo: Combo
    config: EngineConfig
    options: CheckOptions
    key: str | None = None
    inputs: dict[str, Any] | None = None


@dataclass
class RunCache:
    """A run's combos against the cache: which need checking, and every combo's rows.

    Members with the same key (the same combo, configuration and options named twice) are
    checked once and share the rows. ``store`` None: ``--no-cache``, so nothing is read or
    written, but equal members are still checked once."""

    members: list[Member]
    store: ProofCache | None
    rows: dict[int, Rows] = field(default_factory=dict)
    #: the members to check, one per distinct key, in run order
    todo: list[int] = field(default_factory=list)
    #: member -> the member checked in its stead (same key, earlier in the run)
    same_as: dict[int, int] = field(default_factory=dict)

    @classmethod
    def plan(
        cls, members: list[Member], sources: list[dict[str, str]], store: ProofCache | None
    ) -> RunCache:
        """Key every member, take what the cache holds, and list the rest to check."""
        run = cls(members, store)
        first: dict[str, int] = {}
        for i, m in enumerate(members):
            with contextlib.suppress(TypeError, LookupError, OSError):
                m.inputs = key_inputs(m.combo, m.config, m.options, sources[i])
                m.key = key_of(m.inputs)
            if m.key is not None and m.key in first:
                run.same_as[i] = first[m.key]
                continue
            if m.key is not None:
                first[m.key] = i
                found = None if store is None else store.get(m.key, m.inputs or {})
                if found is not None:
                    run.rows[i] = found
                    continue
            run.todo.append(i)
        return run

    def record(self, i: int, rows: Rows) -> None:
        """A checked member's rows: kept, stored, and given to the members that share them."""
        self.rows[i] = rows
        m = self.members[i]
        if self.store is not None and m.key is not None and m.inputs is not None:
            self.store.put(m.key, m.inputs, rows)

    def all_rows(self) -> list[Rows]:
        """Every member's rows, in run order (call once every ``todo`` member is recorded)."""
        return [self.rows[self.same_as.get(i, i)] for i in range(len(self.members))]

    def summary(self) -> dict[str, Any]:
        """The document's ``cache`` block: where, hits, misses, stored, and the members shared."""
        block: dict[str, Any] = {"enabled": self.store is not None}
        if self.store is not None:
            block |= self.store.summary()
        return block | {"checked": len(self.todo), "shared": len(self.same_as)}
