"""Scenarios of N requests for measuring how the scheduler's cost grows with the work.

The shape of issue 21's measurements: 64-token pages, an 8192-token chunk budget, a 64k-token
pool, 30% of requests with a host-tier prefix, 8 arrivals per round, KV released two rounds after
a request finishes. Prompts are 256-1791 tokens (about 1k on average), so the 8 arrivals of a
round roughly fill one round's chunk budget: the node keeps up and the waiting queue stays short,
as on a healthy server. Seeded, so ``(n, seed)`` always gives the same scenario.

Also a script: ``python tests/core/scale_scenario.py 12000 scale-12k.json`` writes one to a file
for ``policykit simulate``.
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any

PAGE = 64
ARRIVALS_PER_ROUND = 8
COMBO = "reserve-tail/sglang/page"


def scale_scenario(n: int, seed: int = 0) -> dict[str, Any]:
    """The scenario JSON (as a dict) of ``n`` requests."""
    rng = random.Random(seed)
    requests = []
    for i in range(n):
        prompt = rng.randrange(256, 1792)
        req: dict[str, Any] = {
            "id": f"r{i}",
            "prompt_tokens": prompt,
            "arrival_round": i // ARRIVALS_PER_ROUND,
        }
        if rng.random() < 0.3:
            req["host_prefix_tokens"] = rng.randrange(1, prompt // PAGE) * PAGE
        requests.append(req)
    return {
        "name": f"scale-{n}",
        "description": f"{n} requests, 8 a round, 30% with host-tier prefixes (seed {seed})",
        "page_size": PAGE,
        "chunked_prefill_size": 8192,
        "pool": {"free_tokens": 65536, "evictable_tokens": 0},
        "kv_release_rounds": 2,
        "requests": requests,
    }


if __name__ == "__main__":
    count, out = int(sys.argv[1]), sys.argv[2]
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(scale_scenario(count), fh)
