"""Every attention backend, through ``forward``, against SDPA on each sequence's own tensors.

A step is a list of rows ``(query_len, context_len)`` in any order: decodes (query 1), whole
prompts (context 0), and chunks after cached context (a later chunk, or a prefix-cache hit).
Each sequence's K/V is generated *contiguously*, then scattered into a paged cache through a
random block table; the reference never looks at the cache or the tables: it is
``torch.nn.functional.scaled_dot_product_attention`` in float64 on the contiguous tensors, with
K/V heads repeated for GQA and the causal mask offset by the context.

Cache slots that hold no one's context start stale: key 0 (so such a slot would get a score of
0, an ordinary weight among unit-scale scores) and value ``STALE`` = 50. Finite, as in the engine
(caches start zeroed and only ever receive finite K/V; the PyTorch backends rely on that, since
``0 * NaN`` is NaN), but a backend that weights a slot it should not (or reads a new token's
slot before writing it) moves its output by about ``50 / seq_len``, far beyond the tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paged_kv_helpers import DEVICE, TOLERANCES

from minivllm.attention import AttentionMetadata, get_attention_backend

TORCH_BACKENDS = ["torch", "torch_padded"]
ALL_BACKENDS = [*TORCH_BACKENDS, "triton"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
STALE = 50.0  # the value that unowned cache slots hold (their key is 0)


@dataclass
class Step:
    """One step's inputs, plus each sequence's contiguous K/V and queries for the reference."""

    meta: AttentionMetadata
    query: torch.Tensor  # [T, H, D]
    key: torch.Tensor  # [T, KVH, D]: the new tokens' keys, to be written by the backend
    value: torch.Tensor
    k_cache: torch.Tensor  # [num_blocks, block_size, KVH, D]
    v_cache: torch.Tensor
    seq_k: list[torch.Tensor]  # per sequence [seq_len, KVH, D] float64 (dtype-rounded values)
    seq_v: list[torch.Tensor]
    rows: list[tuple[int, int]]  # (query_len, context_len)
    real_rows: torch.Tensor  # [T] bool: False for padding rows (slot -1), whose output is unused
    scale: float


def make_step(
    rows: list[tuple[int, int]],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int = 0,
    shared: tuple[int, int, int] | None = None,
    padding: dict[int, int] | None = None,
) -> Step:
    """Build a step.

    ``shared = (a, b, n)``: sequences ``a`` and ``b`` share their first ``n`` logical blocks
    (same physical blocks, same K/V), as after a prefix-cache hit; those blocks must be context
    of both. ``padding = {seq: n}``: the last ``n`` new tokens of ``seq`` have slot -1 (static
    batching's padding, computed but never stored).
    """
    gen = torch.Generator().manual_seed(seed)
    padding = padding or {}

    def randn(*shape):  # values rounded to dtype, kept in float64 for the reference
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype).double()

    seq_lens = [q + c for q, c in rows]
    seq_k = [randn(n, num_kv_heads, head_dim) for n in seq_lens]
    seq_v = [randn(n, num_kv_heads, head_dim) for n in seq_lens]
    needed = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(needed) + 3
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables = []
    for n in needed:
        tables.append(free[:n])
        free = free[n:]
    if shared is not None:
        a, b, n = shared
        assert min(rows[a][1], rows[b][1]) >= n * block_size, "shared blocks must be context of both"
        tables[b][:n] = tables[a][:n]
        seq_k[b][: n * block_size] = seq_k[a][: n * block_size]
        seq_v[b][: n * block_size] = seq_v[a][: n * block_size]

    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.zeros(shape), torch.full(shape, STALE)
    slots, queries, keys, values, real = [], [], [], [], []
    for i, ((query_len, context_len), table) in enumerate(zip(rows, tables, strict=True)):
        for p in range(context_len):  # the context is in the cache before the step
            k_cache[table[p // block_size], p % block_size] = seq_k[i][p].float()
            v_cache[table[p // block_size], p % block_size] = seq_v[i][p].float()
        num_pad = padding.get(i, 0)
        for j, p in enumerate(range(context_len, context_len + query_len)):
            is_pad = j >= query_len - num_pad
            slots.append(-1 if is_pad else table[p // block_size] * block_size + p % block_size)
            real.append(not is_pad)
        queries.append(randn(query_len, num_heads, head_dim))
        keys.append(seq_k[i][context_len:])
        values.append(seq_v[i][context_len:])
    meta = AttentionMetadata.build([q for q, _ in rows], seq_lens, tables, slots, block_size, device=DEVICE)
    return Step(
        meta=meta,
        query=torch.cat(queries).to(DEVICE, dtype),
        key=torch.cat(keys).to(DEVICE, dtype),
        value=torch.cat(values).to(DEVICE, dtype),
        k_cache=k_cache.to(DEVICE, dtype),
        v_cache=v_cache.to(DEVICE, dtype),
        seq_k=seq_k,
        seq_v=seq_v,
        rows=rows,
        real_rows=torch.tensor(real),
        scale=head_dim**-0.5,
    )


def sdpa_reference(step: Step) -> torch.Tensor:
    """float64 SDPA per sequence on its contiguous K/V. Returns ``[T, H, D]`` on the CPU."""
    outs, start = [], 0
    for (query_len, context_len), k, v in zip(step.rows, step.seq_k, step.seq_v, strict=True):
        q = step.query[start : start + query_len].double().cpu()
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        # new token j is at position context_len + j and sees keys 0 .. context_len + j
        mask = torch.arange(context_len + query_len)[None, :] <= (context_len + torch.arange(query_len))[:, None]
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=step.scale
        )
        outs.append(out.transpose(0, 1))
        start += query_len
    return torch.cat(outs)


def run_backend(name: str, step: Step) -> torch.Tensor:
    backend = get_attention_backend(name)
    assert backend.name == name
    return backend.forward(step.query, step.key, step.value, step.k_cache, step.v_cache, step.meta, step.scale)


def check_against_reference(name: str, step: Step, dtype: torch.dtype) -> torch.Tensor:
    out = run_backend(name, step)
    assert out.shape == step.query.shape and out.dtype == dtype
    real = step.real_rows.to(out.device)
    assert torch.isfinite(out[real]).all(), "NaN/inf in a real row"
    torch.testing.assert_close(out[real].double().cpu(), sdpa_reference(step)[step.real_rows], **TOLERANCES[dtype])
    return out


# Row lists (query_len, context_len) in deliberately mixed order; block size 16 unless noted.
STEPS = {
    # Lengths at block boundaries: seq_len = k * 16 - 1, k * 16, k * 16 + 1, and 1.
    "decode_only": [(1, 14), (1, 15), (1, 16), (1, 0), (1, 31), (1, 47), (1, 200)],
    # A prompt, decodes, a later chunk, a one-token prompt, a chunk after a block-aligned hit.
    "mixed": [(1, 40), (17, 0), (1, 15), (5, 27), (1, 0), (33, 16), (1, 63), (2, 30)],
    # Prefill rows only, every one a different kind.
    "prefill_only": [(16, 0), (31, 17), (2, 62), (15, 1)],
    # The decodes come last and have the longest contexts: the decode batch must not be
    # stretched by the prompt, nor the prompt by them.
    "decodes_after_prompt": [(48, 0), (1, 95), (1, 3), (1, 64)],
}

GQA = [(2, 2), (4, 2), (8, 2)]  # query heads per KV head: 1, 2, 4


@pytest.mark.parametrize("heads", GQA, ids=lambda h: f"h{h[0]}kv{h[1]}")
@pytest.mark.parametrize("head_dim", [64, 80], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("step_name", list(STEPS))
@pytest.mark.parametrize("backend", TORCH_BACKENDS)
def test_torch_backends_fp32(backend, step_name, head_dim, heads):
    step = make_step(STEPS[step_name], num_heads=heads[0], num_kv_heads=heads[1], head_dim=head_dim,
                     block_size=16, dtype=torch.float32, seed=head_dim + heads[0])
    check_against_reference(backend, step, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_mixed_step_in_every_dtype(backend, dtype):
    step = make_step(STEPS["mixed"], num_heads=4, num_kv_heads=2, head_dim=80, block_size=16, dtype=dtype, seed=3)
    check_against_reference(backend, step, dtype)


@pytest.mark.parametrize("step_name", ["decode_only", "prefill_only", "decodes_after_prompt"])
def test_triton_backend_fp32(step_name):
    step = make_step(STEPS[step_name], num_heads=8, num_kv_heads=2, head_dim=64, block_size=16,
                     dtype=torch.float32, seed=5)
    check_against_reference("triton", step, torch.float32)


@pytest.mark.parametrize("block_size", [1, 4, 32])
@pytest.mark.parametrize("backend", TORCH_BACKENDS)
def test_torch_backends_other_block_sizes(backend, block_size):
    """Below 16 only the torch backends run (the Triton kernels refuse such blocks)."""
    rows = [(1, 2 * block_size - 1), (9, 3 * block_size), (1, block_size), (3, 0), (4, block_size + 1)]
    step = make_step(rows, num_heads=6, num_kv_heads=2, head_dim=32, block_size=block_size,
                     dtype=torch.float32, seed=block_size)
    check_against_reference(backend, step, torch.float32)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_shared_blocks(backend):
    """Sequences 0 and 2 share two physical blocks of context (a prefix-cache hit); sequence 2
    computes a chunk after them while sequence 0 decodes."""
    rows = [(1, 40), (6, 0), (7, 32), (1, 33)]
    step = make_step(rows, num_heads=4, num_kv_heads=1, head_dim=64, block_size=16, dtype=torch.float32,
                     seed=11, shared=(0, 2, 2))
    assert step.meta.block_tables[0, :2].tolist() == step.meta.block_tables[2, :2].tolist()
    check_against_reference(backend, step, torch.float32)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_padding_rows_are_computed_but_not_stored(backend):
    """Static batching: prompts padded to the longest (trailing slot -1 rows) and a finished
    request's idle seat (a decode row with slot -1). Real rows match the reference, padding
    rows are finite, and no -1 row touches the cache."""
    rows = [(12, 0), (12, 0), (1, 20), (12, 0)]
    step = make_step(rows, num_heads=4, num_kv_heads=2, head_dim=64, block_size=16, dtype=torch.float32,
                     seed=2, padding={0: 5, 2: 1, 3: 11})
    k_before, v_before = step.k_cache.clone(), step.v_cache.clone()
    out = check_against_reference(backend, step, torch.float32)
    assert torch.isfinite(out).all()
    written = step.meta.slot_mapping[step.meta.slot_mapping >= 0].cpu()
    changed = ((step.k_cache != k_before) | (step.v_cache != v_before)).flatten(2).any(-1).flatten().cpu()
    assert set(changed.nonzero().flatten().tolist()) <= set(written.tolist())
    real_keys = step.key[step.real_rows.to(step.key.device)]
    flat_k = step.k_cache.view(-1, *step.k_cache.shape[2:])
    assert torch.equal(flat_k[written.to(flat_k.device)], real_keys), "real rows' keys must be stored"


@pytest.mark.parametrize("backend", TORCH_BACKENDS)
def test_backends_write_the_new_tokens_before_reading(backend):
    """Every new token's slot starts stale; after the step it holds the token's K/V."""
    step = make_step(STEPS["mixed"], num_heads=4, num_kv_heads=2, head_dim=32, block_size=16,
                     dtype=torch.float32, seed=9)
    check_against_reference(backend, step, torch.float32)
    slots = step.meta.slot_mapping
    flat_v = step.v_cache.view(-1, *step.v_cache.shape[2:])
    assert torch.equal(flat_v[slots], step.value)


def test_metadata_keeps_host_lengths():
    meta = AttentionMetadata.build([3, 1], [3, 9], [[4], [0]], [64, 65, 66, 8], 16)
    assert meta.query_lens_cpu == [3, 1] and meta.seq_lens_cpu == [3, 9] and meta.num_skipped_slots == 0
    meta = AttentionMetadata.build([2], [2], [[1]], [16, -1], 16)
    assert meta.num_skipped_slots == 1


@pytest.mark.parametrize("backend", TORCH_BACKENDS)
def test_metadata_without_host_lengths(backend):
    """Metadata assembled from tensors alone (no host lists) still works: the backend reads the
    lengths back once per step."""
    step = make_step(STEPS["mixed"], num_heads=4, num_kv_heads=2, head_dim=32, block_size=16,
                     dtype=torch.float32, seed=4, padding={1: 3})
    step.meta.query_lens_cpu = step.meta.seq_lens_cpu = step.meta.num_skipped_slots = None
    check_against_reference(backend, step, torch.float32)


def test_ragged_plan_is_built_once_per_step():
    step = make_step(STEPS["mixed"], num_heads=4, num_kv_heads=2, head_dim=32, block_size=16,
                     dtype=torch.float32)
    backend = get_attention_backend("torch")
    backend.forward(step.query, step.key, step.value, step.k_cache, step.v_cache, step.meta, step.scale)
    plan = step.meta.backend_cache["torch_ragged"]
    backend.forward(step.query, step.key, step.value, step.k_cache, step.v_cache, step.meta, step.scale)
    assert step.meta.backend_cache["torch_ragged"] is plan
    assert len(plan.prefills) == 4
    # decode contexts 41, 16, 1, 64 tokens (rows 0, 18, 24, 58): buckets within a factor of 1.5,
    # each gathering blocks up to its own longest context, not the step's longest
    assert [b.token_rows.tolist() for b in plan.decode] == [[24], [18], [0], [58]]
    assert [b.key_bias.shape[-1] for b in plan.decode] == [16, 16, 48, 64]


def test_length_buckets_bound_the_padding():
    from minivllm.attention.torch_ref import length_buckets

    lengths = [300, 5, 800, 40, 41, 90, 7, 160, 1, 640]
    buckets = length_buckets(lengths)
    assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))
    for b in buckets:
        lens = [lengths[i] for i in b]
        assert max(lens) <= 1.5 * min(lens) and lens == sorted(lens)
    assert length_buckets([]) == [] and length_buckets([7, 7, 7]) == [[0, 1, 2]]


def test_ragged_rejects_inconsistent_lengths():
    step = make_step([(3, 0)], num_heads=2, num_kv_heads=1, head_dim=32, block_size=16, dtype=torch.float32)
    step.meta.query_lens_cpu = [4]
    with pytest.raises(ValueError, match="query_len 4 > seq_len 3"):
        run_backend("torch", step)
    step.meta.query_lens_cpu, step.meta.seq_lens_cpu = [2], [3]
    with pytest.raises(ValueError, match="add up to 2 tokens but slot_mapping has 3"):
        run_backend("torch", step)


def test_unknown_backend_name_is_refused():
    with pytest.raises(ValueError, match="'torch_ragged' is not one of"):
        get_attention_backend("torch_ragged")


ROWS = st.lists(
    st.one_of(
        st.tuples(st.just(1), st.integers(0, 70)),  # decode
        st.tuples(st.integers(2, 40), st.just(0)),  # whole prompt
        st.tuples(st.integers(2, 40), st.integers(1, 70)),  # chunk after context
    ),
    min_size=1,
    max_size=7,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=ROWS, heads=st.sampled_from(GQA), block_size=st.sampled_from([2, 8, 16]),
       seed=st.integers(0, 2**16))
def test_random_ragged_steps(rows, heads, block_size, seed):
    step = make_step(rows, num_heads=heads[0], num_kv_heads=heads[1], head_dim=24, block_size=block_size,
                     dtype=torch.float32, seed=seed)
    for backend in TORCH_BACKENDS:
        fresh = Step(**{**step.__dict__, "k_cache": step.k_cache.clone(), "v_cache": step.v_cache.clone()})
        check_against_reference(backend, fresh, torch.float32)
