"""Run vLLM with policykit's scheduler class on a GPU machine, and confirm it decides.

``python -m policykit.harness.vllm_server_check --workdir /tmp/pk-vllm`` builds a small
Llama-shaped model with random weights (transformers, no download) and runs vLLM's engine on
it three times, each in its own process, with the same prompts (token ids, longer than the step
budget, on a KV pool small enough to preempt):

1. ``vllm``: vLLM's own scheduler class (``AsyncScheduler``);
2. ``faithful``: ``--scheduler-cls policykit.integrations.vllm.PolicyAsyncScheduler`` with
   vLLM's own combo, which must schedule the same tokens per request in every step;
3. ``combo``: the plugin with ``--combo`` (given through ``--additional-config``), whose
   policies must have answered (and never fallen back) and must have decided otherwise.

Each run records what ``schedule()`` returned step by step (tokens per request, preemptions)
and, for the plugin, its count of policy answers and fallbacks. Exit 0 when every request
completed in every run and the three checks hold. ``--dry-run`` builds the model directory and
prints the plan as JSON without starting anything (what the CPU test runs); without CUDA and
without ``--dry-run`` it refuses with exit 2.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

from policykit.harness.sglang_server_check import build_model
from policykit.interpreter import python_argv

SCHEMA = "policykit.vllm-server-check/1"
CLASS_PATH = "policykit.integrations.vllm.PolicyAsyncScheduler"
SIDES = ("vllm", "faithful", "combo")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument(
        "--combo",
        default="chunking=vllm-threshold:64,queue=lpm",
        help="the combo of the third run (kinds not named are vLLM's own)",
    )
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--num-gpu-blocks", type=int, default=128, help="a small pool preempts")
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--dry-run", action="store_true", help="build and print; start nothing")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # one run, internal
    args = parser.parse_args(argv)
    if args.requests < 1 or args.block_size < 1 or args.max_num_batched_tokens < 1:
        parser.error("--requests, --block-size and --max-num-batched-tokens must be positive")
    return args


def prompts(args: argparse.Namespace) -> list[list[int]]:
    """Token ids: some prompts share a first half (prefix-cache hits), all are longer than
    half the step budget and most longer than it."""
    rng = random.Random(0)
    budget = args.max_num_batched_tokens
    shared = [rng.randrange(1, 1000) for _ in range(budget)]
    out = []
    for index in range(args.requests):
        length = rng.randint(budget // 2, 3 * budget)
        head = shared[: length // 2] if index % 3 == 0 else []
        out.append(head + [rng.randrange(1, 1000) for _ in range(length - len(head))])
    return out


def engine_args(args: argparse.Namespace, model: Path, side: str) -> dict[str, Any]:
    """What ``vllm.LLM`` is given for ``side`` (the same as ``vllm serve``'s flags)."""
    kwargs: dict[str, Any] = {
        "model": str(model),
        "skip_tokenizer_init": True,
        "enforce_eager": True,
        "gpu_memory_utilization": 0.3,
        "block_size": args.block_size,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "num_gpu_blocks_override": args.num_gpu_blocks,
        "max_model_len": 4 * args.max_num_batched_tokens,
    }
    if side != "vllm":
        kwargs["scheduler_cls"] = CLASS_PATH
    if side == "combo":
        kwargs["additional_config"] = {"policykit_combo": args.combo}
    return kwargs


def run_side(args: argparse.Namespace, model: Path) -> dict[str, Any]:
    """One engine in this process: generate, and record each step's decisions."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the scheduler in this process
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.core_client import InprocClient

    llm = LLM(**engine_args(args, model, args.side))
    client = llm.llm_engine.engine_core
    assert isinstance(client, InprocClient)  # no multiprocessing (above): the core is in here
    #: Any: its ``schedule`` is replaced below by one that records each step
    scheduler: Any = client.engine_core.scheduler
    steps: list[dict[str, Any]] = []
    schedule = scheduler.schedule

    def recorded(*a: Any, **kw: Any) -> Any:
        out = schedule(*a, **kw)
        if out.num_scheduled_tokens or out.preempted_req_ids:
            steps.append(
                {
                    "scheduled": sorted(out.num_scheduled_tokens.items()),
                    "preempted": sorted(out.preempted_req_ids or ()),
                }
            )
        return out

    scheduler.schedule = recorded
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts(args)], params)
    guard = getattr(scheduler, "guard", None)
    return {
        "side": args.side,
        "scheduler": type(scheduler).__name__,
        "combo": str(getattr(scheduler, "combo", "")) or None,
        "completed": sum(len(o.outputs[0].token_ids) == args.max_tokens for o in outputs),
        "steps": steps,
        "preemptions": sum(len(s["preempted"]) for s in steps),
        "answered": dict(guard.answered) if guard else None,
        "fallbacks": dict(guard.fallbacks) if guard else None,
    }


def _spawn(args: argparse.Namespace, argv: list[str], side: str) -> dict[str, Any]:
    command = python_argv("-m", "policykit.harness.vllm_server_check", *argv)
    done = subprocess.run([*command, "--side", side], capture_output=True, text=True)
    log = args.workdir / f"{side}.log"
    log.write_text(done.stderr)
    if done.returncode != 0:
        return {"side": side, "error": f"exit {done.returncode}; see {log}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def checks(runs: dict[str, dict[str, Any]], requests: int) -> dict[str, bool]:
    vllm, faithful, combo = (runs[s] for s in SIDES)
    ok = all("error" not in r and r["completed"] == requests for r in runs.values())
    return {
        "all_completed": ok,
        "faithful_is_identity": ok and faithful["steps"] == vllm["steps"],
        "combo_decided": ok
        and sum((combo["answered"] or {}).values()) > 0
        and not combo["fallbacks"]
        and combo["steps"] != vllm["steps"],
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    model = args.workdir / "model"
    if args.side:
        print(json.dumps(run_side(args, model)))
        return 0
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            print(
                "vllm_server_check needs a CUDA GPU to run vLLM's engine, and none is visible "
                "here; use --dry-run to build the model and print the plan on a CPU.",
                file=sys.stderr,
            )
            return 2
    build_model(model)
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "model": str(model),
        "engine_args": {side: engine_args(args, model, side) for side in SIDES},
        "requests": args.requests,
        "dry_run": args.dry_run,
    }
    ok = True
    if not args.dry_run:
        runs = {side: _spawn(args, argv, side) for side in SIDES}
        report["runs"] = runs
        report["checks"] = checks(runs, args.requests)
        ok = all(report["checks"].values())
    print(json.dumps(report, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
