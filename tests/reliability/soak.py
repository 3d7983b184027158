"""A long simulated run: arrivals, chunked prefills, load-backs, cache hits, releases and
evictions, round after round, checking that nothing leaks and memory stays flat.

Run directly for figures::

    python -m tests.reliability.soak --rounds 1000000
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import resource
import time
from dataclasses import asdict, dataclass, field

from policykit.config import EngineConfig
from policykit.errors import PrefillOutOfMemory
from policykit.node import PrefillNode
from policykit.plugin_manager import make_plugin_manager
from policykit.pool import TokenPool
from policykit.registry import PolicyRegistry
from policykit.request import Request, State
from policykit.scheduler import Scheduler

from .node_invariants import check_node

PAGE = 16
#: combos the soak rotates through: the ones meant never to run out of memory
SAFE_COMBOS = (
    "admission=reserve-tail,chunking=defer,alignment=page",
    "admission=reserve-tail,chunking=defer,alignment=checkpoint:64",
    "admission=no-evict,chunking=defer,alignment=page",
    "admission=reserve-tail,chunking=swa-reserve,alignment=truncation:48",
)
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """Resident set size now (``/proc/self/statm``), not the peak."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE_BYTES


@dataclass
class SoakReport:
    rounds: int
    seconds: float
    served: int = 0
    rejected: int = 0
    failed: int = 0
    ooms: int = 0
    leaked_pages: int = 0
    #: (round, rss bytes) every ``sample_every`` rounds
    rss: list[tuple[int, int]] = field(default_factory=list)
    peak_rss_bytes: int = 0

    @property
    def rounds_per_second(self) -> float:
        return self.rounds / self.seconds if self.seconds else 0.0

    def rss_growth(self, after_fraction: float = 0.25) -> int:
        """RSS at the end minus RSS once warmed up (``after_fraction`` into the run)."""
        warm = [b for r, b in self.rss if r >= self.rounds * after_fraction]
        return self.rss[-1][1] - warm[0] if warm else 0


class Workload:
    """Arrivals for a soak: prompt lengths, shared stems (device cache hits) and host-tier
    heads (load-backs), drawn from one seeded generator so a failure replays exactly."""

    def __init__(self, node: PrefillNode, seed: int) -> None:
        self.node, self.rng = node, random.Random(seed)
        self.ids = itertools.count()
        self.fresh = itertools.count(1 << 32)
        self.stems = [tuple(range(s << 20, (s << 20) + 512)) for s in range(4)]
        self.hosted = [tuple(range(h << 24, (h << 24) + 384)) for h in range(1, 4)]
        for head in self.hosted:
            node.host.put(head, 0)  # a fixed set: the host tier does not grow

    def arrivals(self, round_no: int) -> None:
        rng = self.rng
        for _ in range(rng.choice((0, 0, 1, 1, 1, 2))):
            shape = rng.random()
            if shape < 0.3:
                head = rng.choice(self.stems)[: rng.randrange(0, 512, PAGE)]
            elif shape < 0.45:
                head = rng.choice(self.hosted)
            else:
                head = ()
            own = rng.choice((1, 17, 100, 300, 700, 1500))
            if rng.random() < 0.002:
                own = 5000  # bigger than the pool: rejected on arrival
            tokens = head + tuple(itertools.islice(self.fresh, own))
            self.node.add(Request(f"s{next(self.ids)}", tokens, arrival_round=round_no))


def run_soak(rounds: int, *, seed: int = 0, sample_every: int = 1000, check_every: int = 5000):
    """Run ``rounds`` rounds, then drain; return a :class:`SoakReport`."""
    registry = PolicyRegistry.from_plugins(make_plugin_manager(entry_points=False))
    config = EngineConfig(page_size=PAGE, chunked_prefill_size=512, kv_release_rounds=2)
    node = PrefillNode(config, TokenPool(256 * PAGE, PAGE))
    combos = [registry.resolve(c, config=config) for c in SAFE_COMBOS]
    sched = Scheduler(node, combos[0], history=False)
    work = Workload(node, seed)
    report = SoakReport(rounds=rounds, seconds=0.0)
    start = time.perf_counter()
    for r in range(1, rounds + 1):
        work.arrivals(r)
        if r % 997 == 0:
            sched.use(combos[r // 997 % len(combos)])
        if r % 89 == 0:
            node.cache.evict(work.rng.randrange(PAGE, 64 * PAGE))
        _step(sched, report)
        if r % sample_every == 0:
            report.rss.append((r, rss_bytes()))
        if r % check_every == 0:
            check_node(node)
    while node.future or node.waiting or node.chunked or node.held:
        _step(sched, report)
    report.seconds = time.perf_counter() - start
    check_node(node)
    node.cache.evict(node.pool.total_tokens)
    report.leaked_pages = node.pool.num_pages - node.pool.free_pages
    report.peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return report


def _step(sched: Scheduler, report: SoakReport) -> None:
    """One round; finished requests are forgotten so the node's memory stays bounded."""
    node = sched.node
    try:
        record = sched.step()
    except PrefillOutOfMemory:
        report.ooms += 1
        raise
    for rid in record.released:
        del node.requests[rid]
        report.served += 1
    for rid in record.failed:
        del node.requests[rid]
        report.failed += 1
    for rej in record.plan.rejected:
        if node.requests[rej.request_id].state is State.REJECTED:
            del node.requests[rej.request_id]
            report.rejected += 1
    for rid in record.arrived:
        if node.requests[rid].state is State.REJECTED:
            del node.requests[rid]
            report.rejected += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    report = run_soak(args.rounds, seed=args.seed, sample_every=max(args.rounds // 100, 1))
    out = asdict(report)
    out["rounds_per_second"] = round(report.rounds_per_second)
    out["rss_growth_bytes"] = report.rss_growth()
    out["rss"] = out["rss"][:: max(len(out["rss"]) // 10, 1)]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
