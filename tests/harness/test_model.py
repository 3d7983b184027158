"""The decoder over the pool computes what a dense forward computes, and the test can tell when
it does not."""

from __future__ import annotations

import itertools

import pytest
import torch

from policykit.harness.model import Chunk, Decoder
from policykit.harness.presets import PRESETS, get_preset
from policykit.pool import TokenPool

REL = 1e-4


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def run_chunked(model: Decoder, tokens: list[int], cuts: list[int], pool: TokenPool):
    ids = model.token_ids(tokens)
    pages = pool.alloc(-(-len(tokens) // pool.page_size))
    slots = pool.slots(pages, 0, len(tokens))
    bounds = [0, *cuts, len(tokens)]
    out = None
    for start, end in itertools.pairwise(bounds):
        out = model.forward([Chunk(ids[start:end], start, slots[:end], end == len(tokens))], pool)
    return out[0], slots


@pytest.mark.parametrize("cuts", [[], [64], [100, 333], [1, 2, 3, 500]])
def test_chunked_equals_dense(tiny: Decoder, cuts: list[int]) -> None:
    tokens = list(range(7, 7 + 600))
    pool = TokenPool(1024, 64, layout=tiny.layout)
    logits, _ = run_chunked(tiny, tokens, cuts, pool)
    ref = tiny.dense(tiny.token_ids(tokens)).logits
    assert logits.shape == (tiny.preset.vocab,)
    assert rel_err(logits, ref) < REL


def test_pool_holds_the_dense_kv(tiny: Decoder) -> None:
    tokens = list(range(300))
    pool = TokenPool(512, 64, layout=tiny.layout)
    _, slots = run_chunked(tiny, tokens, [128], pool)
    for layer, (k, v) in enumerate(tiny.dense(tiny.token_ids(tokens)).kv):
        assert rel_err(pool.k[layer][slots], k) < REL
        assert rel_err(pool.v[layer][slots], v) < REL


def test_a_corrupted_prefix_slot_changes_the_logits(tiny: Decoder) -> None:
    """The equivalence check is sensitive: the chunk really reads its prefix from the pool."""
    tokens = list(range(400))
    pool = TokenPool(512, 64, layout=tiny.layout)
    ids = tiny.token_ids(tokens)
    slots = pool.slots(pool.alloc(7), 0, 400)
    tiny.forward([Chunk(ids[:300], 0, slots[:300], False)], pool)
    pool.v[0][slots[64:128]] = 0.0  # one page of the prefix lost, as a wrong page table would
    out = tiny.forward([Chunk(ids[300:], 300, slots, True)], pool)[0]
    assert rel_err(out, tiny.dense(ids).logits) > 10 * REL


def test_batched_round_equals_separate_requests(tiny: Decoder) -> None:
    """Varlen batching: several requests in one forward, each attending only to itself."""
    pool = TokenPool(2048, 64, layout=tiny.layout)
    seqs = [list(range(1000 * i, 1000 * i + n)) for i, n in enumerate((130, 257, 64))]
    chunks = []
    for seq in seqs:
        slots = pool.slots(pool.alloc(-(-len(seq) // 64)), 0, len(seq))
        chunks.append(Chunk(tiny.token_ids(seq), 0, slots, True))
    outs = tiny.forward(chunks, pool)
    for seq, out in zip(seqs, outs, strict=True):
        assert rel_err(out, tiny.dense(tiny.token_ids(seq)).logits) < REL


def test_logits_only_for_sampled_chunks(tiny: Decoder) -> None:
    pool = TokenPool(256, 64, layout=tiny.layout)
    slots = pool.slots(pool.alloc(2), 0, 100)
    out = tiny.forward([Chunk(tiny.token_ids(range(100)), 0, slots, False)], pool)
    assert out == [None]


def test_positions_matter(tiny: Decoder) -> None:
    """RoPE is applied: the same last token after a different history gives other logits."""
    a = tiny.dense(tiny.token_ids([1, 2, 3, 4])).logits
    b = tiny.dense(tiny.token_ids([2, 1, 3, 4])).logits
    assert rel_err(a, b) > 1e-3


def test_weights_are_deterministic_per_seed() -> None:
    p = get_preset("tiny")
    ids = torch.arange(20)
    same = Decoder(p, seed=3).dense(ids).logits, Decoder(p, seed=3).dense(ids).logits
    other = Decoder(p, seed=4).dense(ids).logits
    assert torch.equal(*same)
    assert not torch.equal(same[0], other)


def test_presets_have_real_shapes() -> None:
    big = PRESETS["llama3-8b"]
    assert (big.hidden, big.intermediate, big.layers, big.heads, big.kv_heads) == (
        4096,
        14336,
        32,
        32,
        8,
    )
    # Llama-3-8B has ~7.0e9 non-embedding parameters
    assert 6.9e9 < big.matmul_params < 7.1e9
    assert big.kv_bytes_per_token(2) == 131072  # 128 KiB per token in bf16


def test_chunk_flops_adds_up() -> None:
    p = get_preset("llama3-8b")
    whole = p.chunk_flops(0, 8192)
    split = p.chunk_flops(0, 4096) + p.chunk_flops(4096, 8192)
    assert whole == split
    assert p.chunk_flops(0, 1, sampled=1) - p.chunk_flops(0, 1) == 2 * p.hidden * p.vocab


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bf16_cuda_chunked_within_bound() -> None:
    from policykit.harness.gpu_check import BF16_REL_BOUND

    model = Decoder(get_preset("small"), "cuda")
    tokens = list(range(3000))
    pool = TokenPool(4096, 64, device="cuda", layout=model.layout)
    logits, _ = run_chunked(model, tokens, [1024, 2048], pool)
    assert rel_err(logits, model.dense(model.token_ids(tokens)).logits) < BF16_REL_BOUND
