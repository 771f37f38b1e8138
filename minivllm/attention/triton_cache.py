"""Write new K/V rows into the paged KV cache: the Triton ``reshape_and_cache`` kernel.

Each layer's cache is two tensors ``[num_blocks, block_size, num_kv_heads, head_dim]``. A
token's *slot* is ``block_id * block_size + offset``; the scheduler hands out slots, and this
kernel only copies: token ``t``'s ``[num_kv_heads, head_dim]`` rows of ``key``/``value`` go to
``k_cache[slot // block_size, slot % block_size]``. Slot ``-1`` means "do not write" (padding).

Grid: one program per token. Each program moves one small ``[num_kv_heads, head_dim]`` tile,
so the kernel is a pure, memory-bound scatter; it is launched once per layer per step.

An 8-bit cache (``torch.int8``, rows of ``head_dim + 4`` bytes, see ``kv_quant.py``) gets its own
kernel, ``_reshape_and_cache_int8_kernel``: per KV head it takes the row's largest magnitude,
``scale = absmax * (1/127)``, stores ``round(x / scale)`` as int8 codes and the scale as the
row's last 4 bytes (through a float32 pointer). It computes exactly what
``kv_quant.quantize_rows`` computes: a correctly rounded division (``div_rn``), round half to
even, the same float32 constant, so the two writers store the same bytes.
"""

from __future__ import annotations

# Importing this module runs ``minivllm/attention/__init__.py`` first, which imports
# ``triton_env`` (TRITON_INTERPRET=1 on machines without CUDA) *before* the ``@triton.jit``
# below is evaluated.
import torch
import triton
import triton.language as tl

from minivllm.attention.kv_quant import INV_QMAX as _INV_QMAX
from minivllm.attention.kv_quant import QMAX as _QMAX
from minivllm.attention.kv_quant import int8_row_width

# globals a kernel reads must be tl.constexpr
QMAX = tl.constexpr(float(_QMAX))
INV_QMAX = tl.constexpr(_INV_QMAX)


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


@triton.jit
def quantize_tile(x):
    """``x [rows, BLOCK_D]`` float32 (padding columns 0) -> ``(codes [rows, BLOCK_D] int8,
    scales [rows] float32)``: ``kv_quant.quantize_rows`` row by row."""
    scale = tl.max(tl.abs(x), axis=1) * INV_QMAX
    divisor = tl.where(scale > 0, scale, 1.0)  # an all-zero row: 0 / 1 = 0
    y = tl.math.div_rn(x, divisor[:, None])
    # round half to even, as torch.round: y - floor(y) is exact for |y| <= 127
    low = tl.floor(y)
    frac = y - low
    low_is_odd = tl.floor(low * 0.5) * 2.0 != low
    up = (frac > 0.5) | ((frac == 0.5) & low_is_odd)
    codes = tl.where(up, low + 1.0, low)
    codes = tl.minimum(tl.maximum(codes, -QMAX), QMAX)
    return codes.to(tl.int8), scale


@triton.jit
def _reshape_and_cache_int8_kernel(
    key_ptr,  # [num_tokens, num_kv_heads, head_dim]
    value_ptr,  # [num_tokens, num_kv_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim + 4] int8
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim + 4] int8
    slot_mapping_ptr,  # [num_tokens] int64, -1 = skip
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_kcb, stride_kcs, stride_kch,  # the rows themselves are contiguous bytes
    stride_vcb, stride_vcs, stride_vch,
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
    heads_to_copy = tl.where(slot >= 0, NUM_KV_HEADS, 0)  # slot -1: nothing (see above)

    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    h_ok = h < heads_to_copy
    mask = h_ok[:, None] & (d[None, :] < HEAD_DIM)
    # masked columns load as 0, so they do not change a row's largest magnitude
    k = tl.load(key_ptr + token * stride_kt + h[:, None] * stride_kh + d[None, :] * stride_kd,
                mask=mask, other=0.0).to(tl.float32)
    v = tl.load(value_ptr + token * stride_vt + h[:, None] * stride_vh + d[None, :] * stride_vd,
                mask=mask, other=0.0).to(tl.float32)
    k_codes, k_scale = quantize_tile(k)
    v_codes, v_scale = quantize_tile(v)
    k_row = k_cache_ptr + block * stride_kcb + offset * stride_kcs + h * stride_kch  # [BLOCK_H]
    v_row = v_cache_ptr + block * stride_vcb + offset * stride_vcs + h * stride_vch
    tl.store(k_row[:, None] + d[None, :], k_codes, mask=mask)
    tl.store(v_row[:, None] + d[None, :], v_codes, mask=mask)
    tl.store((k_row + HEAD_DIM).to(tl.pointer_type(tl.float32)), k_scale, mask=h_ok)
    tl.store((v_row + HEAD_DIM).to(tl.pointer_type(tl.float32)), v_scale, mask=h_ok)


def reshape_and_cache(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64 (-1 = skip)
) -> None:
    """Store token ``t``'s K/V at slot ``slot_mapping[t]`` of the paged cache, in place.

    ``key``/``value`` may be strided views (for example slices of a fused QKV projection);
    they are cast to the cache's dtype, or quantised for an 8-bit cache (``torch.int8``, rows of
    ``head_dim + 4`` bytes: ``kv_quant.py``). Tokens whose slot is ``-1`` are not written.
    """
    num_tokens, num_kv_heads, head_dim = key.shape
    int8 = k_cache.dtype == torch.int8
    if value.shape != key.shape:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} differ")
    if k_cache.shape != v_cache.shape or k_cache.dim() != 4:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} / v_cache {tuple(v_cache.shape)}: expected equal 4-D shapes")
    row = int8_row_width(head_dim) if int8 else head_dim
    if tuple(k_cache.shape[2:]) != (num_kv_heads, row):
        raise ValueError(
            f"cache holds [{k_cache.shape[2]} heads, {k_cache.shape[3]} dims] per token, "
            f"key has [{num_kv_heads}, {head_dim}]" + (f" (an int8 row: {row} bytes)" if int8 else "")
        )
    if v_cache.dtype != k_cache.dtype:
        raise ValueError(f"k_cache ({k_cache.dtype}) and v_cache ({v_cache.dtype}) differ in dtype")
    if int8 and (k_cache.stride(3) != 1 or v_cache.stride(3) != 1):
        raise ValueError("an int8 cache's rows must be contiguous (its scale is written as 4 aligned bytes)")
    if slot_mapping.shape != (num_tokens,):
        raise ValueError(f"slot_mapping {tuple(slot_mapping.shape)} must be [num_tokens={num_tokens}]")
    if num_tokens == 0:
        return
    if int8:
        _reshape_and_cache_int8_kernel[(num_tokens,)](
            key, value, k_cache, v_cache, slot_mapping,
            *key.stride(), *value.stride(), *k_cache.stride()[:3], *v_cache.stride()[:3],
            NUM_KV_HEADS=num_kv_heads,
            HEAD_DIM=head_dim,
            BLOCK_SIZE=k_cache.shape[1],
            BLOCK_H=triton.next_power_of_2(num_kv_heads),
            BLOCK_D=triton.next_power_of_2(head_dim),
        )
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
