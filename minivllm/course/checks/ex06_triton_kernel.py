"""Cases for ex06_triton_kernel: the paged decode kernel against SDPA, then inside the engine.

Every kernel case builds sequences as plain contiguous K/V tensors, scatters them into a paged
cache through random block tables, and compares the kernel's output with
``torch.nn.functional.scaled_dot_product_attention`` run in float64 on the contiguous tensors.
Every cache slot no sequence owns holds NaN, and the cache is a window into a larger buffer
whose edges are NaN too, so a kernel that reads a slot it should not (past a sequence's end,
through the wrong block, past the last head dimension) produces NaN rather than an almost-right
number, and never reads memory outside the buffer.

The last case serves the tiny model with the student's backend and compares its greedy tokens
with those of minivllm's own backend, on prompts that cover a block boundary and a prefix-cache
hit. The Triton interpreter is slow (milliseconds per program and block), so every shape here
is small.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minivllm.course.grading import Case, Mismatch, case
from minivllm.course.harness import TraceRequest, expect_same_tokens, run_trace
from minivllm.course.runtime import one_cpu_thread

CASES: list[Case] = []

# fp32 kernel vs float64 reference on the same inputs: only the summation order differs
# (observed <= 5e-7). One token too many or too few moves an output by ~1/seq_len of a value.
ATOL = RTOL = 2e-5
GUARD_BLOCKS = 2  # NaN blocks on each side of the cache, inside the same buffer
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass
class PagedProblem:
    """One decode step over a paged cache, with the answer computed from contiguous tensors."""

    q: torch.Tensor  # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    scale: float
    expected: torch.Tensor  # [num_seqs, num_heads, head_dim] float64, on the CPU
    tables: list[list[int]]  # the block tables as lists, for messages


def make_problem(
    seq_lens: list[int],
    *,
    num_heads: int = 6,
    num_kv_heads: int = 2,
    head_dim: int = 32,
    block_size: int = 16,
    scale: float | None = None,
    seed: int = 0,
    share: dict[int, tuple[int, int]] | None = None,
    rising_scores: float = 0.0,
) -> PagedProblem:
    """Build a paged decode problem.

    ``share={b: (a, n)}``: sequence ``b`` starts with the same ``n`` blocks as sequence ``a``
    (same tokens, same physical blocks: a prefix-cache hit); ``n`` may cover all of ``a``.
    ``rising_scores > 0`` adds to each key a component along its query group's direction that
    grows with the position, so the running maximum rises from block to block.
    """
    gen = torch.Generator().manual_seed(seed)
    share = share or {}
    group = num_heads // num_kv_heads
    scale = head_dim**-0.5 if scale is None else scale
    q = torch.randn(len(seq_lens), num_heads, head_dim, generator=gen)
    keys, values = [], []
    for i, n in enumerate(seq_lens):
        k = torch.randn(n, num_kv_heads, head_dim, generator=gen)
        v = torch.randn(n, num_kv_heads, head_dim, generator=gen)
        if rising_scores:
            direction = q[i].view(num_kv_heads, group, head_dim).sum(1)
            direction = direction / direction.norm(dim=-1, keepdim=True)  # [KVH, D]
            k += rising_scores * torch.linspace(0, 1, n)[:, None, None] * direction[None] / scale
        if i in share:
            a, blocks = share[i]
            shared = min(blocks * block_size, n, seq_lens[a])
            k[:shared], v[:shared] = keys[a][:shared], values[a][:shared]
        keys.append(k)
        values.append(v)

    # Physical blocks: a random permutation of the pool, shared prefixes reuse their owner's.
    needed = [-(-n // block_size) for n in seq_lens]
    num_shared = {b: min(blocks, needed[b], needed[a]) for b, (a, blocks) in share.items()}
    num_blocks = sum(needed) - sum(num_shared.values()) + 3  # 3 blocks nobody owns
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables: list[list[int]] = []
    for i, n in enumerate(needed):
        prefix = tables[share[i][0]][: num_shared[i]] if i in share else []
        own = [free.pop() for _ in range(n - len(prefix))]
        tables.append(prefix + own)

    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_buffer = torch.full((num_blocks + 2 * GUARD_BLOCKS, *shape[1:]), float("nan"))
    v_buffer = torch.full_like(k_buffer, float("nan"))
    k_cache, v_cache = k_buffer[GUARD_BLOCKS:-GUARD_BLOCKS], v_buffer[GUARD_BLOCKS:-GUARD_BLOCKS]
    for table, k, v in zip(tables, keys, values, strict=True):
        for pos in range(k.shape[0]):
            block, offset = table[pos // block_size], pos % block_size
            k_cache[block, offset], v_cache[block, offset] = k[pos], v[pos]

    width = max(needed)
    block_tables = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    for i, table in enumerate(tables):
        block_tables[i, : len(table)] = torch.tensor(table, dtype=torch.int32)
    return PagedProblem(
        q=q.to(DEVICE),
        k_cache=k_buffer.to(DEVICE)[GUARD_BLOCKS:-GUARD_BLOCKS],
        v_cache=v_buffer.to(DEVICE)[GUARD_BLOCKS:-GUARD_BLOCKS],
        block_tables=block_tables.to(DEVICE),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        scale=scale,
        expected=sdpa_reference(q, keys, values, scale),
        tables=tables,
    )


def sdpa_reference(
    q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], scale: float
) -> torch.Tensor:
    """``scaled_dot_product_attention`` in float64, one sequence at a time, on contiguous K/V.
    Query head ``h`` reads KV head ``h // (num_heads // num_kv_heads)`` (as Hugging Face's
    ``repeat_kv`` does). Returns ``[num_seqs, num_heads, head_dim]``."""
    num_heads = q.shape[1]
    outs = []
    for i, (k, v) in enumerate(zip(keys, values, strict=True)):
        group = num_heads // k.shape[1]
        k_heads = k.double().repeat_interleave(group, dim=1).transpose(0, 1)  # [H, L, D]
        v_heads = v.double().repeat_interleave(group, dim=1).transpose(0, 1)
        query = q[i].double()[:, None, :]  # [H, 1, D]
        outs.append(F.scaled_dot_product_attention(query, k_heads, v_heads, scale=scale)[:, 0])
    return torch.stack(outs)


def expect_attention(ex, problem: PagedProblem, note: str = "") -> None:
    """Run the student's ``paged_decode`` and compare with the reference, naming the worst
    (sequence, head) when they differ."""
    got = ex.paged_decode(problem.q, problem.k_cache, problem.v_cache, problem.block_tables,
                          problem.seq_lens, problem.scale)
    prefix = f"{note}: " if note else ""
    if tuple(got.shape) != tuple(problem.expected.shape):
        raise Mismatch(tuple(problem.expected.shape), tuple(got.shape), f"{prefix}output shape")
    got = got.detach().double().cpu()
    lens = problem.seq_lens.tolist()
    bad = ~torch.isfinite(got)
    if bad.any():
        seq, head = (int(x) for x in bad.nonzero()[0][:2])
        raise AssertionError(
            f"{prefix}NaN/inf in the output of sequence {seq} (length {lens[seq]}, blocks "
            f"{problem.tables[seq]}), head {head}: the kernel used a cache slot that is not part of "
            "the sequence (unowned slots hold NaN here)"
        )
    error = (got - problem.expected).abs() - RTOL * problem.expected.abs()
    if error.max() > ATOL:
        seq, head = divmod(int(error.amax(dim=2).argmax()), got.shape[1])
        raise Mismatch(
            [round(x, 5) for x in problem.expected[seq, head, :4].tolist()],
            [round(x, 5) for x in got[seq, head, :4].tolist()],
            f"{prefix}sequence {seq} (length {lens[seq]}, blocks {problem.tables[seq]}), head {head}, "
            f"first 4 dims; largest error {float((got - problem.expected).abs().max()):.2e}",
        )


# --- the kernel against SDPA -----------------------------------------------------------------
KERNEL = "paged_decode_kernel"


@case(CASES, "one sequence of one token", KERNEL, "with one key, the output is that key's value")
def _(ex):
    expect_attention(ex, make_problem([1], seed=1))


@case(CASES, "lengths at block boundaries: 15, 16, 17, 32, 33", KERNEL,
      "the last block is usually partial: positions >= seq_len are not part of the sequence")
def _(ex):
    expect_attention(ex, make_problem([15, 16, 17, 32, 33], seed=2))


@case(CASES, "ragged lengths over a shuffled block pool", KERNEL,
      "logical block j of a sequence lives in physical block block_tables[seq, j]")
def _(ex):
    expect_attention(ex, make_problem([3, 50, 21, 100], seed=3))


@case(CASES, "grouped-query attention: 6 heads over 2 KV heads; 8 over 2; 4 over 4", KERNEL,
      "all rows of the query tile read the program's KV head")
def _(ex):
    for seed, (heads, kv_heads) in enumerate([(6, 2), (8, 2), (4, 4)], start=4):
        problem = make_problem([9, 40], num_heads=heads, num_kv_heads=kv_heads, seed=seed)
        expect_attention(ex, problem, f"{heads} heads, {kv_heads} KV heads")


@case(CASES, "shared blocks: a common prefix, and two sequences with one block table", KERNEL,
      "sequences may point at the same physical blocks; read them, never assume ownership")
def _(ex):
    # 1 shares 2 blocks with 0 and goes on; 2 is 0's twin (same blocks, same length) with its own query.
    expect_attention(ex, make_problem([40, 45, 40], share={1: (0, 2), 2: (0, 3)}, seed=7))


@case(CASES, "the running maximum rises from block to block", KERNEL,
      "when the maximum grows, what denom and acc hold so far must be rescaled by exp(m_old - m_new)")
def _(ex):
    expect_attention(ex, make_problem([70, 33], rising_scores=8.0, seed=8))


@case(CASES, "head_dim 40 (padded to 64), block size 32, softmax scale 0.3", KERNEL,
      "multiply the scores by `scale`; mask padded head dimensions when loading K and V")
def _(ex):
    expect_attention(ex, make_problem([31, 32, 65], head_dim=40, block_size=32, scale=0.3, seed=9))


# --- the kernel inside the engine --------------------------------------------------------------
@dataclass
class Served:
    """One request served by the engine."""

    prompt_len: int
    num_cached_tokens: int
    token_ids: list[int]
    text: str


ENGINE_ARGS = dict(dtype="float32", num_kv_blocks=64, max_model_len=256, max_num_seqs=8)
STORY = ("Once upon a time there was a little fox who lived in a quiet forest near a river. "
         "Every morning")


def make_llm(backend=None, **engine_args):
    """The tiny model with minivllm's own attention backend (``backend=None``) or with
    ``backend``, any object with ``name`` and ``forward(query, key, value, k_cache, v_cache,
    meta, scale)``."""
    from minivllm import LLM

    args = {**ENGINE_ARGS, **engine_args}
    if backend is None:
        return LLM(**args)
    return LLM(attention_backend=backend, **args)


def serve_tiny_model(backend=None, max_tokens: int = 16) -> dict[str, Served]:
    """Serve three greedy requests and return what each produced.

    ``boundary`` has a 16-token prompt (exactly one block, so its first decode token opens a
    new block) and ``short`` a 4-token one; both are prefilled in the first step. ``shared``
    then arrives with ``boundary``'s 16 tokens plus more: its first block is a prefix-cache hit.
    The second step mixes the rest of that prompt with two decodes; every later step is
    decode-only, so the backend's kernel serves all but the first two steps.
    """
    with one_cpu_thread():
        llm = make_llm(backend)
        tokenize = llm.engine.tokenizer.encode
        story = tokenize(STORY)
        trace = [
            TraceRequest("boundary", story[:16], max_tokens),
            TraceRequest("short", tokenize("The little fox"), max_tokens),
            TraceRequest("shared", story[:16] + tokenize(" and then she saw a bird"), max_tokens, arrival_step=1),
        ]
        run = run_trace(llm, trace)
    return {r.request_id: Served(r.prompt_len, run.cached[r.request_id], run.tokens[r.request_id],
                                 run.texts[r.request_id]) for r in sorted(trace, key=lambda r: r.request_id)}


@case(CASES, "served by the engine: the tiny model's greedy tokens equal minivllm's", KERNEL,
      "pass the kernel cases above first; the engine only calls paged_decode through your backend")
def _(ex):
    # A quick probe first, so that a wrong kernel fails here in a second instead of after a
    # whole served trace.
    expect_attention(ex, make_problem([40, 17], rising_scores=4.0, seed=10), "probe before serving")
    expected = serve_tiny_model()
    backend = ex.PagedDecodeBackend()
    got = serve_tiny_model(backend)
    if backend.kernel_calls == 0:
        raise AssertionError("the backend never ran the kernel: decode-only steps must use it")
    if expected["shared"].num_cached_tokens < 16:
        raise AssertionError("the trace lost its prefix-cache hit (16 cached tokens expected)")
    expect_same_tokens({rid: s.token_ids for rid, s in expected.items()}, {rid: s.token_ids for rid, s in got.items()},
                       "a 16-token prompt, a short one, a prefix hit")
