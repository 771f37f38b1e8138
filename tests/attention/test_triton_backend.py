"""TritonAttentionBackend against TorchAttentionBackend (and float64 SDPA) through the backend
protocol: same metadata, same new K/V, same starting cache, every unowned slot NaN."""

from __future__ import annotations

import pytest
import torch

from minivllm.attention import TorchAttentionBackend, get_attention_backend
from minivllm.attention.testing import (
    TOLERANCES,
    Seq,
    assert_cache_matches,
    assert_matches_reference,
    make_paged_problem,
)
from minivllm.attention.triton_backend import TritonAttentionBackend

STEPS = {
    # A decode-only step: runs the decode kernel (sequence lengths at block boundaries).
    "decode": ([Seq(1, 0), Seq(1, 15), Seq(1, 16), Seq(1, 149)], None),
    # Prompts, a chunk with context and decode tokens in one step: runs the prefill kernel.
    "mixed": ([Seq(7), Seq(1, 32), Seq(16, 32), Seq(1, 0), Seq(20, 40)], None),
    # Prefix-cache hits: every sequence's first block is the same physical block.
    "shared_prefix": ([Seq(5, 16), Seq(1, 39), Seq(20, 16)], {1: (0, 1), 2: (0, 1)}),
}


@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=lambda d: str(d)[6:])
def test_triton_backend_matches_torch_backend(step, dtype):
    seqs, share = STEPS[step]
    problem = make_paged_problem(seqs, num_heads=4, num_kv_heads=2, head_dim=64, block_size=16, dtype=dtype,
                                 share=share, scale=0.125)
    k_triton, v_triton = problem.caches()
    k_torch, v_torch = problem.caches()
    args = (problem.query, problem.key, problem.value)
    out = TritonAttentionBackend().forward(*args, k_triton, v_triton, problem.meta, problem.scale)
    expected = TorchAttentionBackend().forward(*args, k_torch, v_torch, problem.meta, problem.scale)

    # Both backends must leave identical caches behind: the new K/V, nothing else.
    for name, cache in [("triton k", k_triton), ("torch k", k_torch)]:
        assert_cache_matches(cache, problem.k_cache_after, name)
    for name, cache in [("triton v", v_triton), ("torch v", v_torch)]:
        assert_cache_matches(cache, problem.v_cache_after, name)
    assert out.dtype == dtype and out.shape == problem.query.shape
    # The torch backend computes in `dtype` too, so allow twice the per-dtype tolerance.
    tol = {name: 2 * value for name, value in TOLERANCES[dtype].items()}
    torch.testing.assert_close(out, expected, **tol)
    # And both against the float64 reference on the contiguous tensors.
    assert_matches_reference(out, problem)
    assert_matches_reference(expected, problem)


def test_get_attention_backend_returns_triton():
    backend = get_attention_backend("triton")
    assert isinstance(backend, TritonAttentionBackend)
    assert backend.name == "triton"


def test_padding_token_with_slot_minus_one_is_not_cached():
    """A trailing padding token (slot -1) leaves the cache untouched; real tokens still land."""
    problem = make_paged_problem([Seq(new=2, pad=1)], num_heads=2, num_kv_heads=1, head_dim=64, block_size=16,
                                 dtype=torch.float32)
    assert problem.meta.slot_mapping.tolist()[2] == -1
    k_cache, v_cache = problem.caches()
    TritonAttentionBackend().forward(problem.query, problem.key, problem.value, k_cache, v_cache, problem.meta,
                                     problem.scale)
    assert_cache_matches(k_cache, problem.k_cache_after, "k_cache")
    assert_cache_matches(v_cache, problem.v_cache_after, "v_cache")


def test_rejects_block_size_mismatch():
    problem = make_paged_problem([Seq(1, 4)], num_heads=2, num_kv_heads=1, head_dim=64, block_size=16,
                                 dtype=torch.float32)
    problem.meta.block_size = 32
    k_cache, v_cache = problem.caches()
    with pytest.raises(ValueError, match="block size"):
        TritonAttentionBackend().forward(problem.query, problem.key, problem.value, k_cache, v_cache, problem.meta,
                                         problem.scale)
