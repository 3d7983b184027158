"""Named model shapes, and the FLOPs a forward over them costs.

The harness never downloads weights: a preset is only a shape, and the weights are drawn from a
seed. What matters for scheduling is the shape — it fixes the KV bytes per token (so how many
tokens the pool holds) and the FLOPs per token (so how long a round takes).
"""

from __future__ import annotations

from dataclasses import dataclass

from policykit.errors import PolicykitError
from policykit.memory.model_shapes import PRESETS as SHAPES
from policykit.memory.model_shapes import ModelShape


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

    @classmethod
    def from_shape(cls, shape: ModelShape) -> ModelPreset:
        """The runnable decoder of a dense GQA
        :class:`~policykit.memory.model_shapes.ModelShape`, so the harness and the memory planner
        agree on what a preset name means."""
        return cls(
            name=shape.name,
            hidden=shape.hidden_size,
            intermediate=shape.intermediate_size,
            layers=shape.num_layers,
            heads=shape.num_attention_heads,
            kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            vocab=shape.vocab_size,
        )


#: every dense, GQA model shape the memory planner knows (MLA and MoE shapes are not runnable)
PRESETS: dict[str, ModelPreset] = {
    name: ModelPreset.from_shape(shape)
    for name, shape in SHAPES.items()
    if not shape.is_mla and not shape.is_moe and shape.v_head_dim in (0, shape.head_dim)
}


def get_preset(name: str) -> ModelPreset:
    """The preset called ``name``, or a usage error listing the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise PolicykitError(
            f"There is no model preset named {name!r}. Known presets: {', '.join(PRESETS)}."
        ) from None
