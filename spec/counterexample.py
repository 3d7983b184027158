"""Counterexamples as data: read a z3 model back as rounds, minimise it, print it, export it.

A counterexample is only useful if a person can read it and a machine can replay it. So the
model is turned into the same per-round rows ``policykit simulate`` prints (the A/B/C
table), after :mod:`policykit.spec.shrink` made it small, and written as a scenario file
(``policykit.scenario``) that ``policykit simulate`` replays.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import z3
from rich.console import JustifyMethod
from rich.table import Table
from rich.text import Text

from policykit.fairness import OVERTAKING
from policykit.registry import Combo
from policykit.scenario import config_fields, parse_scenario
from policykit.spec.bmc import Unrolling
from policykit.spec.encoding import value
from policykit.spec.model import KIND_NAMES, NONE, PLACED


@dataclass(frozen=True)
class Row:
    request: str
    kind: str
    start: int
    end: int
    load_back: int
    rem_total: int | None
    cur_rem: int | None


@dataclass(frozen=True)
class TraceRound:
    round: int
    baseline: int
    released: tuple[str, ...]
    rows: tuple[Row, ...]
    need: int
    free_after: int
    oom: str | None  #: "full", "swa" or None
    owed_after: int


#: the failure ``policykit simulate`` must end in when it replays a counterexample, by property
#: (``oom`` with the pool, or ``never-completes``: an admitted request that can never finish)
REPLAYS_TO = {
    "no-oom": ("oom", "full"),
    "swa-no-oom": ("oom", "swa"),
    "admitted-completes": ("never-completes", None),
    "no-starvation": ("starves", None),
    "progress": ("never-completes", None),
    "contract": ("never-completes", None),
    OVERTAKING: ("overtaken", None),
}


@dataclass(frozen=True)
class Failure:
    """What broke when the real scheduler replayed the counterexample, in which round."""

    kind: str  #: "oom", "never-completes", "starves" or "overtaken"
    round: int
    request: str | None
    #: the pool that ran out ("full" / "swa"), or why the request can never complete
    #: ("memory", "stuck", "policy-error")
    detail: str
    message: str  #: the scheduler's own words

    @property
    def summary(self) -> str:
        """One sentence: what broke, in which round."""
        if self.kind == "oom":
            who = f" while placing {self.request}" if self.request else ""
            return f"Round {self.round}: the {self.detail} KV pool ran out of memory{who}."
        if self.kind == "overtaken":
            return (
                f"Round {self.round}: waiting request {self.request}, which an idle node would "
                f"admit, was passed over by {self.detail}."
            )
        if self.kind == "starves":
            return (
                f"Round {self.round}: waiting request {self.request} starves (an idle node "
                "would admit it, but the queue stops in front of it every round)."
            )
        why = {
            "memory": "it owes more KV than the node can ever free again",
            "stuck": "it was deferred with no memory ever coming back, and failed",
            "policy-error": "a policy broke its contract on it, and it failed",
            "stalled": "it was preempted and waits on a node where nothing can change any more",
            "livelock": "it is preempted and recomputed again and again",
        }.get(self.detail, self.detail)
        return f"Round {self.round}: admitted request {self.request} can never complete ({why})."

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "round": self.round,
            "request": self.request,
            "detail": self.detail,
            "message": self.message,
            "summary": self.summary,
        }


@dataclass(frozen=True)
class Counterexample:
    """A violating run: the scenario (as scenario JSON) and its rounds as the model sees them.

    ``failure`` is what the real scheduler did when it replayed ``scenario`` (the failure the
    property names), or None where the replay did not fail that way: such a counterexample is
    not exported (it would be a mismatch between the model and the scheduler)."""

    property: str
    round: int
    scenario: dict[str, Any]
    rounds: tuple[TraceRound, ...]
    failure: Failure | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "property": self.property,
            "round": self.round,
            "scenario": self.scenario,
            "failure": None if self.failure is None else self.failure.to_dict(),
            "rounds": [
                {
                    "round": r.round,
                    "baseline": r.baseline,
                    "released": list(r.released),
                    "entries": [row.__dict__ for row in r.rows],
                    "allocated": r.need,
                    "free_after": r.free_after,
                    "oom": r.oom,
                    "owed_after": r.owed_after,
                }
                for r in self.rounds
            ],
        }


def extract(
    u: Unrolling, model: z3.ModelRef, prop: str, depth: int, combo: Combo
) -> Counterexample:
    """Read the violating run of ``depth`` rounds out of ``model``."""
    inp = u.inputs
    names = [r.name for r in inp.requests]
    rounds = []
    for k, rt in enumerate(u.rounds[:depth], start=1):
        rows = []
        for name, e in zip(names, rt.entries, strict=True):
            kind = value(model, e.kind)
            if kind == NONE:
                continue
            placed = kind in PLACED
            rows.append(
                Row(
                    name,
                    KIND_NAMES[kind],
                    value(model, e.start),
                    value(model, e.end),
                    value(model, e.load_back),
                    value(model, e.rem_total) if placed else None,
                    value(model, e.cur_rem) if placed else None,
                )
            )
        oom = "full" if value(model, rt.oom_full) else "swa" if value(model, rt.oom_swa) else None
        rounds.append(
            TraceRound(
                k,
                value(model, rt.baseline),
                tuple(n for n, rel in zip(names, rt.released, strict=True) if value(model, rel)),
                tuple(rows),
                value(model, rt.need_full),
                value(model, rt.baseline_after),
                oom,
                value(model, rt.owed_after),
            )
        )
    scenario = scenario_of(u, lambda x: value(model, x), prop, depth, combo)
    return Counterexample(prop, depth, scenario, tuple(rounds))


def scenario_of(
    u: Unrolling, read: Callable[[Any], Any], prop: str, depth: int, combo: Combo
) -> dict[str, Any]:
    """The scenario file of the inputs, each input's value given by ``read`` (a z3 model's,
    or a shrunk candidate's)."""
    inp, cfg = u.inputs, u.config
    requests = []
    for r in inp.requests:
        item: dict[str, Any] = {"id": r.name, "prompt_tokens": read(r.prompt)}
        device, host = read(r.device), read(r.host)
        unpinned = read(r.unpinned) if inp.unpinned else 0
        if device:
            item["device_prefix_tokens"] = device
            item["device_prefix_pinned"] = True
        elif unpinned:
            item["device_prefix_tokens"] = unpinned  # unpinned: part of evictable_tokens
        if host:
            item["host_prefix_tokens"] = host
        arrival = read(r.arrival)
        if arrival > 1:
            item["arrival_round"] = arrival
        requests.append(item)
    pool: dict[str, Any] = {
        "free_tokens": read(inp.free),
        "evictable_tokens": read(inp.evictable),
    }
    if cfg.hybrid_swa:
        pool["swa_free_tokens"] = read(inp.swa_free)
    release = None if read(inp.release_never) else read(inp.release_rounds)
    scenario = {
        "name": f"counterexample-{prop}",
        "description": f"Found by policykit check: {prop} violated in round {depth} under {combo}.",
        **config_fields(dataclasses.replace(cfg, kv_release_rounds=release)),
        "pool": pool,
        "combo": combo.as_dict(),
        "requests": requests,
    }
    if u.overtaking is not None:
        scenario["overtaking_bound"] = u.overtaking
    parse_scenario(scenario, source="the exported counterexample")  # must be replayable
    return scenario


def replay(cx: Counterexample, combo: Combo, extra_rounds: int = 8) -> Counterexample:
    """Run ``cx``'s scenario through the real scheduler (as ``policykit simulate`` does) and
    record the failure its property names, if the run ends in it."""
    from policykit.scenario import build_node
    from policykit.scheduler import Scheduler

    sc = parse_scenario(cx.scenario, source="the counterexample")
    sched = Scheduler(build_node(sc), combo, overtaking_bound=sc.overtaking_bound)
    result = sched.run(max_rounds=cx.round + extra_rounds)
    kind, pool = REPLAYS_TO.get(cx.property, (None, None))
    failure = None
    if kind == "oom" and result.oom is not None and result.oom.pool == pool:
        oom = result.oom
        failure = Failure("oom", oom.round, oom.request, oom.pool, oom.message)
    elif kind == "never-completes" and result.never_completes is not None:
        nc = result.never_completes
        failure = Failure("never-completes", nc.round, nc.request, nc.cause, nc.message)
    elif kind == "starves" and result.starvation is not None:
        st = result.starvation
        failure = Failure("starves", st.round, st.request, "blocked", st.message)
    elif kind == "overtaken" and result.overtaken:
        o = next(iter(result.overtaken.values()))
        passed = f"{len(o.by)} later arrivals ({', '.join(o.by)}), more than {o.bound}"
        failure = Failure("overtaken", o.round, o.request, passed, o.message)
    return dataclasses.replace(cx, failure=failure)


def export_name(combo: str, prop: str) -> str:
    """The file ``--export-counterexample`` writes a counterexample to, in its folder: the
    combo with every separator as ``_`` (``+`` would print an older spelling of the combo)."""
    return f"{re.sub(r'[^A-Za-z0-9.-]+', '_', combo)}.{prop}.json"


def start_table(scenario: dict[str, Any]) -> Table:
    """The counterexample's starting state: the pool, the page, and each request's prompt,
    cached prefixes and arrival, as the exported scenario file has them."""
    pool = scenario["pool"]
    parts = [
        f"page {scenario['page_size']}",
        f"chunk {scenario['chunked_prefill_size']}",
        f"free {pool['free_tokens']}",
        f"evictable {pool['evictable_tokens']}",
    ]
    if "swa_free_tokens" in pool:
        # the window sits in the pool in counterexamples exported before it moved to the top
        window = scenario.get("sliding_window", pool.get("sliding_window"))
        parts.append(f"SWA free {pool['swa_free_tokens']} (window {window})")
    if scenario.get("max_prefill_tokens") is not None:
        parts.append(f"max_prefill_tokens {scenario['max_prefill_tokens']}")
    release = scenario.get("kv_release_rounds")
    parts.append("held KV never released" if release is None else f"KV released after {release}")
    table = Table(header_style="bold")
    table.caption = "Pool: " + ", ".join(parts)
    table.caption_justify = "left"
    for col in ("request", "prompt", "device\nprefix", "host\nprefix", "arrives\nround"):
        table.add_column(col, justify="left" if col == "request" else "right", no_wrap=True)
    for r in scenario["requests"]:
        device = r.get("device_prefix_tokens", 0)
        pinned = " pinned" if r.get("device_prefix_pinned") else ""
        table.add_row(
            r["id"],
            str(r["prompt_tokens"]),
            f"{device}{pinned}" if device else "",
            str(r.get("host_prefix_tokens", "") or ""),
            str(r.get("arrival_round", 1)),
        )
    return table


def trace_table(cx: dict[str, Any], title: str) -> Table:
    """The counterexample (as :meth:`Counterexample.to_dict` writes it) as rows per round,
    like ``policykit simulate`` prints a run."""
    table = Table(title=title, title_justify="left", header_style="bold")
    if cx.get("failure"):
        table.caption = f"Replayed by the scheduler: {cx['failure']['summary']}"
        table.caption_justify = "left"
    # two-line headers and unbroken cells: the table fits 80 columns without splitting words
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("round", "right"),
        ("request", "left"),
        ("chunk\n[start,end)", "right"),
        ("tokens", "right"),
        ("kind", "left"),
        ("load-\nback", "right"),
        ("rem_\ntotal", "right"),
        ("cur_\nrem", "right"),
        ("free\nafter", "right"),
    )
    for col, justify in columns:
        table.add_column(col, justify=justify, no_wrap=col != "request")
    for r in cx["rounds"]:
        oom = r["oom"]
        after: Text | str = Text(f"OOM ({oom})", style="bold red") if oom else str(r["free_after"])
        released = r["released"]
        lead = f"{r['round']}" + (f" (released {', '.join(released)})" if released else "")
        rows = r["entries"]
        if not rows:
            table.add_row(lead, Text("(nothing to do)", style="dim"), "", "", "", "", "", "", after)
        for i, row in enumerate(rows):
            computes = row["end"] > row["start"]
            table.add_row(
                lead if i == 0 else "",
                row["request"],
                f"[{row['start']},{row['end']})" if computes else "-",
                str(row["end"] - row["start"]) if computes else "",
                row["kind"],
                str(row["load_back"]) if row["load_back"] else "",
                "" if row["rem_total"] is None else str(row["rem_total"]),
                "" if row["cur_rem"] is None else str(row["cur_rem"]),
                after if i == len(rows) - 1 else "",
            )
        table.add_section()
    return table
