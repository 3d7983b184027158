"""What the CPU server check reads from a ``vllm serve`` run, and its verdicts.

Pure functions on text and dicts, apart from :mod:`.vllm_serve_check`, which starts the servers:
the lines the step log (:mod:`.vllm_serve_steplog`) and policykit's scheduler class leave in a
server's log, vLLM's Prometheus metrics, and the checks on the two runs. The step log imports
its constants from here, so neither this module nor the check's imports vLLM.
"""

from __future__ import annotations

import json
import statistics
from typing import Any

#: how many requests the step log's first step waits for (unset or 0: no wait)
REQUESTS_ENV = "POLICYKIT_SERVE_CHECK_REQUESTS"
#: the prefixes of the step log's two kinds of line
ARRIVED = "policykit serve-check arrived:"
STEP = "policykit serve-check step:"
#: what policykit's class runs with no combo configured
VLLM_COMBO = "vllm/vllm/none/default/fcfs/vllm"
ACTIVE = "policykit vLLM scheduler active with "
GUARD = "policykit vLLM scheduler shutting down with "
#: the policy kinds whose decisions the burst must have asked
ASKED = ("admission", "chunking", "preemption")
#: vLLM's preemption counter as Prometheus exposes it (a counter's name ends in _total)
PREEMPTIONS = "vllm:num_preemptions_total"


def parse_log(text: str) -> dict[str, Any]:
    """What the server's log says: the arrival order, each step, the active combo and the
    guard's counts (None where a line is missing)."""
    found: dict[str, Any] = {"arrivals": None, "steps": [], "combo": None, "guard": None}
    for line in text.splitlines():
        if STEP in line:
            found["steps"].append(json.loads(line.split(STEP, 1)[1]))
        elif ARRIVED in line:
            found["arrivals"] = json.loads(line.split(ARRIVED, 1)[1])
        elif ACTIVE in line:
            found["combo"] = line.split(ACTIVE, 1)[1].split(" ", 1)[0]
        elif GUARD in line:
            rest = line.split(GUARD, 1)[1]
            answered = rest.split(": answered ", 1)[1].split(", fallbacks ", 1)
            found["guard"] = {
                "answered": json.loads(answered[0]),
                "fallbacks": json.loads(answered[1]),
            }
    return found


def metric(text: str, name: str) -> float | None:
    """The sum of a Prometheus metric's samples (over its labels), or None if absent."""
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((name + "{", name + " "))
    ]
    return sum(values) if values else None


def checks(runs: dict[str, dict[str, Any]], lengths: list[int], max_tokens: int) -> dict[str, bool]:
    """The verdicts; each is False where a run failed before it could be judged."""
    ok = all("error" not in run for run in runs.values())
    vllm, policy = runs["vllm"], runs["policykit"]
    guard = policy.get("guard") or {}
    answered = guard.get("answered") or {}
    return {
        "all_completed": ok
        and all(
            len(run["burst"]) == len(lengths)
            and [r.get("prompt_tokens") for r in run["burst"]] == lengths
            and all(r.get("tokens") == max_tokens for r in run["burst"] + run["lone"])
            for run in runs.values()
        ),
        "arrived_in_order": ok and all(run["arrivals"] == lengths for run in runs.values()),
        "policykit_active": ok and policy["combo"] == VLLM_COMBO and vllm["combo"] is None,
        "guard_answered_no_fallbacks": ok
        and all(answered.get(kind, 0) > 0 for kind in ASKED)
        and guard.get("fallbacks") == {},
        "preempted": ok
        and all(
            (run["preemptions"] or 0) > 0 and any(s["preempted"] for s in run["steps"])
            for run in runs.values()
        ),
        "same_steps": ok and bool(vllm["steps"]) and vllm["steps"] == policy["steps"],
    }


def first_difference(a: list[Any], b: list[Any]) -> int | None:
    """The first step where two step logs differ (the shorter's length if one is a prefix)."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def summary(runs: dict[str, dict[str, Any]], verdicts: dict[str, bool]) -> list[str]:
    """The figures a person reads (and the docs quote), one line each."""
    lines = []
    for side, run in runs.items():
        if "error" in run:
            lines.append(f"{side}: {run['error']}")
            continue
        burst = [r["latency_s"] for r in run["burst"] if "latency_s" in r]
        lone = [r["latency_s"] for r in run["lone"] if "latency_s" in r]
        preempted = sum(len(s["preempted"]) for s in run["steps"])
        lines.append(
            f"{side}: vLLM {run['version']}, healthy after {run['startup_s']} s; "
            f"burst of {len(run['burst'])}: latency {min(burst, default=0)}-"
            f"{max(burst, default=0)} s; lone requests: "
            f"{statistics.median(lone) * 1000 if lone else 0:.0f} ms median; "
            f"{len(run['steps'])} steps, {preempted} preemptions in the step log, "
            f"{PREEMPTIONS} {run['preemptions']}"
        )
    policy = runs["policykit"]
    if "error" not in policy:
        lines.append(f"policykit: combo {policy['combo']}, guard {json.dumps(policy['guard'])}")
        if not verdicts["same_steps"]:
            step = first_difference(runs["vllm"].get("steps", []), policy["steps"])
            lines.append(f"the step logs first differ at step {step}")
    lines.extend(f"check {name}: {'ok' if held else 'FAILED'}" for name, held in verdicts.items())
    return lines
