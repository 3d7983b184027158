"""What the scheduler guarantees of each view it asks a policy on, on every node and engine
configuration: a request has a token left, a prefix is not longer than the prompt, a chunk
ends after it starts.

Two readers: cross-validation draws only views that respect them (with what a node or a
configuration adds: :mod:`policykit.spec.crossval`), and the lifting of a loop follows only
the trips such a view can take (:class:`policykit.spec.symbolic.Explorer`). The second needs
them: ``while bucket >= 2 * need: bucket //= 2`` ends for every request with a token left,
and never for a ``need`` below zero, which no view has.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from policykit.policy import AdmitView, AlignView, ChunkView, PreemptView, QueueView, TailView

#: a view's fields (z3 terms or ints) -> the facts the scheduler guarantees of them
Facts = Callable[[dict[str, Any]], list[Any]]

GUARANTEES: dict[type, Facts] = {
    AdmitView: lambda x: [
        x["remaining_tokens"] >= 1,
        x["remaining_tokens"] <= x["prompt_tokens"],
        x["host_prefix_tokens"] >= 0,
        x["host_prefix_tokens"] <= x["remaining_tokens"],
    ],
    TailView: lambda x: [x["tail_tokens"] >= 1],
    ChunkView: lambda x: [x["remaining_tokens"] >= 1],
    AlignView: lambda x: [x["start"] >= 0, x["end"] > x["start"]],
    QueueView: lambda x: [
        x["prefix_tokens"] >= 0,
        x["host_prefix_tokens"] >= 0,
        x["prefix_tokens"] + x["host_prefix_tokens"] < x["prompt_tokens"],
    ],
    PreemptView: lambda x: [
        x["position"] >= 0,
        x["prompt_tokens"] >= 1,
        x["computed_tokens"] >= 0,
        x["computed_tokens"] < x["prompt_tokens"],
        x["held_blocks"] >= 0,
    ],
}


def guaranteed(view_type: type, x: dict[str, Any]) -> list[Any]:
    """The guarantees of a ``view_type`` view whose fields are ``x`` (none for another type)."""
    facts = GUARANTEES.get(view_type)
    return [] if facts is None else facts(x)


def symbolic_guarantees(view: Any, terms: dict[str, Any]) -> list[Any]:
    """The guarantees of ``view`` with its symbolic fields read as ``terms`` (field -> z3
    term) and the rest as they are; those its concrete fields settle are left out."""
    x = {f.name: terms.get(f.name, getattr(view, f.name)) for f in dataclasses.fields(view)}
    return [g for g in guaranteed(type(view), x) if not isinstance(g, bool)]
