"""A Llama-style decoder in plain torch whose KV cache is the scheduler's token pool.

Why a real model in a scheduling project: a policy may only change *when* tokens are computed,
never *what*. That claim is only testable if chunked, prefix-hit and loaded-back requests run
through real attention over the very slots the pool handed out, and come out with the logits a
dense, unchunked forward gives. Weights are random (drawn from a seed), so nothing is
downloaded and the FLOPs and bytes are those of the real shape.

One forward runs every chunk of a round together (varlen batching): the projections and the MLP
see all the round's tokens as one matrix, attention runs per request over its prefix (read from
the pool by slot index) plus its own chunk (written into the pool first).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from policykit.harness.presets import ModelPreset
from policykit.pool import KVLayout, TokenPool

#: token ids in policykit are arbitrary ints (workloads make them unique per prefix group); the
#: model sees them folded into its vocabulary by a fixed multiplicative hash
_FOLD_PRIME = 1_000_003
_FOLD_MULT = 2_654_435_761

#: per layer (k, v), each ``[tokens, kv_heads, head_dim]``
LayerKV = list[tuple[torch.Tensor, torch.Tensor]]


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 where the tensor cores are, fp32 on the CPU (exact enough for the 1e-4 test)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


@dataclass(frozen=True)
class Chunk:
    """One request's share of a round: tokens ``[start, start + len(ids))``.

    ``slots`` are the pool slots of positions ``[0, end)``: the prefix is read from them and the
    chunk's own K/V are written into ``slots[start:]``.
    """

    ids: torch.Tensor
    start: int
    slots: torch.Tensor
    sample: bool

    @property
    def end(self) -> int:
        return self.start + int(self.ids.numel())


@dataclass(frozen=True)
class DenseOutput:
    logits: torch.Tensor  # [vocab], fp32, at the last position
    kv: LayerKV


class _Layer:
    __slots__ = ("attn_norm", "down", "gate_up", "mlp_norm", "o", "qkv")

    def __init__(self, p: ModelPreset, make: Callable[..., torch.Tensor]) -> None:
        residual_scale = (2 * p.layers) ** -0.5  # keeps the residual stream O(1) at any depth
        self.attn_norm = make(p.hidden, norm=True)
        self.qkv = make(p.q_dim + 2 * p.kv_dim, p.hidden)
        self.o = make(p.hidden, p.q_dim, scale=residual_scale)
        self.mlp_norm = make(p.hidden, norm=True)
        self.gate_up = make(2 * p.intermediate, p.hidden)
        self.down = make(p.hidden, p.intermediate, scale=residual_scale)


class Decoder:
    """Random-weight Llama-style decoder of a given :class:`ModelPreset`."""

    def __init__(
        self,
        preset: ModelPreset,
        device: str | torch.device = "cpu",
        *,
        dtype: torch.dtype | None = None,
        seed: int = 0,
    ) -> None:
        self.preset = preset
        self.device = torch.device(device)
        self.dtype = dtype or default_dtype(self.device)
        gen = torch.Generator(device=self.device).manual_seed(seed)

        def make(rows: int, cols: int = 0, *, norm: bool = False, scale: float = 1.0):
            if norm:  # RMSNorm gains near 1, not exactly 1, so a wrong norm shows in the logits
                w = 1.0 + 0.1 * torch.randn(rows, generator=gen, device=self.device)
            else:
                w = torch.randn(rows, cols, generator=gen, device=self.device)
                w.mul_(scale * cols**-0.5)
            return w.to(self.dtype)

        p = preset
        self.embed = torch.randn(p.vocab, p.hidden, generator=gen, device=self.device).to(
            self.dtype
        )
        self.layers = [_Layer(p, make) for _ in range(p.layers)]
        self.final_norm = make(p.hidden, norm=True)
        self.lm_head = make(p.vocab, p.hidden)
        half = p.head_dim // 2
        exponent = torch.arange(half, device=self.device, dtype=torch.float64) / half
        self._inv_freq = (p.rope_theta**-exponent).to(torch.float32)

    @property
    def layout(self) -> KVLayout:
        """What the pool must store per token slot for this model."""
        p = self.preset
        return KVLayout(layers=p.layers, kv_heads=p.kv_heads, head_dim=p.head_dim, dtype=self.dtype)

    def token_ids(self, tokens: Sequence[int]) -> torch.Tensor:
        """Fold policykit token ids (any non-negative ints) into the vocabulary."""
        t = torch.tensor(tokens, dtype=torch.int64)
        return ((t % _FOLD_PRIME) * _FOLD_MULT % self.preset.vocab).to(self.device)

    # -- building blocks -------------------------------------------------------------------
    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.preset.norm_eps)
        return xf.to(x.dtype) * weight

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate-half RoPE on ``[tokens, heads, head_dim]`` (cos/sin: ``[tokens, 1, half]``)."""
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    def _angles(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.to(torch.float32)[:, None] * self._inv_freq[None, :]
        return freqs.cos()[:, None, :], freqs.sin()[:, None, :]

    def _run(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        attend: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """The decoder stack over ``ids``; ``attend(layer, q, k, v)`` owns where KV lives."""
        p = self.preset
        cos, sin = self._angles(positions)
        x = self.embed[ids]
        n = ids.numel()
        for index, layer in enumerate(self.layers):
            h = self._rms(x, layer.attn_norm)
            q, k, v = (h @ layer.qkv.T).split([p.q_dim, p.kv_dim, p.kv_dim], dim=-1)
            q = self._rope(q.view(n, p.heads, p.head_dim), cos, sin)
            k = self._rope(k.view(n, p.kv_heads, p.head_dim), cos, sin)
            v = v.reshape(n, p.kv_heads, p.head_dim)
            x = x + attend(index, q, k, v).reshape(n, p.q_dim) @ layer.o.T
            h = self._rms(x, layer.mlp_norm)
            gate, up = (h @ layer.gate_up.T).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ layer.down.T
        return x

    def _logits(self, rows: torch.Tensor) -> torch.Tensor:
        return (self._rms(rows, self.final_norm) @ self.lm_head.T).float()

    # -- the two forwards ------------------------------------------------------------------
    @torch.inference_mode()
    def dense(self, ids: torch.Tensor) -> DenseOutput:
        """Unchunked forward of one whole prompt: the reference for the logits test, and the
        source of real KV for prefixes a workload places in the cache or the host tier."""
        kv: LayerKV = []

        def attend(_: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            kv.append((k, v))
            return _attention(q, k, v)

        positions = torch.arange(ids.numel(), device=self.device)
        x = self._run(ids, positions, attend)
        return DenseOutput(self._logits(x[-1:])[0], kv)

    @torch.inference_mode()
    def forward(self, chunks: Sequence[Chunk], pool: TokenPool) -> list[torch.Tensor | None]:
        """One round: every chunk in one pass, KV read from and written to ``pool``.

        Returns, per chunk, the fp32 logits of its last position when ``chunk.sample`` (the
        request's final chunk), else ``None``: no logits for positions nobody samples
        (docs/incidents.md#runtime-memory).
        """
        ids = torch.cat([c.ids for c in chunks])
        positions = torch.cat([torch.arange(c.start, c.end, device=self.device) for c in chunks])
        write = torch.cat([c.slots[c.start :] for c in chunks])
        bounds = []
        offset = 0
        for c in chunks:
            bounds.append((offset, offset + c.end - c.start))
            offset = bounds[-1][1]

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            pool.k[layer][write] = k
            pool.v[layer][write] = v
            out = torch.empty_like(q)
            for c, (lo, hi) in zip(chunks, bounds, strict=True):
                if c.start == 0:  # no prefix: the chunk's own K/V are all there is
                    ck, cv = k[lo:hi], v[lo:hi]
                else:
                    ck, cv = pool.k[layer][c.slots], pool.v[layer][c.slots]
                out[lo:hi] = _attention(q[lo:hi], ck, cv)
            return out

        x = self._run(ids, positions, attend)
        last = [hi - 1 for c, (_, hi) in zip(chunks, bounds, strict=True) if c.sample]
        logits = iter(self._logits(x[last]) if last else ())
        return [next(logits) if c.sample else None for c in chunks]


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal GQA attention of ``q`` (the last ``len(q)`` positions) over ``k``/``v``.

    ``causal_lower_right`` aligns the causal mask to the end of the keys, which is what a chunk
    after a prefix needs, and still dispatches to flash attention where the device has it.
    """
    n, ctx = q.shape[0], k.shape[0]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        k.transpose(0, 1)[None],
        v.transpose(0, 1)[None],
        attn_mask=causal_lower_right(n, ctx),
        enable_gqa=True,
    )
    return out[0].transpose(0, 1)
