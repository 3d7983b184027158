"""Predicted time of a run on a named GPU: a roofline over each round's FLOPs and HBM bytes.

The CPU harness measures the schedule, not the accelerator: its wall-clock seconds say how fast
a 2-core box multiplies a tiny model, which no serving engineer picks a policy by. What a policy
does decide is *which tokens each round computes*, and that fixes the round's work. Like Vidur's
simulator, we price that work on a target GPU instead of timing it: a round takes at least its
FLOPs over the GPU's peak (compute-bound) and at least its HBM traffic over the memory bandwidth
(memory-bound); the prediction is the larger of the two. Every figure made here is *predicted*,
and is labelled so wherever it is shown.

The traffic of a round counts what a prefill must move through HBM at least once: every matmul
weight (read once per round, however many tokens share it), the lm_head for rounds that sample,
the KV prefix each chunk attends to (read) and the chunk's own KV (written). Activations are left
out; they stay in on-chip memory for fused kernels and are small next to the weights at these
batch sizes. Peak figures are dense (no sparsity) bf16 tensor-core throughput.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from policykit.errors import PolicykitError
from policykit.harness.presets import ModelPreset
from policykit.plan import Entry
from policykit.scheduler import RunResult

#: the prediction prices bf16 weights and KV, whatever dtype the measured run used
BF16_BYTES = 2


@dataclass(frozen=True)
class GPU:
    """The two numbers a roofline needs, with where they were read."""

    name: str
    peak_flops: float  #: dense bf16 tensor-core FLOP/s
    hbm_bytes_per_s: float
    source: str
    #: HBM capacity in GB (10^9 bytes) as the datasheet gives it; sizes the default KV pool
    memory_gb: float = 0.0

    @property
    def memory_gib(self) -> float:
        return self.memory_gb * 1e9 / 2**30


#: Vendor spec sheets. NVIDIA lists bf16 tensor-core throughput *with* 2:4 sparsity; the dense
#: figure used here is half of it.
#: * H100 SXM5: 1,979 TFLOPS sparse -> 989 dense; HBM3 3.35 TB/s, 80 GB (NVIDIA H100 Tensor
#:   Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h100/).
#: * H200 SXM: 1,979 TFLOPS sparse -> 989 dense (same compute as H100); HBM3e 4.8 TB/s, 141 GB
#:   (NVIDIA H200 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h200/).
#: * B200 (HGX B200, per GPU): 4.5 PFLOPS sparse -> 2.25 dense; HBM3e 8 TB/s, 180 GB (NVIDIA
#:   HGX B200 datasheet, https://www.nvidia.com/en-us/data-center/hgx/).
GPUS: dict[str, GPU] = {
    "H100": GPU("H100", 989e12, 3.35e12, "NVIDIA H100 SXM5 datasheet", 80),
    "H200": GPU("H200", 989e12, 4.8e12, "NVIDIA H200 SXM datasheet", 141),
    "B200": GPU("B200", 2.25e15, 8.0e12, "NVIDIA HGX B200 datasheet", 180),
}


def get_gpu(name: str) -> GPU:
    """The GPU preset called ``name`` (case-insensitive), or a usage error listing them."""
    try:
        return GPUS[name.upper()]
    except KeyError:
        raise PolicykitError(
            f"There is no GPU preset named {name!r}. Known GPUs: {', '.join(GPUS)}."
        ) from None


@dataclass(frozen=True)
class RoundCost:
    """The work of one round: arithmetic and the HBM traffic it cannot avoid."""

    flops: int
    hbm_bytes: int

    def seconds(self, gpu: GPU) -> float:
        """Roofline time: the slower of the compute-bound and memory-bound terms."""
        return max(self.flops / gpu.peak_flops, self.hbm_bytes / gpu.hbm_bytes_per_s)


def round_cost(batch: Iterable[Entry], preset: ModelPreset) -> RoundCost:
    """FLOPs and HBM bytes of one round's batch on ``preset`` (an empty batch costs nothing)."""
    entries = list(batch)
    if not entries:
        return RoundCost(0, 0)
    kv_per_token = preset.kv_bytes_per_token(BF16_BYTES)
    flops = sum(preset.chunk_flops(e.start, e.end) for e in entries)
    sampled = sum(e.kind.finishes for e in entries)
    flops += 2 * preset.hidden * preset.vocab * sampled
    weights = preset.matmul_params * BF16_BYTES
    if sampled:
        weights += preset.hidden * preset.vocab * BF16_BYTES
    kv = sum(e.end * kv_per_token for e in entries)  # prefix read + own chunk written
    return RoundCost(flops, weights + kv)


def predicted_round_seconds(result: RunResult, preset: ModelPreset, gpu: GPU) -> list[float]:
    """Predicted seconds of every round of ``result``, in order."""
    return [round_cost(r.plan.batch, preset).seconds(gpu) for r in result.rounds]
