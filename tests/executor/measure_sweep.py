"""Wall time of one CPU sweep on the local executor (1 and 2 workers) and on Ray.

Not a test (pytest collects only ``test_*.py``): run it by hand and read the ratios::

    .venv/bin/python tests/executor/measure_sweep.py [--requests 600] [--combos all]

The bundled scenarios finish in ~40 ms a unit, less than starting a worker, so they cannot
show scaling; this script generates two heavier scenarios (hundreds of requests arriving over
time, some with host-tier prefixes, KV released after 3 rounds) and sweeps 6 combos over them.
Each configuration runs ``policykit sweep`` as a fresh process, as a user would, and must
produce the same unit results as the others. ``--executor ray`` starts a local Ray cluster on
every CPU of this machine (2 on the CI box).

Columns: ``command s`` is the whole ``policykit sweep`` process (Python and torch start-up, and
for Ray the cluster start); ``sweep s`` is the envelope's ``wall_seconds``, first submission to
last result (local worker start-up included, Ray's cluster start not); ``unit wall s`` and
``unit cpu s`` sum the units' own wall and CPU time. Where other processes compete for the
cores, unit wall time grows while unit CPU time does not: compare the two before reading the
ratios as the executors' doing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMBOS = ";".join(
    f"admission={a},chunking={c},alignment={al}"
    for a, c, al in [
        ("sglang", "sglang", "checkpoint:256"),
        ("reserve-tail", "sglang", "checkpoint:256"),
        ("no-evict", "sglang", "page"),
        ("sglang", "defer", "truncation:192"),
        ("reserve-tail", "defer", "page"),
        ("no-evict", "defer", "checkpoint:256"),
    ]
)
CONFIGS = {
    "local, 1 worker": ["--executor", "local", "--workers", "1"],
    "local, 2 workers": ["--executor", "local", "--workers", "2"],
    "ray": ["--executor", "ray"],
}


def heavy_scenario(name: str, requests: int, seed: int) -> dict:
    rng = random.Random(seed)
    reqs = []
    for i in range(requests):
        prompt = rng.randrange(256, 8192)
        host = rng.choice([0, 0, 0, rng.randrange(0, prompt // 2)])
        reqs.append(
            {"id": f"r{i}", "prompt_tokens": prompt, "host_prefix_tokens": host,
             "arrival_round": i // 3}
        )  # fmt: skip
    return {
        "name": name,
        "description": f"{requests} generated requests, seed {seed}",
        "page_size": 64,
        "chunked_prefill_size": 8192,
        "pool": {"free_tokens": 64 * 1024, "evictable_tokens": 0},
        "kv_release_rounds": 3,
        "requests": reqs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--combos", default=COMBOS, help="as for sweep (default: 6 combos)")
    opts = parser.parse_args()
    policykit = str(Path(sys.executable).with_name("policykit"))
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for name, seed in (("heavy-a", 1), ("heavy-b", 2)):
            path = Path(tmp) / f"{name}.json"
            path.write_text(json.dumps(heavy_scenario(name, opts.requests, seed)))
            paths.append(str(path))
        rows, outcomes = [], {}
        for label, extra in CONFIGS.items():
            out = Path(tmp) / "out.json"
            cmd = [policykit, "sweep", "--scenarios", ",".join(paths), "--combos", opts.combos,
                   *extra, "--out", str(out)]  # fmt: skip
            started = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            wall = time.perf_counter() - started
            doc = json.loads(out.read_text())
            outcomes[label] = [(u["id"], u["result"]) for u in doc["units"]]
            busy = sum(u["wall_seconds"] for u in doc["units"])
            cpu = sum(u["cpu_seconds"] for u in doc["units"])
            rows.append((label, wall, doc["wall_seconds"], busy, cpu, len(doc["units"])))
    first = next(iter(outcomes.values()))
    same = all(o == first for o in outcomes.values())
    base_cmd, base_sweep = rows[0][1], rows[0][2]
    print(f"{rows[0][5]} units, load average {os.getloadavg()[0]:.1f}, "
          f"results identical across executors: {same}")  # fmt: skip
    print(f"{'config':18} {'command s':>10} {'sweep s':>9} {'unit wall s':>12} "
          f"{'unit cpu s':>11} {'ratio cmd':>10} {'ratio sweep':>12}")  # fmt: skip
    for label, wall, sweep, busy, cpu, _ in rows:
        print(f"{label:18} {wall:10.1f} {sweep:9.1f} {busy:12.1f} {cpu:11.1f} "
              f"{base_cmd / wall:10.2f} {base_sweep / sweep:12.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
