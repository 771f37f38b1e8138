"""reshape_and_cache: every token lands at its slot, slot -1 writes nothing, nothing else moves."""

from __future__ import annotations

import pytest
import torch

from minivllm.attention.cache_ops import write_kv_to_cache
from minivllm.attention.testing import DEFAULT_DEVICE as DEVICE
from minivllm.attention.triton_kernels import reshape_and_cache

SENTINEL = -7.0


def empty_cache(num_blocks, block_size, num_kv_heads, head_dim, dtype):
    return torch.full((num_blocks, block_size, num_kv_heads, head_dim), SENTINEL, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize(
    "dtype,block_size,num_kv_heads,head_dim",
    [
        (torch.float32, 16, 2, 64),
        (torch.float16, 32, 1, 80),  # head_dim not a power of two
        (torch.bfloat16, 64, 8, 128),
        (torch.float32, 16, 3, 96),  # head count not a power of two
    ],
)
def test_writes_each_token_to_its_slot(dtype, block_size, num_kv_heads, head_dim):
    gen = torch.Generator().manual_seed(block_size)
    num_blocks, num_tokens = 6, 23
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[3, 11, 12]] = -1  # padding tokens
    key = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    value = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    k_cache = empty_cache(num_blocks, block_size, num_kv_heads, head_dim, dtype)
    v_cache = empty_cache(num_blocks, block_size, num_kv_heads, head_dim, dtype)

    reshape_and_cache(key.to(DEVICE), value.to(DEVICE), k_cache, v_cache, slots.to(DEVICE))

    expected_k = empty_cache(num_blocks, block_size, num_kv_heads, head_dim, dtype)
    expected_v = empty_cache(num_blocks, block_size, num_kv_heads, head_dim, dtype)
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            expected_k[slot // block_size, slot % block_size] = key[t].to(DEVICE)
            expected_v[slot // block_size, slot % block_size] = value[t].to(DEVICE)
    assert torch.equal(k_cache, expected_k)
    assert torch.equal(v_cache, expected_v)
    # The padding tokens' rows went nowhere: exactly num_tokens - 3 slots were written.
    written = (k_cache != SENTINEL).any(dim=-1).any(dim=-1).sum().item()
    assert written == num_tokens - 3


def test_matches_torch_reference_writer():
    gen = torch.Generator().manual_seed(0)
    key = torch.randn(10, 2, 64, generator=gen).to(DEVICE)
    value = torch.randn(10, 2, 64, generator=gen).to(DEVICE)
    slots = torch.tensor([5, 6, 7, -1, 40, 41, 0, 63, 16, 17], device=DEVICE)
    a = [empty_cache(4, 16, 2, 64, torch.float32) for _ in range(2)]
    b = [empty_cache(4, 16, 2, 64, torch.float32) for _ in range(2)]
    reshape_and_cache(key, value, *a, slots)
    write_kv_to_cache(key, value, *b, slots)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_strided_views_and_dtype_cast():
    """K/V as column slices of a fused QKV output (non-contiguous), written into an fp16 cache."""
    gen = torch.Generator().manual_seed(1)
    num_tokens, heads, kv_heads, d = 9, 4, 2, 64
    qkv = torch.randn(num_tokens, (heads + 2 * kv_heads) * d, generator=gen).to(DEVICE)
    key = qkv[:, heads * d : (heads + kv_heads) * d].view(num_tokens, kv_heads, d)
    value = qkv[:, (heads + kv_heads) * d :].view(num_tokens, kv_heads, d)
    assert not key.is_contiguous()
    slots = torch.arange(num_tokens, device=DEVICE) * 3
    k_cache = empty_cache(2, 16, kv_heads, d, torch.float16)
    v_cache = empty_cache(2, 16, kv_heads, d, torch.float16)
    reshape_and_cache(key, value, k_cache, v_cache, slots)
    flat_k = k_cache.view(32, kv_heads, d)
    flat_v = v_cache.view(32, kv_heads, d)
    assert torch.equal(flat_k[slots], key.half())
    assert torch.equal(flat_v[slots], value.half())


def test_all_padding_writes_nothing():
    k_cache = empty_cache(2, 16, 1, 64, torch.float32)
    v_cache = empty_cache(2, 16, 1, 64, torch.float32)
    x = torch.ones(4, 1, 64, device=DEVICE)
    reshape_and_cache(x, x, k_cache, v_cache, torch.full((4,), -1, device=DEVICE))
    assert (k_cache == SENTINEL).all() and (v_cache == SENTINEL).all()


def test_rejects_mismatched_shapes():
    k_cache = empty_cache(2, 16, 2, 64, torch.float32)
    with pytest.raises(ValueError):
        reshape_and_cache(torch.ones(3, 1, 64), torch.ones(3, 1, 64), k_cache, k_cache.clone(), torch.arange(3))
    with pytest.raises(ValueError):
        reshape_and_cache(torch.ones(3, 2, 64), torch.ones(3, 2, 64), k_cache, k_cache.clone(), torch.arange(4))
