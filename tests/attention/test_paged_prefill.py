"""paged_prefill_attention against float64 SDPA on contiguous tensors.

Ragged query chunks with cached context: whole prompts (context 0), chunked-prefill chunks and
prefix-cache hits (context > 0, possibly in blocks shared with other sequences), decode tokens
(query 1) mixed into the same batch, and static batching's padding rows (slot -1, never
written). Every slot a sequence has not written holds NaN (``minivllm.attention.testing``).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minivllm.attention.testing import Seq, assert_matches_reference, make_paged_problem
from minivllm.attention.triton_kernels import paged_prefill_attention


def run_prefill(problem, caches=None, readable=True):
    k_cache, v_cache = caches or problem.caches(after=True)
    return paged_prefill_attention(
        problem.query, k_cache, v_cache, problem.block_tables, problem.query_start_loc, problem.seq_lens,
        problem.scale, problem.max_query_len, readable_lens=problem.meta.readable_lens() if readable else None,
    )


def chunks(pairs):
    """``(query_len, context_len)`` pairs as sequences of the step."""
    return [Seq(new=q, context=c) for q, c in pairs]


# A long decode, a short chunk, a long chunk after a long context, a short decode: one batch.
RAGGED_PAIRS = [(1, 1328), (5, 18), (129, 463), (1, 37)]

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
def test_ragged_query_context_pairs(dtype, block_size, head_dim, num_heads, num_kv_heads):
    problem = make_paged_problem(chunks(RAGGED_PAIRS), num_heads=num_heads, num_kv_heads=num_kv_heads,
                                 head_dim=head_dim, block_size=block_size, dtype=dtype, seed=block_size)
    assert_matches_reference(run_prefill(problem), problem)


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
    pairs = [(1, 0), (bs, 0), (bs + 1, 0), (3, bs), (7, bs + 1)]
    problem = make_paged_problem(chunks(pairs), num_heads=num_heads, num_kv_heads=num_kv_heads,
                                 head_dim=head_dim, block_size=bs, dtype=dtype, seed=head_dim)
    assert_matches_reference(run_prefill(problem), problem)


@pytest.mark.parametrize("unowned", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_padding_rows_never_reach_real_rows(unowned):
    """Static batching: a prompt padded at its end (its padding positions were never written
    and hold NaN/inf) shares tiles with its real rows, next to an idle seat (one padding row
    after its context). Real rows match the reference; without ``readable_lens`` the kernel
    would load the padding positions, and 0 * NaN in P @ V poisons the real rows."""
    seqs = [Seq(new=9), Seq(new=4, pad=5), Seq(new=0, context=12, pad=1), Seq(new=3, context=20)]
    problem = make_paged_problem(seqs, num_heads=4, num_kv_heads=2, head_dim=64, block_size=16,
                                 dtype=torch.float32, unowned=unowned, padding=unowned, seed=6)
    assert problem.meta.readable_lens().tolist() == [9, 4, 12, 23]
    assert_matches_reference(run_prefill(problem), problem)
    with warnings.catch_warnings():  # the interpreter's NumPy warns about the NaN it computes
        warnings.simplefilter("ignore", RuntimeWarning)
        unguarded = run_prefill(problem, readable=False)
    with pytest.raises(AssertionError, match="NaN/inf in the output of sequence 1"):
        assert_matches_reference(unguarded, problem)


def test_prefix_cache_hit_in_shared_blocks():
    """Three requests share a 2-block prefix (same physical blocks); each then has its own
    chunk of new tokens after a different amount of context."""
    problem = make_paged_problem(chunks([(9, 32), (16, 32), (1, 32)]), num_heads=4, num_kv_heads=2, head_dim=64,
                                 block_size=16, dtype=torch.float32, share={1: (0, 2), 2: (0, 2)}, seed=7)
    assert problem.tables[0][:2] == problem.tables[2][:2]
    assert_matches_reference(run_prefill(problem), problem)


def test_chunked_prefill_equals_whole_prompt():
    """Splitting a prompt into chunks (each attending to the cache the earlier chunks filled)
    gives the same outputs as running it whole."""
    problem = make_paged_problem([Seq(new=70)], num_heads=2, num_kv_heads=1, head_dim=64, block_size=16,
                                 dtype=torch.float32, seed=9)
    k_cache, v_cache = problem.caches(after=True)
    whole = run_prefill(problem)
    pieces = []
    for start, end in [(0, 20), (20, 21), (21, 70)]:
        starts = torch.tensor([0, end - start], dtype=torch.int32, device=whole.device)
        lens = torch.tensor([end], dtype=torch.int32, device=whole.device)
        pieces.append(paged_prefill_attention(problem.query[start:end], k_cache, v_cache, problem.block_tables,
                                              starts, lens, problem.scale, end - start))
    torch.testing.assert_close(torch.cat(pieces), whole, atol=1e-6, rtol=1e-6)


def test_causal_mask_is_exact():
    """Changing the K/V of the last token may change only the last query row's output."""
    problem = make_paged_problem([Seq(new=6, context=14)], num_heads=1, num_kv_heads=1, head_dim=64,
                                 block_size=16, dtype=torch.float32, unowned=0.0, seed=2)
    k_cache, v_cache = problem.caches(after=True)
    base = run_prefill(problem, (k_cache, v_cache))
    block = problem.tables[0][1]
    k_cache[block, 3] = 5.0  # position 19 = the last new token
    v_cache[block, 3] = 5.0
    changed = run_prefill(problem, (k_cache, v_cache))
    torch.testing.assert_close(changed[:-1], base[:-1], atol=0, rtol=0)
    assert (changed[-1] - base[-1]).abs().max() > 1e-2


def test_long_prompt_chunk():
    """A 2,000+ token sequence whose last 40 tokens are the new chunk."""
    problem = make_paged_problem(chunks([(40, 2010), (1, 8)]), num_heads=2, num_kv_heads=1, head_dim=64,
                                 block_size=64, dtype=torch.float32, seed=4)
    assert_matches_reference(run_prefill(problem), problem)


def test_rejects_readable_lens_of_the_wrong_shape():
    problem = make_paged_problem(chunks([(3, 4), (2, 0)]), dtype=torch.float32)
    k_cache, v_cache = problem.caches(after=True)
    with pytest.raises(ValueError, match="readable_lens"):
        paged_prefill_attention(problem.query, k_cache, v_cache, problem.block_tables, problem.query_start_loc,
                                problem.seq_lens, problem.scale, 3, readable_lens=problem.seq_lens[:1])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lens=st.lists(st.tuples(st.integers(1, 20), st.integers(0, 40)), min_size=1, max_size=4),
    block_size=st.sampled_from([16, 32]),
    group=st.sampled_from([1, 3]),
    seed=st.integers(0, 2**16),
)
def test_random_ragged_batches(lens, block_size, group, seed):
    problem = make_paged_problem(chunks(lens), num_heads=group, num_kv_heads=1, head_dim=64,
                                 block_size=block_size, dtype=torch.float32, seed=seed)
    assert_matches_reference(run_prefill(problem), problem)
