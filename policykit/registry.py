"""The policy registry: every policy the plugins registered, and combos resolved against it.

A *combo* is one policy per kind. The tool prints a combo one way only, positionally
(:func:`format_combo`): ``reserve-tail/sglang/checkpoint:256`` is admission/chunking/alignment,
with a fourth part (the allocator phase), a fifth (the waiting queue) and a sixth (preemption)
only as far as one is not the default. ``--combo`` accepts that
form back, the explicit ``admission=reserve-tail,alignment=checkpoint:256`` form (kinds left
out keep the defaults in :data:`DEFAULT_COMBO`, or a scenario's own choice), and the older
printed spellings ``sglang+sglang+page`` and ``sglang · sglang · page`` (:func:`parse_combo`).

The default queue is ``fcfs``, what SGLang 0.5.23 runs (``--schedule-policy fcfs``): a combo
printed in three parts is then one an engine can run as printed, and ``policykit check`` and
``policykit sglang-plugin --check`` answer the same for it. policykit's ``fcfs-skip`` extension
(reject a request that can never fit) is a verdict-changing choice, so it is always printed
(``reserve-tail/sglang/page/default/fcfs-skip``). Versions before this one defaulted to
``fcfs-skip``: a three-part combo they printed still parses, but now means the ``fcfs`` queue.

The default preemption is ``none``: the node never preempts, as SGLang's, and its combo is
printed as before. A combo whose preemption policy preempts (``vllm``) runs on a node that
preempts (vLLM 0.33.0's v1 scheduler, :mod:`policykit.preempting`) and is always printed in six
parts (``vllm/vllm/none/default/fcfs/vllm``). Combos printed before the preemption kind existed
have at most five parts and parse as before, with no preemption.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar, cast

from policykit.config import EngineConfig
from policykit.errors import ComboError, PluginError, UnfitPolicyError, quote
from policykit.plugin_manager import PluginSource, PolicykitPluginManager
from policykit.policy import (
    DECISION_KINDS,
    KINDS,
    POLICY_BASES,
    AdmissionPolicy,
    AlignmentPolicy,
    AllocatorPhasePolicy,
    ChunkingPolicy,
    Policy,
    PreemptionPolicy,
    QueuePolicy,
    defined_at,
    incomplete,
)

_P = TypeVar("_P", bound=Policy)

DEFAULT_COMBO: dict[str, str] = {
    "admission": "reserve-tail",
    "chunking": "sglang",
    "alignment": "page",
    "allocator-phase": "default",
    "queue": "fcfs",
    "preemption": "none",
}

#: the kinds whose choice can change a ``policykit check`` verdict, so the kinds ``--all``
#: enumerates; the allocator phase only picks when torch's allocator switches modes, which the
#: checker's token-level model does not see
VERDICT_KINDS: tuple[str, ...] = ("admission", "chunking", "alignment", "queue")

#: the printed form, for help texts and table headers
COMBO_FORM = "ADMISSION/CHUNKING/ALIGNMENT[/ALLOCATOR-PHASE[/QUEUE[/PREEMPTION]]]"

#: parameter values ``--all`` tries for policies that require one
SAMPLE_ARGS: dict[tuple[str, str], tuple[str, ...]] = {
    ("alignment", "checkpoint"): ("256",),
    ("alignment", "truncation"): ("192",),
}


@dataclass(frozen=True)
class PolicyEntry:
    """A registered policy class and the plugin that registered it."""

    cls: type[Policy]
    source: PluginSource

    @property
    def kind(self) -> str:
        return self.cls.kind

    @property
    def name(self) -> str:
        return self.cls.name

    @property
    def doc(self) -> str:
        return inspect.cleandoc(self.cls.__doc__ or "")

    @property
    def summary(self) -> str:
        return self.doc.split("\n\n")[0].replace("\n", " ")


@dataclass(frozen=True)
class Combo:
    """One policy of each kind."""

    admission: AdmissionPolicy
    chunking: ChunkingPolicy
    alignment: AlignmentPolicy
    allocator_phase: AllocatorPhasePolicy
    queue: QueuePolicy
    preemption: PreemptionPolicy

    @property
    def preempts(self) -> bool:
        """Whether the node this combo runs on preempts (vLLM's) rather than never does."""
        return bool(getattr(self.preemption, "preempts", False))

    def as_dict(self) -> dict[str, str]:
        return {p.kind: p.spec for p in self.policies()}

    def policies(self) -> tuple[Policy, ...]:
        return (
            self.admission,
            self.chunking,
            self.alignment,
            self.allocator_phase,
            self.queue,
            self.preemption,
        )

    def __str__(self) -> str:
        return format_combo(self.as_dict())


#: the separator of the printed form; the others are older printed spellings, still accepted
COMBO_SEPARATOR = "/"
_POSITIONAL_SPLIT = re.compile(r"\s*(?:/|\+|·)\s*")
#: characters a policy name may not contain, so that every printed combo parses back
NAME_FORBIDDEN = ",=:/+· \t"


def format_combo(combo: Mapping[str, str]) -> str:
    """The one printed form of a combo:
    ``admission/chunking/alignment[/allocator-phase[/queue[/preemption]]]``.

    Kinds missing from ``combo`` are the defaults. The trailing kinds are printed only as far as
    one differs from its default (most combos leave the allocator phase and the queue alone):
    a non-default queue brings the allocator phase with it, and a preemption policy both, so
    the parts keep their places.
    """
    chosen = {**DEFAULT_COMBO, **combo}
    parts = [chosen[k] for k in KINDS]
    while len(parts) > 3 and parts[-1] == DEFAULT_COMBO[KINDS[len(parts) - 1]]:
        parts.pop()
    return COMBO_SEPARATOR.join(parts)


def parse_combo(text: str) -> dict[str, str]:
    """A ``--combo`` string as ``{kind: policy}``.

    ``"admission=x,alignment=checkpoint:256"`` gives just the kinds it names; the positional
    form ``"x/sglang/checkpoint:256"`` (or with ``+`` or `` · `` between the parts, as older
    versions printed it) names every kind, the allocator phase being the default when there
    are three parts.
    """
    if "=" not in text and _POSITIONAL_SPLIT.search(text.strip()):
        return _parse_positional(text.strip())
    out: dict[str, str] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        kind, sep, spec = part.partition("=")
        kind, spec = kind.strip(), spec.strip()
        if not sep or not spec:
            raise ComboError(
                f"The combo part {quote(part)} is not of the form KIND=POLICY; write for example "
                "admission=reserve-tail,chunking=sglang,alignment=checkpoint:256, or the short "
                "form reserve-tail/sglang/checkpoint:256."
            )
        if kind not in KINDS:
            raise ComboError(
                f"The combo names the kind {quote(kind)}, which does not exist; the kinds are "
                f"{', '.join(KINDS)}."
            )
        if kind in out:
            raise ComboError(f"The combo gives the kind {quote(kind)} twice.")
        out[kind] = spec
    return out


def _parse_positional(text: str) -> dict[str, str]:
    parts = _POSITIONAL_SPLIT.split(text)
    if not 3 <= len(parts) <= len(KINDS) or not all(parts):
        raise ComboError(
            f"The combo {quote(text)} has {len(parts)} part(s); the short form is "
            f"{COMBO_FORM}, for example "
            "reserve-tail/sglang/checkpoint:256 (or write admission=reserve-tail,...)."
        )
    defaults = [DEFAULT_COMBO[k] for k in KINDS[len(parts) :]]
    return dict(zip(KINDS, [*parts, *defaults], strict=True))


class PolicyRegistry:
    """Policies by kind and name, collected once from a plugin manager."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], PolicyEntry] = {}

    @classmethod
    def from_plugins(cls, pm: PolicykitPluginManager) -> PolicyRegistry:
        registry = cls()
        for impl in pm.hook.policykit_register_policies.get_hookimpls():
            source = pm.source_of(impl.plugin)

            def register(policy_cls: object, _source: PluginSource = source) -> None:
                registry.add(policy_cls, _source)

            try:
                impl.function(register=register)
            except PluginError:
                raise
            except Exception as exc:
                raise PluginError(
                    f"The plugin {source.plugin_name!r} ({source}) raised while registering "
                    f"its policies: {type(exc).__name__}: {exc}"
                ) from exc
        return registry

    def add(self, policy_cls: object, source: PluginSource) -> None:
        """Validate and record one registered class; complain naming the plugin."""
        where = f"The plugin {source.plugin_name!r} ({source})"
        if not (isinstance(policy_cls, type) and issubclass(policy_cls, Policy)):
            raise PluginError(
                f"{where} registered {policy_cls!r}, which is not a policy class (a subclass "
                "of AdmissionPolicy, ChunkingPolicy, AlignmentPolicy, AllocatorPhasePolicy, "
                "QueuePolicy or PreemptionPolicy)."
            )
        kind = getattr(policy_cls, "kind", None)
        name = getattr(policy_cls, "name", None)
        if kind not in POLICY_BASES or not issubclass(policy_cls, POLICY_BASES[kind]):
            raise PluginError(f"{where} registered {policy_cls.__name__} with no valid kind.")
        if not isinstance(name, str) or not name or any(c in name for c in NAME_FORBIDDEN):
            raise PluginError(
                f"{where} registered {policy_cls.__name__} with the name {quote(name)}; a policy "
                "name is a non-empty string without spaces, commas, '=', ':', '/', '+' or '·' "
                "(they separate the parts of a combo)."
            )
        key = (kind, name)
        if key in self._entries:
            other = self._entries[key].source
            raise PluginError(
                f"{where} registered the {kind} policy {quote(name)}, which {other.plugin_name!r} "
                f"({other}) already registered."
            )
        if (reason := incomplete(policy_cls)) is not None:
            raise PluginError(f"{where} registered a policy that cannot decide: {reason}")
        self._entries[key] = PolicyEntry(policy_cls, source)

    # -- queries ---------------------------------------------------------------------------
    def entries(self, kind: str | None = None) -> list[PolicyEntry]:
        return [e for (k, _), e in self._entries.items() if kind is None or k == kind]

    def sources(self, combo: Combo) -> dict[str, str]:
        """Where each deciding policy of ``combo`` comes from, for error messages."""
        return {k: str(self.entry(k, getattr(combo, k).name).source) for k in DECISION_KINDS}

    def entry(self, kind: str, name: str) -> PolicyEntry:
        try:
            return self._entries[(kind, name)]
        except KeyError:
            known = ", ".join(e.name for e in self.entries(kind)) or "none"
            raise ComboError(
                f"There is no {kind} policy named {quote(name)}. Registered {kind} policies: "
                f"{known}. Run `policykit policies` to see them all."
            ) from None

    def make(self, kind: str, spec: str, config: EngineConfig | None = None) -> Policy:
        """Instantiate ``name[:arg]`` of ``kind``, parsing and validating the argument."""
        name, sep, raw = spec.partition(":")
        entry = self.entry(kind, name.strip())
        param = entry.cls.parameter
        if param is None:
            if sep:
                raise ComboError(
                    f"The {kind} policy {quote(name)} takes no parameter, got {quote(spec)}."
                )
            arg = None
        elif not sep:
            if param.required:
                raise ComboError(
                    f"The {kind} policy {quote(name)} needs a parameter: write "
                    f"{name}:<{param.name}> ({param.doc})."
                )
            arg = param.default
        else:
            try:
                arg = param.parse(raw.strip())
            except (TypeError, ValueError):
                raise ComboError(
                    f"The parameter of {kind} policy {quote(name)} must be {param.doc}; got "
                    f"{quote(raw)}."
                ) from None
        try:
            policy = entry.cls(arg)
        except Exception as exc:
            raise UnfitPolicyError(
                f"{_who(kind, spec, entry, entry.cls.__init__)} could not create it: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        policy.source = str(entry.source)
        if config is not None:
            try:
                policy.validate(config)
            except ValueError as exc:
                raise UnfitPolicyError(
                    f"The {kind} policy {quote(spec)} ({entry.source}) cannot run here: {exc}."
                ) from None
            except Exception as exc:  # a broken validate: that combo's row, not the list's end
                raise UnfitPolicyError(
                    f"{_who(kind, spec, entry, policy.validate)} raised {type(exc).__name__}: "
                    f"{exc} (a policy refuses a configuration with ValueError)."
                ) from None
        return policy

    def resolve(
        self, *layers: Mapping[str, str] | str | None, config: EngineConfig | None = None
    ) -> Combo:
        """A combo from defaults overlaid by each layer in turn (later layers win)."""
        chosen = dict(DEFAULT_COMBO)
        for layer in layers:
            if layer is None:
                continue
            mapping = parse_combo(layer) if isinstance(layer, str) else dict(layer)
            for kind in mapping:
                if kind not in KINDS:
                    raise ComboError(f"The combo names the unknown kind {quote(kind)}.")
            chosen.update(mapping)
        made = {kind: self.make(kind, spec, config) for kind, spec in chosen.items()}
        combo = Combo(
            admission=of_kind(made["admission"], AdmissionPolicy),
            chunking=of_kind(made["chunking"], ChunkingPolicy),
            alignment=of_kind(made["alignment"], AlignmentPolicy),
            allocator_phase=of_kind(made["allocator-phase"], AllocatorPhasePolicy),
            queue=of_kind(made["queue"], QueuePolicy),
            preemption=of_kind(made["preemption"], PreemptionPolicy),
        )
        refuse_mixed(combo)
        return combo

    def all_combos(
        self, config: EngineConfig | None = None, *, kinds: tuple[str, ...] = VERDICT_KINDS
    ) -> Iterator[Combo]:
        """Every registered combination of ``kinds`` (others at their defaults), skipping those
        a policy declares unsupported on ``config`` through ``validate`` (``sglang-pre-swa-fix``
        without a sliding window, say: it is ``sglang`` there) and policies that are not
        ``enumerated``."""
        choices = []
        for kind in kinds:
            specs = []
            for e in self.entries(kind):
                if not e.cls.enumerated:
                    continue
                param = e.cls.parameter
                if param is None or not param.required:
                    specs.append(e.name)
                else:
                    declared: tuple[str, ...] = getattr(e.cls, "samples", ())
                    samples = SAMPLE_ARGS.get((kind, e.name)) or declared
                    specs.extend(f"{e.name}:{s}" for s in samples)
            choices.append(specs)
        for picked in itertools.product(*choices):
            try:
                yield self.resolve(dict(zip(kinds, picked, strict=True)), config=config)
            except ComboError:
                continue


def of_kind(policy: Policy, base: type[_P]) -> _P:
    """``policy`` typed as its kind's base class: :meth:`PolicyRegistry.add` records a class only
    when it subclasses ``POLICY_BASES[kind]``, so :meth:`PolicyRegistry.make` of a kind returns
    that base's instance. A cast, not a check: nothing is asked at run time."""
    return cast(_P, policy)


def _who(kind: str, spec: str, entry: PolicyEntry, method: Callable[..., object]) -> str:
    """The policy, its distribution, its module and where ``method`` is defined: a policy that
    fails while it is being made sends its author to their own line, not to this file."""
    return (
        f"The {kind} policy {quote(spec)} ({entry.source}), module {entry.cls.__module__}, "
        f"{method.__name__}() at {defined_at(method)},"
    )


def refuse_mixed(combo: Combo) -> None:
    """Raise :class:`ComboError` for policies that cannot decide on the node ``combo`` runs on.

    A combo whose preemption policy preempts runs on vLLM's kind of node; one that never
    preempts on SGLang's ledger planner. Most policies decide on either (their views are
    filled by both), but not all."""
    if not combo.preempts:
        for policy in combo.policies():
            if policy.preempting_only:
                raise ComboError(
                    f"The {policy.kind} policy {quote(policy.spec)} decides on facts that only "
                    "a node that preempts has (vLLM's block pool and its count of running and "
                    f"waiting requests), but the preemption policy "
                    f"{quote(combo.preemption.spec)} never preempts, so the combo would run on "
                    "SGLang's ledger planner, which has neither. Give the combo a preemption "
                    "policy that preempts (sixth part, for example vllm), or pick a policy of "
                    "that kind that does not need one."
                )
        return
    if getattr(combo.queue, "skips_never_fitting", False):
        raise ComboError(
            f"The queue policy {quote(combo.queue.spec)} rejects a request that an idle node "
            "could never admit, a question SGLang's ledger planner answers; a node that "
            f"preempts (preemption {quote(combo.preemption.spec)}) has no such test, and vLLM "
            "keeps such a request waiting at the head of its queue. Use the fcfs or lpm "
            "queue with a preempting combo."
        )


def registry_from(pm: PolicykitPluginManager | None = None) -> PolicyRegistry:
    """Registry of ``pm`` (or of a fresh manager with every installed plugin)."""
    from policykit.plugin_manager import make_plugin_manager

    return PolicyRegistry.from_plugins(pm or make_plugin_manager())


@functools.cache
def builtin_registry() -> PolicyRegistry:
    """The built-in policies only (no entry points), built once: what a comparison against an
    engine's own code resolves its combos from, so no installed plugin can change it."""
    from policykit.plugin_manager import make_plugin_manager

    return PolicyRegistry.from_plugins(make_plugin_manager(entry_points=False))


__all__ = [
    "COMBO_FORM",
    "COMBO_SEPARATOR",
    "DEFAULT_COMBO",
    "VERDICT_KINDS",
    "Combo",
    "PolicyEntry",
    "PolicyRegistry",
    "builtin_registry",
    "format_combo",
    "parse_combo",
    "refuse_mixed",
    "registry_from",
]
