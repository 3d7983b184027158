"""SGLang 0.5.23 with hybrid SWA: a request on a sliding-window pool SGLang starts with, alone
on the node, that its own scheduler never finishes.

Run it with ``python -m policykit.findings.repro.sglang_swa host-hit`` (or ``window-lock``). The
decisions and the storage are SGLang's own classes, driven on a CPU by policykit's conformance
driver (:mod:`policykit.conformance.sglang.storage_driver`; docs/conformance.md says which
classes run and what is stubbed): ``SchedulePolicy`` and ``PrefillAdder`` decide each round,
``UnifiedRadixCache`` with its SWA component and HiCache's host tier hold the KV, and
``SWATokenToKVPoolAllocator`` hands out the slots. The model's forward pass is not run.

Window 512, page 64, a sliding-window pool of 640 tokens (SGLang refuses to start at 576 or
under: ``validate_swa_pool_size``), one request, nothing else on the node:

* ``host-hit``: A (576 tokens) whose first 512 are on the host (a HiCache hit), and C (64
  tokens) arriving in round 2. SGLang's ``PrefillAdder.add_one_req`` answers ``NO_TOKEN`` for A
  every round with the whole sliding-window pool free, and the ``fcfs`` queue never reaches C.
  ``--contrast``: the same A with no host copy is admitted and completes, and so does C.
* ``window-lock``: A (640 tokens, no cached prefix) is admitted and computes 576 tokens in two
  chunks; then all 576 of its sliding-window tokens stay protected, 64 (a page) stay free, and
  ``add_chunked_req`` defers its last chunk every round. ``--contrast``: with
  ``chunked_prefill_size`` 64 the same request completes.

What is printed is read from SGLang's objects: the ``AddReqResult`` each ``add_one_req``
returned, the chunk each round computes, the allocator's ``swa_available_size()``, the tree's
``swa_protected_size()`` and ``swa_evictable_size()``, and A's ``Req``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Any

#: rounds run after the last one in which anything changed, to show that nothing does
IDLE_ROUNDS = 5
WINDOW, PAGE, SWA_POOL = 512, 64, 640


@dataclass(frozen=True)
class Scenario:
    name: str
    prompt: int
    host_prefix: int
    chunk: int
    #: "starves" (never scheduled) or "stuck" (admitted, then no progress)
    failure: str
    what: str
    #: (id, prompt tokens, arrival round) of the requests that come after A, if any
    others: tuple[tuple[str, int, int], ...] = ()


_C = (("C", 64, 2),)
SCENARIOS = {
    "host-hit": Scenario(
        "host-hit", 576, 512, 4096, "starves", "A's first 512 tokens on the host", _C
    ),
    "window-lock": Scenario("window-lock", 640, 0, 4096, "stuck", "A with no cached prefix"),
}
CONTRASTS = {
    "host-hit": Scenario("host-hit", 576, 0, 4096, "starves", "the same A, no host copy", _C),
    "window-lock": Scenario("window-lock", 640, 0, 64, "stuck", "chunked_prefill_size 64"),
}


@dataclass
class Run:
    scenario: Scenario
    version: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)


def _scenario(sc: Scenario) -> Any:
    from policykit.scenario import parse_scenario

    request: dict[str, Any] = {"id": "A", "prompt_tokens": sc.prompt}
    if sc.host_prefix:
        request["host_prefix_tokens"] = sc.host_prefix
    others = [{"id": i, "prompt_tokens": n, "arrival_round": r} for i, n, r in sc.others]
    return parse_scenario(
        {
            "name": f"finding-{sc.name}",
            "page_size": PAGE,
            "chunked_prefill_size": sc.chunk,
            "sliding_window": WINDOW,
            "kv_release_rounds": 1,  # a finished request's KV goes back the next round
            "pool": {"free_tokens": 2048, "evictable_tokens": 0, "swa_free_tokens": SWA_POOL},
            "requests": [request, *others],
        },
        source=f"finding {sc.name}",
    )


def _sizes(driver: Any) -> dict[str, int]:
    """The sliding-window pool as SGLang's allocator and tree count it."""
    return {
        "swa_available_size": int(driver.allocator.swa_available_size()),
        "swa_evictable_size": int(driver.cache.swa_evictable_size()),
        "swa_protected_size": int(driver.cache.swa_protected_size()),
    }


def _request(driver: Any, rid: str) -> dict[str, Any]:
    """A request's ``Req`` as SGLang holds it, where the scheduler keeps it, and the
    sliding-window reservation SGLang's admission asks for it (``estimate_swa_kv_tokens``, the
    budget's own function, with its numbers: what is left to compute, one new token, its host
    hit)."""
    from sglang.srt.mem_cache.prefill_budget import estimate_swa_kv_tokens

    req = driver.reqs[rid]
    where = "chunked_req" if driver.chunked is req else driver.state[rid]
    done = type(req.finished_reason).__name__ if req.finished_reason is not None else None
    prompt = len(req.origin_input_ids)
    extend = prompt - int(req.prefix_len) - int(req.host_hit_length)
    reserve = estimate_swa_kv_tokens(
        extend,
        1,
        sliding_window_size=WINDOW,
        page_size=PAGE,
        host_hit_length=int(req.swa_host_hit_length),
    )
    return {
        "where": where,
        "finished_reason": done,
        "kv_committed_len": int(req.kv.kv_committed_len),
        "prompt_tokens": prompt,
        "host_hit_length": int(req.host_hit_length),
        "swa_host_hit_length": int(req.swa_host_hit_length),
        "swa_reservation": int(reserve),
        "size_swa": int(driver.allocator.size_swa),
    }


def reproduce(name: str, *, contrast: bool = False) -> Run:
    """Drive scenario ``name`` (or its contrast) through SGLang's scheduler and storage."""
    from policykit.conformance.sglang.driver import release
    from policykit.conformance.sglang.storage_driver import StorageDriver

    sc = (CONTRASTS if contrast else SCENARIOS)[name]
    seen: list[dict[str, int]] = []

    class Watching(StorageDriver):
        def _after_forward(self, plan: Any, round_no: int) -> None:
            super()._after_forward(plan, round_no)
            seen.append(_sizes(self))

    driver = Watching(_scenario(sc))
    upstream = driver.run(50, idle_rounds=IDLE_ROUNDS)
    run = Run(sc, release().installed)
    for number, (record, sizes) in enumerate(zip(upstream.rounds, seen, strict=True), 1):
        chunks = [(e.start, e.end, e.kind.value) for e in record.plan.entries]
        verdicts = [v for _, v in record.verdicts]
        run.steps.append({"round": number, "verdicts": verdicts, "chunks": chunks, **sizes})
    requests = {rid: _request(driver, rid) for rid in driver.ids}
    run.state = {"requests": requests, **_sizes(driver), "pending": upstream.pending}
    return run


def failed(run: Run) -> bool:
    """A never completes: nothing it computes in the last rounds, and it is still pending."""
    tail = run.steps[-IDLE_ROUNDS:]
    idle = len(run.steps) > IDLE_ROUNDS and all(
        all(end <= start for start, end, _ in s["chunks"]) for s in tail
    )
    computed = any(end > start for s in run.steps for start, end, _ in s["chunks"])
    expected = computed if run.scenario.failure == "stuck" else not computed
    return idle and "A" in run.state["pending"] and expected


def _chunk(start: int, end: int, kind: str) -> str:
    if end <= start:
        return f"nothing (add_chunked_req leaves A unscheduled at {start})"
    return f"[{start},{end}) {kind}"


def report(run: Run) -> list[str]:
    """The run as text, every figure read from SGLang's objects."""
    sc = run.scenario
    lines = [
        f"SGLang {run.version}: hybrid SWA, window {WINDOW}, page {PAGE}, sliding-window pool "
        f"{SWA_POOL} tokens, chunked_prefill_size {sc.chunk}; A {sc.prompt} tokens ({sc.what})"
    ]
    for s in run.steps:
        chunks = ", ".join(_chunk(*c) for c in s["chunks"]) or "nothing"
        verdicts = f"add_one_req -> {','.join(s['verdicts'])}; " if s["verdicts"] else ""
        lines.append(
            f"round {s['round']:>2}: {verdicts}computes {chunks}; swa available "
            f"{s['swa_available_size']}, protected {s['swa_protected_size']}, evictable "
            f"{s['swa_evictable_size']}"
        )
    lines.append(f"after round {len(run.steps)}:")
    for rid, r in run.state["requests"].items():
        lines.append(
            f"  {rid}: in {r['where']}, finished_reason {r['finished_reason']}, "
            f"kv_committed_len {r['kv_committed_len']}/{r['prompt_tokens']}, host_hit_length "
            f"{r['host_hit_length']}, swa_host_hit_length {r['swa_host_hit_length']}"
        )
    a = run.state["requests"]["A"]
    if sc.failure == "starves" and failed(run):
        lines.append(
            f"SGLang's estimate_swa_kv_tokens for A as it waits: {a['swa_reservation']} "
            f"tokens; the sliding-window pool (size_swa): {a['size_swa']}"
        )
    if not failed(run):
        lines.append("completes: A is not left waiting here.")
    elif sc.failure == "starves":
        lines.append(
            f"STARVED: A never computes a token, nothing behind it is looked at, and the last "
            f"{IDLE_ROUNDS} rounds change nothing."
        )
    else:
        lines.append(
            f"STUCK: A was admitted and computes nothing in the last {IDLE_ROUNDS} rounds."
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print the run; exit 1 when A is left waiting for good, 0 when it is not."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--contrast", action="store_true", help="Run the contrast instead.")
    args = parser.parse_args(argv)
    run = reproduce(args.scenario, contrast=args.contrast)
    print("\n".join(report(run)))
    return 1 if failed(run) else 0


if __name__ == "__main__":
    sys.exit(main())
