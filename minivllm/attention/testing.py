"""Random paged-attention problems with their answers, for testing attention backends and kernels.

One step of an engine, built the way an allocator leaves a pool: every sequence's K/V is drawn as
one contiguous tensor, then scattered into a paged cache through a block table of *shuffled*
physical blocks (ragged lengths, grouped-query attention, prefix blocks shared between
sequences). Every slot that no sequence owns -- spare blocks, the tail of a last block -- holds
``unowned`` (NaN by default, as a freed block may after an overflow), and so do this step's own
slots until the backend writes them. A backend that reads a slot it does not own, or reads a
new token before storing it, gives NaN instead of an almost-right number.

The answer never looks at the cache or the block tables: :func:`reference_attention` is PyTorch's
``scaled_dot_product_attention`` in float64 on each sequence's contiguous tensors, K/V repeated
per query head (query head ``h`` reads KV head ``h // (H / KVH)``, as Hugging Face's ``repeat_kv``
does), causal with the new tokens at the sequence's last positions.

Two ways to use a problem:

* a backend (``forward``, which writes the new K/V first): hand it :meth:`PagedProblem.caches`
  (fresh copies of the cache *before* the step) with ``query``, ``key``, ``value`` and ``meta``;
  compare its output with ``expected`` on ``real_rows``, its caches with ``k_cache_after``;
* a kernel that only reads (paged decode, paged prefill): ``caches(after=True)`` holds every
  sequence's K/V, the new tokens' included. :func:`kernel_problem` builds a decode step as the
  decode kernels' checks do, and :func:`kernel_inputs` hands it to a decode kernel.

:func:`int8_problem` turns a problem into the same step over an 8-bit cache (``kv_quant.py``):
owned slots quantised, every other slot random codes with a NaN (or inf) scale, and the answer
recomputed from the dequantised K/V.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from minivllm.attention.kv_quant import SCALE_BYTES, quantize_rows, round_trip
from minivllm.attention.metadata import AttentionMetadata

DEFAULT_DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

# "output vs float64 reference on the same (rounded) inputs", per dtype. float32: the order of
# the sums only. float16: the output is rounded to 2^-11 relative and the probabilities to float16
# before the P.V product; bfloat16 the same at 2^-8.
TOLERANCES: dict[torch.dtype, dict[str, float]] = {
    torch.float64: dict(atol=1e-9, rtol=1e-9),
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=2e-3, rtol=5e-3),
    torch.bfloat16: dict(atol=1.5e-2, rtol=2e-2),
}


@dataclass(frozen=True)
class Seq:
    """One sequence of a step: ``new`` tokens after ``context`` cached ones, then ``pad`` padding
    rows (slot -1: computed and thrown away, never stored; static batching makes them)."""

    new: int
    context: int = 0
    pad: int = 0

    @property
    def query_len(self) -> int:
        return self.new + self.pad

    @property
    def seq_len(self) -> int:
        return self.context + self.new + self.pad


@dataclass
class PagedProblem:
    """The inputs of one attention call over a paged cache, and what must come out of it."""

    seqs: list[Seq]
    query: torch.Tensor  # [T, H, D] in dtype, on device
    key: torch.Tensor  # [T, KVH, D]: this step's rows (new tokens, then padding), to be stored
    value: torch.Tensor
    meta: AttentionMetadata
    scale: float
    tables: list[list[int]]  # each sequence's physical blocks, logical order
    expected: torch.Tensor  # [T, H, D] float64 on the CPU; padding rows are NaN (not compared)
    real_rows: torch.Tensor  # [T] bool on the CPU: False for padding rows
    keys: list[torch.Tensor] = field(repr=False)  # per sequence [seq_len, KVH, D] float64, CPU
    values: list[torch.Tensor] = field(repr=False)
    # [num_blocks + 2 * guard, block_size, KVH, D]: the cache before / after the step, with
    # ``guard`` blocks of ``unowned`` on each side (a read past the cache's ends stays in memory)
    buffers_before: tuple[torch.Tensor, torch.Tensor] = field(repr=False)
    buffers_after: tuple[torch.Tensor, torch.Tensor] = field(repr=False)
    guard_blocks: int = 0

    def caches(self, after: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh copies ``(k_cache, v_cache)``, each ``[num_blocks, block_size, KVH, D]``: before
        the step (the new tokens' slots unwritten), or ``after=True`` (everything written)."""
        g = self.guard_blocks
        k, v = (b.clone() for b in (self.buffers_after if after else self.buffers_before))
        return (k[g:-g], v[g:-g]) if g else (k, v)

    @property
    def k_cache_after(self) -> torch.Tensor:
        """What the K cache must hold after the step (a read-only view; copy before writing)."""
        return self._window(self.buffers_after[0])

    @property
    def v_cache_after(self) -> torch.Tensor:
        return self._window(self.buffers_after[1])

    def _window(self, buffer: torch.Tensor) -> torch.Tensor:
        g = self.guard_blocks
        return buffer[g:-g] if g else buffer

    @property
    def block_tables(self) -> torch.Tensor:  # [S, max_blocks] int32
        return self.meta.block_tables

    @property
    def seq_lens(self) -> torch.Tensor:  # [S] int32
        return self.meta.seq_lens

    @property
    def query_start_loc(self) -> torch.Tensor:  # [S + 1] int32
        return self.meta.query_start_loc

    @property
    def max_query_len(self) -> int:
        return self.meta.max_query_len

    def describe_row(self, row: int) -> str:
        """Which sequence a flat row belongs to, in words (for failure messages)."""
        start = 0
        for i, (s, table) in enumerate(zip(self.seqs, self.tables, strict=True)):
            if row < start + s.query_len:
                j = row - start
                kind = "padding row" if j >= s.new else "new token"
                return (f"sequence {i} ({s.new} new tokens after {s.context} cached, blocks {table}), "
                        f"its {kind} {j} at position {s.context + j}")
            start += s.query_len
        return f"row {row}"


def make_paged_problem(
    seqs: list[Seq],
    *,
    num_heads: int = 6,
    num_kv_heads: int = 2,
    head_dim: int = 32,
    block_size: int = 16,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    scale: float | None = None,
    share: dict[int, tuple[int, int]] | None = None,
    unowned: float | None = float("nan"),
    padding: float | None = None,
    spare_blocks: int = 3,
    guard_blocks: int = 0,
    rising_scores: float = 0.0,
    seed: int = 0,
) -> PagedProblem:
    """One step over a paged cache, with its answer from contiguous tensors.

    * ``share={b: (a, n)}``: sequence ``b`` starts with the same ``n`` blocks as sequence ``a``
      (the same tokens in the same physical blocks, as after a prefix-cache hit), or with as many
      of them as can hold the same tokens for both: a block of ``a`` that ``b`` would fill past
      ``a``'s last token is not shared (a prefix cache shares full blocks; ``a``'s partly filled
      last block only with a twin that ends in it too). Shared blocks that hold a new token are
      written twice with the same K/V; keep them to cached context for a backend.
    * ``unowned``: what every slot nobody owns holds, and this step's slots before it writes them
      (NaN, inf, 0.0; ``None``: random finite values, as in a cache that starts clean).
    * ``padding``: what the slots at padding rows' positions hold (they are never stored):
      ``None``, random finite values; a float (NaN: the block the engine hands a padded prompt
      may have been freed by a request that overflowed).
    * ``guard_blocks``: the cache is a window into a buffer with that many ``unowned`` blocks on
      each side, so that a read outside the cache lands in memory and shows up as NaN.
    * ``rising_scores > 0``: each key gets a component along its query group's direction that
      grows with the position, so the running maximum of an online softmax rises block by block.

    Values are drawn in float64 and rounded to ``dtype``; the reference uses the rounded values.
    """
    device = torch.device(device) if device is not None else DEFAULT_DEVICE
    gen = torch.Generator().manual_seed(seed)
    share = share or {}
    scale = head_dim**-0.5 if scale is None else scale
    group = num_heads // num_kv_heads
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype).double()

    queries = [randn(s.query_len, num_heads, head_dim) for s in seqs]
    keys, values = [], []
    needed = [-(-s.seq_len // block_size) for s in seqs]
    num_shared = {b: _shareable_blocks(seqs[a].seq_len, seqs[b].seq_len, n, block_size)
                  for b, (a, n) in share.items()}
    for i, s in enumerate(seqs):
        k, v = randn(s.seq_len, num_kv_heads, head_dim), randn(s.seq_len, num_kv_heads, head_dim)
        if rising_scores and s.query_len:
            direction = queries[i].mean(0).view(num_kv_heads, group, head_dim).sum(1)
            direction = direction / direction.norm(dim=-1, keepdim=True)  # [KVH, D]
            ramp = torch.linspace(0, 1, s.seq_len, dtype=torch.float64)[:, None, None]
            k = (k + rising_scores * ramp * direction[None] / scale).to(dtype).double()
        if i in share:
            a = share[i][0]
            shared = min(num_shared[i] * block_size, s.seq_len)  # <= a's length (_shareable_blocks)
            k[:shared], v[:shared] = keys[a][:shared], values[a][:shared]
        keys.append(k)
        values.append(v)

    # Physical blocks: a shuffled pool with spare blocks nobody owns; shared prefixes reuse the owner's.
    num_blocks = sum(needed) - sum(num_shared.values()) + spare_blocks
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables: list[list[int]] = []
    for i, n in enumerate(needed):
        prefix = tables[share[i][0]][: num_shared[i]] if i in share else []
        tables.append(prefix + [free.pop() for _ in range(n - len(prefix))])

    shape = (num_blocks + 2 * guard_blocks, block_size, num_kv_heads, head_dim)
    if unowned is None:
        k_before, v_before = randn(*shape), randn(*shape)
    else:
        k_before, v_before = (torch.full(shape, unowned, dtype=torch.float64) for _ in range(2))
    k_after, v_after = k_before.clone(), v_before.clone()
    slots: list[int] = []
    for s, table, k, v in zip(seqs, tables, keys, values, strict=True):
        for pos in range(s.seq_len):
            block, offset = guard_blocks + table[pos // block_size], pos % block_size
            if pos < s.context:  # cached by earlier steps
                for cache, x in ((k_before, k), (k_after, k), (v_before, v), (v_after, v)):
                    cache[block, offset] = x[pos]
            elif pos < s.context + s.new:  # this step's tokens: the backend stores them
                k_after[block, offset], v_after[block, offset] = k[pos], v[pos]
                slots.append(table[pos // block_size] * block_size + offset)
            else:  # padding: computed, never stored; its slot keeps what it held
                stale = randn(2, num_kv_heads, head_dim) if padding is None else torch.full(
                    (2, num_kv_heads, head_dim), padding, dtype=torch.float64)
                for cache, x in ((k_before, stale[0]), (k_after, stale[0]), (v_before, stale[1]),
                                 (v_after, stale[1])):
                    cache[block, offset] = x
                slots.append(-1)

    step_rows = [slice(s.context, s.seq_len) for s in seqs]
    meta = AttentionMetadata.build([s.query_len for s in seqs], [s.seq_len for s in seqs], tables, slots,
                                   block_size, device=device)

    def on_device(x: torch.Tensor) -> torch.Tensor:
        return x.to(device=device, dtype=dtype)

    empty = torch.zeros(0, num_kv_heads, head_dim, dtype=torch.float64)
    return PagedProblem(
        seqs=list(seqs),
        query=on_device(torch.cat(queries) if queries else torch.zeros(0, num_heads, head_dim)),
        key=on_device(torch.cat([k[r] for k, r in zip(keys, step_rows, strict=True)] or [empty])),
        value=on_device(torch.cat([v[r] for v, r in zip(values, step_rows, strict=True)] or [empty])),
        meta=meta,
        scale=scale,
        tables=tables,
        expected=reference_attention(seqs, queries, keys, values, scale),
        real_rows=torch.tensor([j < s.new for s in seqs for j in range(s.query_len)], dtype=torch.bool),
        keys=keys,
        values=values,
        buffers_before=(on_device(k_before), on_device(v_before)),
        buffers_after=(on_device(k_after), on_device(v_after)),
        guard_blocks=guard_blocks,
    )


def _shareable_blocks(len_a: int, len_b: int, wanted: int, block_size: int) -> int:
    """How many of ``a``'s first ``wanted`` blocks ``b`` can share: every position ``b`` has in
    them must be one of ``a``'s tokens."""
    n = min(wanted, -(-len_a // block_size), -(-len_b // block_size))
    while n and min(len_b, n * block_size) > len_a:
        n -= 1
    return n


def decode_problem(seq_lens: list[int], **kwargs) -> PagedProblem:
    """A decode step: one new token per sequence, at position ``seq_len - 1``."""
    return make_paged_problem([Seq(new=1, context=n - 1) for n in seq_lens], **kwargs)


def kernel_problem(seq_lens: list[int], **kwargs) -> PagedProblem:
    """A decode step as the decode kernels' checks build it: float32 (the kernels' arithmetic)
    and two NaN guard blocks on each side of the cache; ``kwargs`` go to
    :func:`make_paged_problem` (``share``, ``rising_scores``, ``dtype``, ...)."""
    kwargs.setdefault("dtype", torch.float32)
    kwargs.setdefault("guard_blocks", 2)
    return decode_problem(seq_lens, **kwargs)


def kernel_inputs(problem: PagedProblem) -> tuple:
    """``(q, k_cache, v_cache, block_tables, seq_lens, scale)`` for a decode kernel: the cache
    after the step (a decode kernel only reads; the new token's K/V are stored by then)."""
    k_cache, v_cache = problem.caches(after=True)
    return problem.query, k_cache, v_cache, problem.block_tables, problem.seq_lens, problem.scale


def reference_attention(
    seqs: list[Seq],
    queries: list[torch.Tensor],  # per sequence [query_len, H, D]
    keys: list[torch.Tensor],  # per sequence [seq_len, KVH, D]
    values: list[torch.Tensor],
    scale: float,
) -> torch.Tensor:
    """float64 ``scaled_dot_product_attention`` per sequence on its contiguous K/V: new token
    ``j`` (position ``context + j``) over positions ``0 .. context + j``. Returns ``[T, H, D]``
    on the CPU; padding rows are NaN."""
    outs = []
    for s, q, k, v in zip(seqs, queries, keys, values, strict=True):
        out = torch.full(q.shape, float("nan"), dtype=torch.float64)
        if s.new:
            n = s.context + s.new
            group = q.shape[1] // k.shape[1]
            k_heads = k[:n].double().repeat_interleave(group, dim=1).transpose(0, 1)  # [H, n, D]
            v_heads = v[:n].double().repeat_interleave(group, dim=1).transpose(0, 1)
            allowed = torch.ones(s.new, n, dtype=torch.bool).tril(diagonal=s.context)
            o = F.scaled_dot_product_attention(q[: s.new].double().transpose(0, 1), k_heads, v_heads,
                                               attn_mask=allowed, scale=scale)
            out[: s.new] = o.transpose(0, 1)
        outs.append(out)
    return torch.cat(outs) if outs else torch.zeros(0, 0, 0, dtype=torch.float64)


def assert_matches_reference(out: torch.Tensor, problem: PagedProblem, tolerances: dict | None = None) -> None:
    """``out [T, H, D]`` is finite and close to ``problem.expected`` on every real row (padding
    rows are not compared); the error names the row, in words."""
    if tuple(out.shape) != tuple(problem.query.shape):
        raise AssertionError(f"output shape {tuple(out.shape)}, expected {tuple(problem.query.shape)}")
    tol = tolerances or TOLERANCES[problem.query.dtype]
    real = problem.real_rows
    rows = real.nonzero().squeeze(1)
    got, want = out.detach().double().cpu()[real], problem.expected[real]
    bad = ~torch.isfinite(got)
    if bad.any():
        i, head = (int(x) for x in bad.nonzero()[0][:2])
        raise AssertionError(f"NaN/inf in the output of {problem.describe_row(int(rows[i]))}, head {head}: "
                             "it read a cache slot its sequence does not own (those hold NaN here)")
    excess = (got - want).abs() - tol["atol"] - tol["rtol"] * want.abs()
    if len(want) and excess.max() > 0:
        i, head = divmod(int(excess.amax(dim=2).argmax()), got.shape[1])
        raise AssertionError(
            f"{problem.describe_row(int(rows[i]))}, query head {head}: expected "
            f"{[round(x, 5) for x in want[i, head, :4].tolist()]}, got "
            f"{[round(x, 5) for x in got[i, head, :4].tolist()]} (first 4 dims); largest error "
            f"{float((got - want).abs().max()):.2e}"
        )


def assert_cache_matches(got: torch.Tensor, want: torch.Tensor, what: str = "cache") -> None:
    """Every slot as expected (``[num_blocks, block_size, KVH, D]``; NaN equals NaN): the step's
    K/V at their slots, every other slot untouched. The error names the first wrong slot."""
    got, want = got.detach().cpu(), want.detach().cpu()
    same = (got == want) | (got.isnan() & want.isnan())
    if bool(same.all()):
        return
    block, offset = (int(x) for x in (~same).nonzero()[0][:2])
    block_size = got.shape[1]
    was = "an unowned slot" if bool(want[block, offset].isnan().all()) else "a token's K/V"
    raise AssertionError(
        f"{what}: slot {block * block_size + offset} (block {block}, offset {offset}), {was}, holds "
        f"{got[block, offset, 0, :3].tolist()} instead of {want[block, offset, 0, :3].tolist()} "
        "(first 3 dims of KV head 0); slot -1 means 'do not store'"
    )


def owned_slot_masks(problem: PagedProblem) -> tuple[torch.Tensor, torch.Tensor]:
    """``(before, after)`` bool ``[num_blocks + 2 * guard, block_size]`` on the CPU: the slots that
    hold a sequence's K/V before the step (its cached context) and after it (the new tokens too).
    Padding rows' positions, the tails of last blocks, spare and guard blocks are in neither."""
    k_buffer = problem.buffers_before[0]
    block_size = k_buffer.shape[1]
    before = torch.zeros(k_buffer.shape[:2], dtype=torch.bool)
    after = before.clone()
    g = problem.guard_blocks
    for s, table in zip(problem.seqs, problem.tables, strict=True):
        for pos in range(s.context + s.new):
            block, offset = g + table[pos // block_size], pos % block_size
            after[block, offset] = True
            if pos < s.context:
                before[block, offset] = True
    return before, after


def int8_problem(problem: PagedProblem, unowned_scale: float = float("nan"), seed: int = 0) -> PagedProblem:
    """The same step over an 8-bit cache: ``[..., head_dim + 4]`` int8 buffers, each owned slot
    quantised (``kv_quant.quantize_rows``), every other slot random codes (-128 included) and a
    scale of ``unowned_scale`` (NaN, inf, ...), the same bytes before and after the step.

    ``expected`` is recomputed by :func:`reference_attention` from each sequence's K/V as the
    cache gives it back: dequantised and rounded to the query's dtype, as the backends read it.
    ``query``, ``key``, ``value`` and ``meta`` are unchanged (a backend quantises ``key`` and
    ``value`` itself)."""
    dtype, device = problem.query.dtype, problem.query.device
    gen = torch.Generator().manual_seed(seed)
    owned_before, owned_after = owned_slot_masks(problem)
    shape = (*problem.buffers_before[0].shape[:-1], problem.buffers_before[0].shape[-1] + SCALE_BYTES)

    def garbage() -> torch.Tensor:
        rows = torch.randint(-128, 128, shape, generator=gen, dtype=torch.int8)
        scale = torch.full((*shape[:-1], 1), unowned_scale, dtype=torch.float32)
        rows[..., -SCALE_BYTES:] = scale.view(torch.int8)
        return rows

    def packed(buffer: torch.Tensor, owned: torch.Tensor, junk: torch.Tensor) -> torch.Tensor:
        rows = quantize_rows(buffer.cpu())
        return torch.where(owned[:, :, None, None], rows, junk).to(device)

    k_junk, v_junk = garbage(), garbage()
    before = (packed(problem.buffers_before[0], owned_before, k_junk),
              packed(problem.buffers_before[1], owned_before, v_junk))
    after = (packed(problem.buffers_after[0], owned_after, k_junk),
             packed(problem.buffers_after[1], owned_after, v_junk))
    keys = [round_trip(k.to(dtype), dtype).double() for k in problem.keys]
    values = [round_trip(v.to(dtype), dtype).double() for v in problem.values]
    queries = list(problem.query.detach().double().cpu().split([s.query_len for s in problem.seqs]))
    expected = reference_attention(problem.seqs, queries, keys, values, problem.scale)
    return dataclasses.replace(problem, expected=expected, keys=keys, values=values,
                               buffers_before=before, buffers_after=after)


# --- what a kernel reads, under Triton's interpreter -------------------------------------------------
@dataclass
class KernelTraffic:
    """What the kernels launched inside :func:`interpreter_traffic` did: ``loaded[name]``, the
    elements loaded from the named tensor (masked-off lanes not counted; each load of an element
    counted again); ``dots``, the ``tl.dot`` calls."""

    loaded: dict[str, int]
    dots: int = 0


@contextlib.contextmanager
def interpreter_traffic(**tensors: torch.Tensor):
    """``with interpreter_traffic(k_cache=k, v_cache=v) as traffic: kernel[grid](...)``: count,
    by address, the elements every load of a kernel takes from each tensor, and its
    ``tl.dot`` calls -- what shows whether a kernel reads each block once and multiplies with
    the tensor cores' operation. Only Triton's interpreter (``TRITON_INTERPRET=1``) runs a
    kernel's loads as Python, so elsewhere it yields ``None`` and counts nothing.

    It wraps the interpreter's builder for the duration (the interpreter offers no hook for
    this) and restores it on the way out, an exception included."""
    from minivllm.attention.triton_env import triton_mode

    if triton_mode() != "interpreted":
        yield None
        return
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    spans = {name: (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for name, t in tensors.items()}
    traffic = KernelTraffic({name: 0 for name in tensors})
    load, dot = builder.create_masked_load, builder.create_dot

    def counted_load(ptrs, mask, *args, **kwargs):
        addresses, on = np.asarray(ptrs.data), np.asarray(mask.data, dtype=bool)
        for name, (lo, hi) in spans.items():
            traffic.loaded[name] += int(np.count_nonzero(on & (addresses >= lo) & (addresses < hi)))
        return load(ptrs, mask, *args, **kwargs)

    def counted_dot(*args, **kwargs):
        traffic.dots += 1
        return dot(*args, **kwargs)

    builder.create_masked_load, builder.create_dot = counted_load, counted_dot
    try:
        yield traffic
    finally:
        del builder.create_masked_load, builder.create_dot  # the class's own methods again
