"""Model shapes: the handful of numbers that decide weight, KV and activation memory.

A :class:`ModelShape` is what the memory planner sizes and what the harness builds a runnable
model from, so both agree on "the 8B dense model". Shapes come from a named preset or from a
Hugging Face ``config.json`` (the usual key names, including DeepSeek's MLA and MoE keys).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from policykit.errors import PolicykitError

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "fp8": 1}


class ModelShapeError(PolicykitError):
    """A model preset does not exist or a config file cannot describe a model."""


@dataclass(frozen=True)
class ModelShape:
    """Decoder-only transformer dimensions (attention MHA/GQA or MLA; MLP dense or MoE)."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    dtype_bytes: int = 2  #: activations and KV cache
    weight_bytes_per_param: float = 2.0
    v_head_dim: int = 0  #: 0: same as ``head_dim``
    tie_word_embeddings: bool = False
    # multi-head latent attention (DeepSeek-V2/V3): 0 means plain MHA/GQA
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    q_lora_rank: int = 0
    # mixture of experts: 0 experts means a dense MLP in every layer
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_experts: int = 0
    first_dense_layers: int = 0  #: leading layers that keep a dense MLP

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def value_head_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    # -- KV cache ----------------------------------------------------------------------------
    def kv_cell_bytes(self, tp: int = 1, pp: int = 1) -> int:
        """KV bytes per token on one rank.

        MHA/GQA: ``kv_heads * (head_dim + v_head_dim) * layers * dtype`` with the KV heads split
        over TP (replicated when there are fewer heads than ranks). MLA caches one compressed
        latent plus the rope key per layer, the same on every TP rank.
        """
        layers = math.ceil(self.num_layers / pp)
        if self.is_mla:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * layers * self.dtype_bytes
        heads = max(1, self.num_kv_heads // tp)
        return heads * (self.head_dim + self.value_head_dim) * layers * self.dtype_bytes

    # -- weights -----------------------------------------------------------------------------
    def attention_params(self) -> int:
        h, nq = self.hidden_size, self.num_attention_heads
        if self.is_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank * nq * qk
            else:
                q = h * nq * qk
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv_b = self.kv_lora_rank * nq * (self.qk_nope_head_dim + self.value_head_dim)
            return q + kv_a + kv_b + nq * self.value_head_dim * h
        q = h * nq * self.head_dim
        kv = h * self.num_kv_heads * (self.head_dim + self.value_head_dim)
        return q + kv + nq * self.value_head_dim * h

    def mlp_params(self, layer: int) -> int:
        h = self.hidden_size
        if not self.is_moe or layer < self.first_dense_layers:
            return 3 * h * self.intermediate_size
        experts = (self.num_experts + self.shared_experts) * 3 * h * self.moe_intermediate_size
        return experts + h * self.num_experts  # + router

    def weight_bytes(self, tp: int = 1, pp: int = 1) -> int:
        """Estimated weight bytes on the fullest rank (embedding and LM head both on it at pp=1).

        Everything is taken as split evenly over TP; norms and small replicated pieces are
        ignored. A measured pre/post-load difference is always better
        (docs/incidents.md#kv-pool-sizing).
        """
        per_stage = math.ceil(self.num_layers / pp)
        layer_params = max(
            sum(self.attention_params() + self.mlp_params(i) for i in range(s, s + per_stage))
            for s in range(0, self.num_layers, per_stage)
        )
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embed
        edge = embed + head if pp == 1 else max(embed, head)
        return int((layer_params + edge) / tp * self.weight_bytes_per_param)

    def param_count(self) -> int:
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embed
        layers = sum(self.attention_params() + self.mlp_params(i) for i in range(self.num_layers))
        return layers + embed + head

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


PRESETS: dict[str, ModelShape] = {
    shape.name: shape
    for shape in (
        # the worked example of docs/incidents.md#runtime-memory: an 8B dense model (the
        # Llama-3-8B shape)
        ModelShape(
            name="llama3-8b",
            hidden_size=4096,
            intermediate_size=14336,
            num_layers=32,
            num_attention_heads=32,
            num_kv_heads=8,
            head_dim=128,
            vocab_size=128256,
        ),
        # a small MLA + MoE model (the DeepSeek-V2-Lite shape)
        ModelShape(
            name="deepseek-v2-lite",
            hidden_size=2048,
            intermediate_size=10944,
            num_layers=27,
            num_attention_heads=16,
            num_kv_heads=16,
            head_dim=192,
            v_head_dim=128,
            vocab_size=102400,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            qk_nope_head_dim=128,
            num_experts=64,
            experts_per_token=6,
            moe_intermediate_size=1408,
            shared_experts=2,
            first_dense_layers=1,
        ),
        # a large MLA + MoE model, the class of docs/incidents.md#allocator-fragmentation
        # (DeepSeek-V3 shape, FP8 weights)
        ModelShape(
            name="deepseek-v3",
            hidden_size=7168,
            intermediate_size=18432,
            num_layers=61,
            num_attention_heads=128,
            num_kv_heads=128,
            head_dim=192,
            v_head_dim=128,
            vocab_size=129280,
            weight_bytes_per_param=1.0,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            qk_nope_head_dim=128,
            q_lora_rank=1536,
            num_experts=256,
            experts_per_token=8,
            moe_intermediate_size=2048,
            shared_experts=1,
            first_dense_layers=3,
        ),
        # the harness's CPU model: every code path of the real shapes, in milliseconds
        ModelShape(
            name="tiny",
            hidden_size=64,
            intermediate_size=128,
            num_layers=2,
            num_attention_heads=4,
            num_kv_heads=2,
            head_dim=16,
            vocab_size=512,
        ),
        # Llama-3.2-1B-like shapes: a quick GPU run of the harness
        ModelShape(
            name="small",
            hidden_size=2048,
            intermediate_size=8192,
            num_layers=16,
            num_attention_heads=32,
            num_kv_heads=8,
            head_dim=64,
            vocab_size=128256,
        ),
        # small enough to run a real forward on a CPU in tests and harness dry runs
        ModelShape(
            name="tiny-dense",
            hidden_size=256,
            intermediate_size=704,
            num_layers=4,
            num_attention_heads=4,
            num_kv_heads=2,
            head_dim=64,
            vocab_size=4096,
        ),
    )
}


def _from_hf_config(cfg: dict[str, Any], name: str) -> ModelShape:
    """Map the usual Hugging Face ``config.json`` keys onto a :class:`ModelShape`."""
    try:
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        if hidden <= 0 or heads <= 0:
            raise ModelShapeError(
                f"The model config {name!r} needs a positive hidden_size and "
                f"num_attention_heads; got {hidden} and {heads}."
            )
        kv_lora = int(cfg.get("kv_lora_rank") or 0)
        nope = int(cfg.get("qk_nope_head_dim") or 0)
        rope = int(cfg.get("qk_rope_head_dim") or 0)
        head_dim = int(cfg.get("head_dim") or (nope + rope if kv_lora else hidden // heads))
        dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
        experts = int(
            cfg.get("n_routed_experts")
            or cfg.get("num_experts")
            or cfg.get("num_local_experts")
            or 0
        )
        return ModelShape(
            name=name,
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_attention_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            vocab_size=int(cfg["vocab_size"]),
            dtype_bytes=DTYPE_BYTES.get(dtype, 2),
            weight_bytes_per_param=float(DTYPE_BYTES.get(dtype, 2)),
            v_head_dim=int(cfg.get("v_head_dim") or 0),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            kv_lora_rank=kv_lora,
            qk_rope_head_dim=rope,
            qk_nope_head_dim=nope,
            q_lora_rank=int(cfg.get("q_lora_rank") or 0),
            num_experts=experts,
            experts_per_token=int(cfg.get("num_experts_per_tok") or 0),
            moe_intermediate_size=int(cfg.get("moe_intermediate_size") or 0),
            shared_experts=int(cfg.get("n_shared_experts") or 0),
            first_dense_layers=int(cfg.get("first_k_dense_replace") or 0),
        )
    except KeyError as exc:
        raise ModelShapeError(
            f"The model config {name!r} has no {exc.args[0]!r}; a config.json needs at least "
            "hidden_size, intermediate_size, num_hidden_layers, num_attention_heads and "
            "vocab_size."
        ) from None
    except (TypeError, ValueError) as exc:
        raise ModelShapeError(
            f"The model config {name!r} has a value of the wrong type: {exc}."
        ) from None


def load_model_shape(spec: str) -> ModelShape:
    """A preset name, or the path of a Hugging Face style ``config.json``."""
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if not path.is_file():
        raise ModelShapeError(
            f"{spec!r} is neither a model preset ({', '.join(sorted(PRESETS))}) nor a readable "
            "config.json file."
        )
    try:
        cfg = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelShapeError(f"The model config {spec!r} is not valid JSON: {exc}.") from None
    if not isinstance(cfg, dict):
        raise ModelShapeError(f"The model config {spec!r} must hold a JSON object.")
    shape = _from_hf_config(cfg, path.stem if path.stem != "config" else path.parent.name)
    bad = [
        f.name
        for f in fields(shape)
        if f.name
        in (
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_attention_heads",
            "num_kv_heads",
            "head_dim",
            "vocab_size",
        )
        and getattr(shape, f.name) <= 0
    ]
    if bad:
        raise ModelShapeError(f"The model config {spec!r} has non-positive {', '.join(bad)}.")
    return shape
