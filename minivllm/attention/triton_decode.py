"""PagedAttention for decode in Triton: one new token per sequence, K/V read through block tables.

The problem. Sequence ``i`` has one query token ``q[i]`` (``[num_heads, head_dim]``) and
``seq_lens[i]`` cached tokens spread over physical blocks ``block_tables[i, 0..]``. We want
``softmax(q K^T * scale) V`` over those tokens without ever gathering them into one tensor.

Grid and work split. One program per ``(sequence, kv_head)``. With grouped-query attention
(GQA) ``num_heads // num_kv_heads`` query heads share one K/V head, so the program loads that
group's queries as the rows of a small matrix ``[GROUP_PAD, head_dim]`` and reads every K/V
block once for all of them. ``GROUP_PAD`` is the group size rounded up to a power of two and to
at least 16, the smallest ``tl.dot`` tile older Triton releases accept on a GPU (3.9 pads small
tiles itself); padded rows are zeros and are never stored.

Online softmax. The program walks its sequence's blocks in order, keeping per query row a
running maximum ``m``, a running denominator ``denom = sum(exp(s - m))`` and an unnormalised output
``acc = sum(exp(s - m) v)``. When a block raises the maximum from ``m`` to ``m'``, everything
accumulated so far was scaled by ``exp(-m)`` and must now be scaled by ``exp(-m')``, so ``denom``
and ``acc`` are multiplied by ``alpha = exp(m - m')`` before the block's terms are added. After
the last block ``acc / denom`` is exactly the softmax-weighted sum, computed in one pass with O(1)
extra memory per row. Scores and accumulators are fp32 whatever the input dtype.

Split-KV ("flash-decoding"). With few sequences and long contexts the grid above has too few
programs to fill a GPU (batch 1 x 8 KV heads = 8 programs for ~100+ SMs), and each one walks a
long chain of blocks. The split variant adds a third grid axis: split ``s`` of ``num_splits``
covers a contiguous range of the sequence's blocks and writes its normalised partial output
``o_s`` and its log-sum-exp ``lse_s = m_s + log(l_s)``. A second small kernel merges them:
``out = sum_s exp(lse_s - M) o_s / sum_s exp(lse_s - M)`` with ``M = max_s lse_s``, which is the
same softmax over all blocks, re-weighted by each split's share of the total mass.
"""

from __future__ import annotations

# Importing this module runs ``minivllm/attention/__init__.py`` first, which imports
# ``triton_env`` (TRITON_INTERPRET=1 on machines without CUDA) *before* any ``@triton.jit``
# below is evaluated.
import torch
import triton
import triton.language as tl

from minivllm.attention.kv_quant import SCALE_BYTES, int8_row_width
from minivllm.attention.triton_env import triton_mode

# Split-KV heuristic (see ``choose_num_splits``). A GPU has on the order of 100 streaming
# multiprocessors (T4: 40, A100: 108, H100/H200: 132); we aim for a few programs per SM.
TARGET_PROGRAMS = 256
MIN_BLOCKS_PER_SPLIT = 8  # below this a split's fixed cost outweighs the parallelism it adds
MAX_SPLITS = 32


def dot_settings(dtype: torch.dtype) -> tuple[bool, str]:
    """How the kernels call ``tl.dot`` for this cache dtype: ``(upcast_to_fp32, input_precision)``.

    * fp32 inputs use ``input_precision="ieee"``: by default a GPU's ``tl.dot`` on fp32 rounds
      its inputs to TF32 (10 mantissa bits), which would make fp32 results differ from the
      interpreter's exact NumPy matmul.
    * bf16 inputs are upcast to fp32 *only in the interpreter*: its arithmetic on bf16 (``tl.dot``
      included) works on the raw uint16 bit patterns it stores bf16 in (observed with triton
      3.9, see docs/triton_kernels.md). The upcast is exact, so results do not change. The same
      interpreter rounds fp32 -> bf16 toward zero, so in that case the kernels also write an
      fp32 output that the wrapper rounds to bf16 with PyTorch (round-to-nearest-even, as a GPU).
    """
    upcast = dtype == torch.bfloat16 and triton_mode() == "interpreted"
    precision = "ieee" if (dtype == torch.float32 or upcast) else "tf32"
    return upcast, precision


@triton.jit
def online_softmax_step(
    q,  # [M, BLOCK_D] queries, already in the dot dtype
    k,  # [BLOCK_N, BLOCK_D] keys of one block
    v,  # [BLOCK_N, BLOCK_D] values of one block
    valid,  # [M, BLOCK_N] or [1, BLOCK_N] bool: may row r attend to key n?
    m,  # [M] fp32 running max of the scores
    denom,  # [M] fp32 running sum of exp(score - m)
    acc,  # [M, BLOCK_D] fp32 running sum of exp(score - m) * v
    scale,
    DOT_PRECISION: tl.constexpr,
):
    """Fold one block of keys/values into the running softmax state; returns ``(m, denom, acc)``.

    Every row must have at least one valid key *in some earlier or this block*, otherwise
    ``m`` stays ``-inf`` and ``exp(m - m_new)`` is NaN; callers guarantee it by starting each
    row's walk at a block that holds a key it may see.
    """
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale  # [M, BLOCK_N] fp32
    s = tl.where(valid, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    alpha = tl.exp(m - m_new)  # rescales what was accumulated under the old maximum
    p = tl.exp(s - m_new[:, None])  # masked keys: exp(-inf) = 0
    denom = denom * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, denom, acc


@triton.jit
def load_kv_block(
    k_cache_ptr, v_cache_ptr, physical_block, kv_head, t, d, kv_mask,
    stride_kb, stride_kt, stride_kh, stride_kd,
    stride_vb, stride_vt, stride_vh, stride_vd,
    UPCAST: tl.constexpr,
    pos_ok,  # [BLOCK_SIZE] bool: the slots to load (KV_INT8: whose scale to read)
    HEAD_DIM: tl.constexpr,  # KV_INT8: the scale sits after HEAD_DIM codes
    KV_INT8: tl.constexpr,
):
    """Load one cache block's K and V for one KV head: ``[BLOCK_SIZE, BLOCK_D]`` each.

    Masked slots (past the sequence, or padded head dims) read as 0: slots nobody owns may
    hold anything, even NaN from ``torch.empty``, and masking only the scores is not enough
    since 0 * NaN = NaN.

    An 8-bit cache (``KV_INT8``, ``kv_quant.py``): each slot's row is ``HEAD_DIM`` int8 codes and
    then a float32 scale (the row's last 4 bytes, read through a float32 pointer). Returns the
    dequantised ``code * scale`` in float32; a masked slot's scale is not loaded either (it
    may be NaN), and reads as 0.
    """
    k = tl.load(
        k_cache_ptr + physical_block * stride_kb + t[:, None] * stride_kt
        + kv_head * stride_kh + d[None, :] * stride_kd,
        mask=kv_mask,
        other=0.0,
    )
    v = tl.load(
        v_cache_ptr + physical_block * stride_vb + t[:, None] * stride_vt
        + kv_head * stride_vh + d[None, :] * stride_vd,
        mask=kv_mask,
        other=0.0,
    )
    if KV_INT8:
        k_scale_ptr = k_cache_ptr + physical_block * stride_kb + t * stride_kt + kv_head * stride_kh + HEAD_DIM * stride_kd
        v_scale_ptr = v_cache_ptr + physical_block * stride_vb + t * stride_vt + kv_head * stride_vh + HEAD_DIM * stride_vd
        k_scale = tl.load(k_scale_ptr.to(tl.pointer_type(tl.float32)), mask=pos_ok, other=0.0)  # [BLOCK_SIZE]
        v_scale = tl.load(v_scale_ptr.to(tl.pointer_type(tl.float32)), mask=pos_ok, other=0.0)
        k = k.to(tl.float32) * k_scale[:, None]
        v = v.to(tl.float32) * v_scale[:, None]
    elif UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    return k, v


@triton.jit
def _paged_decode_kernel(
    out_ptr,  # IS_SPLIT: [num_seqs, num_heads, num_splits, head_dim] fp32, else [num_seqs, num_heads, head_dim]
    lse_ptr,  # IS_SPLIT: [num_seqs, num_heads, num_splits] fp32, else unused
    q_ptr,  # [num_seqs, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens_ptr,  # [num_seqs] int32
    scale,
    num_splits,
    stride_qs, stride_qh, stride_qd,
    stride_kb, stride_kt, stride_kh, stride_kd,
    stride_vb, stride_vt, stride_vh, stride_vd,
    stride_bts,
    stride_os, stride_oh, stride_osplit, stride_od,
    stride_ls, stride_lh,
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,  # rows of the query tile: max(16, next_pow2(GROUP))
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,  # next_pow2(HEAD_DIM); extra columns are masked to zero
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    IS_SPLIT: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    KV_INT8: tl.constexpr = False,  # an 8-bit cache: rows of HEAD_DIM codes + a float32 scale
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq_len = tl.load(seq_lens_ptr + seq)
    num_blocks = tl.cdiv(seq_len, BLOCK_SIZE)
    # This program's range of logical blocks. Without split-KV it is all of them.
    blocks_per_split = tl.cdiv(num_blocks, num_splits)
    first_block = split * blocks_per_split
    end_block = tl.minimum(first_block + blocks_per_split, num_blocks)

    rows = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + rows  # the query heads that share this KV head
    row_ok = rows < GROUP
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    t = tl.arange(0, BLOCK_SIZE)

    q = tl.load(
        q_ptr + seq * stride_qs + heads[:, None] * stride_qh + d[None, :] * stride_qd,
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    if UPCAST:
        q = q.to(tl.float32)

    m = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    denom = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, BLOCK_D], dtype=tl.float32)

    for logical_block in range(first_block, end_block):
        # int64: block * stride overflows int32 once the cache holds > 2^31 elements.
        physical_block = tl.load(block_tables_ptr + seq * stride_bts + logical_block).to(tl.int64)
        pos = logical_block * BLOCK_SIZE + t  # token positions held by this block
        pos_ok = pos < seq_len
        # Slots past seq_len belong to no one yet and may hold anything: mask the loads.
        kv_mask = pos_ok[:, None] & d_ok[None, :]
        k, v = load_kv_block(
            k_cache_ptr, v_cache_ptr, physical_block, kv_head, t, d, kv_mask,
            stride_kb, stride_kt, stride_kh, stride_kd,
            stride_vb, stride_vt, stride_vh, stride_vd,
            UPCAST, pos_ok, HEAD_DIM, KV_INT8,
        )
        if KV_INT8:  # dequantised in float32, rounded to the query's dtype (as kv_quant does)
            k = k.to(q_ptr.dtype.element_ty).to(q.dtype)  # q.dtype: fp32 if UPCAST
            v = v.to(q_ptr.dtype.element_ty).to(q.dtype)
        # Every row (padded ones too, their q is 0) sees the block's valid positions, and the
        # first block of a non-empty range always has one, so no row's max stays -inf.
        m, denom, acc = online_softmax_step(q, k, v, pos_ok[None, :], m, denom, acc, scale, DOT_PRECISION)

    out_mask = row_ok[:, None] & d_ok[None, :]
    if IS_SPLIT:
        # An empty split (more splits than blocks) has denom = 0: write o = 0, lse = -inf, which
        # the merge kernel weights by exp(-inf) = 0.
        has_any = denom > 0
        o = acc / tl.where(has_any, denom, 1.0)[:, None]
        lse = tl.where(has_any, m + tl.log(tl.where(has_any, denom, 1.0)), float("-inf"))  # [GROUP_PAD]
        tl.store(
            out_ptr + seq * stride_os + heads[:, None] * stride_oh + split * stride_osplit
            + d[None, :] * stride_od,
            o,
            mask=out_mask,
        )
        tl.store(lse_ptr + seq * stride_ls + heads * stride_lh + split, lse, mask=row_ok)
    else:
        o = acc / denom[:, None]
        tl.store(
            out_ptr + seq * stride_os + heads[:, None] * stride_oh + d[None, :] * stride_od,
            o.to(out_ptr.dtype.element_ty),
            mask=out_mask,
        )


@triton.jit
def _merge_splits_kernel(
    out_ptr,  # [num_seqs, num_heads, head_dim]
    partial_ptr,  # [num_seqs, num_heads, num_splits, head_dim] fp32, each split normalised
    lse_ptr,  # [num_seqs, num_heads, num_splits] fp32
    num_splits,
    stride_os, stride_oh, stride_od,
    stride_ps, stride_ph, stride_psplit, stride_pd,
    stride_ls, stride_lh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SPLITS: tl.constexpr,  # next_pow2(num_splits)
):
    """One program per ``(sequence, query head)``: ``out = sum_s w_s o_s / sum_s w_s`` with
    ``w_s = exp(lse_s - max_s lse_s)``."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    s = tl.arange(0, BLOCK_SPLITS)
    s_ok = s < num_splits
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM

    lse = tl.load(lse_ptr + seq * stride_ls + head * stride_lh + s, mask=s_ok, other=float("-inf"))
    weights = tl.exp(lse - tl.max(lse, axis=0))  # split 0 is never empty, so the max is finite
    partial = tl.load(
        partial_ptr + seq * stride_ps + head * stride_ph + s[:, None] * stride_psplit
        + d[None, :] * stride_pd,
        mask=s_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    o = tl.sum(weights[:, None] * partial, axis=0) / tl.sum(weights, axis=0)
    tl.store(out_ptr + seq * stride_os + head * stride_oh + d * stride_od, o.to(out_ptr.dtype.element_ty), mask=d_ok)


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, block_size: int) -> int:
    """The split-KV heuristic: split only when the plain grid is too small *and* there is
    enough work per sequence to share.

    * plain grid ``num_seqs * num_kv_heads >= TARGET_PROGRAMS`` -> 1 (the GPU is already full);
    * otherwise as many splits as it takes to reach ``TARGET_PROGRAMS`` programs, but never
      fewer than ``MIN_BLOCKS_PER_SPLIT`` blocks per split of the longest sequence and never
      more than ``MAX_SPLITS``.

    Example with 8 KV heads and block 16: batch 1 at 32k tokens -> 32 splits; batch 8 at 4k
    -> 4 splits; batch 64 at 4k -> 1 (512 programs already).
    """
    programs = num_seqs * num_kv_heads
    if programs >= TARGET_PROGRAMS:
        return 1
    max_blocks = triton.cdiv(max_seq_len, block_size)
    by_occupancy = triton.cdiv(TARGET_PROGRAMS, programs)
    by_work = max(1, max_blocks // MIN_BLOCKS_PER_SPLIT)
    return max(1, min(by_occupancy, by_work, MAX_SPLITS))


def check_paged_inputs(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor
) -> tuple[int, int]:
    """Validate shapes/dtypes shared by decode and prefill; returns ``(num_kv_heads, group)``.

    The caches hold ``q``'s dtype, or are 8-bit (``torch.int8``, rows of ``head_dim + 4``
    bytes: codes and a float32 scale, see ``kv_quant.py``)."""
    if q.dim() != 3:
        raise ValueError(f"q must be [tokens, num_heads, head_dim], got {tuple(q.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} / v_cache {tuple(v_cache.shape)}: expected equal 4-D shapes")
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    int8 = k_cache.dtype == torch.int8
    row = int8_row_width(head_dim) if int8 else head_dim
    if k_cache.shape[3] != row:
        what = f"head_dim + {SCALE_BYTES} = {row} int8 bytes" if int8 else f"head_dim {head_dim}"
        raise ValueError(f"cache rows hold {k_cache.shape[3]} elements, the query's {what}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    if v_cache.dtype != k_cache.dtype or not (int8 or q.dtype == k_cache.dtype):
        raise ValueError(f"q ({q.dtype}) and the caches ({k_cache.dtype}, {v_cache.dtype}) must share a dtype "
                         "(or the caches be int8)")
    if int8 and (k_cache.stride(3) != 1 or v_cache.stride(3) != 1):
        raise ValueError("an int8 cache's rows must be contiguous (its scale is read as 4 aligned bytes)")
    if block_tables.dim() != 2:
        raise ValueError(f"block_tables must be [num_seqs, max_blocks], got {tuple(block_tables.shape)}")
    check_block_size(k_cache.shape[1])
    return num_kv_heads, num_heads // num_kv_heads


def check_block_size(block_size: int) -> None:
    """The kernels' one rule on the cache layout: a power-of-two block of at least 16 slots.

    One cache block is the K dimension of the ``P @ V`` dot, which a GPU needs >= 16 (the
    interpreter would accept less; we refuse it everywhere so that CPU and GPU agree)."""
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(
            f"the Triton kernels need a power-of-two block_size >= 16, got block_size={block_size}; "
            "use block_size >= 16 or attention_backend='torch' for smaller blocks"
        )


def paged_decode_attention(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32, >= 1, counting the new token
    scale: float,
    num_splits: int | None = None,
    max_seq_len: int | None = None,
) -> torch.Tensor:
    """Attention of one new token per sequence over its whole cached sequence.

    The caches hold ``q``'s dtype, or are 8-bit (``kv_quant.py``: dequantised inside the kernel).
    Returns ``[num_seqs, num_heads, head_dim]`` in ``q``'s dtype. ``num_splits=None`` picks
    plain or split-KV with ``choose_num_splits``; an integer forces that many splits (1 = the
    plain kernel). ``max_seq_len`` only feeds the heuristic; pass it when known to avoid a
    device-to-host sync.
    """
    num_kv_heads, group = check_paged_inputs(q, k_cache, v_cache, block_tables)
    num_seqs, num_heads, head_dim = q.shape
    block_size = k_cache.shape[1]
    if seq_lens.shape != (num_seqs,) or block_tables.shape[0] != num_seqs:
        raise ValueError(
            f"q has {num_seqs} sequences, seq_lens {tuple(seq_lens.shape)}, block_tables {tuple(block_tables.shape)}"
        )
    upcast, precision = dot_settings(q.dtype)
    # fp32 output when bf16 is emulated by the interpreter (see ``dot_settings``).
    out = torch.empty(q.shape, dtype=torch.float32 if upcast else q.dtype, device=q.device)
    if num_seqs == 0:
        return out.to(q.dtype)
    if num_splits is None:
        if max_seq_len is None:
            max_seq_len = int(seq_lens.max().item())
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_seq_len, block_size)
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")

    meta = dict(
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=block_size,
        UPCAST=upcast,
        DOT_PRECISION=precision,
        KV_INT8=k_cache.dtype == torch.int8,
    )
    common = (
        q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), block_tables.stride(0),
    )
    if num_splits == 1:
        _paged_decode_kernel[(num_seqs, num_kv_heads, 1)](
            out, out, *common,
            out.stride(0), out.stride(1), 0, out.stride(2), 0, 0,
            IS_SPLIT=False, **meta,
        )
        return out.to(q.dtype)

    partial = torch.empty((num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device)
    lse = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32, device=q.device)
    _paged_decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        partial, lse, *common,
        *partial.stride(), lse.stride(0), lse.stride(1),
        IS_SPLIT=True, **meta,
    )
    _merge_splits_kernel[(num_seqs, num_heads)](
        out, partial, lse, num_splits,
        *out.stride(), *partial.stride(), lse.stride(0), lse.stride(1),
        HEAD_DIM=head_dim,
        BLOCK_D=meta["BLOCK_D"],
        BLOCK_SPLITS=triton.next_power_of_2(num_splits),
    )
    return out.to(q.dtype)
