"""Whether this machine's SGLang can run the plugin, answered without a GPU and without importing
SGLang's scheduler (which pulls CUDA kernels in at import time).

The hook targets are found by reading the installed ``schedule_policy.py`` and ``scheduler.py``
with :mod:`ast`: a renamed method or a changed keyword in a future release shows up here, before
an engine start-up would log ``Failed to apply hooks`` and serve without the policies.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from policykit import engines
from policykit.integrations.sglang import hooks, plugin

#: how to install what the plugin runs in, without pulling SGLang's GPU builds over torch
INSTALL = engines.written_against("sglang").install
#: keyword arguments the ``_select_prefill_admission`` hook reads
SELECT_KEYWORDS = ("total_tokens", "host_hit_length", "swa_host_hit_length", "has_chunked_req")


@dataclass(frozen=True)
class Finding:
    """One thing the check looked at: ``ok`` and a sentence saying what it found."""

    name: str
    ok: bool
    detail: str

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


def installed_version() -> str | None:
    return engines.installed_version("sglang")


def version_finding() -> Finding:
    version = installed_version()
    if version is None:
        return Finding("sglang", False, f"SGLang is not installed: {INSTALL}.")
    supported = engines.listing("sglang")
    if engines.release("sglang", version) is None:
        return Finding(
            "sglang", False, f"SGLang {version} is installed; the plugin supports {supported}."
        )
    return Finding("sglang", True, f"SGLang {version} is installed (supported: {supported}).")


def _source(module: str) -> ast.Module | None:
    """The parsed source of ``module``, found from the top-level package's location: finding
    the submodule itself would import ``sglang/__init__``, which needs triton."""
    top, _, rest = module.partition(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations)), *rest.split(".")).with_suffix(".py")
    if not path.is_file():
        return None
    return ast.parse(path.read_text(), filename=str(path))


def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    return None


def target_findings() -> list[Finding]:
    """One finding per hook target: the method exists where the hook will look for it."""
    targets = (*plugin.DECISION_TARGETS, plugin.SCHEDULER_INIT)
    trees: dict[str, ast.Module | None] = {}
    out = []
    for target in targets:
        module, cls, name = target.rsplit(".", 2)
        if module not in trees:
            trees[module] = _source(module)
        tree = trees[module]
        method = None if tree is None else _method(tree, cls, name)
        if method is None:
            out.append(Finding(target, False, f"{cls}.{name} is missing from {module}."))
            continue
        detail = f"found at {module} line {method.lineno}."
        if target == hooks.SELECT:
            params = {a.arg for a in (*method.args.args, *method.args.kwonlyargs)}
            missing = [k for k in SELECT_KEYWORDS if k not in params]
            if missing:
                out.append(Finding(target, False, f"lacks the keyword(s) {', '.join(missing)}."))
                continue
        out.append(Finding(target, True, detail))
    return out
