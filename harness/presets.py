"""Named model shapes, and the FLOPs a forward over them costs.

The harness never downloads weights: a preset is only a shape, and the weights are drawn from a
seed. What matters for scheduling is the shape — it fixes the KV bytes per token (so how many
tokens the pool holds) and the FLOPs per token (so how long a round takes).
"""

from __future__ import annotations

from dataclasses import dataclass

from policykit.errors import PolicykitError


@dataclass(frozen=True)
class ModelPreset:
    """Shape of a Llama-style decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU MLP)."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    rope_theta: float = 500_000.0
    norm_eps: float = 1e-5
    summary: str = ""

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV cell size (DESIGN §1, MHA/GQA): ``kv_heads * 2 * head_dim * layers * bytes``."""
        return self.kv_heads * 2 * self.head_dim * self.layers * dtype_bytes

    @property
    def matmul_params(self) -> int:
        """Weights every computed token multiplies through (embedding lookup and lm_head not
        included: the lookup is free and lm_head runs only for sampled positions)."""
        attn = self.hidden * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attn + mlp)

    def chunk_flops(self, start: int, end: int, *, sampled: int = 0) -> int:
        """FLOPs of computing tokens ``[start, end)`` of one sequence.

        ``2 * matmul_params`` per token (a multiply-add is 2 FLOPs), plus attention: a token at
        position ``p`` attends to ``p + 1`` keys, and ``QK^T`` and ``PV`` each cost
        ``2 * heads * head_dim`` FLOPs per key, per layer; plus ``2 * hidden * vocab`` for each
        sampled position's logits. Norms, RoPE, softmax and activations are left out (they are
        well under 1% at these shapes).
        """
        n = end - start
        keys = (start + 1 + end) * n // 2  # sum of (p + 1) for p in [start, end)
        attention = 4 * self.heads * self.head_dim * keys * self.layers
        return 2 * self.matmul_params * n + attention + 2 * self.hidden * self.vocab * sampled


PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset(
            name="tiny",
            hidden=64,
            intermediate=128,
            layers=2,
            heads=4,
            kv_heads=2,
            head_dim=16,
            vocab=512,
            summary="CPU tests and CI: every code path of the real shapes, in milliseconds",
        ),
        ModelPreset(
            name="small",
            hidden=2048,
            intermediate=8192,
            layers=16,
            heads=32,
            kv_heads=8,
            head_dim=64,
            vocab=128_256,
            summary="Llama-3.2-1B-like shapes: a quick GPU run",
        ),
        ModelPreset(
            name="llama-8b",
            hidden=4096,
            intermediate=14_336,
            layers=32,
            heads=32,
            kv_heads=8,
            head_dim=128,
            vocab=128_256,
            summary="8B-class dense (Llama-3-8B shapes): the GPU benchmark",
        ),
    )
}


def get_preset(name: str) -> ModelPreset:
    """The preset called ``name``, or a usage error listing the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise PolicykitError(
            f"There is no model preset named {name!r}. Known presets: "
            f"{', '.join(f'{p.name} ({p.summary})' for p in PRESETS.values())}."
        ) from None
