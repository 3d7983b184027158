"""A prepared GPU run: a production trace with the real model forward on the 8B preset.

``python -m policykit.harness.gpu_trace --trace mooncake-conversation`` replays the trace
through each combination with ``llama3-8b`` in bf16 on the CUDA device, every round's batch
through the model, on the pool ``plan-memory`` gives that preset on the GPU named by ``--gpu``
(849,920 tokens on an H200: about 104 GiB of KV beside 15 GiB of weights). It prints, per
combination, the forward's seconds, achieved TFLOP/s and MFU, and whether the outcomes match
the scheduler-level replay (they must: the forward computes KV, it never changes a decision).
The whole conversation trace is 145 M prompt tokens, roughly an hour of an H200 at 50% MFU;
``--requests N`` runs a declared slice. ``--dry-run`` runs the same code with the tiny preset
on the CPU on a few requests, so the script is tested where no GPU is. Nothing here has been
run on a GPU by the project yet: its figures are whatever the run prints.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import torch

from policykit.harness.metrics import H200_BF16_DENSE_TFLOPS
from policykit.harness.model import Decoder
from policykit.harness.presets import get_preset
from policykit.harness.roofline import get_gpu
from policykit.harness.trace_bench import forward_slice, replay_config
from policykit.harness.trace_formats import resolve_trace
from policykit.registry import registry_from

COMBOS = ("sglang/sglang/checkpoint:256", "reserve-tail/sglang/checkpoint:256")
#: what --dry-run replays on the CPU
DRY_RUN_REQUESTS = 2
DRY_RUN_POOL = 65_536


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default="mooncake-conversation")
    parser.add_argument("--combo", action="append", default=None, help="repeatable")
    parser.add_argument("--requests", type=int, default=None, help="first N requests only")
    parser.add_argument("--gpu", default="H200", help="sizes the pool and clocks the rounds")
    parser.add_argument("--dry-run", action="store_true", help="tiny preset on the CPU")
    parser.add_argument("--json", dest="json_out", default=None, help="write results here")
    args = parser.parse_args(argv)
    if args.dry_run:
        device, preset, requests = torch.device("cpu"), get_preset("tiny"), DRY_RUN_REQUESTS
        torch.set_num_threads(1)
    elif not torch.cuda.is_available():
        print("gpu_trace needs CUDA; use --dry-run to exercise it on the CPU", file=sys.stderr)
        return 2
    else:
        device, preset, requests = torch.device("cuda"), get_preset("llama3-8b"), args.requests
    trace = resolve_trace(args.trace)
    if requests:
        trace = trace.head(requests)
    config, source = replay_config(
        get_preset("llama3-8b"),
        get_gpu(args.gpu),
        pool_tokens=DRY_RUN_POOL if args.dry_run else None,
    )
    model = Decoder(preset, device)
    registry = registry_from()
    print(f"{trace.name}: {len(trace.requests)} requests on {preset.name} ({device}); {source}")
    out: dict[str, Any] = {"trace": trace.summary(), "pool_source": source, "runs": []}
    t0 = time.perf_counter()
    ok = True
    for text in args.combo or COMBOS:
        combo = registry.resolve(text, config=config.engine)
        run = forward_slice(trace, combo, config, model)
        tflops = run["flops"] / run["forward_seconds"] / 1e12 if run["forward_seconds"] else 0.0
        run.update(combo=text, tflops=tflops, mfu=tflops / H200_BF16_DENSE_TFLOPS)
        out["runs"].append(run)
        ok = ok and run["matches_scheduler_replay"]
        print(
            f"{text:40s} forward {run['forward_seconds']:.1f} s, {tflops:.1f} TFLOP/s, "
            f"MFU {run['mfu']:.1%}; outcomes match the scheduler replay: "
            f"{run['matches_scheduler_replay']}"
        )
    out["seconds"] = time.perf_counter() - t0
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
