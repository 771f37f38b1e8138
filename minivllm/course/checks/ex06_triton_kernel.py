"""Cases for ex06_triton_kernel: five kernels, each against float64 SDPA, then the last one inside
the engine.

Every problem is a float32 decode step from :func:`minivllm.attention.testing.kernel_problem`
(the kernels' shared fixture): each sequence's K/V drawn as contiguous tensors, scattered into a
paged cache through shuffled block tables, every slot no sequence owns holding NaN, and the cache a
window into a buffer with NaN guard blocks on each side, so a kernel that reads a slot it should
not (past a sequence's end, through the wrong block, past the last head dimension) produces NaN
rather than an almost-right number, and never reads memory outside the buffer. The answer is
``scaled_dot_product_attention`` in float64 on the contiguous tensors.

The last case serves the tiny model with the student's backend and compares its greedy tokens
with those of minivllm's own backend (:func:`minivllm.course.serving.serve_tiny_model`), on
prompts that cover a block boundary and a prefix-cache hit. The Triton interpreter is slow
(milliseconds per program and block), so every shape here is small.
"""

from __future__ import annotations

import torch

from minivllm.attention.testing import (
    PagedProblem,
    assert_matches_reference,
    interpreter_traffic,
    kernel_inputs,
    kernel_problem,
)
from minivllm.course.grading import Case, Mismatch, case
from minivllm.course.harness import expect_same_tokens
from minivllm.course.serving import serve_tiny_model

CASES: list[Case] = []


def expect_attention(attend, problem: PagedProblem, note: str = "", **kwargs) -> None:
    """Run one of the student's wrappers on ``problem``; its output must match the reference."""
    got = attend(*kernel_inputs(problem), **kwargs)
    try:
        assert_matches_reference(got, problem)
    except AssertionError as err:
        raise AssertionError(f"{note}: {err}" if note else str(err)) from None


def expect_one_pass(attend, problem: PagedProblem, per: str, note: str, min_dots_per_block: int = 0,
                    **kwargs) -> None:
    """``expect_attention``, counting what the kernel loads (under Triton's interpreter): every
    program (one per query head, ``per="head"``, or per KV head, ``per="kv_head"``) may load
    each of its sequence's blocks of K and of V once -- at most ``blocks * block_size *
    head_dim`` elements of each per program -- and, with ``min_dots_per_block``, makes at least
    that many ``tl.dot`` calls per block it reads. On a GPU only the answer is checked."""
    inputs = kernel_inputs(problem)
    _, k_cache, v_cache, *_ = inputs
    with interpreter_traffic(k_cache=k_cache, v_cache=v_cache) as traffic:
        got = attend(*inputs, **kwargs)
    try:
        assert_matches_reference(got, problem)
    except AssertionError as err:
        raise AssertionError(f"{note}: {err}") from None
    if traffic is None:
        return
    block_size, num_kv_heads, head_dim = k_cache.shape[1:]
    programs = problem.query.shape[1] if per == "head" else num_kv_heads
    blocks = sum(-(-int(n) // block_size) for n in problem.seq_lens) * programs
    allowed = blocks * block_size * head_dim
    for name, loaded in traffic.loaded.items():
        if loaded > allowed:
            raise AssertionError(
                f"{note}: the kernel loaded {loaded} elements of {name}, {loaded / allowed:.1f}x what "
                f"reading each block once allows ({allowed}: {blocks} blocks of {block_size} x {head_dim} "
                f"over the {programs} programs per sequence). One pass: each block of K and V is loaded "
                "once, and what the softmax needs from the blocks before is carried, not reloaded")
    if min_dots_per_block and traffic.dots < min_dots_per_block * blocks:
        raise AssertionError(
            f"{note}: {traffic.dots} tl.dot calls for {blocks} blocks read (at least "
            f"{min_dots_per_block * blocks} expected): both products, the scores and the weighted "
            "values, are tl.dot -- the operation a GPU runs on its tensor cores; a broadcast "
            "multiply and tl.sum computes the same numbers without them")


# --- 1. one block through the block table -----------------------------------------------------------
def expect_blocks(ex, problem: PagedProblem) -> None:
    """``load_blocks`` returns each sequence's keys in logical order, zeros past ``seq_len``."""
    k_cache, _ = problem.caches(after=True)
    got = ex.load_blocks(k_cache, problem.block_tables, problem.seq_lens).detach().cpu().double()
    for i, keys in enumerate(problem.keys):
        n = keys.shape[0]
        where = f"sequence {i} ({n} tokens, blocks {problem.tables[i]})"
        if tuple(got.shape[2:]) != tuple(keys.shape[1:]) or got.shape[1] < n:
            raise Mismatch(("...", n, *keys.shape[1:]), tuple(got.shape), f"{where}: output shape")
        wrong = (got[i, :n] != keys).any(dim=(1, 2)).nonzero()
        if len(wrong):
            pos = int(wrong[0])
            raise Mismatch([round(x, 4) for x in keys[pos, 0, :3].tolist()],
                           [round(x, 4) for x in got[i, pos, 0, :3].tolist()],
                           f"{where}, position {pos} (logical block {pos // k_cache.shape[1]}), KV head 0, "
                           "first 3 dims")
        tail = got[i, n:]
        if len(tail) and not bool((tail == 0).all()):
            pos = n + int((tail != 0).any(dim=(1, 2)).nonzero()[0])
            raise AssertionError(f"{where}: position {pos} is past seq_len and must stay as it was (0); "
                                 f"it holds {tail[pos - n, 0, :3].tolist()}")


LOAD = "load_block_kernel"


@case(CASES, "blocks of a shuffled pool: lengths 1, 15, 16, 17, 33, two KV heads", LOAD,
      "logical block j of sequence i is physical block block_tables[i, j]; the last is partial")
def _(ex):
    expect_blocks(ex, kernel_problem([1, 15, 16, 17, 33], seed=1))


@case(CASES, "head_dim 40 (tile 64), block size 32, four KV heads", LOAD,
      "mask the columns past head_dim, and take every stride from the cache")
def _(ex):
    expect_blocks(ex, kernel_problem([31, 32, 65], head_dim=40, block_size=32, num_heads=8,
                                   num_kv_heads=4, seed=2))


# --- 2. one query head over one sequence, in one tile -------------------------------------------------
WHOLE = "attend_whole_kernel"


@case(CASES, "one query per head over whole sequences: lengths 1, 17, 40, 6 heads over 2", WHOLE,
      "look each position's block up in the table: block_tables[i, p // block_size]")
def _(ex):
    expect_attention(ex.attend_whole, kernel_problem([1, 17, 40], seed=3))


@case(CASES, "head_dim 40, block size 32, softmax scale 0.3, a shared prefix", WHOLE,
      "multiply the scores by `scale`; several tables may name one physical block")
def _(ex):
    problem = kernel_problem([33, 50], head_dim=40, block_size=32, scale=0.3, share={1: (0, 1)}, seed=4)
    expect_attention(ex.attend_whole, problem)


@case(CASES, "scores far above 88 (exp overflows float32 there)", WHOLE,
      "subtract the row's maximum score before exp: the weights are the same, and no exp sees a positive number")
def _(ex):
    expect_attention(ex.attend_whole, kernel_problem([40, 25], rising_scores=150.0, seed=21), "scores up to ~150")


# --- 3. block by block, with an online softmax --------------------------------------------------------
BLOCKS = "attend_blocks_kernel"


@case(CASES, "block by block: lengths 15, 16, 17, 33 and 70", BLOCKS,
      "after each block the state must describe every token up to the end of that block")
def _(ex):
    expect_attention(ex.attend_by_blocks, kernel_problem([15, 16, 17, 33, 70], seed=5))


@case(CASES, "the running maximum rises from block to block", BLOCKS,
      "when the maximum grows, what the sums hold so far must be rescaled by exp(m_old - m_new)")
def _(ex):
    expect_attention(ex.attend_by_blocks, kernel_problem([70, 33], rising_scores=8.0, seed=6))


@case(CASES, "one pass: each block's K and V loaded once", BLOCKS,
      "carry the maximum, the sum and the weighted values from block to block; never go back to a block")
def _(ex):
    expect_one_pass(ex.attend_by_blocks, kernel_problem([15, 16, 17, 33, 70], seed=22), "head", "lengths 15-70")


# --- 4. split-KV and its reduction --------------------------------------------------------------------
SPLIT = "split_kernel"


def expect_split(ex, problem: PagedProblem, num_splits: int, note: str = "") -> None:
    """``expect_attention`` on ``attend_split``, except for what a NaN/inf says when it comes
    from a sequence that leaves some of its splits empty: a split with no positions in it
    must add nothing to the merge, and the likeliest cause is one that added NaN."""
    note = note or f"{num_splits} splits"
    got = ex.attend_split(*kernel_inputs(problem), num_splits=num_splits)
    if tuple(got.shape) == tuple(problem.query.shape):
        bad = ~torch.isfinite(got.detach().double().cpu()[problem.real_rows])
        if bool(bad.any()):
            i, head = (int(x) for x in bad.nonzero()[0][:2])
            row = int(problem.real_rows.nonzero().squeeze(1)[i])
            starts = problem.query_start_loc.tolist()
            seq = next(s for s in range(len(problem.seqs)) if starts[s] <= row < starts[s + 1])
            block_size, max_blocks = problem.k_cache_after.shape[1], problem.block_tables.shape[1]
            per_split = -(-max_blocks // num_splits)
            used = -(-int(problem.seq_lens[seq]) // (block_size * per_split))
            if used < num_splits:
                raise AssertionError(
                    f"{note}: NaN/inf in the output of {problem.describe_row(row)}, head {head}. "
                    f"Only {used} of this sequence's {num_splits} splits hold positions; the other "
                    f"{num_splits - used} hold none, and a split with no positions must add nothing "
                    "to the merge: log-sum-exp -inf and a finite output, such as 0 (0 * NaN is "
                    "still NaN). If yours do, look for a load of a slot the sequence does not own "
                    "(those hold NaN here)")
    try:
        assert_matches_reference(got, problem)
    except AssertionError as err:
        raise AssertionError(f"{note}: {err}") from None


@case(CASES, "split-KV: 2 and 3 splits over 100, 45 and 70 tokens, a rising maximum", SPLIT,
      "each split returns softmax over its own range and log(sum of exp(score)) of that range")
def _(ex):
    problem = kernel_problem([100, 45, 70], num_heads=4, rising_scores=6.0, seed=7)
    for splits in (2, 3):
        expect_split(ex, problem, splits)


@case(CASES, "split-KV with empty splits: 7 splits over 1, 20 and 100 tokens", SPLIT,
      "a split past the sequence's end has no keys: log-sum-exp -inf, weight 0, and no NaN")
def _(ex):
    expect_split(ex, kernel_problem([1, 20, 100], num_heads=4, seed=8), 7)


@case(CASES, "the reduction: one split equals the plain answer; splits with very different masses",
      "merge_kernel", "weight each split's answer by exp(lse - largest lse); not a plain average")
def _(ex):
    expect_split(ex, kernel_problem([40, 9], seed=9), 1, "1 split")
    problem = kernel_problem([96, 64], num_heads=4, rising_scores=12.0, seed=10)
    expect_split(ex, problem, 4, "4 splits, rising scores")


# --- 5. the decode kernel the engine runs -------------------------------------------------------------
KERNEL = "paged_decode_kernel"


@case(CASES, "one sequence of one token", KERNEL, "with one key, the output is that key's value")
def _(ex):
    expect_attention(ex.paged_decode, kernel_problem([1], seed=11))


@case(CASES, "lengths at block boundaries: 15, 16, 17, 32, 33", KERNEL,
      "the last block is usually partial: positions >= seq_len are not part of the sequence")
def _(ex):
    expect_attention(ex.paged_decode, kernel_problem([15, 16, 17, 32, 33], seed=12))


@case(CASES, "ragged lengths over a shuffled block pool", KERNEL,
      "logical block j of a sequence lives in physical block block_tables[seq, j]")
def _(ex):
    expect_attention(ex.paged_decode, kernel_problem([3, 50, 21, 100], seed=13))


@case(CASES, "grouped-query attention: 6 heads over 2 KV heads; 8 over 2; 4 over 4", KERNEL,
      "all rows of the query tile read the program's KV head")
def _(ex):
    for seed, (heads, kv_heads) in enumerate([(6, 2), (8, 2), (4, 4)], start=14):
        problem = kernel_problem([9, 40], num_heads=heads, num_kv_heads=kv_heads, seed=seed)
        expect_attention(ex.paged_decode, problem, f"{heads} heads, {kv_heads} KV heads")


@case(CASES, "shared blocks: a common prefix, and two sequences with one block table", KERNEL,
      "sequences may point at the same physical blocks; read them, never assume ownership")
def _(ex):
    # 1 shares 2 blocks with 0 and goes on; 2 is 0's twin (same blocks, same length) with its own query.
    expect_attention(ex.paged_decode, kernel_problem([40, 45, 40], share={1: (0, 2), 2: (0, 3)}, seed=17))


@case(CASES, "the running maximum rises from block to block", KERNEL,
      "when the maximum grows, what denom and acc hold so far must be rescaled by exp(m_old - m_new)")
def _(ex):
    expect_attention(ex.paged_decode, kernel_problem([70, 33], rising_scores=8.0, seed=18))


@case(CASES, "head_dim 40 (padded to 64), block size 32, softmax scale 0.3", KERNEL,
      "multiply the scores by `scale`; mask padded head dimensions when loading K and V")
def _(ex):
    expect_attention(ex.paged_decode, kernel_problem([31, 32, 65], head_dim=40, block_size=32, scale=0.3, seed=19))


@case(CASES, "one pass over each sequence's blocks, both products on tl.dot", KERNEL,
      "load each block of K and V once for the whole query group; scores and weighted values are tl.dot")
def _(ex):
    expect_one_pass(ex.paged_decode, kernel_problem([15, 33, 70], num_heads=8, num_kv_heads=2, seed=23),
                    "kv_head", "8 heads over 2 KV heads", min_dots_per_block=2)


# --- the kernel inside the engine --------------------------------------------------------------
@case(CASES, "served by the engine: the tiny model's greedy tokens equal minivllm's", KERNEL,
      "pass the kernel cases above first; the engine only calls paged_decode through your backend")
def _(ex):
    # A quick probe first, so that a wrong kernel fails here in a second instead of after a
    # whole served trace.
    expect_attention(ex.paged_decode, kernel_problem([40, 17], rising_scores=4.0, seed=20), "probe before serving")
    expected = serve_tiny_model()
    backend = ex.PagedDecodeBackend()
    got = serve_tiny_model(backend)
    if backend.kernel_calls == 0:
        raise AssertionError("the backend never ran the kernel: decode-only steps must use it")
    if expected["shared"].num_cached_tokens < 16:
        raise AssertionError("the trace lost its prefix-cache hit (16 cached tokens expected)")
    expect_same_tokens({rid: s.token_ids for rid, s in expected.items()}, {rid: s.token_ids for rid, s in got.items()},
                       "a 16-token prompt, a short one, a prefix hit")
