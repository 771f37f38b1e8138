"""The Triton kernels over an 8-bit KV cache (``kv_cache_dtype="int8"``, ``kv_quant.py``).

* ``reshape_and_cache`` stores exactly the bytes ``kv_quant.quantize_rows`` computes (codes and
  float32 scale), ties rounded half to even, padding slots untouched;
* paged decode (plain and split-KV) and paged prefill, and the Triton backend through
  ``forward``, against float64 SDPA on the dequantised K/V (``testing.int8_problem``): every
  slot no sequence owns holds random codes and a NaN or inf scale, so a kernel that loads one
  gives NaN. Shapes are small: the interpreter's cost grows with programs x blocks.
"""

from __future__ import annotations

import pytest
import torch

from minivllm.attention import get_attention_backend
from minivllm.attention.kv_quant import quantize_rows, split_rows
from minivllm.attention.testing import (
    Seq,
    assert_cache_matches,
    assert_matches_reference,
    decode_problem,
    int8_problem,
    make_paged_problem,
)
from minivllm.attention.triton_kernels import (
    paged_decode_attention,
    paged_prefill_attention,
    reshape_and_cache,
)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_reshape_and_cache_stores_the_reference_bytes(dtype):
    gen = torch.Generator().manual_seed(3)
    tokens, heads, head_dim, block_size, num_blocks = 9, 3, 40, 16, 4
    # a strided view, as from a fused QKV projection; rows of very different magnitudes
    fused = torch.randn(tokens, 2 * heads, head_dim, generator=gen) * torch.rand(tokens, 2 * heads, 1, generator=gen) * 8
    fused[2, 1] = 0.0  # an all-zero row: scale 0, codes 0
    fused[4, 0] = 1e-30  # tiny: a scale far below float16's range, still float32
    key, value = fused[:, :heads].to(dtype), fused[:, heads:].to(dtype)
    k_cache = torch.randint(-128, 128, (num_blocks, block_size, heads, head_dim + 4), generator=gen, dtype=torch.int8)
    v_cache = torch.randint(-128, 128, k_cache.shape, generator=gen, dtype=torch.int8)
    slots = torch.tensor([0, 5, 17, 33, -1, 63, 20, 21, 2])
    want_k, want_v = k_cache.clone(), v_cache.clone()
    keep = slots >= 0
    want_k.view(-1, heads, head_dim + 4)[slots[keep]] = quantize_rows(key[keep])
    want_v.view(-1, heads, head_dim + 4)[slots[keep]] = quantize_rows(value[keep])
    k_dev, v_dev = k_cache.to(DEVICE), v_cache.to(DEVICE)
    reshape_and_cache(key.to(DEVICE), value.to(DEVICE), k_dev, v_dev, slots.to(DEVICE))
    assert_cache_matches(k_dev, want_k, "int8 K cache")
    assert_cache_matches(v_dev, want_v, "int8 V cache")


def test_reshape_and_cache_rounds_ties_to_even():
    """A row whose largest magnitude is 127 has scale exactly 1.0: x.5 values are ties."""
    row = torch.tensor([127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.49, 126.5, -126.5, 0.0, 7.5])
    key = row.repeat(1, 1, 1)  # [1 token, 1 head, 12]
    k_cache = torch.zeros(1, 16, 1, 16, dtype=torch.int8, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    reshape_and_cache(key.to(DEVICE), key.to(DEVICE), k_cache, v_cache, torch.tensor([3], device=DEVICE))
    codes, scale = split_rows(k_cache.cpu()[0, 3, 0])
    assert scale.item() == 1.0
    assert codes.tolist() == [127, 0, 2, 2, 0, -2, -2, 3, 126, -126, 0, 8]
    assert torch.equal(k_cache.cpu()[0, 3, 0], quantize_rows(row))


def test_reshape_and_cache_refuses_a_wrong_row_width():
    key = torch.randn(2, 1, 16)
    cache = torch.zeros(1, 16, 1, 16, dtype=torch.int8)  # 16 bytes: no room for the scale
    with pytest.raises(ValueError, match="an int8 row: 20 bytes"):
        reshape_and_cache(key, key, cache, cache.clone(), torch.tensor([0, 1]))


# (dtype, block_size, head_dim, num_heads, num_kv_heads)
DECODE_CONFIGS = [
    (torch.float32, 16, 32, 4, 2),
    (torch.float16, 32, 64, 4, 1),
    (torch.bfloat16, 16, 40, 5, 1),  # odd group, head_dim not a power of two
]


@pytest.mark.parametrize("unowned_scale", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("dtype,block_size,head_dim,num_heads,num_kv_heads", DECODE_CONFIGS,
                         ids=[f"{str(c[0])[6:]}-bs{c[1]}-d{c[2]}" for c in DECODE_CONFIGS])
def test_int8_decode_matches_reference(dtype, block_size, head_dim, num_heads, num_kv_heads, unowned_scale):
    float_problem = decode_problem([1, block_size, block_size + 1, 3 * block_size + 5], num_heads=num_heads,
                                   num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size,
                                   dtype=dtype, guard_blocks=1, seed=head_dim, device=DEVICE)
    problem = int8_problem(float_problem, unowned_scale=unowned_scale)
    k_cache, v_cache = problem.caches(after=True)
    assert k_cache.dtype == torch.int8 and k_cache.shape[-1] == head_dim + 4
    for num_splits in (1, 3):
        out = paged_decode_attention(problem.query, k_cache, v_cache, problem.block_tables, problem.seq_lens,
                                     problem.scale, num_splits=num_splits)
        assert_matches_reference(out, problem)


@pytest.mark.parametrize("unowned_scale", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_int8_prefill_matches_reference(dtype, unowned_scale):
    """A whole prompt, a chunk after cached context, a decode row, and a prompt padded with
    slot -1 rows whose positions are never written."""
    seqs = [Seq(new=20), Seq(new=9, context=23), Seq(new=1, context=16), Seq(new=5, context=0, pad=3)]
    float_problem = make_paged_problem(seqs, num_heads=4, num_kv_heads=2, head_dim=32, block_size=16, dtype=dtype,
                                       guard_blocks=1, seed=5, device=DEVICE)
    problem = int8_problem(float_problem, unowned_scale=unowned_scale)
    k_cache, v_cache = problem.caches(after=True)
    out = paged_prefill_attention(problem.query, k_cache, v_cache, problem.block_tables, problem.query_start_loc,
                                  problem.seq_lens, problem.scale, problem.max_query_len,
                                  readable_lens=problem.meta.readable_lens())
    assert_matches_reference(out, problem)


@pytest.mark.parametrize("kind", ["decode", "mixed"])
def test_triton_backend_on_an_int8_cache(kind):
    """``forward`` writes the new rows (quantised: the same bytes as the PyTorch writer), then
    attends; the ragged PyTorch backend gives the same answer from the same cache."""
    if kind == "decode":
        seqs = [Seq(new=1, context=n) for n in (0, 15, 16, 40)]
    else:
        seqs = [Seq(new=12), Seq(new=1, context=20), Seq(new=6, context=16)]
    float_problem = make_paged_problem(seqs, num_heads=4, num_kv_heads=2, head_dim=32, block_size=16,
                                       dtype=torch.float32, seed=9, device=DEVICE)
    problem = int8_problem(float_problem)
    results = {}
    for name in ("triton", "torch"):
        k_cache, v_cache = problem.caches()
        out = get_attention_backend(name).forward(problem.query, problem.key, problem.value, k_cache, v_cache,
                                                  problem.meta, problem.scale)
        assert_matches_reference(out, problem)
        assert_cache_matches(k_cache, problem.k_cache_after, f"{name}: K cache")
        assert_cache_matches(v_cache, problem.v_cache_after, f"{name}: V cache")
        results[name] = out
    torch.testing.assert_close(results["triton"], results["torch"], atol=2e-5, rtol=2e-5)
