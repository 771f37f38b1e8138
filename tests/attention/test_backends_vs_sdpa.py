"""Every attention backend, through ``forward``, against SDPA on each sequence's own tensors.

A step is a list of rows ``(query_len, context_len)`` in any order: decodes (query 1), whole
prompts (context 0), and chunks after cached context (a later chunk, or a prefix-cache hit).
Each sequence's K/V is generated *contiguously*, then scattered into a paged cache through a
shuffled block table (``minivllm.attention.testing``); the reference never looks at the cache or
the tables: it is ``torch.nn.functional.scaled_dot_product_attention`` in float64 on the
contiguous tensors, with K/V heads repeated for GQA and the causal mask offset by the context.

Every slot a sequence does not own holds NaN (or inf): the tails of last blocks, spare blocks,
this step's slots until the backend writes them, and the positions of padding rows, which are
never written. A backend that lets one into a real row's result -- by reading it, or by masking
its score while multiplying its value by 0 -- gives NaN. That is the attention backend contract:
a freed block keeps its previous owner's values, and they must not reach the next owner.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minivllm.attention import AttentionMetadata, get_attention_backend
from minivllm.attention.testing import (
    PagedProblem,
    Seq,
    assert_cache_matches,
    assert_matches_reference,
    make_paged_problem,
)

TORCH_BACKENDS = ["cpp", "torch", "torch_padded"]
ALL_BACKENDS = [*TORCH_BACKENDS, "triton"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def make_step(rows: list[tuple[int, int]], *, padding: dict[int, int] | None = None,
              shared: tuple[int, int, int] | None = None, padding_fill: float = float("nan"),
              **kwargs) -> PagedProblem:
    """A step of ``(query_len, context_len)`` rows. ``padding = {seq: n}``: the last ``n`` of
    ``seq``'s query rows are padding (slot -1), whose slots hold ``padding_fill``.
    ``shared = (a, b, n)``: ``b`` starts with ``a``'s first ``n`` blocks, which must be cached
    context of both."""
    padding = padding or {}
    seqs = [Seq(new=q - padding.get(i, 0), context=c, pad=padding.get(i, 0)) for i, (q, c) in enumerate(rows)]
    if shared is not None:
        a, b, n = shared
        assert min(rows[a][1], rows[b][1]) >= n * kwargs["block_size"], "shared blocks must be context of both"
        kwargs["share"] = {b: (a, n)}
    return make_paged_problem(seqs, padding=padding_fill, **kwargs)


def run_backend(name: str, problem: PagedProblem) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backend on fresh copies of the caches: ``(output, k_cache, v_cache)``."""
    backend = get_attention_backend(name)
    assert backend.name == name
    k_cache, v_cache = problem.caches()
    out = backend.forward(problem.query, problem.key, problem.value, k_cache, v_cache, problem.meta, problem.scale)
    return out, k_cache, v_cache


def check_against_reference(name: str, problem: PagedProblem) -> torch.Tensor:
    """Output close to SDPA on every real row; the caches hold the new K/V, nothing else changed."""
    out, k_cache, v_cache = run_backend(name, problem)
    assert out.dtype == problem.query.dtype
    assert_matches_reference(out, problem)
    assert_cache_matches(k_cache, problem.k_cache_after, f"{name}: k_cache")
    assert_cache_matches(v_cache, problem.v_cache_after, f"{name}: v_cache")
    return out


# Row lists (query_len, context_len) in deliberately mixed order; block size 16 unless noted.
STEPS = {
    # Lengths at block boundaries: seq_len = k * 16 - 1, k * 16, k * 16 + 1, and 1.
    "decode_only": [(1, 14), (1, 15), (1, 16), (1, 0), (1, 31), (1, 47), (1, 200)],
    # A prompt, decodes, a later chunk, a one-token prompt, a chunk after a block-aligned hit.
    "mixed": [(1, 40), (17, 0), (1, 15), (5, 27), (1, 0), (33, 16), (1, 63), (2, 30)],
    # Decodes verifying speculative drafts (a few new tokens over a context), with plain decodes,
    # at block boundaries and in several length buckets; one of 16 tokens, the most batched so.
    "verify": [(4, 30), (4, 12), (1, 40), (3, 47), (4, 31), (16, 20), (4, 200), (2, 1)],
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
    check_against_reference(backend, step)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_mixed_step_in_every_dtype(backend, dtype):
    step = make_step(STEPS["mixed"], num_heads=4, num_kv_heads=2, head_dim=80, block_size=16, dtype=dtype, seed=3)
    check_against_reference(backend, step)


@pytest.mark.parametrize("step_name", ["decode_only", "prefill_only", "decodes_after_prompt"])
def test_triton_backend_fp32(step_name):
    step = make_step(STEPS[step_name], num_heads=8, num_kv_heads=2, head_dim=64, block_size=16,
                     dtype=torch.float32, seed=5)
    check_against_reference("triton", step)


@pytest.mark.parametrize("block_size", [1, 4, 32])
@pytest.mark.parametrize("backend", TORCH_BACKENDS)
def test_torch_backends_other_block_sizes(backend, block_size):
    """Below 16 only the torch backends run (the Triton kernels refuse such blocks)."""
    rows = [(1, 2 * block_size - 1), (9, 3 * block_size), (1, block_size), (3, 0), (4, block_size + 1)]
    step = make_step(rows, num_heads=6, num_kv_heads=2, head_dim=32, block_size=block_size,
                     dtype=torch.float32, seed=block_size)
    check_against_reference(backend, step)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_shared_blocks(backend):
    """Sequences 0 and 2 share two physical blocks of context (a prefix-cache hit); sequence 2
    computes a chunk after them while sequence 0 decodes."""
    rows = [(1, 40), (6, 0), (7, 32), (1, 33)]
    step = make_step(rows, num_heads=4, num_kv_heads=1, head_dim=64, block_size=16, dtype=torch.float32,
                     seed=11, shared=(0, 2, 2))
    assert step.meta.block_tables[0, :2].tolist() == step.meta.block_tables[2, :2].tolist()
    check_against_reference(backend, step)


@pytest.mark.parametrize("fill", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_padding_rows_are_computed_but_not_stored(backend, fill):
    """Static batching: prompts padded to the longest (trailing slot -1 rows) and a finished
    request's idle seat (a decode row with slot -1). The padding positions were never written
    and hold ``fill``, as every unowned slot does. Real rows match the reference, and no -1 row
    touches the cache."""
    rows = [(12, 0), (12, 0), (1, 20), (12, 0)]
    step = make_step(rows, num_heads=4, num_kv_heads=2, head_dim=64, block_size=16, dtype=torch.float32,
                     seed=2, padding={0: 5, 2: 1, 3: 11}, unowned=fill, padding_fill=fill)
    check_against_reference(backend, step)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_unowned_slots_hold_infinities(backend):
    """+inf and -inf instead of NaN: an inf key would make a score inf, an inf value inf * 0."""
    for seed, fill in enumerate([float("inf"), float("-inf")]):
        step = make_step(STEPS["mixed"], num_heads=4, num_kv_heads=2, head_dim=32, block_size=16,
                         dtype=torch.float16, seed=seed, unowned=fill, padding_fill=fill)
        check_against_reference(backend, step)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_backends_write_the_new_tokens_before_reading(backend):
    """Every new token's slot holds NaN before the step; after it, the token's K/V."""
    step = make_step(STEPS["mixed"], num_heads=4, num_kv_heads=2, head_dim=32, block_size=16,
                     dtype=torch.float32, seed=9)
    _, _, v_cache = run_backend(backend, step)
    flat_v = v_cache.view(-1, *v_cache.shape[2:])
    assert torch.equal(flat_v[step.meta.slot_mapping], step.value)


def test_metadata_keeps_host_lengths():
    meta = AttentionMetadata.build([3, 1], [3, 9], [[4], [0]], [64, 65, 66, 8], 16)
    assert meta.query_lens_cpu == [3, 1] and meta.seq_lens_cpu == [3, 9] and meta.num_skipped_slots == 0
    meta = AttentionMetadata.build([2], [2], [[1]], [16, -1], 16)
    assert meta.num_skipped_slots == 1


@pytest.mark.parametrize("host_lists", [True, False])
def test_readable_lens_leave_out_padding_rows(host_lists):
    """A padded prompt, a sequence without padding, an idle seat: seq_lens less padding rows."""
    meta = AttentionMetadata.build([4, 2, 1], [4, 9, 13], [[0], [1], [2]],
                                   [0, 1, -1, -1, 23, 24, -1], 16)
    if not host_lists:  # made from tensors alone: the count of -1 slots is not known on the host
        meta.query_lens_cpu = meta.seq_lens_cpu = meta.num_skipped_slots = None
    assert meta.readable_lens().tolist() == [2, 9, 12]
    assert meta.readable_lens() is meta.readable_lens(), "computed once per step"
    clean = AttentionMetadata.build([1, 1], [5, 7], [[0], [1]], [4, 22], 16)
    assert clean.readable_lens() is clean.seq_lens


@pytest.mark.parametrize("backend", TORCH_BACKENDS)
def test_metadata_without_host_lengths(backend):
    """Metadata assembled from tensors alone (no host lists) still works: the backend reads the
    lengths back once per step."""
    step = make_step(STEPS["mixed"], num_heads=4, num_kv_heads=2, head_dim=32, block_size=16,
                     dtype=torch.float32, seed=4, padding={1: 3})
    step.meta.query_lens_cpu = step.meta.seq_lens_cpu = step.meta.num_skipped_slots = None
    check_against_reference(backend, step)


def test_ragged_plan_is_built_once_per_step():
    step = make_step(STEPS["mixed"], num_heads=4, num_kv_heads=2, head_dim=32, block_size=16,
                     dtype=torch.float32)
    backend = get_attention_backend("torch")
    k_cache, v_cache = step.caches()
    backend.forward(step.query, step.key, step.value, k_cache, v_cache, step.meta, step.scale)
    plan = step.meta.backend_cache["torch_ragged"]
    backend.forward(step.query, step.key, step.value, k_cache, v_cache, step.meta, step.scale)
    assert step.meta.backend_cache["torch_ragged"] is plan
    # one sequence at a time: the 17-token prompt (rows 1..17) and the 33-token chunk (rows 25..57)
    assert [(p.start, p.stop) for p in plan.prefills] == [(1, 18), (25, 58)]
    # decode sequences of 41, 16, 1, 64 tokens (rows 0, 18, 24, 58): buckets within a factor of
    # 1.5, each gathering keys up to its own longest sequence, not the step's longest
    decodes = [b for b in plan.decode if b.query_len == 1]
    assert [b.token_rows.tolist() for b in decodes] == [[24], [18], [0], [58]]
    assert [b.key_bias.shape[-1] for b in decodes] == [1, 16, 41, 64]
    assert [tuple(b.key_slots.shape) for b in decodes] == [(1, 1), (1, 16), (1, 41), (1, 64)]
    # a few new tokens over a context (5 after 27, 2 after 30) are batched like decodes, with a
    # causal mask row per new token: [sequences, 1, new tokens, keys]
    short = [b for b in plan.decode if b.query_len > 1]
    assert [(b.query_len, b.token_rows.tolist(), list(b.key_bias.shape)) for b in short] == [
        (2, [59, 60], [1, 1, 2, 32]), (5, [19, 20, 21, 22, 23], [1, 1, 5, 32])]


def test_decode_bucket_reads_only_owned_slots():
    """In a bucket, a shorter sequence's positions past its end are gathered from its own first
    slot, never from a block of its table's padding or the tail of its last block."""
    from minivllm.attention.torch_ragged import plan_step

    step = make_step([(1, 40), (1, 30), (1, 36)], num_heads=2, num_kv_heads=1, head_dim=32, block_size=16,
                     dtype=torch.float32)
    (bucket,) = plan_step(step.meta, torch.device("cpu"), torch.float32).decode
    assert bucket.token_rows.tolist() == [1, 2, 0], "sorted by length (one decode row per sequence)"
    for seq, slots in zip(bucket.token_rows.tolist(), bucket.key_slots.tolist(), strict=True):
        n, table = step.seqs[seq].seq_len, step.tables[seq]
        owned = {table[p // 16] * 16 + p % 16 for p in range(n)}
        assert set(slots) <= owned, f"sequence {seq} gathers a slot it does not own"
        assert slots[n:] == [slots[0]] * (41 - n), "positions past its end repeat its first slot"


def test_length_buckets_bound_the_padding():
    from minivllm.attention.torch_ragged import length_buckets

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
        check_against_reference(backend, step)


@settings(max_examples=40, deadline=None)
@given(lens=st.lists(st.integers(1, 50), min_size=2, max_size=5), shared=st.integers(0, 3),
       block_size=st.sampled_from([4, 16]), seed=st.integers(0, 2**16))
def test_the_fixture_caches_what_the_reference_reads(lens, shared, block_size, seed):
    """The shared problem itself (``minivllm.attention.testing``): after the step, every position
    of every sequence, read through its block table, holds that sequence's own K/V -- shared
    prefix blocks included -- so the reference and the cache describe the same problem."""
    from minivllm.attention.testing import decode_problem

    problem = decode_problem(lens, block_size=block_size, share={i: (0, shared) for i in range(1, len(lens))},
                             seed=seed, dtype=torch.float32)
    k_after = problem.k_cache_after.cpu().double()
    for table, keys, n in zip(problem.tables, problem.keys, lens, strict=True):
        slots = torch.tensor([table[p // block_size] * block_size + p % block_size for p in range(n)])
        assert torch.equal(k_after.view(-1, *k_after.shape[2:])[slots], keys)
