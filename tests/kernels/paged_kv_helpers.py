"""Shared pieces of the kernel tests: building paged batches and a plain reference.

The reference here is deliberately *not* ``minivllm/attention/torch_ref.py``: it loops over
sequences, gathers exactly ``seq_len`` positions through the block table, repeats KV heads for
GQA and runs softmax attention in float64. If the shipped reference and the kernels shared a
mistake, this one would still disagree with both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Kernels run compiled on a GPU when there is one, in the Triton interpreter on the CPU otherwise.
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

# Tolerances per dtype for "kernel output vs float64 reference on the same (rounded) inputs".
# fp32: accumulation order only. fp16: the output is rounded to fp16 (2^-11 relative) and the
# probabilities are rounded to fp16 before the P.V dot. bf16: the same with 2^-8.
TOLERANCES = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=2e-3, rtol=5e-3),
    torch.bfloat16: dict(atol=1.5e-2, rtol=2e-2),
}


@dataclass
class PagedBatch:
    """One flat batch over a paged cache whose contents are already written."""

    q: torch.Tensor  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    query_lens: list[int]
    seq_lens: list[int]
    scale: float

    @property
    def seq_lens_t(self) -> torch.Tensor:
        return torch.tensor(self.seq_lens, dtype=torch.int32, device=DEVICE)

    @property
    def query_start_loc(self) -> torch.Tensor:
        starts = [0]
        for n in self.query_lens:
            starts.append(starts[-1] + n)
        return torch.tensor(starts, dtype=torch.int32, device=DEVICE)


def random_block_tables(
    seq_lens: list[int],
    block_size: int,
    gen: torch.Generator,
    spare_blocks: int = 3,
    shared_prefix_blocks: int = 0,
) -> tuple[list[list[int]], int]:
    """Random, permuted block tables. The first ``shared_prefix_blocks`` logical blocks of every
    sequence are the *same* physical blocks (a prefix-cache hit). Returns ``(tables, num_blocks)``
    where ``num_blocks`` includes ``spare_blocks`` blocks that no sequence owns."""
    needed = [-(-n // block_size) for n in seq_lens]
    shared = min([shared_prefix_blocks, *needed]) if seq_lens else 0
    own = sum(n - shared for n in needed)
    num_blocks = shared + own + spare_blocks
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    prefix, rest = perm[:shared], perm[shared:]
    tables = []
    for n in needed:
        tables.append(prefix + rest[: n - shared])
        rest = rest[n - shared :]
    return tables, num_blocks


def make_batch(
    query_lens: list[int],
    seq_lens: list[int],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int = 0,
    shared_prefix_blocks: int = 0,
    poison: float | None = float("nan"),
    scale: float | None = None,
) -> PagedBatch:
    """A batch (on ``DEVICE``) whose cache already holds every sequence's K/V (context and new tokens).

    Slots that belong to no sequence (spare blocks, the tail of each last block) are filled
    with ``poison`` (NaN by default): a kernel that reads or weights them produces NaN.
    """
    gen = torch.Generator().manual_seed(seed)
    tables, num_blocks = random_block_tables(seq_lens, block_size, gen, shared_prefix_blocks=shared_prefix_blocks)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen)
    v_cache = torch.randn(shape, generator=gen)
    if poison is not None:
        owned = torch.zeros(num_blocks * block_size, dtype=torch.bool)
        for table, n in zip(tables, seq_lens, strict=True):
            for p in range(n):
                owned[table[p // block_size] * block_size + p % block_size] = True
        flat_k = k_cache.view(num_blocks * block_size, -1)
        flat_v = v_cache.view(num_blocks * block_size, -1)
        flat_k[~owned] = poison
        flat_v[~owned] = poison
    width = max(len(t) for t in tables)
    block_tables = torch.zeros((len(tables), width), dtype=torch.int32)
    for i, t in enumerate(tables):
        block_tables[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
    q = torch.randn((sum(query_lens), num_heads, head_dim), generator=gen)
    return PagedBatch(
        q=q.to(DEVICE, dtype),
        k_cache=k_cache.to(DEVICE, dtype),
        v_cache=v_cache.to(DEVICE, dtype),
        block_tables=block_tables.to(DEVICE),
        query_lens=list(query_lens),
        seq_lens=list(seq_lens),
        scale=head_dim**-0.5 if scale is None else scale,
    )


def reference_attention(batch: PagedBatch) -> torch.Tensor:
    """float64 causal attention, one sequence at a time, on the CPU. Returns ``[num_tokens, H, D]``."""
    q_all = batch.q.double().cpu()
    k_cache, v_cache, block_tables = batch.k_cache.cpu(), batch.v_cache.cpu(), batch.block_tables.cpu()
    num_heads = q_all.shape[1]
    block_size, num_kv_heads, head_dim = batch.k_cache.shape[1:]
    group = num_heads // num_kv_heads
    outs = []
    start = 0
    for i, (query_len, seq_len) in enumerate(zip(batch.query_lens, batch.seq_lens, strict=True)):
        blocks = block_tables[i, : -(-seq_len // block_size)].long()
        # Gather exactly this sequence's positions 0..seq_len-1 through its block table.
        k = k_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len].double()
        v = v_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len].double()
        k = k.repeat_interleave(group, dim=1)  # [seq_len, H, D]: query head h reads KV head h // group
        v = v.repeat_interleave(group, dim=1)
        q = q_all[start : start + query_len]  # [query_len, H, D]
        scores = torch.einsum("qhd,khd->hqk", q, k) * batch.scale
        q_pos = seq_len - query_len + torch.arange(query_len)
        future = torch.arange(seq_len)[None, :] > q_pos[:, None]  # [query_len, seq_len]
        scores = scores.masked_fill(future[None], float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v))
        start += query_len
    return torch.cat(outs) if outs else q_all.new_zeros(q_all.shape)


def assert_close_to_reference(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert out.dtype == dtype, f"output dtype {out.dtype}, expected {dtype}"
    assert torch.isfinite(out).all(), "kernel output has NaN/inf (did it read unowned cache slots?)"
    torch.testing.assert_close(out.double().cpu(), ref, **TOLERANCES[dtype])
