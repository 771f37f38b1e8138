"""PagedAttention for prefill and chunked prefill in Triton: ragged query chunks over a paged cache.

The problem. The flat batch holds, for sequence ``i``, ``query_len_i`` new tokens (rows
``query_start_loc[i] : query_start_loc[i+1]`` of ``q``) that are the *last* ``query_len_i``
positions of a sequence of ``seq_lens[i]`` tokens. The first ``context_len = seq_len -
query_len`` positions were cached by earlier steps (an earlier chunk, or a shared prefix found
in the prefix cache); the new tokens' K/V were written into the cache just before this kernel
runs. So new token ``j`` sits at position ``context_len + j`` and attends causally to cached
positions ``0 .. context_len + j``, all read through the block table. No padding anywhere.

Grid. ``(num_seqs, cdiv(max_query_len, BLOCK_Q), num_kv_heads)``: a program takes up to
``BLOCK_Q`` consecutive new tokens of one sequence and, as in decode, all the query heads of
one KV head. Its query tile has ``BLOCK_M = BLOCK_Q * GROUP_PAD`` rows, row ``r`` being token
``r // GROUP_PAD`` and head ``r % GROUP_PAD`` of the group, so each K/V block is loaded once
for the whole group. Programs whose tile starts past their sequence's query length (short
sequences in a batch with a long one) exit at once.

Each program walks the sequence's blocks from 0 up to the block holding its last token's
position with the same online-softmax step as decode (see ``triton_decode``), masking keys
that lie in a row's future (``key_pos > query_pos``). It loads only the positions the sequence
has written, ``readable_lens[i]`` of them (``seq_len`` less any padding rows, whose slots are
never written): every other slot is masked out of the *loads*, not just the scores, because
the tile's rows share each loaded block and ``0 * NaN`` is NaN in the ``P @ V`` product. Key 0 is
visible to every row, so the first block gives every row a finite maximum.
"""

from __future__ import annotations

# Importing this module runs ``minivllm/attention/__init__.py`` first, which imports
# ``triton_env`` (TRITON_INTERPRET=1 on machines without CUDA) *before* any ``@triton.jit``
# below is evaluated.
import torch
import triton
import triton.language as tl

from minivllm.attention.triton_decode import (
    check_paged_inputs,
    dot_settings,
    load_kv_block,
    online_softmax_step,
)

# Query-tile rows (tokens x heads of a group) per program, and warps per program. 64 rows with
# Triton's default 4 warps spilled registers to local memory (ptxas -v: 255 registers and 200 to
# 3,400 bytes spilled for fp16 at head_dim 128 on sm_75, head_dim 80 on sm_80); 32 rows over 8
# warps spill nothing in any case tests/attention/test_gpu_compile.py compiles.
BLOCK_M_TARGET = 32
NUM_WARPS = 8


@triton.jit
def _paged_prefill_kernel(
    out_ptr,  # [num_tokens, num_heads, head_dim]
    q_ptr,  # [num_tokens, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq] int32
    query_start_loc_ptr,  # [num_seqs + 1] int32
    seq_lens_ptr,  # [num_seqs] int32
    readable_lens_ptr,  # [num_seqs] int32: positions written (seq_len less padding rows)
    scale,
    stride_qt, stride_qh, stride_qd,
    stride_kb, stride_kt, stride_kh, stride_kd,
    stride_vb, stride_vt, stride_vh, stride_vd,
    stride_bts,
    stride_ot, stride_oh, stride_od,
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,  # next_pow2(GROUP)
    BLOCK_Q: tl.constexpr,  # new tokens per program
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,  # next_pow2(HEAD_DIM)
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    KV_INT8: tl.constexpr = False,  # an 8-bit cache: rows of HEAD_DIM codes + a float32 scale
):
    seq = tl.program_id(0)
    q_tile = tl.program_id(1)
    kv_head = tl.program_id(2)

    q_start = tl.load(query_start_loc_ptr + seq)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if q_tile * BLOCK_Q >= query_len:
        return  # this sequence has fewer new tokens than the longest one in the batch
    seq_len = tl.load(seq_lens_ptr + seq)
    readable = tl.load(readable_lens_ptr + seq)
    context_len = seq_len - query_len

    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_PAD
    r = tl.arange(0, BLOCK_M)
    token_in_seq = q_tile * BLOCK_Q + r // GROUP_PAD  # 0-based among the new tokens
    head_in_group = r % GROUP_PAD
    row_ok = (token_in_seq < query_len) & (head_in_group < GROUP)
    heads = kv_head * GROUP + head_in_group
    q_pos = context_len + token_in_seq  # absolute position of each row's token
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    t = tl.arange(0, BLOCK_SIZE)

    q_offsets = (q_start + token_in_seq)[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :] * stride_qd
    q = tl.load(q_ptr + q_offsets, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    denom = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # Keys up to the tile's last token (exclusive end), and never past what the sequence wrote.
    kv_end = tl.minimum(context_len + (q_tile + 1) * BLOCK_Q, readable)
    for logical_block in range(0, tl.cdiv(kv_end, BLOCK_SIZE)):
        physical_block = tl.load(block_tables_ptr + seq * stride_bts + logical_block).to(tl.int64)
        pos = logical_block * BLOCK_SIZE + t
        pos_ok = pos < readable
        kv_mask = pos_ok[:, None] & d_ok[None, :]  # never load a slot it did not write (may be NaN)
        k, v = load_kv_block(
            k_cache_ptr, v_cache_ptr, physical_block, kv_head, t, d, kv_mask,
            stride_kb, stride_kt, stride_kh, stride_kd,
            stride_vb, stride_vt, stride_vh, stride_vd,
            UPCAST, pos_ok, HEAD_DIM, KV_INT8,
        )
        if KV_INT8:  # dequantised in float32, rounded to the query's dtype (as kv_quant does)
            k = k.to(q_ptr.dtype.element_ty).to(q.dtype)  # q.dtype: fp32 if UPCAST
            v = v.to(q_ptr.dtype.element_ty).to(q.dtype)
        causal = (pos[None, :] <= q_pos[:, None]) & pos_ok[None, :]  # [BLOCK_M, BLOCK_SIZE]
        m, denom, acc = online_softmax_step(q, k, v, causal, m, denom, acc, scale, DOT_PRECISION)

    o = acc / denom[:, None]
    out_offsets = (q_start + token_in_seq)[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :] * stride_od
    tl.store(out_ptr + out_offsets, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def paged_prefill_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32, counting the new tokens
    scale: float,
    max_query_len: int,
    readable_lens: torch.Tensor | None = None,  # [num_seqs] int32; None: seq_lens
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its cached context and themselves.

    Works for any mix of whole prompts, prompt chunks with cached context (chunked prefill,
    prefix-cache hits) and single decode tokens. The caches hold ``q``'s dtype, or are 8-bit
    (``kv_quant.py``: dequantised inside the kernel). Returns ``[num_tokens, num_heads, head_dim]``
    in ``q``'s dtype. The new tokens' K/V must already be in the cache, except padding rows'
    (slot -1, the last rows of their sequence): ``readable_lens`` (``AttentionMetadata.
    readable_lens()``) then says how many positions each sequence wrote, and no slot past them
    is loaded. Padding rows' outputs are computed from those positions and are to be thrown away.
    """
    num_kv_heads, group = check_paged_inputs(q, k_cache, v_cache, block_tables)
    num_tokens, num_heads, head_dim = q.shape
    num_seqs = seq_lens.shape[0]
    readable_lens = seq_lens if readable_lens is None else readable_lens
    if (query_start_loc.shape != (num_seqs + 1,) or block_tables.shape[0] != num_seqs
            or readable_lens.shape != seq_lens.shape):
        raise ValueError(
            f"seq_lens {tuple(seq_lens.shape)}, readable_lens {tuple(readable_lens.shape)}, query_start_loc "
            f"{tuple(query_start_loc.shape)} and block_tables {tuple(block_tables.shape)} disagree on the "
            "number of sequences"
        )
    upcast, precision = dot_settings(q.dtype)
    # fp32 output when bf16 is emulated by the interpreter (see ``dot_settings``).
    out = torch.empty(q.shape, dtype=torch.float32 if upcast else q.dtype, device=q.device)
    if num_tokens == 0 or num_seqs == 0 or max_query_len == 0:
        return out.to(q.dtype)

    group_pad = triton.next_power_of_2(group)
    block_q = max(1, BLOCK_M_TARGET // group_pad)
    grid = (num_seqs, triton.cdiv(max_query_len, block_q), num_kv_heads)
    _paged_prefill_kernel[grid](
        out, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, readable_lens, scale,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), block_tables.stride(0), *out.stride(),
        GROUP=group,
        GROUP_PAD=group_pad,
        BLOCK_Q=block_q,
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=k_cache.shape[1],
        UPCAST=upcast,
        DOT_PRECISION=precision,
        KV_INT8=k_cache.dtype == torch.int8,
        num_warps=NUM_WARPS,
    )
    return out.to(q.dtype)
