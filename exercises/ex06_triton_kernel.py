# This file is generated from solutions/ex06_triton_kernel.py by `minivllm course make-exercises`.
# It is yours: replace each `raise NotImplementedError(...)` with your code, then run
# `minivllm grade ex06` or `pytest -m ex06`. Stuck? `course.hint("ex06")` in the
# notebook (or `minivllm hint ex06`) gives a hint, one at a time.
"""Exercise 06: the inner loop of a paged decode-attention kernel, written in Triton.

Notebook: notebooks/06_paged_attention_triton.ipynb. Check your work with
``course.check(course.load("ex06_triton_kernel"))`` there, or ``pytest -m ex06``.

Decode attention: each sequence has one new query token and ``seq_len`` cached tokens whose
keys and values sit in fixed-size blocks scattered over the paged KV cache. The kernel below
runs one program per (sequence, KV head). The program holds the query heads that share its KV
head (grouped-query attention) as the rows of one small tile, walks the sequence's blocks in
logical order, and keeps a running softmax over them, so it never gathers the sequence into one
tensor and never holds more than one block of scores.

Everything around the loop is given: the program ids, the query tile, the offsets of one
slot inside a cache block, the initial softmax state, the final normalisation, the launch
wrapper and an attention backend that lets the engine use the kernel. The loop body is yours.
It runs in the Triton interpreter on a CPU (slowly: keep your tests small) and compiled on a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.compiler.errors import CompilationError
from triton.runtime.errors import InterpreterError

# Importing minivllm sets TRITON_INTERPRET=1 on a machine without CUDA, which must happen
# before the @triton.jit below runs (Triton reads the flag when a kernel is defined).
from minivllm.attention import get_attention_backend
from minivllm.attention.metadata import AttentionMetadata
from minivllm.attention.triton_kernels import reshape_and_cache

NOTEBOOK = "notebooks/06_paged_attention_triton.ipynb"

MIN_TILE = 16  # a GPU's tl.dot needs every tile dimension >= 16


@triton.jit
def paged_decode_kernel(
    out_ptr,  # [num_seqs, num_heads, head_dim]
    q_ptr,  # [num_seqs, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq] int32: logical block -> physical block
    seq_lens_ptr,  # [num_seqs] int32: tokens in the cache for each sequence, the new one included
    scale,  # softmax scale, usually head_dim ** -0.5
    stride_qs, stride_qh, stride_qd,
    stride_kb, stride_kt, stride_kh, stride_kd,
    stride_vb, stride_vt, stride_vh, stride_vd,
    stride_bts,
    stride_os, stride_oh, stride_od,
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,  # rows of the query tile: GROUP rounded up to a power of two >= 16
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,  # HEAD_DIM rounded up to a power of two >= 16; extra columns masked
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)

    # Rows of the tile: query heads kv_head * GROUP .. kv_head * GROUP + GROUP - 1 all read this
    # KV head. Padded rows (row >= GROUP) load zeros and are never stored.
    rows = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + rows
    row_ok = rows < GROUP
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    t = tl.arange(0, BLOCK_SIZE)  # slot offsets inside one cache block

    q = tl.load(
        q_ptr + seq * stride_qs + heads[:, None] * stride_qh + d[None, :] * stride_qd,
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    ).to(tl.float32)  # [GROUP_PAD, BLOCK_D]

    seq_len = tl.load(seq_lens_ptr + seq)
    table = block_tables_ptr + seq * stride_bts  # this sequence's row of the block table
    # Where slot t, dimension d of this KV head lies inside *any* cache block; add
    # physical_block * stride_kb (or stride_vb) to point into one block.
    k_in_block = t[:, None] * stride_kt + kv_head * stride_kh + d[None, :] * stride_kd
    v_in_block = t[:, None] * stride_vt + kv_head * stride_vh + d[None, :] * stride_vd

    # Running softmax state, one entry per row, all fp32:
    m = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)  # largest score so far
    denom = tl.zeros([GROUP_PAD], dtype=tl.float32)  # sum of exp(score - m) so far
    acc = tl.zeros([GROUP_PAD, BLOCK_D], dtype=tl.float32)  # sum of exp(score - m) * v so far

    for logical_block in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):
        raise NotImplementedError("ex06 paged_decode_kernel: yours to write; stuck? course.hint('ex06') (notebooks/06_paged_attention_triton.ipynb)")

    out = acc / denom[:, None]
    tl.store(
        out_ptr + seq * stride_os + heads[:, None] * stride_oh + d[None, :] * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & d_ok[None, :],
    )


def paged_decode(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32, every entry >= 1
    scale: float,
) -> torch.Tensor:
    """Launch ``paged_decode_kernel`` on a grid of (sequence, KV head). Returns
    ``[num_seqs, num_heads, head_dim]`` in ``q``'s dtype; the arithmetic is fp32."""
    _check_inputs(q, k_cache, v_cache, block_tables, seq_lens)
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    grid = (num_seqs, num_kv_heads)
    try:
        paged_decode_kernel[grid](
            out, q, k_cache, v_cache, block_tables, seq_lens, scale,
            *q.stride(), *k_cache.stride(), *v_cache.stride(), block_tables.stride(0), *out.stride(),
            GROUP=group,
            GROUP_PAD=max(MIN_TILE, triton.next_power_of_2(group)),
            HEAD_DIM=head_dim,
            BLOCK_D=max(MIN_TILE, triton.next_power_of_2(head_dim)),
            BLOCK_SIZE=k_cache.shape[1],
        )
    except (InterpreterError, CompilationError) as err:
        _raise_stub_error(err)
        raise
    return out


def _raise_stub_error(err: Exception) -> None:
    """The exercise stub is a ``raise NotImplementedError(...)`` inside the kernel. The
    interpreter wraps it in an ``InterpreterError`` and a GPU compiler rejects ``raise``
    altogether; report both as the ``NotImplementedError`` they stand for."""
    if isinstance(err.__cause__, NotImplementedError):
        raise err.__cause__
    if isinstance(err, CompilationError) and "NotImplementedError" in str(err):
        raise NotImplementedError(f"the kernel still holds the exercise stub:\n{err}") from err


def _check_inputs(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
) -> None:
    if q.dim() != 3:
        raise ValueError(f"q must be [num_seqs, num_heads, head_dim], got shape {tuple(q.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must both be "
            "[num_blocks, block_size, num_kv_heads, head_dim]"
        )
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    if cache_head_dim != head_dim:
        raise ValueError(f"the cache's head_dim {cache_head_dim} != the query's {head_dim}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    if block_size < MIN_TILE or block_size & (block_size - 1):
        raise ValueError(
            f"block_size must be a power of two >= {MIN_TILE} (one tl.dot tile), got {block_size}"
        )
    if not q.dtype == k_cache.dtype == v_cache.dtype:
        raise ValueError(
            f"q ({q.dtype}) and the caches ({k_cache.dtype}, {v_cache.dtype}) must share a dtype"
        )
    if block_tables.dim() != 2 or len(block_tables) != num_seqs or seq_lens.shape != (num_seqs,):
        raise ValueError(
            f"{num_seqs} sequences: block_tables must be [{num_seqs}, max_blocks] and seq_lens "
            f"[{num_seqs}], got {tuple(block_tables.shape)} and {tuple(seq_lens.shape)}"
        )


class PagedDecodeBackend:
    """An attention backend for the engine built on ``paged_decode``.

    Decode-only steps (every sequence brings exactly one new token) run your kernel; steps with
    prompt tokens in them go to minivllm's reference backend, since a prompt's queries attend
    causally to each other, which a one-query-per-sequence kernel does not do.
    """

    name = "ex06-paged-decode"

    def __init__(self) -> None:
        self.reference = get_attention_backend("torch")
        self.kernel_calls = 0  # layers x decode steps served by the kernel
        self.reference_calls = 0  # layers x steps with prompt tokens

    def forward(
        self,
        query: torch.Tensor,  # [T, H, D]
        key: torch.Tensor,  # [T, KVH, D]
        value: torch.Tensor,  # [T, KVH, D]
        k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        if meta.max_query_len == 1 and query.shape[0] == meta.num_seqs:
            reshape_and_cache(key, value, k_cache, v_cache, meta.slot_mapping)
            self.kernel_calls += 1
            return paged_decode(query, k_cache, v_cache, meta.block_tables, meta.seq_lens, scale)
        self.reference_calls += 1
        return self.reference.forward(query, key, value, k_cache, v_cache, meta, scale)
