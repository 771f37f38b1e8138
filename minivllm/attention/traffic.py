"""What each Triton kernel must move through memory, from the shapes alone: a prediction.

A paged-attention launch does almost no arithmetic per byte, so its time on a GPU is bounded
below by the bytes it reads and writes over the memory bandwidth. This module counts those
bytes for one launch of each kernel of ``triton_*.py``, part by part, as the kernel loads them:

* ``reshape_and_cache``: each new token's K and V rows (read), its slot (8 bytes), and the rows
  it stores (``head_dim`` elements, or ``head_dim + 4`` int8 bytes for an 8-bit cache);
* ``paged_decode``: per program ``(sequence, KV head, split)``: the group's queries, the
  block-table entries of its blocks, its ``seq_len``, the K and V rows of its positions (masked
  rows past ``seq_len`` are not loaded); it writes the output rows, or, split, one normalised
  fp32 partial row and one log-sum-exp per (query head, split);
* ``merge_splits``: reads those partials and log-sum-exps, writes the output;
* ``paged_prefill``: per program ``(sequence, query block, KV head)``: its queries, and every K/V
  row its causal window reaches (each query block reads its sequence's context again).

Counts are per program, as loaded: a block-table entry or query row read by several programs is
counted each time, though a GPU's L2 cache may serve the repeats; so the totals are what the
kernel asks of the memory system, an upper bound on what DRAM delivers. Time =
``bytes / bandwidth``: a floor a kernel reaches only at 100 % of peak; a measured time divided by
it is the fraction of peak achieved (``scripts/gpu_check.sh`` puts them side by side).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minivllm.attention.kv_quant import SCALE_BYTES

INT32, INT64, FP32 = 4, 8, 4
T4_BANDWIDTH = 320e9  # bytes/s: minivllm.sim.hardware's T4 (NVIDIA datasheet, GDDR6)
H100_BANDWIDTH = 3.35e12  # bytes/s: H100 SXM, HBM3
BANDWIDTHS = {"T4": T4_BANDWIDTH, "H100": H100_BANDWIDTH}


@dataclass
class Traffic:
    """The bytes of one launch: ``reads`` and ``writes`` by what they are."""

    kernel: str
    reads: dict[str, int] = field(default_factory=dict)
    writes: dict[str, int] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(self.reads.values()) + sum(self.writes.values())

    def fraction(self, part: str) -> float:
        """Share of the launch's bytes that ``part`` (a read or a write) accounts for."""
        return (self.reads.get(part, 0) + self.writes.get(part, 0)) / self.bytes

    def seconds(self, bandwidth: float) -> float:
        return self.bytes / bandwidth

    def row(self) -> dict:
        return dict(kernel=self.kernel, bytes=self.bytes,
                    **{f"{gpu}_us": self.seconds(bw) * 1e6 for gpu, bw in BANDWIDTHS.items()})


def _kv_row_bytes(head_dim: int, dtype_bytes: int, kv_int8: bool) -> int:
    return head_dim + SCALE_BYTES if kv_int8 else head_dim * dtype_bytes


def cache_write_traffic(num_tokens: int, num_kv_heads: int, head_dim: int, dtype_bytes: int = 2,
                        kv_int8: bool = False, num_skipped: int = 0) -> Traffic:
    """``reshape_and_cache``: one program per token; a skipped slot (-1) reads its slot only."""
    written = num_tokens - num_skipped
    return Traffic(
        "reshape_and_cache",
        reads={"K/V rows": 2 * written * num_kv_heads * head_dim * dtype_bytes, "slots": num_tokens * INT64},
        writes={"K/V rows": 2 * written * num_kv_heads * _kv_row_bytes(head_dim, dtype_bytes, kv_int8)},
    )


def decode_traffic(seq_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int, block_size: int = 16,
                   dtype_bytes: int = 2, kv_int8: bool = False, num_splits: int | None = None) -> list[Traffic]:
    """``paged_decode_attention``: the decode kernel, and the merge if it splits. ``num_splits``:
    ``None`` picks it as the engine does (``choose_num_splits``)."""
    if num_splits is None:
        from minivllm.attention.triton_decode import choose_num_splits

        num_splits = choose_num_splits(len(seq_lens), num_kv_heads, max(seq_lens, default=1), block_size)
    group = num_heads // num_kv_heads
    row = _kv_row_bytes(head_dim, dtype_bytes, kv_int8)
    n = len(seq_lens)
    programs = n * num_kv_heads * num_splits
    blocks = sum(-(-s // block_size) for s in seq_lens)
    reads = {
        "queries": programs * group * head_dim * dtype_bytes,  # each split loads its group's queries
        "block table": num_kv_heads * blocks * INT32,  # each KV head's program(s) read the sequence's entries
        "seq_lens": programs * INT32,
        "K/V rows": 2 * num_kv_heads * sum(seq_lens) * row,
    }
    if num_splits == 1:
        return [Traffic("paged_decode", reads, {"output": n * num_heads * head_dim * dtype_bytes})]
    partial = n * num_heads * num_splits * head_dim * FP32
    lse = n * num_heads * num_splits * FP32
    decode = Traffic("paged_decode (split)", reads, {"split partials": partial, "log-sum-exp": lse})
    merge = Traffic("merge_splits", {"split partials": partial, "log-sum-exp": lse},
                    {"output": n * num_heads * head_dim * dtype_bytes})
    return [decode, merge]


def prefill_traffic(query_lens: list[int], seq_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int,
                    block_size: int = 16, dtype_bytes: int = 2, kv_int8: bool = False) -> Traffic:
    """``paged_prefill_attention``: each ``(sequence, query block, KV head)`` program reads its
    queries and the K/V rows up to its last query's position."""
    from minivllm.attention.triton_prefill import BLOCK_M_TARGET

    group = num_heads // num_kv_heads
    group_pad = 1 << (group - 1).bit_length()
    block_q = max(1, BLOCK_M_TARGET // group_pad)
    row = _kv_row_bytes(head_dim, dtype_bytes, kv_int8)
    kv_rows = table = programs = 0
    for q, s in zip(query_lens, seq_lens, strict=True):
        context = s - q
        for start in range(0, q, block_q):
            reach = context + min(q, start + block_q)  # positions this query block attends to
            kv_rows += reach
            table += -(-reach // block_size)
            programs += 1
    tokens = sum(query_lens)
    return Traffic(
        "paged_prefill",
        reads={
            "queries": tokens * num_heads * head_dim * dtype_bytes,
            "block table": num_kv_heads * table * INT32,
            "seq_lens": num_kv_heads * programs * 3 * INT32,  # seq_len, readable_len, query start
            "K/V rows": 2 * num_kv_heads * kv_rows * row,
        },
        writes={"output": tokens * num_heads * head_dim * dtype_bytes},
    )


def decode_step_traffic(batch: int, context: int, num_heads: int, num_kv_heads: int, head_dim: int,
                        block_size: int = 16, dtype_bytes: int = 2, kv_int8: bool = False) -> list[Traffic]:
    """One layer's attention launches in a decode step of ``batch`` sequences of ``context``
    tokens (the new one included): the cache write, then decode (and merge)."""
    return [cache_write_traffic(batch, num_kv_heads, head_dim, dtype_bytes, kv_int8),
            *decode_traffic([context] * batch, num_heads, num_kv_heads, head_dim, block_size, dtype_bytes, kv_int8)]


def table(launches: list[Traffic]) -> str:
    """A markdown table: each launch's bytes and its time at a T4's and an H100's peak."""
    lines = ["| kernel | bytes read | bytes written | T4 µs (prediction) | H100 µs (prediction) |",
             "|---|---:|---:|---:|---:|"]
    for t in launches:
        lines.append(f"| {t.kernel} | {sum(t.reads.values()):,} | {sum(t.writes.values()):,} | "
                     f"{t.seconds(T4_BANDWIDTH) * 1e6:,.1f} | {t.seconds(H100_BANDWIDTH) * 1e6:,.2f} |")
    return "\n".join(lines)
