"""The fragmentation workload: does ``frag_gap`` creep up under an allocator-phase policy?

The fragmentation incident (docs/incidents.md#allocator-fragmentation) needs days of
serving; this workload compresses its two ingredients into
minutes. Every step is one prefill forward whose activations have a different size (prompt
lengths vary, and the longest prompts seen so far slowly get longer), and a population of
long-lived small tensors (per-request metadata, cached indices) comes and goes between them.
Under the default allocator a small tensor carved out of a freed activation block pins that
whole segment; ``empty_cache()`` (what the allocator also does before an OOM) cannot return it.
Under expandable segments it pins one 20 MiB handle at most.

Each policy runs in its own process (the allocator setting is process-global and a fresh
process starts with clean segments): initialisation allocates the static buffers, the policy's
``on_serving()`` marks the boundary, a late static buffer is allocated in a
``static_allocations()`` window, then the steps run. Every ``release_every`` steps the child
calls ``empty_cache()`` and samples the watermark; what is left as ``frag_gap`` then is memory
that nothing can reclaim.

    python -m policykit.harness.fragmentation                # GPU: one child per policy
    python -m policykit.harness.fragmentation --dry-run      # CPU: allocator model predictions

Sized for one H200 (peak reserved under ``default`` stays well below 141 GB) and well under
5 minutes: the steps allocate and free memory without launching kernels.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from policykit.interpreter import python_argv

MIB = 1 << 20
GIB = 1 << 30

POLICIES = ("default", "phased-expandable")


@dataclass(frozen=True)
class Workload:
    """The knobs of the workload; the defaults are the prepared H200 run."""

    steps: int = 4000
    seed: int = 0
    chunk_min_mib: int = 64  #: the smallest activation block of a forward
    chunk_max_start_mib: int = 256  #: the largest one at the start ...
    chunk_max_end_mib: int = 3072  #: ... grows to this by the last step (longer prompts)
    pin_mib: int = 2  #: a long-lived small tensor (above 1 MiB: the large pool)
    pins_per_step: float = 0.5
    pin_lifetime: tuple[int, int] = (200, 800)  #: steps
    release_every: int = 100
    static_gib: float = 8.0  #: weights + KV pool, allocated during initialisation
    #: a serving-time RDMA staging buffer (docs/incidents.md#allocator-fragmentation)
    late_static_mib: int = 256


@dataclass(frozen=True)
class Op:
    """One step of the allocation stream: ``alloc``/``free`` a key, or ``release`` + sample."""

    kind: str
    key: int = 0
    nbytes: int = 0
    step: int = 0


def ops(w: Workload) -> Iterator[Op]:
    """The serving-phase allocation stream, deterministic for a seed."""
    rng = random.Random(w.seed)
    keys = iter(range(1, 1 << 62))
    pins: list[tuple[int, int]] = []  #: (dies at step, key)
    for step in range(1, w.steps + 1):
        top = w.chunk_max_start_mib + (w.chunk_max_end_mib - w.chunk_max_start_mib) * step // (
            w.steps
        )
        s = rng.randrange(w.chunk_min_mib, top + 1, 2) * MIB
        # one forward: layer input, the widest moment (gate_up), the layer output
        x, up, out = next(keys), next(keys), next(keys)
        yield Op("alloc", x, s)
        yield Op("alloc", up, 2 * s)
        yield Op("free", x)
        yield Op("alloc", out, s)
        yield Op("free", up)
        # requests finishing and arriving: small tensors that outlive many forwards
        while pins and pins[0][0] <= step:
            yield Op("free", pins.pop(0)[1])
        if rng.random() < w.pins_per_step:
            key = next(keys)
            yield Op("alloc", key, w.pin_mib * MIB)
            pins.append((step + rng.randint(*w.pin_lifetime), key))
            pins.sort()
        yield Op("free", out)
        if step % w.release_every == 0:
            yield Op("release", step=step)


# -- the two executors --------------------------------------------------------------------------
def run_model(w: Workload, expandable: bool) -> list[dict[str, float]]:
    """Predict the watermark after each release with :class:`AllocatorModel` (no device)."""
    from policykit.harness.allocator_model import AllocatorModel

    model = AllocatorModel(expandable=expandable)
    samples = []
    for op in ops(w):
        if op.kind == "alloc":
            model.alloc(op.key, op.nbytes)
        elif op.kind == "free":
            model.free(op.key)
        else:
            model.empty_cache()
            samples.append(_sample(op.step, model.allocated, model.reserved))
    return samples


def run_device(w: Workload, policy_name: str) -> dict[str, Any]:
    """Run the workload on CUDA under one policy (in this process)."""
    import torch

    from policykit.memory.allocator import torch_allocator
    from policykit.memory.allocator_settings import expandable_enabled
    from policykit.memory.oom_chain import watermark_on_cuda_oom
    from policykit.memory.watermark import read_watermark
    from policykit.policy import AllocatorPhasePolicy
    from policykit.registry import of_kind, registry_from

    facade = torch_allocator()
    registry = registry_from()
    policy = of_kind(registry.make("allocator-phase", policy_name), AllocatorPhasePolicy)
    policy.on_init()
    dev = torch.device("cuda")
    static_buffers = [torch.empty(int(w.static_gib * GIB), dtype=torch.uint8, device=dev)]
    policy.on_serving()
    with policy.static_allocations():
        static_buffers.append(torch.empty(w.late_static_mib * MIB, dtype=torch.uint8, device=dev))
    base = read_watermark(facade)
    live: dict[int, torch.Tensor] = {}
    samples = []
    with watermark_on_cuda_oom(facade, print):
        for op in ops(w):
            if op.kind == "alloc":
                live[op.key] = torch.empty(op.nbytes, dtype=torch.uint8, device=dev)
            elif op.kind == "free":
                del live[op.key]
            else:
                facade.empty_cache()
                mark = read_watermark(facade)
                samples.append(
                    _sample(op.step, mark.alloc - base.alloc, mark.reserved - base.reserved)
                )
    return {
        "policy": policy_name,
        "settings": facade.settings(),
        "expandable_on": expandable_enabled(facade.settings()),
        "samples": samples,
        "final": read_watermark(facade).format(),
    }


def _sample(step: int, alloc: int, reserved: int) -> dict[str, float]:
    return {
        "step": step,
        "alloc_gib": alloc / GIB,
        "reserved_gib": reserved / GIB,
        "frag_gap_gib": (reserved - alloc) / GIB,
    }


# -- the parent: one child per policy -----------------------------------------------------------
def summary(samples: list[dict[str, float]]) -> dict[str, float]:
    """frag_gap (GiB) at the first and last sample, its maximum and its mean.

    Fragmentation grows in steps (a new largest activation gets pinned) and falls back a little
    when long-lived tensors die, so one number is not enough to tell creep from noise.
    """
    gaps = [s["frag_gap_gib"] for s in samples]
    return {"first": gaps[0], "max": max(gaps), "last": gaps[-1], "mean": sum(gaps) / len(gaps)}


def run_all(w: Workload, dry_run: bool, out: Path | None) -> dict[str, Any]:
    results: dict[str, Any] = {"workload": asdict(w), "dry_run": dry_run, "policies": {}}
    for name in POLICIES:
        cmd = python_argv("-m", "policykit.harness.fragmentation", "--child", name)
        cmd += ["--workload", json.dumps(asdict(w))]
        if dry_run:
            cmd.append("--dry-run")
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"the {name} child failed:\n{done.stderr.strip()}")
        child = json.loads(done.stdout)
        child["frag_gap_gib"] = summary(child["samples"])
        results["policies"][name] = child
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "fragmentation.json").write_text(json.dumps(results, indent=2))
        _plot(results, out / "fragmentation.png")
    return results


def _plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, child in results["policies"].items():
        steps = [s["step"] for s in child["samples"]]
        ax.plot(steps, [s["frag_gap_gib"] for s in child["samples"]], label=name)
    what = "allocator model prediction" if results["dry_run"] else "measured"
    ax.set(xlabel="step", ylabel="frag_gap after empty_cache (GiB)", title=f"frag_gap ({what})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU: predict with the allocator model")
    p.add_argument("--steps", type=int, default=Workload.steps)
    p.add_argument("--out", type=Path, default=None, help="folder for JSON + PNG")
    p.add_argument("--child", choices=POLICIES, help=argparse.SUPPRESS)
    p.add_argument("--workload", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.child is not None:
        spec = json.loads(args.workload)
        spec["pin_lifetime"] = tuple(spec["pin_lifetime"])
        w = Workload(**spec)
        if args.dry_run:
            expandable = args.child != "default"
            result = {"policy": args.child, "samples": run_model(w, expandable)}
        else:
            result = run_device(w, args.child)
        print(json.dumps(result))
        return 0

    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            print("No CUDA device: run with --dry-run for the allocator-model prediction.")
            return 2
    results = run_all(Workload(steps=args.steps), args.dry_run, args.out)
    label = "predicted by the allocator model" if args.dry_run else "measured"
    print(f"frag_gap after empty_cache, {label} (GiB):")
    for name, child in results["policies"].items():
        figures = "  ".join(f"{k} {v:6.2f}" for k, v in child["frag_gap_gib"].items())
        print(f"  {name:18s} {figures}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
