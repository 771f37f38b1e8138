"""Exercise 06: PagedAttention for decode in Triton, built as a ladder of kernels.

(An alternative correct answer, for tests/course/test_alternatives.py: base-2 exponentials, a
shared helper for kernels 3 and 4, a slot-by-slot copy in kernel 1, a split-by-split merge.)

Notebook: notebooks/06_paged_attention_triton.ipynb. Check your work with
``course.check(course.load("ex06_triton_kernel"))`` there, or ``pytest -m ex06``.

Decode attention: sequence ``i`` has one new query, ``q[i]`` (``[num_heads, head_dim]``), and
``seq_lens[i]`` tokens in the paged KV cache ``[num_blocks, block_size, num_kv_heads, head_dim]``:
its position ``p`` lives in physical block ``block_tables[i, p // block_size]``, at offset
``p % block_size``. Query head ``h`` reads KV head ``h // (num_heads // num_kv_heads)``. Every slot
a sequence does not own (past ``seq_len`` in its last block, other blocks, padding entries of its
table) may hold anything, NaN included: the checks fill them with NaN.

Five kernels, each one step further; each body is yours, each launch wrapper is given. A
kernel's docstring says what one program computes.

1. ``load_block_kernel``: one block of one sequence, found through the block table, copied out.
2. ``attend_whole_kernel``: one query head over its whole sequence, in one tile of positions.
3. ``attend_blocks_kernel``: the same, walking the sequence block by block with an online
   softmax, so that no tile has to hold a whole sequence.
4. ``split_kernel`` and ``merge_kernel``: several programs per (sequence, head), each over a
   range of blocks, then a reduction of their partial answers (split-KV).
5. ``paged_decode_kernel``: the decode kernel the engine runs, one program per (sequence, KV
   head) for all the query heads of its group, with ``tl.dot``. ``PagedDecodeBackend`` (given)
   serves the tiny model with it.

They run in the Triton interpreter on a CPU (slowly: keep your own tests small) and compiled on
a GPU. On a GPU a tile's sizes must be powers of two, and ``tl.dot`` needs ``>= 16`` per side.
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


# --- 1. one block through the block table -------------------------------------------------------
@triton.jit
def load_block_kernel(
    out_ptr,  # [num_seqs, max_blocks * BLOCK_SIZE, num_kv_heads, head_dim], contiguous
    cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, head_dim]
    block_tables_ptr,  # [num_seqs, max_blocks] int32
    seq_lens_ptr,  # [num_seqs] int32
    stride_cb, stride_ct, stride_ch, stride_cd,
    stride_bts,
    stride_os, stride_ot, stride_oh, stride_od,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,  # HEAD_DIM rounded up to a power of two; extra columns masked
    BLOCK_SIZE: tl.constexpr,
):
    """Program ``(seq, logical_block, kv_head)``: copy the sequence's positions
    ``logical_block * BLOCK_SIZE ..`` (those ``< seq_len``) of KV head ``kv_head`` to
    ``out[seq, position, kv_head, :]``. Write nothing else: every other entry of ``out`` keeps
    what it held. Read only the table entry of this logical block and, in the block it names,
    the slots of those positions: a table entry past the sequence's last block may name any
    block, and a slot past ``seq_len`` may hold NaN. Example: blocks of 4, table ``[5, 0]``,
    ``seq_len`` 6: program ``(0, 1, h)`` copies slots 0 and 1 of physical block 0 to positions 4
    and 5, and program ``(0, 2, h)`` copies nothing."""
    s_id, lb, kvh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n_tokens = tl.load(seq_lens_ptr + s_id)
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < HEAD_DIM
    if lb * BLOCK_SIZE < n_tokens:  # a block wholly past the end: nothing to read or write
        frame = tl.load(block_tables_ptr + s_id * stride_bts + lb).to(tl.int64)
        base_in = cache_ptr + frame * stride_cb + kvh * stride_ch + cols * stride_cd
        base_out = out_ptr + s_id * stride_os + kvh * stride_oh + cols * stride_od
        for i in range(BLOCK_SIZE):  # one slot at a time, each a row of HEAD_DIM numbers
            here = lb * BLOCK_SIZE + i
            keep = col_ok & (cols * 0 + here < n_tokens)  # the row's columns, if the slot is the sequence's
            row = tl.load(base_in + i * stride_ct, mask=keep)
            tl.store(base_out + here * stride_ot, row, mask=keep)


def load_blocks(cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """Every sequence's positions, copied out through its table by ``load_block_kernel``:
    ``[num_seqs, max_blocks * block_size, num_kv_heads, head_dim]``, zero past each ``seq_len``."""
    num_blocks, block_size, num_kv_heads, head_dim = cache.shape
    num_seqs, max_blocks = block_tables.shape
    out = torch.zeros(num_seqs, max_blocks * block_size, num_kv_heads, head_dim, dtype=cache.dtype,
                      device=cache.device)
    _launch(load_block_kernel, (num_seqs, max_blocks, num_kv_heads), out, cache, block_tables, seq_lens,
            *cache.stride(), block_tables.stride(0), *out.stride(),
            HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_SIZE=block_size)
    return out


# --- 2. one query head over one sequence, in one tile ---------------------------------------------
@triton.jit
def attend_whole_kernel(
    out_ptr,  # [num_seqs, num_heads, head_dim]
    q_ptr,  # [num_seqs, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, head_dim]
    v_cache_ptr,  # the same layout and strides as k_cache
    block_tables_ptr,  # [num_seqs, max_blocks] int32
    seq_lens_ptr,  # [num_seqs] int32, each <= SEQ_PAD
    scale,
    stride_qs, stride_qh, stride_qd,
    stride_kb, stride_kt, stride_kh, stride_kd,
    stride_bts,
    stride_os, stride_oh, stride_od,
    GROUP: tl.constexpr,  # query heads per KV head
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    SEQ_PAD: tl.constexpr,  # the longest seq_len rounded up to a power of two: one tile of positions
):
    """Program ``(seq, head)``: one query head's attention over its whole sequence, in one tile.

    It writes ``out[seq, head] = sum_j w_j v_j`` with ``w = softmax_j(scale * q[seq, head] . k_j)``
    over the positions ``j < seq_len``. Position ``j`` is slot ``j % BLOCK_SIZE`` of block
    ``block_tables[seq, j // BLOCK_SIZE]``, and query head ``head`` reads KV head
    ``head // GROUP`` there. Example: blocks of 16, table ``[7, 2, 0]``, ``seq_len`` 20:
    positions 0..15 are the 16 slots of block 7, positions 16..19 slots 0..3 of block 2, and
    the last entry is padding, no block of the sequence's.

    - Tiles: the program holds all its positions at once, K and V as ``[SEQ_PAD, BLOCK_D]``
      tiles (``SEQ_PAD >= seq_len``, set by the wrapper), each loaded once.
    - Reads: its query row, ``seq_lens[seq]``, the table entries of its positions, and K/V of
      those positions, dimensions ``< HEAD_DIM``. Nothing else: every other slot may be NaN.
      A row of the tile past ``seq_len`` weighs exactly 0.
    - Writes: ``out[seq, head, :HEAD_DIM]`` only, in ``out``'s dtype.
    - Numbers: fp32 arithmetic; never ``exp`` of a positive number (an fp32 ``exp`` overflows
      above 88, and scores can be that large)."""
    s_id, h = tl.program_id(0), tl.program_id(1)
    n_tokens = tl.load(seq_lens_ptr + s_id)
    j = tl.arange(0, SEQ_PAD)
    cols = tl.arange(0, BLOCK_D)
    live = j < n_tokens
    col_ok = cols < HEAD_DIM
    # log2(e) folded into the query: exp2 of base-2 scores is exp of the natural ones
    query = tl.load(q_ptr + s_id * stride_qs + h * stride_qh + cols * stride_qd, mask=col_ok, other=0.0)
    query = query.to(tl.float32) * (scale * 1.4426950408889634)
    frames = tl.load(block_tables_ptr + s_id * stride_bts + j // BLOCK_SIZE, mask=live, other=0).to(tl.int64)
    row_off = frames * stride_kb + (j % BLOCK_SIZE) * stride_kt + (h // GROUP) * stride_kh
    offs = row_off[:, None] + (cols * stride_kd)[None, :]
    both = live[:, None] & col_ok[None, :]
    keys = tl.load(k_cache_ptr + offs, mask=both, other=0.0).to(tl.float32)
    vals = tl.load(v_cache_ptr + offs, mask=both, other=0.0).to(tl.float32)
    s2 = tl.where(live, tl.sum(keys * query[None, :], axis=1), -float("inf"))
    weights = tl.exp2(s2 - tl.max(s2, axis=0))
    weights = weights / tl.sum(weights, axis=0)
    answer = tl.sum(vals * weights[:, None], axis=0)
    tl.store(out_ptr + s_id * stride_os + h * stride_oh + cols * stride_od,
             answer.to(out_ptr.dtype.element_ty), mask=col_ok)


def attend_whole(q, k_cache, v_cache, block_tables, seq_lens, scale: float) -> torch.Tensor:
    """``[num_seqs, num_heads, head_dim]`` by ``attend_whole_kernel``, one program per (sequence,
    query head); ``seq_lens`` is read once on the host to size the tile."""
    _check_inputs(q, k_cache, v_cache, block_tables, seq_lens)
    num_seqs, num_heads, head_dim = q.shape
    out = torch.empty_like(q)
    _launch(attend_whole_kernel, (num_seqs, num_heads), out, q, k_cache, v_cache, block_tables, seq_lens,
            scale, *q.stride(), *k_cache.stride(), block_tables.stride(0), *out.stride(),
            GROUP=num_heads // k_cache.shape[2], HEAD_DIM=head_dim,
            BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_SIZE=k_cache.shape[1],
            SEQ_PAD=max(16, triton.next_power_of_2(int(seq_lens.max()))))
    return out


@triton.jit
def _head_over_blocks(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, s_id, h, n_tokens, lo, hi, scale,
    stride_qs, stride_qh, stride_qd, stride_kb, stride_kt, stride_kh, stride_kd, stride_bts,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    """One query head over logical blocks ``lo .. hi - 1``, in base 2: ``(largest score, sum of
    2**(score - largest), sum of 2**(score - largest) * v)``. An empty range: ``(-inf, 0, 0)``."""
    cols = tl.arange(0, BLOCK_D)
    slots = tl.arange(0, BLOCK_SIZE)
    col_ok = cols < HEAD_DIM
    query = tl.load(q_ptr + s_id * stride_qs + h * stride_qh + cols * stride_qd, mask=col_ok, other=0.0)
    query = query.to(tl.float32) * (scale * 1.4426950408889634)
    tile = (h // GROUP) * stride_kh + slots[:, None] * stride_kt + cols[None, :] * stride_kd
    big = tl.max(tl.zeros([1], dtype=tl.float32) - float("inf"), axis=0)
    mass = tl.sum(tl.zeros([1], dtype=tl.float32), axis=0)
    total = tl.zeros([BLOCK_D], dtype=tl.float32)
    for lb in range(lo, hi):
        frame = tl.load(block_tables_ptr + s_id * stride_bts + lb).to(tl.int64)
        live = lb * BLOCK_SIZE + slots < n_tokens
        both = live[:, None] & col_ok[None, :]
        keys = tl.load(k_cache_ptr + frame * stride_kb + tile, mask=both, other=0.0).to(tl.float32)
        vals = tl.load(v_cache_ptr + frame * stride_kb + tile, mask=both, other=0.0).to(tl.float32)
        s2 = tl.where(live, tl.sum(keys * query[None, :], axis=1), -float("inf"))
        grown = tl.maximum(big, tl.max(s2, axis=0))
        e = tl.exp2(s2 - grown)
        shrink = tl.exp2(big - grown)
        mass = mass * shrink + tl.sum(e, axis=0)
        total = total * shrink + tl.sum(vals * e[:, None], axis=0)
        big = grown
    return big, mass, total


# --- 3. block by block, with an online softmax ----------------------------------------------------
@triton.jit
def attend_blocks_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,  # as attend_whole
    scale,
    stride_qs, stride_qh, stride_qd,
    stride_kb, stride_kt, stride_kh, stride_kd,
    stride_bts,
    stride_os, stride_oh, stride_od,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """Program ``(seq, head)``: ``attend_whole_kernel``'s answer, in one pass over the blocks.

    The same output, reads, writes and numeric rules as ``attend_whole_kernel``, for a
    ``seq_len`` of any size, under three limits:

    - no tile spans more than one block: K and V come in as ``[BLOCK_SIZE, BLOCK_D]`` tiles;
    - one pass: each of the sequence's blocks is loaded once;
    - what the program carries from one block to the next has a size fixed at compile time, so
      it cannot keep earlier blocks' scores, weights or values.

    The scores may rise from block to block (a check raises them by 8 per block), so no block
    can assume it holds the largest one."""
    s_id, h = tl.program_id(0), tl.program_id(1)
    n_tokens = tl.load(seq_lens_ptr + s_id)
    big, mass, total = _head_over_blocks(
        q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, s_id, h, n_tokens,
        0, tl.cdiv(n_tokens, BLOCK_SIZE), scale,
        stride_qs, stride_qh, stride_qd, stride_kb, stride_kt, stride_kh, stride_kd, stride_bts,
        GROUP, HEAD_DIM, BLOCK_D, BLOCK_SIZE)
    cols = tl.arange(0, BLOCK_D)
    tl.store(out_ptr + s_id * stride_os + h * stride_oh + cols * stride_od,
             (total / mass).to(out_ptr.dtype.element_ty), mask=cols < HEAD_DIM)


def attend_by_blocks(q, k_cache, v_cache, block_tables, seq_lens, scale: float) -> torch.Tensor:
    """``[num_seqs, num_heads, head_dim]`` by ``attend_blocks_kernel``, one program per (sequence,
    query head)."""
    _check_inputs(q, k_cache, v_cache, block_tables, seq_lens)
    num_seqs, num_heads, head_dim = q.shape
    out = torch.empty_like(q)
    _launch(attend_blocks_kernel, (num_seqs, num_heads), out, q, k_cache, v_cache, block_tables, seq_lens,
            scale, *q.stride(), *k_cache.stride(), block_tables.stride(0), *out.stride(),
            GROUP=num_heads // k_cache.shape[2], HEAD_DIM=head_dim,
            BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_SIZE=k_cache.shape[1])
    return out


# --- 4. split-KV: ranges of blocks, then a reduction -----------------------------------------------
@triton.jit
def split_kernel(
    partial_out_ptr,  # [num_seqs, num_heads, num_splits, head_dim] fp32, contiguous
    partial_lse_ptr,  # [num_seqs, num_heads, num_splits] fp32, contiguous
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,  # as attend_whole
    scale,
    blocks_per_split,  # split s covers logical blocks s * blocks_per_split .. (s + 1) * ... - 1
    stride_qs, stride_qh, stride_qd,
    stride_kb, stride_kt, stride_kh, stride_kd,
    stride_bts,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """Program ``(seq, head, split)``: one query head's attention over one range of blocks only.

    The range: logical blocks ``split * blocks_per_split`` up to, not including,
    ``(split + 1) * blocks_per_split``, and of their positions those ``< seq_len``. Over those
    positions alone the program writes what the merge needs:

    - ``partial_out[seq, head, split, :HEAD_DIM]``: ``sum_j w_j v_j`` with ``w`` the softmax of
      the range's scores (normalised within the range, so the weights sum to 1);
    - ``partial_lse[seq, head, split]``: ``log(sum_j exp(score_j))`` over the range.

    Both buffers are contiguous, indexed in the grid's order ``(seq, head, split)``. A range
    with no positions (past the sequence's end: a short sequence leaves its later splits empty)
    writes log-sum-exp ``-inf`` and an output of zeros, never NaN: it must add nothing to the
    merge, and ``0 * NaN`` is still NaN. Reads, tiles and numeric rules as
    ``attend_blocks_kernel``, over this range only: no table entry or slot outside it. Example:
    blocks of 16, ``blocks_per_split`` 1, ``seq_len`` 20: split 0 covers positions 0..15, split
    1 positions 16..19, and every later split is empty."""
    s_id, h, part = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n_tokens = tl.load(seq_lens_ptr + s_id)
    lo = part * blocks_per_split
    hi = tl.minimum(lo + blocks_per_split, tl.cdiv(n_tokens, BLOCK_SIZE))
    big, mass, total = _head_over_blocks(
        q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, s_id, h, n_tokens, lo, hi, scale,
        stride_qs, stride_qh, stride_qd, stride_kb, stride_kt, stride_kh, stride_kd, stride_bts,
        GROUP, HEAD_DIM, BLOCK_D, BLOCK_SIZE)
    cols = tl.arange(0, BLOCK_D)
    flat = (s_id * tl.num_programs(1) + h) * tl.num_programs(2) + part
    held = mass > 0.0  # an empty range keeps mass 0 and big -inf
    safe = tl.where(held, mass, 1.0)
    tl.store(partial_out_ptr + flat * HEAD_DIM + cols, tl.where(held, total / safe, 0.0), mask=cols < HEAD_DIM)
    # back from base 2: ln(sum exp(s)) = ln 2 * (big + log2(mass))
    lse = tl.where(held, (big + tl.log2(safe)) * 0.6931471805599453, -float("inf"))
    tl.store(partial_lse_ptr + flat, lse)


@triton.jit
def merge_kernel(
    out_ptr,  # [num_seqs, num_heads, head_dim]
    partial_out_ptr,  # [num_seqs, num_heads, num_splits, head_dim] fp32, contiguous
    partial_lse_ptr,  # [num_seqs, num_heads, num_splits] fp32, contiguous
    num_splits,
    stride_os, stride_oh, stride_od,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SPLITS_PAD: tl.constexpr,  # num_splits rounded up to a power of two
):
    """Program ``(seq, head)``: the attention over the whole sequence, from its splits' results.

    It reads the ``num_splits`` entries of ``(seq, head)`` in ``partial_out`` and
    ``partial_lse`` and nothing else (no query, K, V or table), and writes
    ``out[seq, head, :HEAD_DIM]``: what ``attend_whole_kernel`` gives for the same head. A split
    whose log-sum-exp is ``-inf`` held no positions and carries no weight; every sequence has at
    least one split that held some. Numbers: fp32; never ``exp`` of a positive number
    (log-sum-exps can be in the hundreds)."""
    s_id, h = tl.program_id(0), tl.program_id(1)
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < HEAD_DIM
    first = (s_id * tl.num_programs(1) + h) * num_splits
    mixed = tl.zeros([BLOCK_D], dtype=tl.float32)
    weight = tl.sum(tl.zeros([1], dtype=tl.float32), axis=0)
    top = tl.max(tl.load(partial_lse_ptr + first + tl.arange(0, SPLITS_PAD),
                         mask=tl.arange(0, SPLITS_PAD) < num_splits, other=-float("inf")), axis=0)
    for r in range(num_splits):  # one split at a time, each weighed by exp(lse - top) <= 1
        lse_r = tl.load(partial_lse_ptr + first + r)
        share = tl.where(lse_r == -float("inf"), 0.0, tl.exp(lse_r - top))
        part = tl.load(partial_out_ptr + (first + r) * HEAD_DIM + cols, mask=col_ok, other=0.0)
        mixed += share * part
        weight += share
    tl.store(out_ptr + s_id * stride_os + h * stride_oh + cols * stride_od,
             (mixed / weight).to(out_ptr.dtype.element_ty), mask=col_ok)


def attend_split(q, k_cache, v_cache, block_tables, seq_lens, scale: float, num_splits: int) -> torch.Tensor:
    """``[num_seqs, num_heads, head_dim]``: ``split_kernel`` on a grid of (sequence, query head,
    split), each split ``ceil(max_blocks / num_splits)`` blocks, then ``merge_kernel``."""
    _check_inputs(q, k_cache, v_cache, block_tables, seq_lens)
    if not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"num_splits must be a positive int, got {num_splits!r}")
    num_seqs, num_heads, head_dim = q.shape
    blocks_per_split = -(-block_tables.shape[1] // num_splits)
    partial_out = torch.zeros(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    partial_lse = torch.zeros(num_seqs, num_heads, num_splits, dtype=torch.float32, device=q.device)
    block_d = triton.next_power_of_2(head_dim)
    _launch(split_kernel, (num_seqs, num_heads, num_splits), partial_out, partial_lse, q, k_cache, v_cache,
            block_tables, seq_lens, scale, blocks_per_split, *q.stride(), *k_cache.stride(),
            block_tables.stride(0), GROUP=num_heads // k_cache.shape[2], HEAD_DIM=head_dim,
            BLOCK_D=block_d, BLOCK_SIZE=k_cache.shape[1])
    out = torch.empty_like(q)
    _launch(merge_kernel, (num_seqs, num_heads), out, partial_out, partial_lse, num_splits, *out.stride(),
            HEAD_DIM=head_dim, BLOCK_D=block_d, SPLITS_PAD=triton.next_power_of_2(num_splits))
    return out


# --- 5. the decode kernel the engine runs -----------------------------------------------------------
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
    """Program ``(seq, kv_head)``: decode attention for all the query heads that read one KV head.

    What it computes. Query heads ``h = kv_head * GROUP + r`` for ``r < GROUP`` (a group) all
    read KV head ``kv_head``. For each of them it writes
    ``out[seq, h] = sum_j w_j v_j`` with ``w = softmax_j(scale * q[seq, h] . k_j)`` over the
    positions ``j < seq_len``, where ``k_j`` and ``v_j`` are slot ``j % BLOCK_SIZE`` of block
    ``block_tables[seq, j // BLOCK_SIZE]`` at KV head ``kv_head`` in the two caches. Example:
    ``GROUP`` 3, blocks of 16, table ``[7, 2, 0]``, ``seq_len`` 20: program ``(0, 1)`` answers
    query heads 3, 4 and 5 of sequence 0 from KV head 1 of slots 0..15 of block 7 and slots
    0..3 of block 2.

    What it may read: the ``GROUP`` query rows of its group; ``seq_lens[seq]``; the table
    entries of the sequence's ``cdiv(seq_len, BLOCK_SIZE)`` blocks; in those blocks, KV head
    ``kv_head`` of the slots that hold a position ``< seq_len``, dimensions ``< HEAD_DIM``.
    Nothing else: every other slot may hold anything, NaN included (the checks fill them with
    NaN), and a table entry past the last block may name any block. A position past
    ``seq_len`` must weigh exactly 0.

    What it writes: ``out[seq, h, :HEAD_DIM]`` for the ``GROUP`` heads of its group, in
    ``out``'s dtype, and nothing else.

    How the work is tiled (so that it runs well on a GPU, not only here):

    - one program per (sequence, KV head): the grid is ``(num_seqs, num_kv_heads)``;
    - the query is one ``[GROUP_PAD, BLOCK_D]`` tile, one row per query head of the group;
      rows ``>= GROUP`` and columns ``>= HEAD_DIM`` are padding, read as 0 and never stored;
    - K and V come in one block at a time, as ``[BLOCK_SIZE, BLOCK_D]`` tiles: one pass, each
      block loaded once and used by every row of the query tile; no tile spans more than one
      block, and what is carried from one block to the next has a size fixed at compile time;
    - both products, queries by keys and weights by values, are ``tl.dot`` of tiles (every
      side ``>= 16`` on a GPU: the wrapper pads ``GROUP_PAD`` and ``BLOCK_D``, and blocks
      hold at least 16 tokens).

    Numeric rules: fp32 arithmetic whatever the dtype of ``q`` and the caches; every ``tl.dot``
    with ``input_precision="ieee"`` (else a GPU rounds fp32 inputs to TF32 and results move by
    about 1e-3); never ``exp`` of a positive number, for any scores (they may rise from block
    to block far beyond 88, where an fp32 ``exp`` overflows); block numbers widened to int64
    before they multiply a stride (a cache of more than 2**31 numbers overflows int32
    offsets). Every ``seq_len`` is at least 1.
    """
    s_id, kvh = tl.program_id(0), tl.program_id(1)
    r = tl.arange(0, GROUP_PAD)
    cols = tl.arange(0, BLOCK_D)
    slots = tl.arange(0, BLOCK_SIZE)
    r_ok = r < GROUP
    col_ok = cols < HEAD_DIM
    q_rows = q_ptr + s_id * stride_qs + (kvh * GROUP + r)[:, None] * stride_qh + cols[None, :] * stride_qd
    # the softmax scale and log2(e) go into the query once; the state below is in base 2
    qt = tl.load(q_rows, mask=r_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
    qt = qt * (scale * 1.4426950408889634)
    n_tokens = tl.load(seq_lens_ptr + s_id)
    k_tile = kvh * stride_kh + slots[:, None] * stride_kt + cols[None, :] * stride_kd
    v_tile = kvh * stride_vh + slots[:, None] * stride_vt + cols[None, :] * stride_vd
    best = tl.zeros([GROUP_PAD], dtype=tl.float32) - float("inf")
    mass = tl.zeros([GROUP_PAD], dtype=tl.float32)
    total = tl.zeros([GROUP_PAD, BLOCK_D], dtype=tl.float32)
    for lb in range(tl.cdiv(n_tokens, BLOCK_SIZE)):
        frame = tl.load(block_tables_ptr + s_id * stride_bts + lb).to(tl.int64)
        live = slots + lb * BLOCK_SIZE < n_tokens
        both = live[:, None] & col_ok[None, :]
        kt = tl.load(k_cache_ptr + frame * stride_kb + k_tile, mask=both, other=0.0).to(tl.float32)
        vt = tl.load(v_cache_ptr + frame * stride_vb + v_tile, mask=both, other=0.0).to(tl.float32)
        s2 = tl.dot(qt, tl.trans(kt), input_precision="ieee")
        s2 = tl.where(live[None, :], s2, -float("inf"))
        grown = tl.maximum(best, tl.max(s2, axis=1))
        shrink = tl.exp2(best - grown)
        e = tl.exp2(s2 - grown[:, None])
        mass = mass * shrink + tl.sum(e, axis=1)
        total = total * shrink[:, None] + tl.dot(e, vt, input_precision="ieee")
        best = grown
    o_rows = out_ptr + s_id * stride_os + (kvh * GROUP + r)[:, None] * stride_oh + cols[None, :] * stride_od
    tl.store(o_rows, (total / mass[:, None]).to(out_ptr.dtype.element_ty), mask=r_ok[:, None] & col_ok[None, :])


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
    _launch(paged_decode_kernel, (num_seqs, num_kv_heads),
            out, q, k_cache, v_cache, block_tables, seq_lens, scale,
            *q.stride(), *k_cache.stride(), *v_cache.stride(), block_tables.stride(0), *out.stride(),
            GROUP=group,
            GROUP_PAD=max(MIN_TILE, triton.next_power_of_2(group)),
            HEAD_DIM=head_dim,
            BLOCK_D=max(MIN_TILE, triton.next_power_of_2(head_dim)),
            BLOCK_SIZE=k_cache.shape[1])
    return out


def _launch(kernel, grid: tuple[int, ...], *args, **constants) -> None:
    """``kernel[grid](*args, **constants)``, reporting a stub's ``NotImplementedError`` as such."""
    try:
        kernel[grid](*args, **constants)
    except (InterpreterError, CompilationError) as err:
        _raise_stub_error(err)
        raise


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
