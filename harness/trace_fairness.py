"""Who waited on a trace replay: TTFT by prompt-size class, the longest wait, preemptions.

A replay's outcomes (:class:`~policykit.harness.trace_replay.TraceTally`) say how the node did
on the whole; a policy that serves the many short prompts fast and leaves a long one waiting
looks good there. Issue 33 asks what the long and short prompts each got: TTFT p50, p99 and
max per prompt-size class, the longest any request waited without a chunk, how often requests
were preempted and what that made the node compute again, and how many completed. Counted
round by round from the round records either node writes (SGLang's ledger node and vLLM's
node that preempts), on the replay's predicted clock, so the figures are deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from policykit.harness.metrics import percentile
from policykit.scheduler import RoundRecord

#: prompt-size classes: (name, smallest prompt, largest prompt or None), in tokens
SIZE_CLASSES: tuple[tuple[str, int, int | None], ...] = (
    ("<1k", 0, 1023),
    ("1k-8k", 1024, 8192),
    (">8k", 8193, None),
)


def size_class(prompt_tokens: int) -> str:
    """The class of a prompt of ``prompt_tokens`` tokens (:data:`SIZE_CLASSES`)."""
    for name, low, high in SIZE_CLASSES:
        if prompt_tokens >= low and (high is None or prompt_tokens <= high):
            return name
    raise ValueError(f"a prompt of {prompt_tokens} tokens fits no size class")


@dataclass
class _Waiting:
    """One request's clock: when it arrived, when it last had a chunk (or arrived), how far it
    has computed, and its longest stretch without a chunk so far."""

    prompt: int
    arrival_round: int
    arrival_s: float
    since_round: int
    since_s: float
    reached: int = 0
    longest_rounds: int = 0
    longest_s: float = 0.0
    ttft_s: float | None = None
    ttft_rounds: int | None = None


@dataclass
class FairnessTally:
    """Per-request waits and TTFT, counted as the replay's rounds go by."""

    requests: dict[str, _Waiting] = field(default_factory=dict)
    preemptions: int = 0
    preempted: dict[str, int] = field(default_factory=dict)
    #: tokens a request computed again at positions it had computed before (after a
    #: preemption, less what its surviving cached blocks saved)
    recomputed_after_preemption: int = 0

    def arrived(self, rid: str, prompt_tokens: int, round_no: int, now: float) -> None:
        self.requests[rid] = _Waiting(prompt_tokens, round_no, now, round_no, now)

    def count(self, record: RoundRecord, start_s: float, end_s: float) -> None:
        """Round ``record`` ran from ``start_s`` to ``end_s`` on the replay's clock."""
        r = record.plan.round
        for entry in record.plan.batch:
            w = self.requests[entry.request_id]
            self._waited(w, r - w.since_round, start_s - w.since_s)
            w.since_round, w.since_s = r + 1, end_s
            self.recomputed_after_preemption += max(0, min(entry.end, w.reached) - entry.start)
            w.reached = max(w.reached, entry.end)
            if entry.kind.finishes:
                w.ttft_s, w.ttft_rounds = end_s - w.arrival_s, r - w.arrival_round + 1

    def preempt(self, victims: list[str]) -> None:
        self.preemptions += len(victims)
        for rid in victims:
            self.preempted[rid] = self.preempted.get(rid, 0) + 1

    @staticmethod
    def _waited(w: _Waiting, rounds: int, seconds: float) -> None:
        w.longest_rounds = max(w.longest_rounds, rounds)
        w.longest_s = max(w.longest_s, seconds)

    def summary(self, end_round: int, end_s: float) -> dict[str, Any]:
        """The ``fairness`` block of a row; a request still unfinished at the end (``end_round``
        rounds, ``end_s`` seconds) has waited until then. ``max_wait`` names the request that
        waited longest in seconds; its ``rounds`` is the longest wait in rounds of any request
        (a round's length varies, so the two may be different requests)."""
        for w in self.requests.values():
            if w.ttft_s is None:
                self._waited(w, end_round - w.since_round + 1, end_s - w.since_s)
        longest = max(self.requests.items(), key=lambda kv: kv[1].longest_s, default=None)
        return {
            "size_classes": {name: _class_row(self._of(name)) for name, _, _ in SIZE_CLASSES},
            "max_wait": None
            if longest is None
            else {
                "seconds": longest[1].longest_s,
                "rounds": max(w.longest_rounds for w in self.requests.values()),
                "request": longest[0],
            },
            "preemptions": self.preemptions,
            "preempted_requests": len(self.preempted),
            "max_preemptions_of_one_request": max(self.preempted.values(), default=0),
            "recomputed_after_preemption_tokens": self.recomputed_after_preemption,
        }

    def starved(self, bound: int) -> dict[str, int]:
        """Requests whose longest stretch without a chunk was more than ``bound`` rounds (after
        :meth:`summary`, which counts the unfinished ones to the end), with that stretch."""
        return {
            rid: w.longest_rounds for rid, w in self.requests.items() if w.longest_rounds > bound
        }

    def _of(self, name: str) -> list[_Waiting]:
        return [w for w in self.requests.values() if size_class(w.prompt) == name]


def _class_row(ws: list[_Waiting]) -> dict[str, Any]:
    """One size class: how many arrived and completed, TTFT p50/p99/max (seconds and rounds)
    over those that completed, and the longest wait of any of them."""
    ttft_s = [w.ttft_s for w in ws if w.ttft_s is not None]
    ttft_rounds = [float(w.ttft_rounds) for w in ws if w.ttft_rounds is not None]
    return {
        "requests": len(ws),
        "completed": len(ttft_s),
        "ttft_s": _stats(ttft_s),
        "ttft_rounds": _stats(ttft_rounds),
        "max_wait_s": max((w.longest_s for w in ws), default=None),
    }


def _stats(values: list[float]) -> dict[str, float | None]:
    return {
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": max(values, default=None),
    }
