"""Measuring, on a CUDA device, what :mod:`policykit.memory.plan` and
:mod:`policykit.memory.activation_peak` otherwise estimate.

``pre_load`` is what SGLang measures too: free memory after ``empty_cache()``
(docs/incidents.md#kv-pool-sizing). The activation moments are measured by running the very
operations at their real sizes (MLP gate/up with the activation written over the gate half as a
fused kernel would, and the LM head with its float32 copy) and reading the allocator's peak
counter around each one. MoE and attention moments stay estimates.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from policykit.memory.activation_peak import LOGPROB_CHUNK_ROWS, ActivationPeak
from policykit.memory.allocator import AllocatorFacade, AllocatorUnavailable
from policykit.memory.model_shapes import ModelShape
from policykit.memory.watermark import read_watermark


def measure_pre_load(facade: AllocatorFacade) -> int:
    """Free device bytes as the driver reports them, after returning cached segments."""
    facade.empty_cache()
    return facade.mem_get_info()[0]


def _peak_of(facade: AllocatorFacade, run: Callable[[], object]) -> int:
    """Bytes allocated at the peak of ``run()`` above what was allocated before it."""
    base = read_watermark(facade).alloc
    facade.reset_peak_stats()
    result = run()
    peak = read_watermark(facade).max_alloc - base
    del result
    return peak


def measure_activation_peak(
    facade: AllocatorFacade,
    model: ModelShape,
    estimate: ActivationPeak,
    tp: int = 1,
) -> ActivationPeak:
    """``estimate`` with the MLP and logits moments replaced by measured bytes.

    The caller should ``empty_cache()`` afterwards: the test tensors die on return.
    """
    if not facade.is_available():
        raise AllocatorUnavailable(
            "--measure runs the model's widest operations on a CUDA device, and this torch "
            f"build sees none (torch {torch.__version__}); drop --measure to estimate instead."
        )
    dev = torch.device("cuda")
    dtype = {2: torch.bfloat16, 4: torch.float32}.get(model.dtype_bytes, torch.bfloat16)
    t, h, v = estimate.tokens, model.hidden_size, model.vocab_size
    inter = model.intermediate_size // tp

    x = torch.randn(t, h, device=dev, dtype=dtype)
    mlp = 0
    if estimate.mlp:
        w_gate_up = torch.randn(h, 2 * inter, device=dev, dtype=dtype)

        def mlp_moment() -> torch.Tensor:
            gate_up = x @ w_gate_up
            torch.nn.functional.silu(gate_up[:, :inter], inplace=True)
            return gate_up[:, :inter] * gate_up[:, inter:]

        mlp = _peak_of(facade, mlp_moment)
    lm_head = torch.randn(v, h, device=dev, dtype=dtype)

    def logits_moment(rows: int) -> int:
        hidden = x[:rows]
        return _peak_of(facade, lambda: (hidden @ lm_head.T).float())

    return ActivationPeak(
        tokens=t,
        requests=estimate.requests,
        resident=estimate.resident,
        attention=estimate.attention,
        mlp=mlp,
        moe=estimate.moe,
        logits_all=logits_moment(t),
        logits_pruned=logits_moment(estimate.requests),
        logits_pruned_fp32=estimate.requests * v * 4,
        logits_chunked=logits_moment(min(t, LOGPROB_CHUNK_ROWS)),
    )
