"""The deterministic outcomes of a run: what the scheduler decided, counted in rounds and tokens.

Everything here is a function of the plans alone, never of a clock, so two runs of the same
workload under the same combination report identical outcomes on any machine. They are what a
comparison should lead with; measured seconds (noisy on a shared CPU) and predicted seconds
(:mod:`policykit.harness.roofline`) come second.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from policykit.harness.metrics import deferred_requests, percentile
from policykit.request import Request
from policykit.scheduler import RunResult


def finish_rounds(result: RunResult) -> dict[str, int]:
    """Per request: the round whose chunk computed its last prompt token (its first token)."""
    out: dict[str, int] = {}
    for record in result.rounds:
        for entry in record.plan.batch:
            if entry.kind.finishes:
                out.setdefault(entry.request_id, record.plan.round)
    return out


def ttft_rounds(finished: Mapping[str, int], arrivals: Mapping[str, int]) -> list[int]:
    """Rounds from arrival to first token, counting both ends (finishing in the arrival round
    is one round). A request there from the start arrives in round 1."""
    return [done - max(arrivals[rid], 1) + 1 for rid, done in finished.items()]


def recomputed_tokens(result: RunResult, requests: Mapping[str, Request], page_size: int) -> int:
    """Prompt tokens computed although the same prefix had already been computed in this run.

    Counted per whole page: a page is identified by its tokens and everything before it, so
    two requests sharing a system prompt share page identities. Work on a page seen before is
    work a prefix cache could have saved (it was evicted, not yet published, or never cached).
    """
    page_ids: dict[tuple[int, Sequence[int]], int] = {}  #: (previous page, tokens) -> id
    seen: set[int] = set()
    chains: dict[str, list[int]] = {}
    recomputed = 0
    for record in result.rounds:
        for entry in record.plan.batch:
            tokens = requests[entry.request_id].tokens
            chain = chains.setdefault(entry.request_id, [])
            while len(chain) < len(tokens) // page_size:
                i = len(chain)
                key = (chain[-1] if chain else -1, tokens[i * page_size : (i + 1) * page_size])
                chain.append(page_ids.setdefault(key, len(page_ids)))
            first, last = -(-entry.start // page_size), entry.end // page_size
            for page in range(first, last):
                if chain[page] in seen:
                    recomputed += page_size
                seen.add(chain[page])
    return recomputed


def _pool_use(result: RunResult, pool_tokens: int) -> list[float]:
    """Share of the pool in use after each round; a crashed round counts as full."""
    crash = result.oom.round if result.oom is not None else None
    return [
        1.0 if r.plan.round == crash else (pool_tokens - r.free_tokens_after) / pool_tokens
        for r in result.rounds
    ]


def _quantiles(values: Sequence[float], *qs: int) -> dict[str, float | None]:
    return {f"p{q}": percentile(values, q) for q in qs}


def outcomes(
    result: RunResult,
    requests: Mapping[str, Request],
    arrivals: Mapping[str, int],
    *,
    pool_tokens: int,
    page_size: int,
    crash_round: int | None,
) -> dict[str, Any]:
    """The deterministic outcome block of a bench row."""
    completed = set(result.completed)
    finished = {rid: r for rid, r in finish_rounds(result).items() if rid in completed}
    ttft = ttft_rounds(finished, arrivals)
    use = _pool_use(result, pool_tokens)
    batches = [e for record in result.rounds for e in record.plan.batch]
    return {
        "rounds": len(result.rounds),
        "crash_round": crash_round,
        "requests": {
            "total": len(requests),
            "completed": len(result.completed),
            "rejected": len(result.rejected),
            "starved": len(result.starved),
            "failed": len(result.failed),
            "deferred": len(deferred_requests(result)),
            "pending": len(result.pending),
        },
        "completion_round": {
            **_quantiles(list(finished.values()), 50),
            "max": max(finished.values(), default=None),
        },
        "ttft_rounds": _quantiles(ttft, 50, 99),
        "computed_tokens": sum(e.tokens for e in batches),
        "recomputed_tokens": recomputed_tokens(result, requests, page_size),
        "load_back_tokens": sum(e.load_back for e in batches),
        "pool_use": {
            "peak": max(use, default=0.0),
            "mean": sum(use) / len(use) if use else 0.0,
            "by_round": use,
        },
    }
