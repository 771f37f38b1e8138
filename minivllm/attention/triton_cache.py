"""Write new K/V rows into the paged KV cache: the Triton ``reshape_and_cache`` kernel.

Each layer's cache is two tensors ``[num_blocks, block_size, num_kv_heads, head_dim]``. A
token's *slot* is ``block_id * block_size + offset``; the scheduler hands out slots, and this
kernel only copies: token ``t``'s ``[num_kv_heads, head_dim]`` rows of ``key``/``value`` go to
``k_cache[slot // block_size, slot % block_size]``. Slot ``-1`` means "do not write" (padding).

Grid: one program per token. Each program moves one small ``[num_kv_heads, head_dim]`` tile,
so the kernel is a pure, memory-bound scatter; it is launched once per layer per step.
"""

from __future__ import annotations

# Importing this module runs ``minivllm/attention/__init__.py`` first, which imports
# ``triton_env`` (TRITON_INTERPRET=1 on machines without CUDA) *before* the ``@triton.jit``
# below is evaluated.
import torch
import triton
import triton.language as tl


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr,  # [num_tokens, num_kv_heads, head_dim]
    value_ptr,  # [num_tokens, num_kv_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping_ptr,  # [num_tokens] int64, -1 = skip
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_kcb, stride_kcs, stride_kch, stride_kcd,
    stride_vcb, stride_vcs, stride_vch, stride_vcd,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    BLOCK_H: tl.constexpr,  # next power of two >= NUM_KV_HEADS
    BLOCK_D: tl.constexpr,  # next power of two >= HEAD_DIM
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    # Slot -1 (padding) is skipped by masking every load and store: such a token has zero
    # heads to copy. (Written as a head count rather than ``(slot >= 0) & mask`` because the
    # triton 3.9 interpreter turns ``scalar_bool & block_bool`` into an int32 mask that
    # tl.load rejects; see docs/triton_kernels.md.)
    heads_to_copy = tl.where(slot >= 0, NUM_KV_HEADS, 0)

    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (h[:, None] < heads_to_copy) & (d[None, :] < HEAD_DIM)

    k = tl.load(key_ptr + token * stride_kt + h[:, None] * stride_kh + d[None, :] * stride_kd, mask=mask)
    v = tl.load(value_ptr + token * stride_vt + h[:, None] * stride_vh + d[None, :] * stride_vd, mask=mask)
    k_dst = k_cache_ptr + block * stride_kcb + offset * stride_kcs + h[:, None] * stride_kch + d[None, :] * stride_kcd
    v_dst = v_cache_ptr + block * stride_vcb + offset * stride_vcs + h[:, None] * stride_vch + d[None, :] * stride_vcd
    tl.store(k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def reshape_and_cache(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64 (-1 = skip)
) -> None:
    """Store token ``t``'s K/V at slot ``slot_mapping[t]`` of the paged cache, in place.

    ``key``/``value`` may be strided views (for example slices of a fused QKV projection);
    they are cast to the cache's dtype. Tokens whose slot is ``-1`` are not written.
    """
    num_tokens, num_kv_heads, head_dim = key.shape
    if value.shape != key.shape:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} differ")
    if k_cache.shape != v_cache.shape or k_cache.dim() != 4:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} / v_cache {tuple(v_cache.shape)}: expected equal 4-D shapes")
    if tuple(k_cache.shape[2:]) != (num_kv_heads, head_dim):
        raise ValueError(
            f"cache holds [{k_cache.shape[2]} heads, {k_cache.shape[3]} dims] per token, "
            f"key has [{num_kv_heads}, {head_dim}]"
        )
    if slot_mapping.shape != (num_tokens,):
        raise ValueError(f"slot_mapping {tuple(slot_mapping.shape)} must be [num_tokens={num_tokens}]")
    if num_tokens == 0:
        return
    _reshape_and_cache_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        *key.stride(), *value.stride(), *k_cache.stride(), *v_cache.stride(),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=k_cache.shape[1],
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
    )
