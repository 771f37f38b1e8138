"""paged_decode_attention (plain and split-KV) against float64 SDPA on contiguous tensors.

Problems come from ``minivllm.attention.testing``: shuffled physical blocks, ragged lengths, GQA,
and every slot no sequence owns filled with NaN, so a kernel that loads one gives NaN. Runs in
the Triton interpreter on a CPU; head counts are small because the interpreter's cost grows with
programs x blocks, not with the size of each tile.
"""

from __future__ import annotations

import pytest
import torch

from minivllm.attention.testing import TOLERANCES, assert_matches_reference, decode_problem
from minivllm.attention.triton_kernels import choose_num_splits, paged_decode_attention


def run_decode(problem, num_splits=None, caches=None):
    k_cache, v_cache = caches or problem.caches(after=True)
    return paged_decode_attention(problem.query, k_cache, v_cache, problem.block_tables, problem.seq_lens,
                                  problem.scale, num_splits=num_splits)


def boundary_lengths(block_size: int) -> list[int]:
    """1 token, exactly one block, one past a block, and a few blocks plus change."""
    return [1, block_size, block_size + 1, 3 * block_size + 5]


# (dtype, block_size, head_dim, num_heads, num_kv_heads): every dtype, block size, head dim
# (64, 128, and non-powers of two 80 / 96) and GQA ratio (1, 2, 4, 8, and 5:1) appears at least once.
CONFIGS = [
    (torch.float32, 16, 64, 2, 2),  # ratio 1
    (torch.float32, 32, 80, 4, 2),  # ratio 2, head_dim 80
    (torch.float32, 64, 128, 8, 1),  # ratio 8
    (torch.float16, 16, 128, 4, 1),  # ratio 4
    (torch.float16, 64, 96, 5, 1),  # odd group: 5 query heads over 1 KV head, head_dim 96
    (torch.bfloat16, 32, 64, 8, 2),  # ratio 4
    (torch.bfloat16, 16, 80, 5, 1),  # odd group, head_dim 80
]


@pytest.mark.parametrize(
    "dtype,block_size,head_dim,num_heads,num_kv_heads",
    CONFIGS,
    ids=[f"{str(c[0])[6:]}-bs{c[1]}-d{c[2]}-h{c[3]}kv{c[4]}" for c in CONFIGS],
)
def test_decode_matches_reference(dtype, block_size, head_dim, num_heads, num_kv_heads):
    problem = decode_problem(boundary_lengths(block_size), num_heads=num_heads, num_kv_heads=num_kv_heads,
                             head_dim=head_dim, block_size=block_size, dtype=dtype, seed=block_size + head_dim)
    assert_matches_reference(run_decode(problem, num_splits=1), problem)


@pytest.mark.parametrize("unowned", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_unowned_slots_never_reach_the_output(unowned, num_splits):
    """Every slot no sequence owns (the tails of last blocks, spare blocks, the guard blocks
    around the cache) holds NaN or an infinity; plain and split-KV give the reference."""
    problem = decode_problem([1, 15, 16, 17, 40], num_heads=4, num_kv_heads=2, head_dim=64, block_size=16,
                             dtype=torch.float16, unowned=unowned, guard_blocks=2, seed=4)
    assert_matches_reference(run_decode(problem, num_splits=num_splits), problem)


@pytest.mark.parametrize("block_size", [16, 64])
def test_decode_long_context(block_size):
    """A context of more than 2,000 tokens, in one batch with a short sequence."""
    problem = decode_problem([2049, 7], num_heads=2, num_kv_heads=1, head_dim=64, block_size=block_size,
                             dtype=torch.float32, seed=block_size)
    assert_matches_reference(run_decode(problem, num_splits=1), problem)


def test_decode_sees_every_token_and_only_those():
    """Perturbing the last token of a sequence must change its output; perturbing a slot the
    sequence does not own (the rest of its last block) must not."""
    problem = decode_problem([37], num_heads=2, num_kv_heads=1, head_dim=64, block_size=16,
                             dtype=torch.float32, unowned=0.0)
    k_cache, v_cache = problem.caches(after=True)
    base = run_decode(problem, 1, (k_cache, v_cache))
    last_block = problem.tables[0][2]
    saved = v_cache[last_block, 4].clone()
    v_cache[last_block, 4] += 10.0  # position 36 = the last token
    assert (run_decode(problem, 1, (k_cache, v_cache)) - base).abs().max() > 1e-3
    v_cache[last_block, 4] = saved
    v_cache[last_block, 5:] = 1e4  # positions 37.. are not part of the sequence
    torch.testing.assert_close(run_decode(problem, 1, (k_cache, v_cache)), base, atol=0, rtol=0)


def test_shared_blocks_between_sequences():
    """Three sequences whose first two blocks are the same physical blocks (prefix sharing)."""
    problem = decode_problem([40, 33, 70], num_heads=4, num_kv_heads=2, head_dim=64, block_size=16,
                             dtype=torch.float32, share={1: (0, 2), 2: (0, 2)}, seed=3)
    assert problem.tables[0][:2] == problem.tables[1][:2] == problem.tables[2][:2]
    assert_matches_reference(run_decode(problem, num_splits=1), problem)


@pytest.mark.parametrize("num_splits", [2, 3, 8, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_kv_equals_plain(num_splits, dtype):
    """Split-KV must give the plain kernel's answer. 40 splits is more than any sequence has
    blocks, so some splits are empty and must drop out of the merge."""
    problem = decode_problem([1, 16, 17, 300], num_heads=4, num_kv_heads=1, head_dim=64, block_size=16,
                             dtype=dtype, seed=num_splits)
    plain = run_decode(problem, num_splits=1)
    split = run_decode(problem, num_splits=num_splits)
    assert_matches_reference(split, problem)
    # Both accumulate in fp32; only the merge's summation order differs.
    tol = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else TOLERANCES[dtype]
    torch.testing.assert_close(split, plain, **tol)


def test_split_kv_long_context():
    problem = decode_problem([2100], num_heads=4, num_kv_heads=1, head_dim=64, block_size=64,
                             dtype=torch.float16, seed=11)
    assert_matches_reference(run_decode(problem, num_splits=4), problem)


def test_split_heuristic():
    # Few programs and a long context: split; the documented examples (8 KV heads, block 16).
    assert choose_num_splits(1, 8, 32768, 16) == 32
    assert choose_num_splits(8, 8, 4096, 16) == 4
    # Enough programs already: never split.
    assert choose_num_splits(64, 8, 4096, 16) == 1
    assert choose_num_splits(256, 8, 32768, 16) == 1
    # Short context: not enough blocks to share.
    assert choose_num_splits(1, 8, 100, 16) == 1
    for args in [(1, 1, 10**6, 16), (3, 2, 5000, 32), (1, 8, 1, 16)]:
        assert 1 <= choose_num_splits(*args) <= 32


def test_auto_split_matches_forced(monkeypatch):
    """num_splits=None follows choose_num_splits (batch 1, 1 KV head, 1,000 tokens -> split)."""
    import minivllm.attention.triton_decode as dec

    problem = decode_problem([1000], num_heads=2, num_kv_heads=1, head_dim=64, block_size=64,
                             dtype=torch.float32, seed=5)
    assert choose_num_splits(1, 1, 1000, 64) > 1
    launched = []
    real = dec._merge_splits_kernel

    class Spy:
        def __getitem__(self, grid):
            launched.append(grid)
            return real[grid]

    monkeypatch.setattr(dec, "_merge_splits_kernel", Spy())
    out = run_decode(problem)
    assert launched, "the heuristic should have chosen split-KV here"
    assert_matches_reference(out, problem)


def test_rejects_bad_inputs():
    problem = decode_problem([5], num_heads=3, num_kv_heads=1, head_dim=64, block_size=16, dtype=torch.float32)
    k_cache, v_cache = problem.caches(after=True)
    tables, lens, scale = problem.block_tables, problem.seq_lens, problem.scale
    with pytest.raises(ValueError, match="dtype"):
        paged_decode_attention(problem.query.half(), k_cache, v_cache, tables, lens, scale)
    with pytest.raises(ValueError, match="multiple"):
        paged_decode_attention(problem.query[:, :2], k_cache.expand(-1, -1, 3, -1), v_cache.expand(-1, -1, 3, -1),
                               tables, lens, scale)
    with pytest.raises(ValueError, match="num_splits"):
        run_decode(problem, num_splits=0)
    small = decode_problem([5], num_heads=1, num_kv_heads=1, head_dim=64, block_size=8, dtype=torch.float32)
    with pytest.raises(ValueError, match="block_size"):
        run_decode(small)
