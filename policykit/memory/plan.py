"""KV-pool sizing the way SGLang does it, term by term (docs/incidents.md#kv-pool-sizing).

Two measurements frame the KV pool: ``pre`` (free memory after the process and its
communicators exist, before weights load) and ``post`` (free memory after the weights are in).
``mem_fraction_static = y`` splits ``pre`` into a static part (weights + KV) and a dynamic part
``(1 - y) * pre`` left to activations, workspaces and CUDA-graph pools, so::

    kv_bytes = post - (1 - y) * pre

When the user gives no ``y``, SGLang derives one from a reserve (in MiB, which its source calls
MB): ``512 + 1.5 * activation_tokens + tp * pp / 8 * 1024 + graph``, at least 10 GiB on cards
over 60 GiB, plus the DeepEP all-to-all buffer; ``y = (gpu_mem - reserved) / gpu_mem``. Source:
SGLang's ``_handle_gpu_memory_settings`` / ``reserve_for_graph_mb``, as docs/incidents.md reads
them.

Without a GPU the two measurements are estimated: ``pre`` defaults to the whole card (an upper
bound: the CUDA context, NCCL buffers and other processes take some) and the weights to the
model shape's parameter bytes. Pass measured figures when you have them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from policykit.errors import PolicykitError
from policykit.memory.model_shapes import ModelShape

MIB = 1 << 20
GIB = 1 << 30

#: SGLang's default when chunked prefill is off (``max_prefill_tokens``)
DEFAULT_MAX_PREFILL_TOKENS = 16384


class MemoryPlanError(PolicykitError):
    """The inputs of a memory plan are out of range, or the KV pool would not fit."""


def default_chunked_prefill_size(gpu_mem_gib: float) -> int:
    """SGLang's per-card default: <20 GiB 2048, <60 4096, <160 8192 (H100/H20/H200), else 16384."""
    if gpu_mem_gib < 20:
        return 2048
    if gpu_mem_gib < 60:
        return 4096
    if gpu_mem_gib < 160:
        return 8192
    return 16384


@dataclass(frozen=True)
class ReservedMemory:
    """The runtime reserve behind an automatic ``mem_fraction_static``, in MiB, term by term."""

    constant: float  #: attention-backend metadata and other fixed costs (512)
    activation: float  #: 1.5 MiB per activation token
    parallel: float  #: tp * pp / 8 * 1024: communication slack of large parallel groups
    cuda_graph: float  #: 2 MiB per decode capture batch (0 on a prefill node)
    floor_top_up: float  #: what lifts the sum to 10 GiB on cards over 60 GiB
    deepep_a2a: float  #: DeepEP all-to-all buffers (2 GiB when used)
    activation_tokens: int

    @property
    def before_graphs(self) -> float:
        return self.constant + self.activation + self.parallel

    @property
    def total(self) -> float:
        return self.before_graphs + self.cuda_graph + self.floor_top_up + self.deepep_a2a

    def to_dict(self) -> dict[str, float]:
        return {
            "constant_mib": self.constant,
            "activation_mib": self.activation,
            "activation_tokens": self.activation_tokens,
            "parallel_mib": self.parallel,
            "before_graphs_mib": self.before_graphs,
            "cuda_graph_mib": self.cuda_graph,
            "floor_top_up_mib": self.floor_top_up,
            "deepep_a2a_mib": self.deepep_a2a,
            "total_mib": self.total,
        }


def reserved_memory(
    gpu_mem_gib: float,
    *,
    chunked_prefill_size: int,
    tp: int = 1,
    pp: int = 1,
    cuda_graph_max_bs: int = 0,
    deepep: bool = False,
    max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS,
) -> ReservedMemory:
    """The reserve SGLang keeps for runtime memory when ``mem_fraction_static`` is not given."""
    tokens = chunked_prefill_size if chunked_prefill_size > 0 else max_prefill_tokens
    activation_tokens = max(tokens, 2048)
    constant, activation = 512.0, activation_tokens * 1.5
    parallel = tp * pp / 8 * 1024
    graph = 2.0 * cuda_graph_max_bs
    subtotal = constant + activation + parallel + graph
    floor = 10 * 1024.0 if gpu_mem_gib * 1024 > 60 * 1024 else 0.0
    return ReservedMemory(
        constant=constant,
        activation=activation,
        parallel=parallel,
        cuda_graph=graph,
        floor_top_up=max(0.0, floor - subtotal),
        deepep_a2a=2 * 1024.0 if deepep else 0.0,
        activation_tokens=activation_tokens,
    )


@dataclass(frozen=True)
class KVPlan:
    """Where the card's memory goes before the serving loop, and the KV pool that results."""

    gpu_mem: int
    pre_load: int
    weights: int
    mem_fraction_static: float
    fraction_source: str  #: "given" or "heuristic"
    kv_cell: int  #: bytes per token per rank
    page_size: int
    reserved: ReservedMemory | None  #: only when the fraction came from the heuristic
    pre_load_source: str = "given"  #: "given", "measured" or "assumed = card"
    weights_source: str = "given"  #: "given" or "estimated from the model shape"

    @property
    def post_load(self) -> int:
        return self.pre_load - self.weights

    @property
    def dynamic(self) -> float:
        """``(1 - y) * pre``: what activations, workspaces and graphs may use."""
        return (1 - self.mem_fraction_static) * self.pre_load

    @property
    def kv_bytes(self) -> float:
        return self.post_load - self.dynamic

    @property
    def kv_tokens(self) -> int:
        tokens = math.floor(self.kv_bytes / self.kv_cell) if self.kv_bytes > 0 else 0
        return tokens // self.page_size * self.page_size

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu_mem_gib": self.gpu_mem / GIB,
            "pre_load_gib": self.pre_load / GIB,
            "weights_gib": self.weights / GIB,
            "post_load_gib": self.post_load / GIB,
            "mem_fraction_static": self.mem_fraction_static,
            "fraction_source": self.fraction_source,
            "dynamic_gib": self.dynamic / GIB,
            "kv_gib": self.kv_bytes / GIB,
            "kv_cell_bytes": self.kv_cell,
            "kv_tokens": self.kv_tokens,
            "page_size": self.page_size,
            "reserved": None if self.reserved is None else self.reserved.to_dict(),
            "pre_load_source": self.pre_load_source,
            "weights_source": self.weights_source,
        }


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise MemoryPlanError(message)


def _check_inputs(
    gpu_mem_gib: float,
    *,
    tp: int,
    pp: int,
    chunked_prefill_size: int,
    mem_fraction_static: float | None,
    page_size: int,
    pre_load_gib: float | None,
    weights_gib: float | None,
    cuda_graph_max_bs: int,
) -> None:
    """Refuse inputs the engine would refuse, or that size nothing, with the flag to fix."""
    given = (gpu_mem_gib, pre_load_gib, weights_gib, mem_fraction_static)
    _require(
        all(x is None or math.isfinite(x) for x in given),
        "Memory figures and fractions must be finite numbers (not inf or nan).",
    )
    _require(gpu_mem_gib > 0, f"The GPU memory must be positive, got {gpu_mem_gib} GiB.")
    _require(tp >= 1 and pp >= 1, f"--tp and --pp must be at least 1, got {tp} and {pp}.")
    _require(page_size >= 1, f"The page size must be at least 1 token, got {page_size}.")
    _require(
        chunked_prefill_size == -1 or chunked_prefill_size > 0,
        f"--chunked-prefill-size must be positive, or -1 to disable chunked prefill; got "
        f"{chunked_prefill_size}.",
    )
    _require(cuda_graph_max_bs >= 0, "--cuda-graph-max-bs cannot be negative.")
    if mem_fraction_static is not None:
        _require(
            0 < mem_fraction_static < 1,
            f"--mem-fraction-static is the share of pre-load memory for weights and KV, "
            f"strictly between 0 and 1; got {mem_fraction_static}.",
        )
    if pre_load_gib is not None:
        _require(
            0 < pre_load_gib <= gpu_mem_gib,
            f"The pre-load free memory must be positive and at most the card's {gpu_mem_gib} "
            f"GiB; got {pre_load_gib} GiB.",
        )
    if weights_gib is not None:
        _require(weights_gib >= 0, f"The weight memory cannot be negative, got {weights_gib} GiB.")


def _heuristic_fraction(gpu_mem_gib: float, reserved: ReservedMemory) -> float:
    """SGLang's automatic ``mem_fraction_static``: the card less the reserve, as a share."""
    gpu_mib = gpu_mem_gib * 1024
    fraction = round((gpu_mib - reserved.total) / gpu_mib, 3)
    _require(
        0 < fraction < 1,
        f"The runtime reserve ({reserved.total:.0f} MiB) leaves nothing of a "
        f"{gpu_mem_gib} GiB card for weights and KV.",
    )
    return fraction


def _empty_pool(plan: KVPlan) -> MemoryPlanError:
    """The engine's startup refusal, with the arithmetic that led to it."""
    return MemoryPlanError(
        "Not enough memory. Please try to increase --mem-fraction-static. "
        f"With mem_fraction_static={plan.mem_fraction_static} the dynamic part is "
        f"(1 - {plan.mem_fraction_static}) x {plan.pre_load / GIB:.1f} = "
        f"{plan.dynamic / GIB:.1f} GiB, but only {plan.post_load / GIB:.1f} GiB is free "
        f"after {plan.weights / GIB:.1f} GiB of weights, so the KV pool would be "
        f"{plan.kv_bytes / GIB:.1f} GiB. A startup OOM like this "
        "needs a larger fraction (or a card with more free memory); only a runtime OOM is "
        "fixed by lowering it."
    )


def plan_kv(
    model: ModelShape,
    gpu_mem_gib: float,
    *,
    tp: int = 1,
    pp: int = 1,
    chunked_prefill_size: int,
    mem_fraction_static: float | None = None,
    page_size: int = 1,
    pre_load_gib: float | None = None,
    weights_gib: float | None = None,
    cuda_graph_max_bs: int = 0,
    deepep: bool = False,
    pre_load_source: str = "given",
) -> KVPlan:
    """Size the KV pool; refuse (like the engine) when it would be empty or negative."""
    _check_inputs(
        gpu_mem_gib,
        tp=tp,
        pp=pp,
        chunked_prefill_size=chunked_prefill_size,
        mem_fraction_static=mem_fraction_static,
        page_size=page_size,
        pre_load_gib=pre_load_gib,
        weights_gib=weights_gib,
        cuda_graph_max_bs=cuda_graph_max_bs,
    )
    pre = gpu_mem_gib if pre_load_gib is None else pre_load_gib
    weights = model.weight_bytes(tp, pp) if weights_gib is None else weights_gib * GIB
    reserved = None
    if mem_fraction_static is None:
        reserved = reserved_memory(
            gpu_mem_gib,
            chunked_prefill_size=chunked_prefill_size,
            tp=tp,
            pp=pp,
            cuda_graph_max_bs=cuda_graph_max_bs,
            deepep=deepep,
        )
        mem_fraction_static = _heuristic_fraction(gpu_mem_gib, reserved)
    plan = KVPlan(
        gpu_mem=int(gpu_mem_gib * GIB),
        pre_load=int(pre * GIB),
        weights=int(weights),
        mem_fraction_static=mem_fraction_static,
        fraction_source="heuristic" if reserved is not None else "given",
        kv_cell=model.kv_cell_bytes(tp, pp),
        page_size=page_size,
        reserved=reserved,
        pre_load_source="assumed = card" if pre_load_gib is None else pre_load_source,
        weights_source="estimated from the model shape" if weights_gib is None else "given",
    )
    if plan.kv_tokens <= 0:
        raise _empty_pool(plan)
    return plan
