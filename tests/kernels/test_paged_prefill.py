"""paged_prefill_attention against a float64 gather-and-softmax reference.

Ragged query chunks with cached context: whole prompts (context 0), chunked-prefill chunks and
prefix-cache hits (context > 0, possibly in blocks shared with other sequences), decode tokens
(query 1) mixed into the same batch.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paged_kv_helpers import assert_close_to_reference, make_batch, reference_attention

from minivllm.attention.triton_kernels import paged_prefill_attention


def run_prefill(batch):
    return paged_prefill_attention(
        batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.query_start_loc,
        batch.seq_lens_t, batch.scale, max(batch.query_lens),
    )


# The (query, context) pairs the issue asks for, as one ragged batch.
ISSUE_PAIRS = [(1, 1328), (5, 18), (129, 463), (1, 37)]

CONFIGS = [
    (torch.float32, 16, 64, 2, 1),  # ratio 2
    (torch.float16, 32, 128, 4, 1),  # ratio 4
    (torch.bfloat16, 64, 96, 5, 1),  # odd group 5:1, head_dim 96
]


@pytest.mark.parametrize(
    "dtype,block_size,head_dim,num_heads,num_kv_heads",
    CONFIGS,
    ids=[f"{str(c[0])[6:]}-bs{c[1]}-d{c[2]}-h{c[3]}kv{c[4]}" for c in CONFIGS],
)
def test_issue_query_context_pairs(dtype, block_size, head_dim, num_heads, num_kv_heads):
    query_lens = [q for q, _ in ISSUE_PAIRS]
    seq_lens = [q + c for q, c in ISSUE_PAIRS]
    batch = make_batch(query_lens, seq_lens, num_heads=num_heads, num_kv_heads=num_kv_heads,
                       head_dim=head_dim, block_size=block_size, dtype=dtype, seed=block_size)
    out = run_prefill(batch)
    assert out.shape == batch.q.shape
    assert_close_to_reference(out, reference_attention(batch), dtype)


BOUNDARY_CONFIGS = [
    (torch.float32, 16, 80, 1, 1),  # ratio 1, head_dim 80
    (torch.float32, 32, 64, 8, 1),  # ratio 8
    (torch.float16, 16, 64, 4, 2),  # ratio 2, two KV heads
    (torch.bfloat16, 32, 128, 4, 1),  # ratio 4
]


@pytest.mark.parametrize(
    "dtype,block_size,head_dim,num_heads,num_kv_heads",
    BOUNDARY_CONFIGS,
    ids=[f"{str(c[0])[6:]}-bs{c[1]}-d{c[2]}-h{c[3]}kv{c[4]}" for c in BOUNDARY_CONFIGS],
)
def test_prompts_at_block_boundaries(dtype, block_size, head_dim, num_heads, num_kv_heads):
    """Whole prompts (no context) of 1, exactly a block and one past a block, next to chunks
    whose context ends exactly at, and one past, a block boundary."""
    bs = block_size
    query_lens = [1, bs, bs + 1, 3, 7]
    seq_lens = [1, bs, bs + 1, bs + 3, bs + 1 + 7]
    batch = make_batch(query_lens, seq_lens, num_heads=num_heads, num_kv_heads=num_kv_heads,
                       head_dim=head_dim, block_size=bs, dtype=dtype, seed=head_dim)
    assert_close_to_reference(run_prefill(batch), reference_attention(batch), dtype)


def test_prefix_cache_hit_in_shared_blocks():
    """Three requests share a 2-block prefix (same physical blocks); each then has its own
    chunk of new tokens after a different amount of context."""
    batch = make_batch([9, 16, 1], [41, 48, 33], num_heads=4, num_kv_heads=2, head_dim=64, block_size=16,
                       dtype=torch.float32, shared_prefix_blocks=2, seed=7)
    assert torch.equal(batch.block_tables[0, :2], batch.block_tables[2, :2])
    assert_close_to_reference(run_prefill(batch), reference_attention(batch), torch.float32)


def test_chunked_prefill_equals_whole_prompt():
    """Splitting a prompt into chunks (each attending to the cache the earlier chunks filled)
    gives the same outputs as running it whole."""
    batch = make_batch([70], [70], num_heads=2, num_kv_heads=1, head_dim=64, block_size=16,
                       dtype=torch.float32, seed=9)
    whole = run_prefill(batch)
    chunks = []
    for start, end in [(0, 20), (20, 21), (21, 70)]:
        chunk = make_batch([end - start], [end], num_heads=2, num_kv_heads=1, head_dim=64, block_size=16,
                           dtype=torch.float32, seed=9)
        chunk.k_cache, chunk.v_cache, chunk.block_tables = batch.k_cache, batch.v_cache, batch.block_tables
        chunk.q = batch.q[start:end]
        chunks.append(run_prefill(chunk))
    torch.testing.assert_close(torch.cat(chunks), whole, atol=1e-6, rtol=1e-6)


def test_causal_mask_is_exact():
    """Changing the K/V of the last token may change only the last query row's output."""
    batch = make_batch([6], [20], num_heads=1, num_kv_heads=1, head_dim=64, block_size=16,
                       dtype=torch.float32, poison=0.0, seed=2)
    base = run_prefill(batch)
    block = int(batch.block_tables[0, 1])
    batch.k_cache[block, 3] = 5.0  # position 19 = the last new token
    batch.v_cache[block, 3] = 5.0
    changed = run_prefill(batch)
    torch.testing.assert_close(changed[:-1], base[:-1], atol=0, rtol=0)
    assert (changed[-1] - base[-1]).abs().max() > 1e-2


def test_long_prompt_chunk():
    """A 2,000+ token sequence whose last 40 tokens are the new chunk."""
    batch = make_batch([40, 1], [2050, 9], num_heads=2, num_kv_heads=1, head_dim=64, block_size=64,
                       dtype=torch.float32, seed=4)
    assert_close_to_reference(run_prefill(batch), reference_attention(batch), torch.float32)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lens=st.lists(st.tuples(st.integers(1, 20), st.integers(0, 40)), min_size=1, max_size=4),
    block_size=st.sampled_from([16, 32]),
    group=st.sampled_from([1, 3]),
    seed=st.integers(0, 2**16),
)
def test_random_ragged_batches(lens, block_size, group, seed):
    query_lens = [q for q, _ in lens]
    seq_lens = [q + c for q, c in lens]
    batch = make_batch(query_lens, seq_lens, num_heads=group, num_kv_heads=1, head_dim=64,
                       block_size=block_size, dtype=torch.float32, seed=seed)
    assert_close_to_reference(run_prefill(batch), reference_attention(batch), torch.float32)
