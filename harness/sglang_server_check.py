"""Launch a real SGLang server with the policykit plugin on a GPU machine, and confirm it decides.

``python -m policykit.harness.sglang_server_check --workdir /tmp/pk-sglang`` builds a small
Llama-shaped model with random weights (transformers, no download), starts
``sglang.launch_server`` on it with ``SGLANG_PLUGINS=policykit`` and the chosen combo, sends
prompts longer than the chunk size (so chunking, alignment and tails are exercised), and reads
the server log for the plugin's evidence: one ``Applied`` line per hooked ``PrefillAdder``
method, the ``policykit SGLang plugin active`` line and the ``policykit check`` verdicts. Exit 0
when every request completed and every line is there.

``--dry-run`` builds the model directory and prints the command and environment as JSON
without starting anything (what the CPU test runs). Random weights make the text meaningless;
only scheduling is under test, so the server runs with ``--skip-tokenizer-init`` and takes token
ids.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from policykit.integrations.sglang import plugin
from policykit.interpreter import python_argv

#: log lines the plugin must leave in a server that runs it
EVIDENCE = (
    *(f"Applied 1 hook(s) to {target}" for target in plugin.DECISION_TARGETS),
    "policykit SGLang plugin active",
    "policykit check:",
)


def build_model(directory: Path, seed: int = 0) -> Path:
    """A 2-layer Llama-shaped model with random weights, saved as safetensors."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=1024,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)  # type: ignore[arg-type]  # transformers types its wrapped .to() as taking the model
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    return directory


def launch_plan(args: argparse.Namespace, model: Path) -> tuple[list[str], dict[str, str]]:
    command = [
        *python_argv("-m"),
        "sglang.launch_server",
        "--model-path",
        str(model),
        "--skip-tokenizer-init",
        "--port",
        str(args.port),
        "--page-size",
        str(args.page_size),
        "--chunked-prefill-size",
        str(args.chunked_prefill_size),
        "--mem-fraction-static",
        "0.3",
    ]
    env = {"SGLANG_PLUGINS": "policykit", "POLICYKIT_COMBO": args.combo}
    return command, env


def _post(url: str, body: dict, timeout: float) -> dict:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def _wait_ready(base: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode} before serving")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=5):
                return
        except OSError:
            time.sleep(2)
    raise RuntimeError(f"the server was not ready after {timeout:.0f} s")


def serve_and_check(args: argparse.Namespace, command: list[str], env: dict[str, str]) -> dict:
    log_path = args.workdir / "server.log"
    base = f"http://127.0.0.1:{args.port}"
    rng = random.Random(0)
    lengths = [
        rng.randint(args.chunked_prefill_size // 2, 3 * args.chunked_prefill_size)
        for _ in range(args.requests)
    ]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, env={**os.environ, **env}, stdout=log, stderr=log)
        try:
            _wait_ready(base, proc, args.ready_timeout)
            done = 0
            for n in lengths:
                ids = [rng.randrange(1, 1000) for _ in range(n)]
                body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 4}}
                out = _post(f"{base}/generate", body, timeout=300)
                done += bool(out.get("output_ids"))
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    text = log_path.read_text()
    missing = [line for line in EVIDENCE if line not in text]
    return {"requests": len(lengths), "completed": done, "missing_log_lines": missing}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--combo", default="admission=reserve-tail,chunking=sglang,alignment=page")
    parser.add_argument("--port", type=int, default=30123)
    parser.add_argument("--page-size", type=int, default=64)
    parser.add_argument("--chunked-prefill-size", "--chunk-size", type=int, default=1024)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--ready-timeout", type=float, default=900)
    parser.add_argument("--dry-run", action="store_true", help="build and print; start nothing")
    args = parser.parse_args(argv)
    model = build_model(args.workdir / "model")
    command, env = launch_plan(args, model)
    report: dict = {
        "schema": "policykit.sglang-server-check/1",
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "model": str(model),
        "command": command,
        "env": env,
        "dry_run": args.dry_run,
    }
    ok = True
    if not args.dry_run:
        report["result"] = serve_and_check(args, command, env)
        ok = not report["result"]["missing_log_lines"] and (
            report["result"]["completed"] == report["result"]["requests"]
        )
    print(json.dumps(report, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
