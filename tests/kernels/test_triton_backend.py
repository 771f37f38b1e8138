"""TritonAttentionBackend against TorchAttentionBackend (and the float64 reference) through the
backend protocol: same metadata, same new K/V, same starting cache."""

from __future__ import annotations

import pytest
import torch
from paged_kv_helpers import (
    DEVICE,
    TOLERANCES,
    PagedBatch,
    random_block_tables,
    reference_attention,
)

from minivllm.attention import AttentionMetadata, TorchAttentionBackend, get_attention_backend
from minivllm.attention.triton_backend import TritonAttentionBackend


def build_step(query_lens, seq_lens, *, num_heads, num_kv_heads, head_dim, block_size, dtype, seed=0, shared=0):
    """Metadata, new Q/K/V and a cache holding every sequence's *context* (finite values).
    ``shared`` leading blocks are common to all sequences; they must hold context only."""
    gen = torch.Generator().manual_seed(seed)
    assert all(s - q >= shared * block_size for q, s in zip(query_lens, seq_lens, strict=True)), "would write a shared block"
    tables, num_blocks = random_block_tables(seq_lens, block_size, gen, shared_prefix_blocks=shared)
    slots = []
    for table, q_len, s_len in zip(tables, query_lens, seq_lens, strict=True):
        slots += [table[p // block_size] * block_size + p % block_size for p in range(s_len - q_len, s_len)]
    meta = AttentionMetadata.build(query_lens, seq_lens, tables, slots, block_size, device=DEVICE)
    t = sum(query_lens)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(DEVICE, dtype)

    q, k, v = randn(t, num_heads, head_dim), randn(t, num_kv_heads, head_dim), randn(t, num_kv_heads, head_dim)
    k_cache = randn(num_blocks, block_size, num_kv_heads, head_dim)
    v_cache = randn(num_blocks, block_size, num_kv_heads, head_dim)
    return meta, q, k, v, k_cache, v_cache


STEPS = {
    # A decode-only step: runs the decode kernel (sequence lengths at block boundaries).
    "decode": (([1, 1, 1, 1], [1, 16, 17, 150]), 0),
    # Prompts, a chunk with context and decode tokens in one step: runs the prefill kernel.
    "mixed": (([7, 1, 16, 1, 20], [7, 33, 48, 1, 60]), 0),
    # Prefix-cache hits: every sequence's first block is the same physical block.
    "shared_prefix": (([5, 1, 20], [21, 40, 36]), 1),
}


@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=lambda d: str(d)[6:])
def test_triton_backend_matches_torch_backend(step, dtype):
    (query_lens, seq_lens), shared = STEPS[step]
    meta, q, k, v, k_cache, v_cache = build_step(
        query_lens, seq_lens, num_heads=4, num_kv_heads=2, head_dim=64, block_size=16, dtype=dtype, shared=shared
    )
    k_torch, v_torch = k_cache.clone(), v_cache.clone()
    out = TritonAttentionBackend().forward(q, k, v, k_cache, v_cache, meta, scale=0.125)
    expected = TorchAttentionBackend().forward(q, k, v, k_torch, v_torch, meta, scale=0.125)

    # Both backends must leave identical caches behind.
    assert torch.equal(k_cache, k_torch) and torch.equal(v_cache, v_torch)
    assert out.dtype == dtype and out.shape == q.shape
    # The torch backend computes in `dtype` too, so allow twice the per-dtype tolerance.
    tol = {name: 2 * value for name, value in TOLERANCES[dtype].items()}
    torch.testing.assert_close(out, expected, **tol)

    # And both against the independent float64 reference on the final cache.
    batch = PagedBatch(q, k_cache, v_cache, meta.block_tables, list(query_lens), list(seq_lens), 0.125)
    torch.testing.assert_close(out.double().cpu(), reference_attention(batch), **TOLERANCES[dtype])


def test_get_attention_backend_returns_triton():
    backend = get_attention_backend("triton")
    assert isinstance(backend, TritonAttentionBackend)
    assert backend.name == "triton"


def test_padding_token_with_slot_minus_one_is_not_cached():
    """A trailing padding token (slot -1) leaves the cache untouched; real tokens still land."""
    meta, q, k, v, k_cache, v_cache = build_step(
        [3], [3], num_heads=2, num_kv_heads=1, head_dim=64, block_size=16, dtype=torch.float32
    )
    before = k_cache.clone()
    meta.slot_mapping[2] = -1
    TritonAttentionBackend().forward(q, k, v, k_cache, v_cache, meta, scale=0.125)
    changed_slots = (k_cache != before).flatten(2).any(-1).flatten().nonzero().flatten().tolist()
    assert sorted(changed_slots) == sorted(meta.slot_mapping[:2].tolist())


def test_rejects_block_size_mismatch():
    meta, q, k, v, k_cache, v_cache = build_step(
        [1], [5], num_heads=2, num_kv_heads=1, head_dim=64, block_size=16, dtype=torch.float32
    )
    meta.block_size = 32
    with pytest.raises(ValueError, match="block size"):
        TritonAttentionBackend().forward(q, k, v, k_cache, v_cache, meta, scale=0.125)
