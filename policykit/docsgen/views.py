"""The plugin-author reference, generated from the code a plugin is written against.

Per policy kind, ``generated/views/<kind>.md``: the methods a policy of that kind implements
(from the base class) and a table per view of its fields, with each field's ``#:`` comment in
:mod:`policykit.policy` as its meaning; the tutorial includes them with ``--8<--``. And
``generated/hooks.md``: every hook of :mod:`policykit.hookspecs`, signature and docstring. A
field or hook added to the code is in the docs on the next build: they cannot drift.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

from policykit import hookspecs
from policykit.docsgen.markdown import GENERATED_BANNER, table
from policykit.policy import KINDS, POLICY_BASES

#: ``name: type  #: meaning`` on one line of a dataclass body
_FIELD_COMMENT = re.compile(r"^\s+(?P<name>\w+)\s*:[^#]*#:\s*(?P<doc>.+?)\s*$")
#: inline reST of a docstring: ``literal`` and :role:`~dotted.Target`
_REST_LITERAL = re.compile(r"``(.+?)``")
_REST_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def markdown_of(rest: str) -> str:
    """A docstring's reST as Markdown: inline literals and cross-references become code
    spans, and a paragraph ending in ``::`` introduces a Python code block."""
    text = _REST_LITERAL.sub(r"`\1`", rest)
    text = _REST_ROLE.sub(lambda m: f"`{m[1].rsplit('.', 1)[-1]}`", text)
    out: list[str] = []
    code: list[str] | None = None
    for line in [*text.splitlines(), "end"]:
        if code is not None:
            if not line.strip() or line.startswith("    "):
                code.append(line[4:])
                continue
            out += ["```python", *"\n".join(code).strip("\n").splitlines(), "```", ""]
            code = None
        if line.rstrip().endswith("::"):
            out += [line.rstrip()[:-1], ""]
            code = []
        else:
            out.append(line)
    return "\n".join(out[:-1]).strip() + "\n"


def field_docs(view_cls: type) -> dict[str, str]:
    """``{field: its #: comment}`` of a view dataclass, read from its source."""
    source = inspect.getsource(view_cls)
    found = (_FIELD_COMMENT.match(line) for line in source.splitlines())
    return {m["name"]: m["doc"] for m in found if m is not None}


def view_table(view_cls: type) -> str:
    """A Markdown table of ``view_cls``'s fields: name, type, meaning."""
    docs = field_docs(view_cls)
    rows = [
        (f"`{f.name}`", f"`{getattr(f.type, '__name__', f.type)}`", _inline(docs.get(f.name, "")))
        for f in fields(view_cls)
    ]
    return table(("field", "type", "meaning"), rows)


def decision_methods(kind: str) -> list[tuple[str, Callable[..., object]]]:
    """The methods a policy of ``kind`` implements: public, defined on the kind's base class."""
    base = POLICY_BASES[kind]
    return [
        (name, fn)
        for name, fn in vars(base).items()
        if callable(fn) and not name.startswith("_") and name not in ("kind",)
    ]


def _view_of(fn: Callable[..., object]) -> type | None:
    hints = typing.get_type_hints(fn)
    view = next((h for n, h in hints.items() if n != "return"), None)
    return view if isinstance(view, type) and hasattr(view, "__dataclass_fields__") else None


def _inline(rest: str) -> str:
    return markdown_of(rest).strip().replace("\n", " ")


def _first_paragraph(doc: str | None) -> str:
    return _inline(inspect.cleandoc(doc or "").split("\n\n")[0])


def kind_fragment(kind: str) -> str:
    """The methods of ``kind`` and the table of each view they receive."""
    methods = decision_methods(kind)
    rows = []
    views: list[type] = []
    for name, fn in methods:
        view = _view_of(fn)
        returns = typing.get_type_hints(fn).get("return")
        shown = getattr(returns, "__name__", str(returns)).replace("NoneType", "None")
        rows.append(
            (
                f"`{name}({'v: ' + view.__name__ if view else ''})`",
                f"`{shown}`",
                _first_paragraph(fn.__doc__) or _first_paragraph(POLICY_BASES[kind].__doc__),
            )
        )
        if view is not None and view not in views:
            views.append(view)
    parts = [GENERATED_BANNER, table(("method", "returns", "what it decides"), rows), "\n"]
    for view in views:
        parts += [f"**`{view.__name__}`**: {_first_paragraph(view.__doc__)}\n\n", view_table(view)]
        parts.append("\n")
    return "".join(parts)


def hooks_page() -> str:
    """Every hook specification: its call signature and what it tells the plugin."""
    parts = [
        GENERATED_BANNER,
        "# Plugin hooks\n\n",
        markdown_of(inspect.cleandoc(hookspecs.__doc__ or "")) + "\n",
        "A plugin implements any of these as a function (or method) of the same name, marked "
        "with `@policykit.hookimpl`; it may accept fewer arguments than the specification "
        "lists. `policykit plugins` shows which hooks each installed plugin implements.\n\n",
    ]
    for name, fn in vars(hookspecs).items():  # in the order the module defines them
        if not (name.startswith("policykit_") and inspect.isfunction(fn)):
            continue
        signature = str(inspect.signature(fn)).replace("'", "")  # postponed annotations
        parts += [
            f"## `{name}`\n\n",
            f"```python\ndef {name}{signature}\n```\n\n",
            markdown_of(inspect.cleandoc(fn.__doc__ or "")) + "\n",
        ]
    return "".join(parts)


def write_plugin_reference(out: Path) -> list[Path]:
    """Write ``views/<kind>.md`` for every kind and ``hooks.md`` under ``out``."""
    folder = out / "views"
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for kind in KINDS:
        path = folder / f"{kind}.md"
        path.write_text(kind_fragment(kind), encoding="utf-8")
        written.append(path)
    hooks = out / "hooks.md"
    hooks.write_text(hooks_page(), encoding="utf-8")
    return [*written, hooks]
