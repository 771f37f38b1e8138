"""Decode-attention kernel benchmark (GPU only): how close does paged decode get to HBM peak?

Decode attention reads every cached K/V byte of every sequence once per step and does little
arithmetic on it, so its speed limit is memory bandwidth. For each batch x context pair this
script times

* ``paged``       the Triton decode kernel on a cache whose blocks are randomly permuted
                  (what a serving engine's allocator produces), split-KV chosen by the heuristic;
* ``no split``    the same, forced to one program per (sequence, KV head) (num_splits=1);
* ``contiguous``  the same kernel on the same cache with identity block tables (each
                  sequence's blocks consecutive): paged / contiguous - 1 is the cost of paging;
* ``sdpa``        ``torch.nn.functional.scaled_dot_product_attention`` on a contiguous
                  ``[batch, kv_heads, context, head_dim]`` cache;
* ``flash-attn``  ``flash_attn_with_kvcache`` with a block table, if flash-attn is installed
                  (it needs pages of 256 tokens, so it gets its own copy of the cache),

and reports achieved bandwidth = K/V bytes read / time, as a fraction of the card's peak when
the card is in ``PEAK_BANDWIDTH``. Timings are medians of ``triton.testing.do_bench`` (CUDA
events, L2 flushed between runs).

Usage::

    python benchmarks/attention_kernels.py                 # markdown table to stdout
    python benchmarks/attention_kernels.py --out kernels.json
    python benchmarks/attention_kernels.py --store benchmarks/results   # the course's record

``--store DIR`` writes ``DIR/attention_kernels-<gpu>.json``, which notebook 06 reads through
``minivllm.course.kernel_results.stored_kernel_benchmark()`` on machines without a GPU.

Without a CUDA device it prints why it skipped and exits with status 0.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from typing import Any

import torch

import minivllm.attention  # noqa: F401  (sets up Triton before any kernel module is imported)
from minivllm.course.kernel_results import store_kernel_benchmark

# Peak HBM bandwidth in bytes/s, matched against torch.cuda.get_device_name(). Each entry is
# (substrings that must all appear, substrings that must not appear, bytes/s).
PEAK_BANDWIDTH: list[tuple[tuple[str, ...], tuple[str, ...], float]] = [
    (("H200",), (), 4.8e12),
    (("H100",), ("PCIe", "NVL"), 3.35e12),  # SXM (HBM3); PCIe / NVL cards differ
    (("A100", "80GB"), (), 2.0e12),
    (("L4",), ("L40",), 0.3e12),
    (("T4",), (), 0.32e12),
]

SKIP_MESSAGE = (
    "SKIPPED: benchmarks/attention_kernels.py measures GPU memory bandwidth and needs a CUDA "
    "device (torch.cuda.is_available() is False). On CPU the kernels run in the Triton "
    "interpreter, which is correct but far too slow to time; run `pytest tests/attention` instead."
)


def peak_bandwidth(device_name: str) -> float | None:
    """Peak HBM bandwidth (bytes/s) for a device name, or None when the card is not in the table."""
    for must, must_not, peak in PEAK_BANDWIDTH:
        if all(s in device_name for s in must) and not any(s in device_name for s in must_not):
            return peak
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    p.add_argument("--contexts", type=int, nargs="+", default=[512, 4096, 32768])
    p.add_argument("--num-heads", type=int, default=32)
    p.add_argument("--num-kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--dtype", choices=["float16", "bfloat16"], default="bfloat16")
    p.add_argument("--memory-fraction", type=float, default=0.8,
                   help="skip a case whose tensors would need more than this fraction of free memory")
    p.add_argument("--out", default=None, help="also write the results as JSON to this path")
    p.add_argument("--store", default=None, metavar="DIR",
                   help="also store them as DIR/attention_kernels-<gpu>.json (the course's record)")
    return p.parse_args(argv)


def bench_ms(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def run_case(
    batch: int, context: int, args: argparse.Namespace, peak: float | None, device: str = "cuda"
) -> dict[str, Any]:
    """Time one batch x context case; returns a row of the results table. (``device`` is "cuda"
    except in the test that checks this function's logic on CPU with a stubbed ``bench_ms``.)"""
    from minivllm.attention.triton_kernels import choose_num_splits, paged_decode_attention

    dtype = getattr(torch, args.dtype)
    h, kvh, d, bs = args.num_heads, args.num_kv_heads, args.head_dim, args.block_size
    elt = torch.finfo(dtype).bits // 8
    kv_bytes = 2 * batch * context * kvh * d * elt  # K and V of every cached token, read once
    row: dict[str, Any] = {"batch": batch, "context": context, "kv_bytes": kv_bytes}

    try:
        from flash_attn import flash_attn_with_kvcache
    except ImportError:
        flash_attn_with_kvcache = None
    # The paged cache, a contiguous copy for SDPA (plus a gather temporary), and a copy in
    # 256-token pages for flash-attn.
    copies = 2.5 + (flash_attn_with_kvcache is not None)
    free = torch.cuda.mem_get_info()[0] if device == "cuda" else float("inf")
    if copies * kv_bytes > args.memory_fraction * free:
        row["skipped"] = f"needs ~{copies * kv_bytes / 2**30:.0f} GiB, {free / 2**30:.0f} GiB free"
        return row

    torch.manual_seed(0)
    blocks_per_seq = math.ceil(context / bs)
    num_blocks = batch * blocks_per_seq
    k_cache = torch.randn(num_blocks, bs, kvh, d, device=device, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(batch, h, d, device=device, dtype=dtype)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    identity = torch.arange(num_blocks, dtype=torch.int32, device=device).view(batch, blocks_per_seq)
    permuted = torch.randperm(num_blocks, device=device).to(torch.int32).view(batch, blocks_per_seq)
    scale = d**-0.5
    splits = choose_num_splits(batch, kvh, context, bs)
    row["num_splits"] = splits

    def paged(table, num_splits=None):
        return lambda: paged_decode_attention(q, k_cache, v_cache, table, seq_lens, scale,
                                              num_splits=num_splits, max_seq_len=context)

    row["paged_ms"] = bench_ms(paged(permuted))
    row["no_split_ms"] = bench_ms(paged(permuted, 1)) if splits > 1 else row["paged_ms"]
    row["contiguous_ms"] = bench_ms(paged(identity))
    row["paging_cost"] = row["paged_ms"] / row["contiguous_ms"] - 1
    row["paged_GBps"] = kv_bytes / (row["paged_ms"] * 1e-3) / 1e9
    row["peak_fraction"] = row["paged_GBps"] * 1e9 / peak if peak else None

    reference = _bench_sdpa(row, q, k_cache, v_cache, permuted, context, scale)
    if reference is not None:
        row["max_abs_diff_vs_sdpa"] = float((paged(permuted)() - reference).abs().max())
    if flash_attn_with_kvcache is not None:
        _bench_flash_attn(row, flash_attn_with_kvcache, q, k_cache, v_cache, permuted, seq_lens, context, scale,
                          reference)
    return row


def _logical(cache: torch.Tensor, block_tables: torch.Tensor, context: int) -> torch.Tensor:
    """Gather each sequence's tokens in order: ``[batch, context, kv_heads, head_dim]``."""
    batch = block_tables.shape[0]
    return cache[block_tables.long()].reshape(batch, -1, *cache.shape[2:])[:, :context]


def _bench_sdpa(row, q, k_cache, v_cache, block_tables, context, scale) -> torch.Tensor | None:
    """Time SDPA on a contiguous ``[batch, kv_heads, context, head_dim]`` copy of the same
    sequences (freed on return). Returns SDPA's output ``[batch, heads, head_dim]``."""
    import torch.nn.functional as F

    batch, h, d = q.shape
    k = _logical(k_cache, block_tables, context).transpose(1, 2).contiguous()
    v = _logical(v_cache, block_tables, context).transpose(1, 2).contiguous()
    q4 = q.view(batch, h, 1, d)

    def sdpa():
        return F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True)

    try:
        reference = sdpa().view(batch, h, d)
    except TypeError:  # torch < 2.5 has no enable_gqa; expanding K/V would distort the timing
        return None
    row["sdpa_ms"] = bench_ms(sdpa)
    return reference


def _bench_flash_attn(row, flash_attn_with_kvcache, q, k_cache, v_cache, block_tables, seq_lens, context, scale,
                      reference):
    """Time flash-attn's paged decode. Its block table wants pages of a multiple of 256 tokens,
    so the same data is copied into randomly placed 256-token pages (freed on return)."""
    batch, h, d = q.shape
    kvh, dtype = k_cache.shape[2], k_cache.dtype
    page = 256
    pages = math.ceil(context / page)
    table = torch.randperm(batch * pages, device=q.device).to(torch.int32).view(batch, pages)

    def repage(cache: torch.Tensor) -> torch.Tensor:
        logical = torch.zeros(batch, pages * page, kvh, d, device=q.device, dtype=dtype)
        logical[:, :context] = _logical(cache, block_tables, context)
        physical = torch.empty(batch * pages, page, kvh, d, device=q.device, dtype=dtype)
        physical[table.flatten().long()] = logical.view(batch * pages, page, kvh, d)
        return physical

    k_pages, v_pages = repage(k_cache), repage(v_cache)
    q4 = q.view(batch, 1, h, d)

    def fa():
        return flash_attn_with_kvcache(q4, k_pages, v_pages, cache_seqlens=seq_lens, block_table=table,
                                       softmax_scale=scale)

    if reference is not None:
        row["max_abs_diff_flash_vs_sdpa"] = float((fa().view(batch, h, d) - reference).abs().max())
    row["flash_attn_ms"] = bench_ms(fa)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    def ms(x):
        return f"{x * 1e3:.1f}" if isinstance(x, float) else "-"

    head = ("| batch | context | splits | paged µs | GB/s | % of peak | no-split µs | contiguous µs "
            "| paging cost | SDPA µs | flash-attn µs | max diff vs SDPA |")
    lines = [head, "|" + "|".join(["---"] * 12) + "|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['batch']} | {r['context']} | skipped: {r['skipped']} |" + " |" * 9)
            continue
        pct = f"{100 * r['peak_fraction']:.1f}%" if r.get("peak_fraction") is not None else "n/a"
        lines.append(
            f"| {r['batch']} | {r['context']} | {r['num_splits']} | {ms(r['paged_ms'])} | {r['paged_GBps']:.0f} "
            f"| {pct} | {ms(r['no_split_ms'])} | {ms(r['contiguous_ms'])} | {100 * r['paging_cost']:+.1f}% "
            f"| {ms(r.get('sdpa_ms'))} | {ms(r.get('flash_attn_ms'))} | {r.get('max_abs_diff_vs_sdpa', float('nan')):.2e} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print(SKIP_MESSAGE)
        return 0

    name = torch.cuda.get_device_name()
    peak = peak_bandwidth(name)
    rows = [run_case(b, c, args, peak) for b in args.batches for c in args.contexts]
    torch.cuda.synchronize()
    peak_text = f"peak {peak / 1e12:.2f} TB/s" if peak else "peak bandwidth unknown: absolute GB/s only"
    print(f"## Paged decode attention on {name} ({peak_text})\n")
    print(f"heads {args.num_heads}, KV heads {args.num_kv_heads}, head_dim {args.head_dim}, "
          f"block {args.block_size}, {args.dtype}\n")
    print(markdown_table(rows))
    if args.out or args.store:
        import triton

        record = {
            "device": name,
            "measured_at": datetime.date.today().isoformat(),
            "peak_bandwidth_Bps": peak,
            "torch": torch.__version__,
            "triton": triton.__version__,
            "cuda": torch.version.cuda,
            "config": {k: v for k, v in vars(args).items() if k not in ("out", "store")},
            "rows": rows,
        }
        if args.out:
            with open(args.out, "w") as f:
                json.dump(record, f, indent=2)
            print(f"\nwrote {args.out}")
        if args.store:
            print(f"stored {store_kernel_benchmark(record, args.store)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
