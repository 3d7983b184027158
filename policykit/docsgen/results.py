"""Reading results files: one small adapter per kind (``check``, ``bench``).

The JSON written by ``policykit check --json`` and ``policykit bench --json`` is owned by those
commands and may still change; the generators never read it directly. Each adapter turns a
file into the plain records below, accepting the *provisional* shape documented on the
"Results files" page (``docs/results-format.md``). Reconciling a schema change means editing one
adapter, not the pages.
"""

from __future__ import annotations

import builtins
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeGuard

from policykit.config import current_keys
from policykit.docsgen.markdown import Provenance
from policykit.errors import ComboError, PolicykitError
from policykit.registry import DEFAULT_COMBO, parse_combo

VERDICTS = ("proved", "violated", "unknown", "refused")
_VERDICT_WORDS = {
    "proved": "proved",
    "proven": "proved",
    "safe": "proved",
    "violated": "violated",
    "counterexample": "violated",
    "unsafe": "violated",
    "unknown": "unknown",
    "timeout": "unknown",
    "refused": "refused",
}


class ResultsError(PolicykitError):
    """A results file is unreadable or does not have the shape its adapter expects."""


def combo_key(raw: Mapping[str, str] | str) -> str:
    """The canonical spelling of a combo: every kind, in :data:`KINDS` order, defaults filled."""
    mapping = parse_combo(raw) if isinstance(raw, str) else dict(raw)
    chosen = {**DEFAULT_COMBO, **mapping}
    return ",".join(f"{k}={chosen[k]}" for k in DEFAULT_COMBO)


def combo_parts(key: str) -> dict[str, str]:
    """``{kind: policy}`` of a combo key, every kind (the ones it leaves out at their defaults,
    as results written before a kind existed leave it out)."""
    return {**DEFAULT_COMBO, **parse_combo(key)}


@dataclass(frozen=True)
class VerdictRow:
    """One (combo, property) verdict of ``policykit check``."""

    combo: str
    property: str
    verdict: str  #: proved | violated | unknown | refused (the checker could not trust a policy)
    bound: int | None  #: rounds explored; ``None`` on a proof means unbounded (induction)
    seconds: float | None
    scenario: dict[str, Any] | None  #: the counterexample exported as a scenario file
    trace: tuple[dict[str, Any], ...]  #: the counterexample's rounds as the checker prints them
    note: str = ""  #: the checker's remark (why a proof is only bounded, why unknown or refused)
    failure: str = ""  #: what went wrong in the replay, in words (the counterexample's own)
    #: the trace's steps as given (a step may hold a list of entries), for the trace page
    steps: tuple[dict[str, Any], ...] = ()
    round: int | None = None  #: the round the property broke in
    #: the request the failure is about, where the counterexample names one
    request: str = ""
    #: a verdict that reached less than was asked, in words (``proved to round 2 of 4: ...``)
    shortfall: str = ""

    @builtins.property  # the field ``property`` above shadows the builtin in this body
    def unbounded(self) -> bool:
        return self.verdict == "proved" and self.bound is None


@dataclass(frozen=True)
class CheckResults:
    provenance: Provenance
    verdicts: tuple[VerdictRow, ...]
    source: Path
    #: the engine facts the verdicts hold under (page size, chunk size, SWA window, bounds)
    config: dict[str, Any] = field(default_factory=dict)
    kind = "check"


@dataclass(frozen=True)
class BenchRun:
    """One combination's row of ``policykit bench`` on one workload."""

    combo: str
    completed: int | None
    rejected: int | None
    pending: int | None
    crashed_at_round: int | None
    tokens_per_s: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    rounds: int | None
    peak_pool_use: float | None  #: fraction of the KV pool, 0..1
    scheduler_share: float | None  #: planning time / round time, 0..1
    mfu: float | None  #: model FLOPs utilisation, 0..1 (CUDA only)
    pool_use_by_round: tuple[float, ...]
    #: the scheduler's deterministic outcomes (rounds, tokens, pool use); empty in old files
    outcomes: dict[str, Any] = field(default_factory=dict)
    #: roofline-predicted figures per GPU name, and the model they price
    predicted: dict[str, Any] = field(default_factory=dict)
    #: measured times over repeats: ``{"repeats": n, metric: {median, min, max}}``
    wall: dict[str, Any] = field(default_factory=dict)

    @property
    def crashed(self) -> bool:
        return self.crashed_at_round is not None


@dataclass(frozen=True)
class BenchResults:
    provenance: Provenance
    workload: str
    runs: tuple[BenchRun, ...]
    source: Path
    kind = "bench"


@dataclass(frozen=True)
class TraceBenchResults:
    """``policykit bench`` on a production trace (``policykit.trace-bench/1``): per combo
    outcomes over the whole trace, groups of identical combos, the replay's settings."""

    provenance: Provenance
    trace: dict[str, Any]
    replay: dict[str, Any]
    rows: tuple[dict[str, Any], ...]
    groups: tuple[dict[str, Any], ...]
    coverage: dict[str, str]
    source: Path
    kind = "trace-bench"


@dataclass(frozen=True)
class TraceSweepResults:
    """A load sweep of one trace (``policykit.trace-sweep/1``): per load point and combo, how
    the replay ended."""

    provenance: Provenance
    trace: dict[str, Any]
    axis: str
    points: tuple[float, ...]
    #: combo -> one summary per point, in the order of ``points``
    combos: dict[str, tuple[dict[str, Any], ...]]
    source: Path
    kind = "trace-sweep"


Results = CheckResults | BenchResults | TraceBenchResults | TraceSweepResults


# --- field helpers ------------------------------------------------------------------------------
def _get(obj: Any, name: str) -> Any:
    """``obj["a"]["b"]`` for ``name == "a.b"``; ``None`` when any step is missing."""
    for part in name.split("."):
        if not isinstance(obj, Mapping) or part not in obj:
            return None
        obj = obj[part]
    return obj


def _pick(obj: Mapping[str, Any], *names: str) -> Any:
    """The first of ``names`` (dotted paths) that is present and not null."""
    for name in names:
        value = _get(obj, name)
        if value is not None:
            return value
    return None


def _number(obj: Mapping[str, Any], where: str, *names: str) -> float | None:
    value = _pick(obj, *names)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ResultsError(f"{where}: {names[0]!r} must be a number, got {value!r}.")
    return value


def _int(obj: Mapping[str, Any], where: str, *names: str) -> int | None:
    value = _number(obj, where, *names)
    if value is not None and value != int(value):
        raise ResultsError(f"{where}: {names[0]!r} must be a whole number, got {value!r}.")
    return None if value is None else int(value)


def _count(obj: Mapping[str, Any], where: str, *names: str) -> int | None:
    """A count given either as a number or as the list of request ids."""
    value = _pick(obj, *names)
    if isinstance(value, list):
        return len(value)
    return _int(obj, where, *names)


def _records(obj: Mapping[str, Any], where: str, *names: str) -> list[dict[str, Any]]:
    value = _pick(obj, *names)
    if not isinstance(value, list) or not all(isinstance(x, dict) for x in value):
        raise ResultsError(f"{where}: expected a list of objects under {names[0]!r}.")
    return value


def _combo(obj: Mapping[str, Any], where: str) -> str:
    """A combo given as ``policies`` / ``combo`` object, a ``--combo`` string, or the
    checker's short ``admission+chunking+alignment`` form."""
    raw = _pick(obj, "policies", "combo")
    if isinstance(raw, str) and "=" not in raw and raw.count("+") == 2:
        raw = dict(zip(("admission", "chunking", "alignment"), raw.split("+"), strict=True))
    if not isinstance(raw, dict | str):
        raise ResultsError(f"{where}: 'combo' must be an object or a KIND=POLICY string.")
    try:
        return combo_key(raw)
    except ComboError as exc:
        raise ResultsError(f"{where}: {exc}") from None


def _bound(item: Mapping[str, Any], where: str) -> int | None:
    """Rounds explored: a number, or text such as ``K=4,N=3`` / ``round 3``; ``None`` for
    ``unbounded`` (or no bound at all)."""
    bound = item.get("bound")
    if bound is None or bound == "unbounded" or item.get("unbounded") is True:
        return None
    if isinstance(bound, int) and not isinstance(bound, bool):
        return bound
    if not isinstance(bound, str):
        raise ResultsError(f"{where}: 'bound' must be a number of rounds or 'unbounded'.")
    found = re.search(r"\d+", bound)
    return None if found is None else int(found.group())  # "-": nothing was explored


def _trace_rows(steps: Any) -> tuple[dict[str, Any], ...]:
    """Flat table rows from a trace: a step holding a list of entries becomes one row per
    entry, the step's own fields on its first row."""
    rows: list[dict[str, Any]] = []
    for step in steps if isinstance(steps, list) else ():
        if not isinstance(step, dict):
            continue
        scalar = {k: v for k, v in step.items() if not isinstance(v, list) or not v}
        nested = next(
            (v for v in step.values() if isinstance(v, list) and v and isinstance(v[0], dict)),
            None,
        )
        if nested is None:
            rows.append(scalar)
            continue
        for i, entry in enumerate(nested):
            rows.append({**(scalar if i == 0 else {}), **entry})
    return tuple(rows)


def provenance_of(top: Mapping[str, Any], tool: str) -> Provenance:
    name = _pick(top, "device_name", "device.name")
    kind = _pick(top, "device.type") or (
        top["device"] if isinstance(top.get("device"), str) else None
    )
    if name and kind and str(kind) not in str(name):
        device = f"{name} ({kind})"
    else:
        device = name or kind or "an unrecorded device"
    model = _pick(top, "model.preset", "model")
    created = _pick(top, "created", "started", "date", "timestamp")
    executor = _pick(top, "executor.name", "executor")
    produced_by = f"`policykit {tool}`"
    if isinstance(executor, str):
        produced_by += f" on the {executor} executor"
    return Provenance(
        device=str(device),
        model=model if isinstance(model, str) else None,
        date=str(created) if created else "an unrecorded date",
        produced_by=produced_by,
    )


# --- adapters -----------------------------------------------------------------------------------
def _failure(value: Any) -> tuple[str, int | None]:
    """A counterexample's failure in words, and its round. The checker gives an object
    (``summary``, ``message``, ``kind``, ``round``); a plain string is taken as the words. An
    OOM's ``message`` is the engine's log line, which the replay shows anyway."""
    if isinstance(value, dict):
        words = [str(value.get("summary") or "").strip()]
        if value.get("kind") != "oom" and value.get("message"):
            words.append(str(value["message"]).strip())
        found = value.get("round")
        at = found if isinstance(found, int) and not isinstance(found, bool) else None
        return " ".join(w for w in words if w), at
    return ("" if value is None else str(value)), None


def _shortfall(item: Mapping[str, Any]) -> str:
    """How far short of the asked bounds a verdict fell, in the words ``check`` prints."""
    from policykit.spec.report import shortfall_words

    if not isinstance(item.get("shortfall"), str) or "verdict" not in item:
        return ""
    bounds = item.get("bounds")
    return shortfall_words({**item, "bounds": bounds if isinstance(bounds, dict) else {}})


def parse_check(top: Mapping[str, Any], path: Path) -> list[CheckResults]:
    where = path.name
    verdicts = []
    for i, item in enumerate(_records(top, where, "results", "verdicts", "checks")):
        at = f"{where}: result #{i + 1}"
        word = str(item.get("verdict", "")).lower()
        if word not in _VERDICT_WORDS:
            raise ResultsError(
                f"{at}: 'verdict' is {item.get('verdict')!r}; expected one of "
                f"{', '.join(VERDICTS)}."
            )
        trace = _pick(item, "trace.rounds", "trace", "counterexample.rounds")
        scenario = _pick(item, "scenario", "counterexample.scenario")
        told = _pick(item, "failure", "counterexample.failure")
        failure, failed_in = _failure(told)
        verdicts.append(
            VerdictRow(
                combo=_combo(item, at),
                property=str(_pick(item, "property", "invariant") or "?"),
                verdict=_VERDICT_WORDS[word],
                bound=_bound(item, at),
                seconds=_number(item, at, "seconds", "time_s"),
                scenario=scenario if isinstance(scenario, dict) else None,
                trace=_trace_rows(trace),
                note=str(item.get("note") or ""),
                failure=failure,
                steps=tuple(s for s in trace if isinstance(s, dict))
                if isinstance(trace, list)
                else (),
                round=_int(item, at, "round", "counterexample.round") or failed_in,
                shortfall=_shortfall(item),
                request=str(told.get("request") or "") if isinstance(told, dict) else "",
            )
        )
    config = found if isinstance(found := top.get("config"), dict) else {}
    config = current_keys(config)  # an older document's ``swa_window`` is ``sliding_window``
    return [CheckResults(provenance_of(top, "check"), tuple(verdicts), path, config)]


def _fractions(values: list[Any]) -> TypeGuard[list[float]]:
    """Whether every value is an int or a float (a bool is neither here)."""
    return all(isinstance(x, int | float) and not isinstance(x, bool) for x in values)


def _series(value: Any, at: str) -> tuple[float, ...]:
    """Pool use per round: fractions, or objects carrying the fraction as ``used``."""
    if value is None:
        return ()
    if isinstance(value, list):
        out = [v.get("used") if isinstance(v, dict) else v for v in value]
        if _fractions(out):
            return tuple(out)
    raise ResultsError(f"{at}: 'pool_use_by_round' must be a list of fractions.")


def _bench_run(item: Mapping[str, Any], at: str) -> BenchRun:
    m = {**item, **(item.get("metrics") or {})}
    return BenchRun(
        combo=_combo(item, at),
        completed=_count(m, at, "completed", "requests.completed"),
        rejected=_count(m, at, "rejected", "requests.rejected"),
        pending=_count(m, at, "pending", "requests.pending"),
        crashed_at_round=_int(m, at, "crashed_at_round", "crash_round", "crash.round"),
        tokens_per_s=_number(m, at, "tokens_per_s", "prompt_tokens_per_s"),
        ttft_p50_s=_number(m, at, "ttft_p50_s", "ttft_s.p50"),
        ttft_p99_s=_number(m, at, "ttft_p99_s", "ttft_s.p99"),
        rounds=_int(m, at, "rounds"),
        peak_pool_use=_number(
            m, at, "peak_pool_use", "peak_pool_utilisation", "peak_kv_utilisation"
        ),
        scheduler_share=_number(m, at, "scheduler_share", "planning_share"),
        mfu=_number(m, at, "mfu"),
        pool_use_by_round=_series(
            _pick(m, "pool_use_by_round", "outcomes.pool_use.by_round", "kv_utilisation"), at
        ),
        outcomes=_block(item, "outcomes", at),
        predicted=_block(item, "predicted", at),
        wall=_block(item, "wall", at),
    )


def _block(item: Mapping[str, Any], name: str, at: str) -> dict[str, Any]:
    """A nested object of a bench row, kept as is (the pages pick from it); ``{}`` if absent."""
    value = item.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ResultsError(f"{at}: {name!r} must be an object.")
    return value


def parse_bench(top: Mapping[str, Any], path: Path) -> list[BenchResults]:
    where = path.name
    workloads = top.get("workloads")
    blocks = workloads if isinstance(workloads, list) else [top]
    out = []
    for block in blocks:
        merged = {**top, **block}
        name = _pick(merged, "workload.name", "workload")
        if not isinstance(name, str):
            raise ResultsError(f"{where}: every bench block needs a 'workload' name.")
        runs = [
            _bench_run(item, f"{where}: workload {name!r} run #{i + 1}")
            for i, item in enumerate(_records(merged, where, "runs", "results", "combos"))
        ]
        out.append(BenchResults(provenance_of(merged, "bench"), name, tuple(runs), path))
    return out


def _object(top: Mapping[str, Any], name: str, where: str) -> dict[str, Any]:
    value = top.get(name)
    if not isinstance(value, dict):
        raise ResultsError(f"{where}: {name!r} must be an object.")
    return value


def parse_trace_bench(top: Mapping[str, Any], path: Path) -> list[TraceBenchResults]:
    where = path.name
    rows = _records(top, where, "combos")
    for i, row in enumerate(rows):
        for name in ("combo", "outcomes", "predicted"):
            if name not in row:
                raise ResultsError(f"{where}: combo row #{i + 1} has no {name!r}.")
    groups = top.get("groups")
    if not isinstance(groups, list):
        raise ResultsError(f"{where}: 'groups' must be a list.")
    trace = _object(top, "trace", where)
    provenance = provenance_of(top, "bench")
    replay = _object(top, "replay", where)
    clock = replay.get("clock") or {}
    provenance = Provenance(
        device=f"scheduler-level replay; time predicted for {clock.get('gpu', '?')}",
        model=clock.get("model"),
        date=provenance.date,
        produced_by=f"`policykit bench --workload {trace.get('name', '?')}`"
        + provenance.produced_by.removeprefix("`policykit bench`"),
    )
    coverage = found if isinstance(found := top.get("provenance"), dict) else {}
    return [
        TraceBenchResults(
            provenance, trace, replay, tuple(rows), tuple(groups), dict(coverage), path
        )
    ]


def parse_trace_sweep(top: Mapping[str, Any], path: Path) -> list[TraceSweepResults]:
    where = path.name
    points = top.get("points")
    combos = top.get("combos")
    if not isinstance(points, list) or not all(isinstance(p, int | float) for p in points):
        raise ResultsError(f"{where}: 'points' must be a list of numbers.")
    if not isinstance(combos, dict) or not all(
        isinstance(v, list) and len(v) == len(points) for v in combos.values()
    ):
        raise ResultsError(f"{where}: 'combos' must map each combo to one result per point.")
    base = provenance_of(top, "docs")
    provenance = Provenance(
        device="scheduler-level replay (predicted time, no model forward)",
        model=_pick(top, "replay.clock.model"),
        date=base.date,
        produced_by="`policykit docs` (load sweep through the executor)",
    )
    return [
        TraceSweepResults(
            provenance,
            _object(top, "trace", where),
            str(top.get("axis", "time_scale")),
            tuple(float(p) for p in points),
            {str(k): tuple(v) for k, v in combos.items()},
            path,
        )
    ]


ADAPTERS: dict[str, Callable[[Mapping[str, Any], Path], list[Any]]] = {
    "check": parse_check,
    "bench": parse_bench,
    "trace-bench": parse_trace_bench,
    "trace-sweep": parse_trace_sweep,
}


def kind_of(top: Mapping[str, Any], path: Path) -> str:
    kind = top.get("kind")
    schema = top.get("schema")
    if kind is None and isinstance(schema, str) and schema.startswith("policykit."):
        kind = schema.removeprefix("policykit.").split("/")[0]
    if kind is None:
        kind = "check" if "verdicts" in top else "bench" if "workload" in top else None
    if kind not in ADAPTERS:
        raise ResultsError(
            f'{path.name}: cannot tell which command wrote it; give it a "kind" of '
            f"{' or '.join(map(repr, ADAPTERS))} (see the Results files page of the docs)."
        )
    return str(kind)


def load_results_file(path: Path) -> list[Results]:
    try:
        top = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ResultsError(f"Cannot read the results file {str(path)!r}: {exc.strerror}.") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResultsError(f"The results file {str(path)!r} is not JSON: {exc}.") from None
    if not isinstance(top, dict):
        raise ResultsError(f"The results file {str(path)!r} must hold one JSON object.")
    return ADAPTERS[kind_of(top, path)](top, path)


def load_results_dir(folder: Path) -> list[Results]:
    """Every ``*.json`` file in ``folder`` (not recursive), in name order."""
    if not folder.is_dir():
        raise ResultsError(f"The results folder {str(folder)!r} does not exist.")
    out: list[Results] = []
    for path in sorted(folder.glob("*.json")):
        out.extend(load_results_file(path))
    return out


def now_utc() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
