"""Cases for ex05_paged_attention_ref: a ragged attention backend, against float64 SDPA, counted,
then serving the tiny model.

**Steps.** Each step case builds its sequences as contiguous K/V tensors, scatters the cached
part into a paged cache through shuffled block tables (:mod:`minivllm.attention.testing`, the
kernels' own fixture), hands the student's ``forward`` the step's new rows and metadata, and
compares with ``scaled_dot_product_attention`` in float64 on the contiguous tensors. Every slot
no sequence owns holds NaN, and so do this step's slots until ``forward`` writes them (reading a
slot that is not the sequence's, or a new token before storing it, gives NaN, not an almost-right
number); the cache is a window into a buffer with NaN blocks on each side; the whole cache is
compared after the step (new K/V at their slots, nothing else touched: a padding row stored "at
-1" lands in the cache's last slot). Padding rows' own outputs are not compared: the engine
throws them away.

**Work.** Counted with :func:`minivllm.course.work.count_work` on the CPU (the same counts on
every machine): the operations of a call do not grow with its decode rows; its multiply-adds
stay within twice what its rows need; its values written do not grow as if K/V were copied per
query head.

**The engine.** The tiny model served with the student's backend on a pool filled with NaN
before the run: chunked prefill, a prefix-cache hit and a preemption; then static batching's
padding rows. The greedy tokens must be those of minivllm's own PyTorch backend on a clean pool.
"""

from __future__ import annotations

import ast
import inspect
import random
from functools import lru_cache

import torch

from minivllm.attention.testing import DEFAULT_DEVICE as DEVICE
from minivllm.attention.testing import PagedProblem, Seq, assert_cache_matches, make_paged_problem
from minivllm.course.grading import Case, Mismatch, case
from minivllm.course.harness import TraceRequest, TraceResult, expect_same_tokens, run_trace
from minivllm.course.runtime import one_cpu_thread
from minivllm.course.serving import make_llm, serve_trace
from minivllm.course.work import Work, count_work

CASES: list[Case] = []

# float64 on both sides: only the summation order differs (~1e-15). Off by one key moves an
# output by ~1/seq_len of a value; a wrong scale by far more. An error below ROUNDING is a step
# computed in a narrower dtype (float32: ~1e-7), not a wrong attention.
ATOL = 1e-9
ROUNDING = 1e-4
DTYPE = torch.float64
BACKEND = "PagedAttentionBackend"
# minivllm's attention code a student's backend must not call (rule 5 of the contract)
ENGINE_ATTENTION = ("minivllm.attention.cache_ops", "minivllm.attention.torch_ragged",
                    "minivllm.attention.torch_padded", "minivllm.attention.triton")


def make_step(seqs: list[Seq], **kwargs) -> PagedProblem:
    """One step over a paged cache in float64 on ``DEVICE``, with its answer from contiguous
    tensors (:func:`minivllm.attention.testing.make_paged_problem`): shuffled block tables, NaN
    in every slot no sequence owns and in this step's slots until they are written, one NaN
    guard block on each side of the cache. ``share={b: (a, n)}``: sequence ``b`` starts with
    ``a``'s first ``n`` blocks (a prefix-cache hit); keep them to cached context."""
    kwargs.setdefault("guard_blocks", 1)
    return make_paged_problem(seqs, dtype=DTYPE, device=DEVICE, **kwargs)


def own_backend(ex):
    """``ex.PagedAttentionBackend()``, refused if the module leans on minivllm's attention code
    or the object misses the protocol."""
    from minivllm.attention import AttentionBackend

    borrowed = sorted(_borrowed(ex))
    if borrowed:
        raise AssertionError(f"the backend must be your own PyTorch code; the file uses minivllm's "
                             f"{', '.join(borrowed)}")
    backend = ex.PagedAttentionBackend()
    if not isinstance(backend, AttentionBackend):
        raise AssertionError("PagedAttentionBackend needs a `name` and a `forward(...)` (the "
                             "AttentionBackend protocol)")
    return backend


def _borrowed(ex) -> set[str]:
    """Names the module imports from minivllm's attention backends (its source, then its globals)."""
    found = set()
    try:
        tree = ast.parse(inspect.getsource(ex))
    except (OSError, TypeError):
        tree = None
    for node in ast.walk(tree) if tree else ():
        module = node.module if isinstance(node, ast.ImportFrom) else None
        names = [a.name for a in node.names] if isinstance(node, (ast.Import, ast.ImportFrom)) else []
        for name in ([module] if module else []) + names:
            if name and (name.startswith(ENGINE_ATTENTION) or name in ("get_attention_backend", "BACKENDS",
                                                                       "TorchAttentionBackend",
                                                                       "PaddedTorchAttentionBackend")):
                found.add(name)
    for value in vars(ex).values():
        where = getattr(value, "__module__", None) or getattr(value, "__name__", "")
        if isinstance(where, str) and where.startswith(ENGINE_ATTENTION):
            found.add(where)
    return found


def run_step(ex, problem: PagedProblem):
    """The student's backend on fresh copies of the caches: ``(output, k_cache, v_cache)``."""
    k_cache, v_cache = problem.caches()
    out = own_backend(ex).forward(problem.query, problem.key, problem.value, k_cache, v_cache,
                                  problem.meta, problem.scale)
    return out, k_cache, v_cache


def expect_step(ex, problem: PagedProblem, note: str = "") -> None:
    """Run the backend; compare the caches it leaves, then the outputs of the real rows."""
    prefix = f"{note}: " if note else ""
    out, k_cache, v_cache = run_step(ex, problem)
    assert_cache_matches(k_cache, problem.k_cache_after, f"{prefix}k_cache")
    assert_cache_matches(v_cache, problem.v_cache_after, f"{prefix}v_cache")
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(problem.expected.shape):
        raise Mismatch(tuple(problem.expected.shape), getattr(out, "shape", out), f"{prefix}output shape [T, H, D]")
    if out.dtype != problem.query.dtype:
        raise Mismatch(problem.query.dtype, out.dtype, f"{prefix}output dtype (the query's)")
    expect_close(out.detach().cpu(), problem.expected, problem, prefix)


def expect_close(got: torch.Tensor, want: torch.Tensor, problem: PagedProblem, prefix: str) -> None:
    real = problem.real_rows
    got, want = got[real].double(), want[real]
    if not len(want):
        return
    rows = real.nonzero().squeeze(1)
    bad = ~torch.isfinite(got)
    if bad.any():
        i, head = (int(x) for x in bad.nonzero()[0][:2])
        raise AssertionError(
            f"{prefix}NaN/inf in the output of {problem.describe_row(int(rows[i]))}, head {head}: "
            "it used a cache slot its sequence does not own (such slots hold NaN here), or a new "
            "token's slot before storing it"
        )
    error = (got - want).abs()
    largest = float(error.max())
    i, head = divmod(int(error.amax(dim=2).argmax()), got.shape[1])
    if ATOL < largest < ROUNDING:
        raise AssertionError(
            f"{prefix}error {largest:.1e} > tolerance {ATOL:.0e} on {str(problem.query.dtype)[6:]} "
            f"inputs ({problem.describe_row(int(rows[i]))}, query head {head}): is a step computed "
            "in lower precision, a cast to float32? Compute in the inputs' dtype. Rounding, not a "
            "wrong attention: the hint below is about other mistakes")
    if largest > ATOL:
        raise Mismatch(
            [round(x, 5) for x in want[i, head, :4].tolist()],
            [round(x, 5) for x in got[i, head, :4].tolist()],
            f"{prefix}{problem.describe_row(int(rows[i]))}, query head {head}, first 4 dims; "
            f"largest error {float(error.max()):.2e}",
        )


# --- steps against float64 SDPA ------------------------------------------------------------------
@case(CASES, "decode rows at block boundaries: contexts 0, 14, 15, 16, 30, 31, 32, 47", BACKEND,
      "a decode token sits at position seq_len - 1 and sees every position up to its own, its "
      "own K/V included: store before you read")
def _(ex):
    contexts = (0, 14, 15, 16, 30, 31, 32, 47)
    expect_step(ex, make_step([Seq(new=1, context=c) for c in contexts], seed=8))


@case(CASES, "whole prompts of 1, 5, 16 and 17 tokens", BACKEND,
      "token j of a prompt sees tokens 0..j of it, never a later one")
def _(ex):
    expect_step(ex, make_step([Seq(new=n) for n in (1, 5, 16, 17)], seed=9))


@case(CASES, "chunks after cached tokens: 7 after 32, 16 after 16, 5 after 27", BACKEND,
      "new token j of a chunk sits at position (cached tokens) + j, not at j")
def _(ex):
    seqs = [Seq(new=7, context=32), Seq(new=16, context=16), Seq(new=5, context=27)]
    expect_step(ex, make_step(seqs, seed=10))


@case(CASES, "a mixed step as the engine sends it: decodes, a chunk, a prompt", BACKEND,
      "each sequence owns rows query_start_loc[i] .. query_start_loc[i+1] - 1 of the flat batch")
def _(ex):
    seqs = [Seq(new=1, context=40), Seq(new=1, context=3), Seq(new=11, context=32), Seq(new=9),
            Seq(new=1, context=15)]
    expect_step(ex, make_step(seqs, seed=11))


@case(CASES, "grouped-query ratios on a mixed step: 6/2, 8/2, 4/4, 4/1 heads/KV heads", BACKEND,
      "query head h reads KV head h // (H // KVH): heads 0..2 share KV head 0 when H=6, KVH=2")
def _(ex):
    seqs = [Seq(new=1, context=20), Seq(new=6, context=10), Seq(new=3), Seq(new=1, context=7)]
    for seed, (heads, kv_heads) in enumerate([(6, 2), (8, 2), (4, 4), (4, 1)], start=12):
        expect_step(ex, make_step(seqs, num_heads=heads, num_kv_heads=kv_heads, seed=seed),
                    f"{heads} heads over {kv_heads} KV heads")


@case(CASES, "shared blocks: sequences read the same physical blocks (a prefix-cache hit)", BACKEND,
      "several block tables may point at one physical block; read it, never assume it is yours")
def _(ex):
    seqs = [Seq(new=1, context=40), Seq(new=6, context=32), Seq(new=1, context=33)]
    expect_step(ex, make_step(seqs, share={1: (0, 2), 2: (0, 2)}, seed=16))


@case(CASES, "padding rows (slot -1): a padded prompt, an idle seat; their slots hold NaN", BACKEND,
      "a row with slot -1 is computed and thrown away: store nothing for it (in Python, index -1 is "
      "the cache's last slot), and never read its position's slot, which was never written")
def _(ex):
    # a static batch: prompts padded to 9 tokens; a finished request's seat computed for nothing
    seqs = [Seq(new=9), Seq(new=4, pad=5), Seq(new=0, context=12, pad=1), Seq(new=1, context=20),
            Seq(new=2, context=16, pad=3)]
    expect_step(ex, make_step(seqs, padding=float("nan"), seed=17))


@case(CASES, "head_dim 40, block size 8, softmax scale 0.3", BACKEND,
      "take block_size from the cache, and multiply the scores by `scale`, once")
def _(ex):
    seqs = [Seq(new=1, context=23), Seq(new=9, context=8), Seq(new=4), Seq(new=1, context=2)]
    expect_step(ex, make_step(seqs, head_dim=40, block_size=8, scale=0.3, seed=18))


@case(CASES, "blocks of one slot, and sequences with nothing new this step", BACKEND,
      "a sequence with query_len 0 owns no row of the batch; block_size may be 1")
def _(ex):
    seqs = [Seq(new=1, context=5), Seq(new=0, context=7), Seq(new=3, context=2), Seq(new=0, context=1)]
    expect_step(ex, make_step(seqs, block_size=1, seed=19))


@case(CASES, "decodes of near lengths (contexts 5 to 45), idle seats; block 0 owned by nobody", BACKEND,
      "a position a row does not own must read a slot its own sequence owns before it is "
      "masked; slot 0, and block 0 (what block_tables is padded with), may be nobody's")
def _(ex):
    # any grouping of these decodes pads some to a longer one's length; where the padded
    # positions read global slot 0 or a table's padding entry, they read NaN
    seqs = [Seq(new=1, context=c) for c in (5, 9, 17, 22, 29, 31, 40, 45)]
    seqs += [Seq(new=0, context=12, pad=1), Seq(new=0, context=26, pad=1)]
    problem = make_step(seqs, padding=float("nan"), seed=26)
    if any(0 in table for table in problem.tables):
        raise AssertionError("the step's shuffle changed: pick a seed where no table holds block 0")
    expect_step(ex, problem)


# --- the work, counted --------------------------------------------------------------------------
def work_of(ex, seqs: list[Seq], **kwargs) -> Work:
    """What one call of the student's ``forward`` does on a float32 step on the CPU (NaN in every
    slot it must not read); its output must be right too."""
    problem = make_paged_problem(seqs, dtype=torch.float32, device="cpu", seed=kwargs.pop("seed", 0), **kwargs)
    backend = own_backend(ex)
    k_cache, v_cache = problem.caches()
    out, work = count_work(backend.forward, problem.query, problem.key, problem.value, k_cache, v_cache,
                           problem.meta, problem.scale)
    from minivllm.attention.testing import assert_matches_reference

    assert_matches_reference(out, problem)
    return work


def needed_multiply_adds(seqs: list[Seq], num_heads: int, head_dim: int, block_size: int) -> int:
    """What a step's rows need: ``2 x H x D x query_len x seq_len`` per sequence, the length
    rounded up to whole blocks (scores, then the weighted values)."""
    return sum(2 * num_heads * head_dim * s.query_len * -(-s.seq_len // block_size) * block_size for s in seqs)


def similar_decodes(n: int, seed: int) -> list[Seq]:
    """``n`` decode rows whose contexts (96..111 tokens) fill 7 blocks of 16 each."""
    rng = random.Random(seed)
    return [Seq(new=1, context=rng.randint(96, 111)) for _ in range(n)]


@case(CASES, "32 decodes (contexts 96 to 111) computed together: no more operations than 4", BACKEND,
      "gather every decode row's keys in one indexing operation (a [rows, positions] tensor of "
      "slots), and attend for all of them at once")
def _(ex):
    few, many = work_of(ex, similar_decodes(4, 1)), work_of(ex, similar_decodes(32, 2))
    if many.operations > few.operations + 8:
        raise AssertionError(
            f"a step of 4 decode rows ran {few.operations} PyTorch operations, one of 32 ran "
            f"{many.operations}, all with contexts of 96 to 111 tokens (7 blocks): the decode rows "
            "are computed one at a time (a Python loop over sequences runs its operations once "
            "per sequence)")


@case(CASES, "work that follows each row's context: a prompt, or a long decode, among short ones", BACKEND,
      "do not pad every sequence to the step's longest: decodes apart from prompts, and decodes of "
      "very different lengths apart from each other")
def _(ex):
    steps = {
        "a 64-token prompt next to 8 decodes of ~100 tokens": [Seq(new=64)] + similar_decodes(8, 3),
        "15 decodes of 41 tokens next to one of 601": [Seq(new=1, context=40)] * 15 + [Seq(new=1, context=600)],
    }
    for what, seqs in steps.items():
        work = work_of(ex, seqs, seed=4)
        needed = needed_multiply_adds(seqs, 6, 32, 16)
        if work.multiply_adds == 0:
            raise AssertionError("no matrix product counted: compute scores and weighted sums with @, "
                                 "matmul, einsum, bmm or scaled_dot_product_attention (the checks count those)")
        if work.multiply_adds > 2 * needed:
            raise AssertionError(
                f"{what}: {work.multiply_adds:,} multiply-adds for rows that need {needed:,} "
                f"({work.multiply_adds / needed:.1f}x, at most 2x): some rows are padded to a much "
                "longer sequence's length")


@case(CASES, "no K/V copied per query head (decodes, chunks): 16 heads over 2 KV heads vs 2 over 2",
      BACKEND,
      "view the query heads as [KVH, H // KVH] and let each KV head meet its group in one product, on "
      "both paths; repeat_interleave (or expand then reshape) on K or V is the copy")
def _(ex):
    steps = {  # head_dim 128: the K/V a step reads outweighs its scores, so a copy of it shows
        "6 decode rows of ~100 tokens": similar_decodes(6, 5),
        "a 2-token chunk after 600 cached tokens": [Seq(new=2, context=600)],
    }
    for what, seqs in steps.items():
        grouped, alone = (work_of(ex, seqs, num_heads=h, num_kv_heads=2, head_dim=128, seed=6) for h in (16, 2))
        if grouped.values_written > 2 * alone.values_written:
            raise AssertionError(
                f"{what}: with 16 query heads over 2 KV heads the step wrote {grouped.values_written:,} "
                f"values, with 2 over 2 (the same K/V) {alone.values_written:,}: K or V copied once per "
                "query head?")


# --- the backend inside the engine ---------------------------------------------------------------
# The trace (minivllm.course.serving, which notebook 05 runs too), and static batching's.
STATIC_ARGS = dict(scheduler="static", dtype="float32", max_model_len=128, max_num_seqs=3, num_kv_blocks=32)
STATIC_PROMPTS = ["Once upon a time", "The little fox went to the river to drink", "Tom smiled",
                  "A small bird sat on a branch and sang a song", "Mia had a red ball"]


class Recorded:
    """Wraps a backend and keeps the first exception it raised. The engine turns an exception in
    a step into failed requests and goes on serving; the case re-raises it, so the scoreboard
    shows the student's error rather than a token mismatch."""

    def __init__(self, inner):
        self.inner, self.name = inner, inner.name
        self.error: Exception | None = None

    def forward(self, query, key, value, k_cache, v_cache, meta, scale):
        try:
            return self.inner.forward(query, key, value, k_cache, v_cache, meta, scale)
        except Exception as err:
            self.error = self.error or err
            raise

    def reraise(self) -> None:
        if self.error is not None:
            raise self.error


def serve_static(backend=None, poisoned: bool = False) -> TraceResult:
    """Five prompts of different lengths in static batches of 3: padded prompts (slot -1 rows),
    then idle seats of finished requests computed until their batch ends."""
    with one_cpu_thread():
        llm = make_llm(backend, poisoned, **STATIC_ARGS)
        trace = [TraceRequest(f"p{i}", llm.engine.tokenizer.encode(text), 4 + 3 * i)
                 for i, text in enumerate(STATIC_PROMPTS)]
        return run_trace(llm, trace)


@lru_cache(maxsize=1)
def reference_run() -> TraceResult:
    return serve_trace()


@lru_cache(maxsize=1)
def reference_static() -> TraceResult:
    return serve_static()


@case(CASES, "serves the tiny model on a NaN-filled pool (chunks, a prefix hit, a preemption)",
      BACKEND, "pass the step cases above first; this runs your backend in every layer and step, "
      "with every slot NaN until written")
def _(ex):
    # a quick probe first, so that a wrong backend fails here in a moment, not after a whole trace
    expect_step(ex, make_step([Seq(new=1, context=20), Seq(new=7, context=16)], seed=20),
                "probe before serving")
    want = reference_run()
    if want.num_preemptions == 0 or want.cached["shared"] < 32:
        raise AssertionError(f"the trace lost its preemption or its prefix hit: {want.preemptions}, "
                             f"{want.cached}")  # minivllm's scheduling changed: rebuild the trace
    recorder = Recorded(own_backend(ex))
    got = serve_trace(recorder, poisoned=True)
    recorder.reraise()
    if max(n for s in got.steps for _, n in s.batch) != 32 or got.cached["shared"] < 32:
        raise AssertionError("the trace no longer has a 32-token chunk and a prefix hit")
    expect_same_tokens(want.tokens, got.tokens, "chunked prefill, a prefix hit and a preemption on 8 blocks")


@case(CASES, "serves the tiny model, static batching on a NaN-filled pool: padding rows, idle seats",
      BACKEND, "rows with slot -1 must not be stored, and their slots, never written, hold NaN here")
def _(ex):
    expect_step(ex, make_step([Seq(new=2, pad=3), Seq(new=0, context=5, pad=1)], padding=float("nan"), seed=21),
                "probe before serving")
    recorder = Recorded(own_backend(ex))
    got = serve_static(recorder, poisoned=True)
    recorder.reraise()
    if not any(s.num_padding_tokens for s in got.steps):
        raise AssertionError("the static trace lost its padding rows")
    expect_same_tokens(reference_static().tokens, got.tokens, "static batches of 3, prompts padded to the longest")
