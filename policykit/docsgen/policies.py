"""The policy reference page, generated from the plugin registry.

It lists whatever the registry holds in the environment that builds the docs: the built-ins and
every policy an installed distribution registers through the ``policykit`` entry-point group.
For each policy: how to select it, its parameter, its full docstring, where it came from
(built-in, or distribution and version) and its source, read with :mod:`inspect`.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

from policykit.docsgen.markdown import EVERY_PAGE, GENERATED_BANNER, Links, Provenance, fence, table
from policykit.policy import KINDS
from policykit.registry import DEFAULT_COMBO, SAMPLE_ARGS, PolicyEntry, PolicyRegistry

_KIND_DOC = {
    "admission": "whether a waiting request may enter this round, and what a truncation owes "
    "the memory ledger",
    "chunking": "how many tokens a new or the resumed request computes this round",
    "alignment": "where a non-final chunk may end",
    "allocator-phase": "the torch caching-allocator settings of each process phase",
    "queue": "the order of the waiting requests, and whether one that can never fit stops the "
    "queue",
    "preemption": "which running request gives its KV back when a running chunk cannot be "
    "allocated, on a node that preempts (vLLM's); `none` keeps the combo on SGLang's node",
}


def anchor(kind: str, name: str) -> str:
    """The heading id of a policy, stable across builds (used by other pages' links)."""
    return f"{kind}-{name}".lower()


def source_location(cls: type) -> str:
    """``path:line`` of a class, relative to its top-level package's parent when possible.

    Relative paths keep the page identical across checkouts and virtual environments.
    """
    try:
        file = Path(inspect.getsourcefile(cls) or "")
        _, line = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return "(source not available)"
    top = sys.modules.get(cls.__module__.split(".")[0])
    root = Path(getattr(top, "__file__", "") or "").parent.parent
    try:
        shown = file.resolve().relative_to(root.resolve())
    except ValueError:
        shown = file
    return f"{shown.as_posix()}:{line}"


def _selector(entry: PolicyEntry) -> str:
    param = entry.cls.parameter
    if param is None:
        return entry.name
    examples = SAMPLE_ARGS.get((entry.kind, entry.name)) or getattr(entry.cls, "samples", ())
    example = f" (e.g. `{entry.name}:{examples[0]}`)" if examples else ""
    return f"{entry.name}:<{param.name}>{example}"


def policy_section(entry: PolicyEntry) -> str:
    cls = entry.cls
    param = cls.parameter
    is_default = DEFAULT_COMBO.get(entry.kind) == entry.name
    title = f"`{entry.name}`" + (" (default)" if is_default else "")
    facts = [
        ("select with", f"`--combo {entry.kind}={_selector(entry)}`"),
        (
            "parameter",
            "none"
            if param is None
            else f"`{param.name}`: {param.doc}"
            + ("" if param.required else f" (default {param.default})"),
        ),
        ("registered by", f"plugin `{entry.source.plugin_name}` ({entry.source})"),
        ("class", f"`{cls.__module__}.{cls.__qualname__}`"),
        ("source", f"`{source_location(cls)}`"),
    ]
    out = [f"### {title} {{ #{anchor(entry.kind, entry.name)} }}\n"]
    out.append("\n".join(f"- **{k}**: {v}" for k, v in facts) + "\n")
    out.append("\n" + (entry.doc or "*(no docstring)*") + "\n")
    try:
        code = inspect.getsource(cls)
    except (OSError, TypeError):
        code = ""
    if code:
        body = "\n".join(
            "    " + line if line else "" for line in fence(code, "python").splitlines()
        )
        out.append(f'\n??? example "Source of `{cls.__qualname__}`"\n{body}\n')
    return "\n".join(out)


def policies_page(
    registry: PolicyRegistry, provenance: Provenance, links: Links = EVERY_PAGE
) -> str:
    parts = [GENERATED_BANNER, "# Policy reference\n\n", provenance.note()]
    parts.append(
        "Every policy registered in the environment that built this site, by kind: the built-ins "
        "and any installed plugin's (see "
        + links.to("Write your own policy", "tutorial.md", page="generated/policies.md")
        + "). Run "
        "`policykit policies` to list the ones in yours.\n\n"
    )
    summary = []
    for kind in KINDS:
        for e in registry.entries(kind):
            link = f"[`{e.name}`](#{anchor(kind, e.name)})"
            summary.append((kind, link, str(e.source), e.summary))
    parts.append(table(("kind", "policy", "from", "what it does"), summary) + "\n")
    for kind in KINDS:
        parts.append(f"## {kind}\n\nDecides {_KIND_DOC[kind]}.\n\n")
        entries = registry.entries(kind)
        if not entries:
            parts.append("*No policy of this kind is registered.*\n\n")
        for e in entries:
            parts.append(policy_section(e) + "\n")
    return "".join(parts).replace("\n\n\n", "\n\n")


def write_policies_page(
    registry: PolicyRegistry, out: Path, provenance: Provenance, links: Links = EVERY_PAGE
) -> Path:
    path = out / "policies.md"
    path.write_text(policies_page(registry, provenance, links), encoding="utf-8")
    return path
