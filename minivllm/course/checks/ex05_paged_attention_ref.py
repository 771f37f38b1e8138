"""Cases for ex05_paged_attention_ref: PagedAttention in PyTorch against SDPA, then in the engine.

Every step case builds its sequences as plain contiguous K/V tensors in float64, scatters the
cached part into a paged cache through shuffled block tables, hands the student's backend the
step's new rows and metadata, and compares with ``torch.nn.functional.scaled_dot_product_attention``
run on the contiguous tensors (K/V repeated per query head, as Hugging Face's ``repeat_kv`` does).
What the checks can see:

* every cache slot that no sequence owns holds NaN, and so do the slots of this step's new
  tokens until the backend writes them: reading a slot that is not the sequence's (a logical
  block used as a physical one, the stale tail of a last block, a new token read before it is
  stored) turns the answer into NaN instead of an almost-right number;
* the whole cache is compared after the step: new K/V at their slots, nothing else touched
  (a padding row with slot -1 stored "at -1" lands in the cache's last slot);
* padding rows (slot -1) sit on stale but finite slots, as in the engine, and their outputs are
  not compared: the engine throws them away.

The last cases serve the tiny model with the student's backend and compare its greedy tokens
with those of minivllm's own backend: chunked prefill, a prefix-cache hit, a preemption, and
static batching's padding rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from minivllm.attention.testing import DEFAULT_DEVICE as DEVICE
from minivllm.attention.testing import PagedProblem, Seq, assert_cache_matches, make_paged_problem
from minivllm.course.grading import Case, Mismatch, case, expect
from minivllm.course.harness import TraceRequest, expect_same_tokens, run_trace
from minivllm.course.runtime import one_cpu_thread

CASES: list[Case] = []

# float64 on both sides: only the summation order differs (~1e-15). Off by one key moves an
# output by ~1/seq_len of a value; a wrong scale by far more.
ATOL = 1e-9
DTYPE = torch.float64


def make_step(seqs: list[Seq], **kwargs) -> PagedProblem:
    """One step over a paged cache, in float64 on ``DEVICE``, with its answer from contiguous
    tensors (:func:`minivllm.attention.testing.make_paged_problem`, the kernels' own tests'
    fixture): shuffled block tables, NaN in every slot no sequence owns and in this step's slots
    until they are written, stale finite values under padding rows. ``share={b: (a, n)}``:
    sequence ``b`` starts with ``a``'s first ``n`` blocks (a prefix-cache hit); keep them to
    cached context."""
    return make_paged_problem(seqs, dtype=DTYPE, device=DEVICE, **kwargs)


def run_step(ex, problem: PagedProblem):
    """The student's backend on fresh copies of the caches: ``(output, k_cache, v_cache)``."""
    k_cache, v_cache = problem.caches()
    out = ex.PagedAttentionBackend().forward(problem.query, problem.key, problem.value, k_cache,
                                             v_cache, problem.meta, problem.scale)
    return out, k_cache, v_cache


def expect_step(ex, problem: PagedProblem, note: str = "") -> None:
    """Run the backend; compare the caches it leaves, then the outputs of the real rows."""
    prefix = f"{note}: " if note else ""
    out, k_cache, v_cache = run_step(ex, problem)
    assert_cache_matches(k_cache, problem.k_cache_after, f"{prefix}k_cache")
    assert_cache_matches(v_cache, problem.v_cache_after, f"{prefix}v_cache")
    if tuple(out.shape) != tuple(problem.expected.shape):
        raise Mismatch(tuple(problem.expected.shape), tuple(out.shape),
                       f"{prefix}output shape [T, H, D]")
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
            "it read a cache slot that is not part of its sequence (such slots hold NaN here), "
            "or a new token's slot before storing it"
        )
    error = (got - want).abs()
    if error.max() > ATOL:
        i, head = divmod(int(error.amax(dim=2).argmax()), got.shape[1])
        raise Mismatch(
            [round(x, 5) for x in want[i, head, :4].tolist()],
            [round(x, 5) for x in got[i, head, :4].tolist()],
            f"{prefix}{problem.describe_row(int(rows[i]))}, query head {head}, first 4 dims; "
            f"largest error {float(error.max()):.2e}",
        )


# --- the four functions, one at a time -----------------------------------------------------------
@case(CASES, "new rows land at their slots; slot -1 rows are stored nowhere", "write_kv",
      "slot s is row s of the cache viewed as [num_blocks * block_size, KVH, D]; and in Python, "
      "index -1 is the last row")
def _(ex):
    p = make_step([Seq(new=3, context=14), Seq(new=1, context=31), Seq(new=2, pad=3)], seed=1)
    k_cache, v_cache = p.caches()
    ex.write_kv(p.key, p.value, k_cache, v_cache, p.meta.slot_mapping)
    assert_cache_matches(k_cache, p.k_cache_after, "k_cache after write_kv")
    assert_cache_matches(v_cache, p.v_cache_after, "v_cache after write_kv")


@case(CASES, "a sequence in logical order: lengths 1, 15, 16, 17, 33 over a shuffled pool",
      "gather_context", "logical block j lives in physical block block_table[j]; a last block is "
      "usually partly filled")
def _(ex):
    p = make_step([Seq(new=0, context=n) for n in (1, 15, 16, 17, 33)], seed=2)
    for i, (s, k, v) in enumerate(zip(p.seqs, p.keys, p.values, strict=True)):
        for cache, want, what in zip(p.caches(), (k, v), "KV", strict=True):
            got = ex.gather_context(cache, p.meta.block_tables[i], s.seq_len).detach().cpu()
            note = f"{what} of a sequence of {s.seq_len} tokens in blocks {p.tables[i]}"
            expect(tuple(got.shape), tuple(want.shape), f"{note}: shape [seq_len, KVH, D]")
            wrong = (got != want).flatten(1).any(dim=1)  # [seq_len]; NaN differs from everything
            if wrong.any():
                pos = int(wrong.nonzero()[0])
                raise AssertionError(f"{note}: position {pos} (logical block {pos // 16}, offset "
                                     f"{pos % 16}) is not the sequence's token {pos}")


@case(CASES, "decode, whole prompt, chunk after 32 cached tokens, a prefix hit of 16",
      "causal_mask", "the new tokens are the last query_len positions of the sequence")
def _(ex):
    for query_len, seq_len in [(1, 1), (1, 17), (5, 5), (7, 39), (4, 20)]:
        context = seq_len - query_len
        # row j is the token at position context + j: it sees positions 0 .. context + j
        want = [[p <= context + j for p in range(seq_len)] for j in range(query_len)]
        got = ex.causal_mask(query_len, seq_len, DEVICE)
        expect(got.dtype, torch.bool, "dtype of the mask")
        what = f"query_len={query_len}, seq_len={seq_len}"
        expect(tuple(got.shape), (query_len, seq_len), f"shape for {what}")
        expect(got.cpu().tolist(), want, f"{what} (rows: new tokens)")


@case(CASES, "grouped-query attention: 6 heads over 2 KV heads, 8 over 2, 4 over 4, 3 over 1",
      "grouped_attention", "query head h reads KV head h // (H // KVH): heads 0..2 share KV head 0 "
      "when H=6, KVH=2")
def _(ex):
    for seed, (heads, kv_heads) in enumerate([(6, 2), (8, 2), (4, 4), (3, 1)], start=3):
        p = make_step([Seq(new=5, context=20)], num_heads=heads, num_kv_heads=kv_heads, seed=seed)
        mask = torch.ones(5, 25, dtype=torch.bool, device=DEVICE).tril(diagonal=20)
        k, v = p.keys[0].to(DEVICE), p.values[0].to(DEVICE)
        got = ex.grouped_attention(p.query, k, v, mask, p.scale)
        expect(tuple(got.shape), tuple(p.expected.shape),
               f"{heads} heads over {kv_heads}: shape [n, H, D]")
        expect_close(got.detach().cpu(), p.expected, p, f"{heads} heads over {kv_heads} KV heads: ")


@case(CASES, "softmax scale 0.3 and 1.0, not the default D ** -0.5", "grouped_attention",
      "the scores are q . k * scale, once")
def _(ex):
    for scale in (0.3, 1.0):
        p = make_step([Seq(new=3, context=9)], scale=scale, seed=7)
        mask = torch.ones(3, 12, dtype=torch.bool, device=DEVICE).tril(diagonal=9)
        k, v = p.keys[0].to(DEVICE), p.values[0].to(DEVICE)
        got = ex.grouped_attention(p.query, k, v, mask, scale)
        expect_close(got.detach().cpu(), p.expected, p, f"scale {scale}: ")


# --- the backend on whole steps -------------------------------------------------------------
BACKEND = "PagedAttentionBackend"


@case(CASES, "decode rows at block boundaries: contexts of 0, 14, 15, 16, 30, 31, 32, 47", BACKEND,
      "a decode token sits at position seq_len - 1 and sees every position up to its own")
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
      "query head h reads KV head h // (H // KVH)")
def _(ex):
    seqs = [Seq(new=1, context=20), Seq(new=6, context=10), Seq(new=3)]
    for seed, (heads, kv_heads) in enumerate([(6, 2), (8, 2), (4, 4), (4, 1)], start=12):
        expect_step(ex, make_step(seqs, num_heads=heads, num_kv_heads=kv_heads, seed=seed),
                    f"{heads} heads over {kv_heads} KV heads")


@case(CASES, "shared blocks: sequences read the same physical blocks (a prefix-cache hit)", BACKEND,
      "several block tables may point at one physical block; read it, never assume it is yours")
def _(ex):
    seqs = [Seq(new=1, context=40), Seq(new=6, context=32), Seq(new=1, context=33)]
    expect_step(ex, make_step(seqs, share={1: (0, 2), 2: (0, 2)}, seed=16))


@case(CASES, "padding rows (slot -1): a padded prompt and an idle decode seat", BACKEND,
      "a row with slot -1 is computed and thrown away: store nothing for it, and do not let it "
      "disturb the real rows")
def _(ex):
    # a static batch: prompts padded to 9 tokens; a finished request's seat computed for nothing
    seqs = [Seq(new=9), Seq(new=4, pad=5), Seq(new=0, context=12, pad=1), Seq(new=1, context=20)]
    expect_step(ex, make_step(seqs, seed=17))


@case(CASES, "head_dim 40, block size 8, softmax scale 0.3", BACKEND,
      "take block_size from the cache, and multiply the scores by `scale`, once")
def _(ex):
    seqs = [Seq(new=1, context=23), Seq(new=9, context=8), Seq(new=4)]
    expect_step(ex, make_step(seqs, head_dim=40, block_size=8, scale=0.3, seed=18))


# --- the backend inside the engine ----------------------------------------------------------
STORY = ("Once upon a time there was a little fox who lived in a quiet forest near a river. "
         "Every morning she walked to the water and looked at the fish. One day she saw a big bird "
         "on a rock by the water.")  # 48 tokens
ENGINE_ARGS = dict(dtype="float32", max_model_len=128, max_num_seqs=4, num_kv_blocks=8,
                   max_num_batched_tokens=32)
MAX_TOKENS = 16


@dataclass
class EngineRun:
    """What one served trace produced (requests in alphabetical order)."""

    tokens: dict[str, list[int]]
    num_cached_tokens: dict[str, int]
    preemptions: int
    max_query_lens: list[int]  # per step, the longest run of new tokens of one sequence


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


def serve_trace(backend=None) -> EngineRun:
    """Four greedy requests on a pool of 8 blocks of 16 tokens, 32 tokens per step at most.

    ``long`` (44 tokens) is prefilled in two chunks, 32 then 12, the second next to ``short``.
    Before step 3 ``shared`` arrives with the same first 32 tokens plus its own: a prefix-cache
    hit of two blocks, so its first step is a chunk after 32 cached tokens, in a step with
    decodes; ``tom`` arrives with it. The four cannot all fit in 8 blocks: one is preempted and
    recomputed. ``backend=None``: minivllm's own backend.
    """
    from minivllm import LLM

    with one_cpu_thread():
        extra = {} if backend is None else {"attention_backend": backend}
        llm = LLM(debug_checks=True, **ENGINE_ARGS, **extra)
        tokenize = llm.engine.tokenizer.encode
        story = tokenize(STORY)
        trace = [
            TraceRequest("long", story[:44], MAX_TOKENS),
            TraceRequest("short", tokenize("The little fox"), MAX_TOKENS),
            TraceRequest("shared", story[:32] + tokenize(" and then she saw a big bird"), MAX_TOKENS, 3),
            TraceRequest("tom", tokenize("Tom went to the market with his mother and"), MAX_TOKENS, 3),
        ]
        run = run_trace(llm, trace)
    return EngineRun(
        tokens=dict(sorted(run.tokens.items())),
        num_cached_tokens=dict(sorted(run.cached.items())),
        preemptions=run.num_preemptions,
        max_query_lens=[max(n for _, n in s.batch) for s in run.steps],
    )


@lru_cache(maxsize=1)
def reference_run() -> EngineRun:
    return serve_trace(None)


def static_tokens(backend=None) -> dict[str, list[int]]:
    """Five prompts of different lengths in static batches of 3: padded prompts (slot -1 rows),
    then idle seats of finished requests computed until their batch ends."""
    from minivllm import LLM, SamplingParams

    prompts = ["Once upon a time", "The little fox went to the river to drink", "Tom smiled",
               "A small bird sat on a branch and sang a song", "Mia had a red ball"]
    with one_cpu_thread():
        extra = {} if backend is None else {"attention_backend": backend}
        llm = LLM(scheduler="static", dtype="float32", max_model_len=128, max_num_seqs=3,
                  num_kv_blocks=32, debug_checks=True, **extra)
        params = [SamplingParams(temperature=0, max_tokens=4 + 3 * i, ignore_eos=True)
                  for i in range(len(prompts))]
        outs = llm.generate(prompts, params, use_tqdm=False)
    return {o.request_id: list(o.outputs[0].token_ids) for o in outs}


@lru_cache(maxsize=1)
def reference_static_tokens() -> dict[str, list[int]]:
    return static_tokens(None)


@case(CASES, "serves the tiny model (chunks, a prefix hit, a preemption): minivllm's tokens",
      BACKEND, "pass the step cases above first; this runs your backend in every layer and step")
def _(ex):
    from minivllm.attention import AttentionBackend

    backend = ex.PagedAttentionBackend()
    if not isinstance(backend, AttentionBackend):
        raise AssertionError("PagedAttentionBackend needs a `name` and a `forward(...)` "
                             "(the AttentionBackend protocol)")
    # a quick probe first, so that a wrong backend fails here in a moment, not after a whole trace
    probe = make_step([Seq(new=1, context=20), Seq(new=7, context=16)], seed=19)
    expect_step(ex, probe, "probe before serving")
    want = reference_run()
    if want.preemptions == 0 or want.num_cached_tokens["shared"] < 32:
        # minivllm's scheduling changed under this trace: it must be rebuilt
        raise AssertionError(f"the trace lost its preemption or its prefix hit: {want}")
    recorder = Recorded(backend)
    got = serve_trace(recorder)
    recorder.reraise()
    if max(got.max_query_lens) != 32 or got.num_cached_tokens["shared"] < 32:
        raise AssertionError("the trace no longer has a 32-token chunk and a prefix hit")
    expect_same_tokens(want.tokens, got.tokens,
                       "chunked prefill, a prefix hit and a preemption on 8 blocks")


@case(CASES, "serves the tiny model, static batching: padding rows, idle seats (slot -1)", BACKEND,
      "rows with slot -1 must not be stored: in Python, index -1 is the cache's last slot")
def _(ex):
    probe = make_step([Seq(new=2, pad=3), Seq(new=0, context=5, pad=1)], seed=20)
    expect_step(ex, probe, "probe before serving")
    recorder = Recorded(ex.PagedAttentionBackend())
    got = static_tokens(recorder)
    recorder.reraise()
    expect_same_tokens(reference_static_tokens(), got,
                       "static batches of 3, prompts padded to the longest")
