"""Where a combo that claims an engine's behaviour cannot be shown to behave like that engine.

The ``sglang`` built-ins claim to decide as SGLang 0.5.23 does, and the conformance driver
(:mod:`policykit.upstream`) holds them to it. Some inputs hold something that claim has not been
shown for; a run on such an input is an approximation, and ``simulate``, ``check`` and
``bench`` say so in one line (and under ``--json``) rather than present it as the engine's
behaviour. :data:`GAPS` is the one list of such cases: when the model learns a case (and the
conformance driver can drive it), its entry is removed here and every command stops warning.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from policykit import engines
from policykit.registry import Combo
from policykit.scenario import Scenario, load_scenario


@dataclass(frozen=True)
class Holds:
    """What an input (a scenario, a workload, the checker's model) can contain that a claim
    depends on."""

    #: hybrid SWA: the node has sliding-window layers
    sliding_window: bool
    #: some request has a prefix in the host tier (HiCache)
    host_tier: bool
    #: the input is ``policykit check``'s model, not a node that runs it
    checker: bool = False

    @classmethod
    def of_scenario(cls, scenario: Scenario) -> Holds:
        """What a scenario holds."""
        return cls(
            sliding_window=scenario.config.sliding_window is not None,
            host_tier=any(r.host_prefix_tokens for r in scenario.requests),
        )

    @classmethod
    def of_checker(cls, sliding_window: bool) -> Holds:
        """``policykit check``'s model: any request may have a host-tier prefix."""
        return cls(sliding_window=sliding_window, host_tier=True, checker=True)

    @classmethod
    def of_bench_input(cls, sliding_window: int | None, source: str | None) -> Holds:
        """A bench input: a scenario file says what it holds; a generated workload or a trace
        may have host-tier prefixes (and has the sliding window its config says)."""
        path = Path(source) if source else None
        if path is not None and path.suffix == ".json" and path.is_file():
            return cls.of_scenario(load_scenario(path))
        return cls(sliding_window=sliding_window is not None, host_tier=True)


@dataclass(frozen=True)
class Gap:
    """One case an engine claim has not been shown for."""

    #: the engine the policies below claim to reproduce
    engine: str
    #: ``(kind, policy name)`` of each policy that makes the claim
    claimants: frozenset[tuple[str, str]]
    #: the inputs the gap is about
    sliding_window: bool
    host_tier: bool
    #: what the engine does that the model does not
    what: str
    #: only the checker's model has the gap (the node that simulate and bench run does not)
    checker_only: bool = False

    def applies(self, combo: Mapping[str, str], holds: Holds) -> bool:
        claimed = any(
            (kind, spec.partition(":")[0]) in self.claimants for kind, spec in combo.items()
        )
        needs = (not self.sliding_window or holds.sliding_window) and (
            not self.host_tier or holds.host_tier
        )
        return claimed and needs and (holds.checker or not self.checker_only)


SGLANG = engines.written_against("sglang").label

#: every known gap; remove an entry when the model and the conformance driver cover it
GAPS: tuple[Gap, ...] = (
    Gap(
        engine=SGLANG,
        claimants=frozenset({("admission", "sglang"), ("chunking", "sglang")}),
        sliding_window=True,
        host_tier=False,
        what=(
            "hybrid SWA storage in the checker: SGLang 0.5.23 keeps sliding-window KV in its "
            "radix tree, in whole pages, and evicts it node by node, whole cached leaves "
            "first; the checker's model keeps the same account per request, evicting a "
            "request's sliding-window KV whole and keeping a finished request's full KV "
            "where SGLang drops the leaf (docs/conformance.md, Known differences)"
        ),
        checker_only=True,
    ),
)


def approximations(combo: Combo | Mapping[str, str], holds: Holds) -> list[str]:
    """One line per gap between what ``combo`` claims and what it is shown to do on an input
    that ``holds`` describes; empty when the run is what it claims."""
    kinds = combo.as_dict() if isinstance(combo, Combo) else dict(combo)
    return [
        f"approximation: {gap.what}; this run is not shown to be {gap.engine}'s behaviour."
        for gap in GAPS
        if gap.applies(kinds, holds)
    ]


def approximation_lines(combos: Iterable[Combo | Mapping[str, str]], holds: Holds) -> list[str]:
    """:func:`approximations` over several combos, each line once (a bench of 36 combos with
    one gap says it once)."""
    out: dict[str, None] = {}
    for combo in combos:
        out.update(dict.fromkeys(approximations(combo, holds)))
    return list(out)


__all__ = ["GAPS", "Gap", "Holds", "approximation_lines", "approximations"]
