"""The activation peak of one forward: what is alive at the worst moment, not the sum
(docs/incidents.md#runtime-memory).

A forward runs layer by layer and each layer's temporaries go back to the caching allocator
before the next layer reuses them. So the peak is the widest moment inside one layer, plus the
hidden state and residual that live across layers, or the logits moment at the end, whichever
is larger. Every term is proportional to the tokens of one forward, which is why
``chunked_prefill_size`` caps it regardless of prompt length.

The moments counted:

* dense MLP: the gate/up output ``[T, 2I]`` and the activated ``[T, I]`` are alive together;
* MoE (fused kernel): ``T * topk`` rows of width ``2I`` (intermediate_cache1) and ``I``
  (intermediate_cache2);
* attention: the projected q/k/v plus the attention output;
* logits: the LM head writes model-dtype logits and a float32 copy of them exists briefly, so
  ``dtype + 4`` bytes per vocab entry per row. Rows are every position when input logprobs are
  asked for without chunking, the chunk size (2048 by default) with chunked logprobs, and one
  per request otherwise (the hidden states are pruned before the LM head).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policykit.memory.model_shapes import ModelShape

#: SGLang's ``SGLANG_LOGPROB_CHUNK_SIZE`` default
LOGPROB_CHUNK_ROWS = 2048
FP32 = 4


@dataclass(frozen=True)
class ActivationPeak:
    """Bytes of each moment of one forward of ``tokens`` tokens on one TP rank."""

    tokens: int
    requests: int
    resident: int  #: hidden state + residual, alive across layers
    attention: int
    mlp: int  #: the dense MLP moment (0 when every layer is MoE)
    moe: int
    logits_all: int  #: every position: model dtype + FP32 copy
    logits_pruned: int  #: one row per request: model dtype + FP32 copy
    logits_pruned_fp32: int  #: just the FP32 rows (the figure docs/incidents.md quotes)
    logits_chunked: int  #: input logprobs computed in chunks of LOGPROB_CHUNK_ROWS rows

    @property
    def widest_layer(self) -> int:
        return max(self.attention, self.mlp, self.moe)

    def peak(self, logits: int) -> int:
        """The forward's peak with the given logits moment."""
        return self.resident + max(self.widest_layer, logits)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "requests": self.requests,
            "resident_bytes": self.resident,
            "attention_bytes": self.attention,
            "mlp_bytes": self.mlp,
            "moe_bytes": self.moe,
            "widest_layer_bytes": self.widest_layer,
            "logits_all_positions_bytes": self.logits_all,
            "logits_pruned_bytes": self.logits_pruned,
            "logits_pruned_fp32_bytes": self.logits_pruned_fp32,
            "logits_chunked_logprobs_bytes": self.logits_chunked,
            "peak_pruned_bytes": self.peak(self.logits_pruned),
            "peak_chunked_logprobs_bytes": self.peak(self.logits_chunked),
            "peak_all_logits_bytes": self.peak(self.logits_all),
        }


def activation_peak(model: ModelShape, tokens: int, requests: int, tp: int = 1) -> ActivationPeak:
    """Estimate the moments of one forward of ``tokens`` tokens from ``requests`` requests."""
    m, d = model, model.dtype_bytes
    h, v = m.hidden_size, m.vocab_size
    requests = max(1, min(requests, tokens))
    if m.is_mla:
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        width = m.num_attention_heads * (qk + m.qk_nope_head_dim + 2 * m.value_head_dim)
    else:
        width = (m.num_attention_heads * 2 + m.num_kv_heads * 2) * m.head_dim
    attention = tokens * width // tp * d
    dense_layers = m.num_layers if not m.is_moe else m.first_dense_layers
    mlp = tokens * 3 * m.intermediate_size // tp * d if dense_layers else 0
    moe = tokens * m.experts_per_token * 3 * m.moe_intermediate_size // tp * d if m.is_moe else 0
    row = v * (d + FP32)
    return ActivationPeak(
        tokens=tokens,
        requests=requests,
        resident=2 * tokens * h * d,
        attention=attention,
        mlp=mlp,
        moe=moe,
        logits_all=tokens * row,
        logits_pruned=requests * row,
        logits_pruned_fp32=requests * v * FP32,
        logits_chunked=min(tokens, LOGPROB_CHUNK_ROWS) * row,
    )
