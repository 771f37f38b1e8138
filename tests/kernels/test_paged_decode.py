"""paged_decode_attention (plain and split-KV) against a float64 gather-and-softmax reference.

Runs in the Triton interpreter on CPU. Head counts are kept small because the interpreter's
cost grows with programs x blocks, not with the size of each tile.
"""

from __future__ import annotations

import pytest
import torch
from paged_kv_helpers import TOLERANCES, assert_close_to_reference, make_batch, reference_attention

from minivllm.attention.triton_kernels import choose_num_splits, paged_decode_attention


def run_decode(batch, num_splits=None):
    return paged_decode_attention(
        batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens_t, batch.scale,
        num_splits=num_splits,
    )


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
    seq_lens = boundary_lengths(block_size)
    batch = make_batch(
        [1] * len(seq_lens), seq_lens, num_heads=num_heads, num_kv_heads=num_kv_heads,
        head_dim=head_dim, block_size=block_size, dtype=dtype, seed=block_size + head_dim,
    )
    out = run_decode(batch, num_splits=1)
    assert out.shape == batch.q.shape
    assert_close_to_reference(out, reference_attention(batch), dtype)


@pytest.mark.parametrize("block_size", [16, 64])
def test_decode_long_context(block_size):
    """A context of more than 2,000 tokens, in one batch with a short sequence."""
    batch = make_batch(
        [1, 1], [2049, 7], num_heads=2, num_kv_heads=1, head_dim=64, block_size=block_size,
        dtype=torch.float32, seed=block_size,
    )
    ref = reference_attention(batch)
    assert_close_to_reference(run_decode(batch, num_splits=1), ref, torch.float32)


def test_decode_sees_every_token_and_only_those():
    """Perturbing the last token of a sequence must change its output; perturbing a slot the
    sequence does not own (the rest of its last block, or a spare block) must not."""
    batch = make_batch([1], [37], num_heads=2, num_kv_heads=1, head_dim=64, block_size=16,
                       dtype=torch.float32, poison=0.0)
    base = run_decode(batch, num_splits=1)
    last_block = int(batch.block_tables[0, 2])
    saved = batch.v_cache[last_block, 4].clone()
    batch.v_cache[last_block, 4] += 10.0  # position 36 = the last token
    changed = run_decode(batch, num_splits=1)
    assert (changed - base).abs().max() > 1e-3
    batch.v_cache[last_block, 4] = saved
    batch.v_cache[last_block, 5:] = 1e4  # positions 37.. are not part of the sequence
    unchanged = run_decode(batch, num_splits=1)
    torch.testing.assert_close(unchanged, base, atol=0, rtol=0)


def test_shared_blocks_between_sequences():
    """Three sequences whose first two blocks are the same physical blocks (prefix sharing)."""
    batch = make_batch([1, 1, 1], [40, 33, 70], num_heads=4, num_kv_heads=2, head_dim=64, block_size=16,
                       dtype=torch.float32, shared_prefix_blocks=2, seed=3)
    assert torch.equal(batch.block_tables[0, :2], batch.block_tables[1, :2])
    assert_close_to_reference(run_decode(batch, num_splits=1), reference_attention(batch), torch.float32)


@pytest.mark.parametrize("num_splits", [2, 3, 8, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_kv_equals_plain(num_splits, dtype):
    """Split-KV must give the plain kernel's answer. 40 splits is more than any sequence has
    blocks, so some splits are empty and must drop out of the merge."""
    seq_lens = [1, 16, 17, 300]
    batch = make_batch([1] * 4, seq_lens, num_heads=4, num_kv_heads=1, head_dim=64, block_size=16,
                       dtype=dtype, seed=num_splits)
    plain = run_decode(batch, num_splits=1)
    split = run_decode(batch, num_splits=num_splits)
    assert_close_to_reference(split, reference_attention(batch), dtype)
    # Both accumulate in fp32; only the merge's summation order differs.
    tol = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else TOLERANCES[dtype]
    torch.testing.assert_close(split, plain, **tol)


def test_split_kv_long_context():
    batch = make_batch([1], [2100], num_heads=4, num_kv_heads=1, head_dim=64, block_size=64,
                       dtype=torch.float16, seed=11)
    assert_close_to_reference(run_decode(batch, num_splits=4), reference_attention(batch), torch.float16)


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

    batch = make_batch([1], [1000], num_heads=2, num_kv_heads=1, head_dim=64, block_size=64,
                       dtype=torch.float32, seed=5)
    chosen = choose_num_splits(1, 1, 1000, 64)
    assert chosen > 1
    launched = []
    real = dec._merge_splits_kernel

    class Spy:
        def __getitem__(self, grid):
            launched.append(grid)
            return real[grid]

    monkeypatch.setattr(dec, "_merge_splits_kernel", Spy())
    out = run_decode(batch)
    assert launched, "the heuristic should have chosen split-KV here"
    assert_close_to_reference(out, reference_attention(batch), torch.float32)


def test_rejects_bad_inputs():
    batch = make_batch([1], [5], num_heads=3, num_kv_heads=1, head_dim=64, block_size=16, dtype=torch.float32)
    with pytest.raises(ValueError, match="dtype"):
        paged_decode_attention(batch.q.half(), batch.k_cache, batch.v_cache, batch.block_tables,
                               batch.seq_lens_t, batch.scale)
    with pytest.raises(ValueError, match="multiple"):
        paged_decode_attention(batch.q[:, :2], batch.k_cache.expand(-1, -1, 3, -1), batch.v_cache.expand(-1, -1, 3, -1),
                               batch.block_tables, batch.seq_lens_t, batch.scale)
    with pytest.raises(ValueError, match="num_splits"):
        run_decode(batch, num_splits=0)
    small = make_batch([1], [5], num_heads=1, num_kv_heads=1, head_dim=64, block_size=8, dtype=torch.float32)
    with pytest.raises(ValueError, match="block_size"):
        run_decode(small)
