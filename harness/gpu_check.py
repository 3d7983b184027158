"""One prepared GPU check: the 8B-class preset at 8k-token chunks through a few combinations.

Run on one H200 (``python -m policykit.harness.gpu_check``): it builds the ``llama3-8b`` preset
in bf16, a 32768-token pool (chunk budget 8192), checks that chunked bf16 logits stay within
:data:`BF16_REL_BOUND` of a dense forward, then runs ``long-prompts`` (no crash: throughput)
and ``host-hit-heavy`` (the truncated-tail crash, docs/incidents.md#truncated-tail) through
three combinations, and prints achieved
TFLOP/s, MFU against the 989 TFLOP/s bf16 dense peak, and the allocator watermark. Sized to
finish well under five minutes. ``--dry-run`` runs the same code with the tiny preset on the
CPU, so the script is tested where no GPU is.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any

import torch

from policykit.harness.metrics import H200_BF16_DENSE_TFLOPS, watermark
from policykit.harness.model import Chunk, Decoder
from policykit.harness.presets import get_preset
from policykit.harness.runner import from_workload, run_bench
from policykit.harness.workloads import generate
from policykit.memory.watermark import Watermark
from policykit.pool import TokenPool
from policykit.registry import registry_from

#: max |chunked - dense| / max |dense| over the logits for bf16 on CUDA (justified in
#: docs/harness.md: bf16 keeps 8 significant bits, so every stored activation and every K/V
#: slot carries up to 2^-9 relative rounding; chunking changes the summation order of the
#: attention and matmul reductions, and these independent roundings compound over 32 layers)
BF16_REL_BOUND = 5e-2

COMBOS = (
    "admission=sglang,chunking=sglang,alignment=checkpoint:256",
    "admission=reserve-tail,chunking=sglang,alignment=checkpoint:256",
    "admission=reserve-tail,chunking=defer,alignment=page",
)
MFU_TARGET = 0.5


def logits_deviation(model: Decoder, tokens: int, chunk: int) -> float:
    """Chunked-through-the-pool vs dense logits of one ``tokens``-long prompt."""
    ids = model.token_ids(range(tokens))
    pool = TokenPool(-(-tokens // 64) * 64, 64, device=model.device, layout=model.layout)
    slots = pool.slots(pool.alloc(pool.num_pages), 0, tokens)
    out = None
    for start in range(0, tokens, chunk):
        end = min(tokens, start + chunk)
        out = model.forward([Chunk(ids[start:end], start, slots[:end], end == tokens)], pool)[0]
    ref = model.dense(ids).logits
    assert out is not None
    return float((out - ref).abs().max() / ref.abs().max())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny preset on the CPU")
    parser.add_argument("--chunk", type=int, default=8192, help="chunk budget in tokens")
    parser.add_argument("--json", dest="json_out", default=None, help="write results here")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    if args.dry_run:
        device, preset, chunk = torch.device("cpu"), get_preset("tiny"), 1024
        torch.set_num_threads(1)
    else:
        if not torch.cuda.is_available():
            print("gpu_check needs CUDA; use --dry-run to exercise it on the CPU", file=sys.stderr)
            return 2
        device, preset, chunk = torch.device("cuda"), get_preset("llama3-8b"), args.chunk
    pool = 4 * chunk
    model = Decoder(preset, device)
    print(f"{preset.name} on {device} ({model.dtype}), pool {pool} tokens, chunk {chunk}")
    deviation = logits_deviation(model, tokens=min(3 * chunk // 4 * 2, pool), chunk=chunk // 2)
    bound = BF16_REL_BOUND if model.dtype == torch.bfloat16 else 1e-4
    print(f"chunked vs dense logits: {deviation:.2e} (bound {bound:.0e})")
    registry = registry_from()
    results: dict[str, Any] = {"deviation": deviation, "bound": bound, "runs": []}
    for name in ("long-prompts", "host-hit-heavy"):
        workload = generate(name, pool)
        config = dataclasses.replace(workload.config, chunked_prefill_size=chunk)
        workload = dataclasses.replace(workload, config=config)
        bench = from_workload(workload)
        combos = [registry.resolve(c, config=bench.config) for c in COMBOS]
        result = run_bench(bench, combos, model)
        results["runs"].append(result)
        for row in result["combos"]:
            _print_row(name, row)
    results["watermark"] = watermark(device)
    results["seconds"] = time.perf_counter() - t0
    print(f"watermark: {_fmt_watermark(results['watermark'])}")
    print(f"total {results['seconds']:.0f} s")
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2)
    return 0 if deviation < bound else 1


def _print_row(workload: str, row: dict[str, Any]) -> None:
    crash = f"crashed at round {row['crash']['round']}" if row["crash"] else row["status"]
    tflops = "n/a" if row["tflops"] is None else f"{row['tflops']:.1f}"
    mfu = "n/a" if row["mfu"] is None else f"{row['mfu']:.1%}"
    target = ""
    if row["mfu"] is not None:
        target = " (target met)" if row["mfu"] >= MFU_TARGET else " (below the 50% target)"
    print(
        f"{workload:15s} {row['combo'].removesuffix(',allocator-phase=default'):62s} {crash:20s} "
        f"TFLOP/s {tflops} MFU {mfu}{target} of {H200_BF16_DENSE_TFLOPS:.0f} "
        f"prompt tok/s {row['prompt_tokens_per_s'] or 0:,.0f} "
        f"watermark {_fmt_watermark(row['watermark'])}"
    )


def _fmt_watermark(mark: dict[str, int] | None) -> str:
    if mark is None:
        return "n/a (CPU)"
    return Watermark(mark["alloc"], mark["reserved"], mark["max_alloc"]).format()


if __name__ == "__main__":
    sys.exit(main())
