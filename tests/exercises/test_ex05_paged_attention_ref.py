"""Grade exercise 05 (`pytest -m ex05`): beyond the notebook's cases (`test_cases.py`),
random steps (hypothesis) against SDPA on contiguous tensors, a half-precision cache next to
minivllm's own backend, the protocol, and bad inputs.

Imports `exercises/ex05_paged_attention_ref.py` (your work) by default, `solutions/` with
`MINIVLLM_SOLUTIONS=1` or `--solutions`.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minivllm.attention import AttentionBackend, get_attention_backend
from minivllm.attention.metadata import AttentionMetadata
from minivllm.course.checks.ex05_paged_attention_ref import DEVICE, Seq, expect_step, make_step

NAME = "ex05_paged_attention_ref"


@st.composite
def steps(draw):
    block_size = draw(st.sampled_from([1, 4, 16]))
    num_kv_heads = draw(st.sampled_from([1, 2]))
    seqs = []
    for _ in range(draw(st.integers(1, 5))):
        context = draw(st.integers(0, 3 * block_size + 1))
        new = draw(st.integers(0 if context else 1, 2 * block_size + 1))
        pad = draw(st.sampled_from([0, 0, 0, 1, 3])) if new or context else 0
        seqs.append(Seq(new=new, context=context, pad=max(pad, 0 if new else 1)))
    group = draw(st.sampled_from([1, 3, 4]))
    return dict(seqs=seqs, block_size=block_size, num_kv_heads=num_kv_heads,
                num_heads=num_kv_heads * group, head_dim=draw(st.sampled_from([8, 32])),
                seed=draw(st.integers(0, 10_000)))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps())
def test_random_steps_match_sdpa(ex, spec):
    seqs = spec.pop("seqs")
    expect_step(ex, make_step(seqs, **spec))


def engine_step(backend, cache_dtype, seed=0):
    """A float32 step (a decode, a chunk after a hit on shared blocks, a prompt) over a cache of
    ``cache_dtype``: returns the output and both caches after the step."""
    gen = torch.Generator().manual_seed(seed)
    block_size, heads, kv_heads, dim = 16, 6, 2, 32
    query_lens, seq_lens, tables = [1, 6, 9], [34, 38, 9], [[4, 7, 2], [4, 7, 5], [9]]
    slots = []
    for n_new, n, table in zip(query_lens, seq_lens, tables, strict=True):
        slots += [table[p // block_size] * block_size + p % block_size for p in range(n - n_new, n)]
    meta = AttentionMetadata.build(query_lens, seq_lens, tables, slots, block_size, device=DEVICE)
    k_cache = torch.randn(12, block_size, kv_heads, dim, generator=gen).to(cache_dtype).to(DEVICE)
    v_cache = torch.randn(12, block_size, kv_heads, dim, generator=gen).to(cache_dtype).to(DEVICE)
    num_tokens = sum(query_lens)
    q, k, v = (torch.randn(num_tokens, h, dim, generator=gen).to(DEVICE)
               for h in (heads, kv_heads, kv_heads))
    out = backend.forward(q, k, v, k_cache, v_cache, meta, dim**-0.5)
    return out, k_cache, v_cache


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_like_minivllm_backend_on_a_cache_of_another_dtype(ex, cache_dtype):
    """The cache keeps its own dtype (``kv_cache_dtype``); the output has the query's."""
    got = engine_step(ex.PagedAttentionBackend(), cache_dtype)
    want = engine_step(get_attention_backend("torch"), cache_dtype)
    assert got[0].dtype == torch.float32 and got[1].dtype == cache_dtype
    for g, w, what in zip(got, want, ["output", "k_cache", "v_cache"], strict=True):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=2e-5,
                                   msg=lambda m, what=what: f"{what}: {m}")


def test_meets_the_protocol(ex):
    backend = ex.PagedAttentionBackend()
    assert isinstance(backend, AttentionBackend) and isinstance(backend.name, str)


def test_an_empty_step(ex):
    p = make_step([Seq(new=2, context=3)])
    meta = AttentionMetadata.build([], [], [], [], 16, device=DEVICE)
    out = ex.PagedAttentionBackend().forward(p.query[:0], p.key[:0], p.value[:0], *p.caches(), meta, 0.1)
    assert out.shape == (0, 6, 32)


def test_bad_inputs_are_refused(ex):
    p = make_step([Seq(new=2, context=3), Seq(new=1, context=20)])
    k_cache, v_cache = p.caches()
    backend = ex.PagedAttentionBackend()
    with pytest.raises(ValueError, match="num_heads=5 is not a multiple of num_kv_heads=2"):
        backend.forward(p.query[:, :5], p.key, p.value, k_cache, v_cache, p.meta, 0.1)
    with pytest.raises(ValueError, match="add up to 3 rows, the batch has 2"):
        backend.forward(p.query[:2], p.key[:2], p.value[:2], k_cache, v_cache, p.meta, 0.1)
    with pytest.raises(ValueError, match="k_cache .* and v_cache"):
        backend.forward(p.query, p.key, p.value, k_cache, v_cache[:, :8], p.meta, 0.1)
    bad = AttentionMetadata.build([3], [2], [[0]], [0, 1, 2], 16, device=DEVICE)
    with pytest.raises(ValueError, match="query_len 3 must be in 0..seq_len \\(2\\)"):
        backend.forward(p.query[:3], p.key[:3], p.value[:3], k_cache, v_cache, bad, 0.1)
