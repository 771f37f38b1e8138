"""Each attention kernel's bytes per launch and the time they take at peak bandwidth (a
prediction, ``minivllm/attention/traffic.py``), and on a GPU the measured time beside it.

    python benchmarks/kernel_traffic.py [--batches 1 8 64] [--contexts 512 4096] [--dtype bfloat16]

Shapes: Llama-3-8B's attention (32 query heads over 8 KV heads, head_dim 128), blocks of 16,
scattered over the pool as an allocator leaves them. Per (batch, context): the cache write of the
step's new K/V, then decode (split-KV and its merge where the engine would split), then a prefill
of one ``context``-token prompt. Without CUDA it prints the prediction only; ``scripts/gpu_check.sh``
runs it on the GPU (step ``traffic``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minivllm.attention import traffic  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16


def predict(batch: int, context: int, dtype_bytes: int = 2) -> list[traffic.Traffic]:
    """The launches of one layer's decode step, then a ``context``-token prefill."""
    return [*traffic.decode_step_traffic(batch, context, HEADS, KV_HEADS, HEAD_DIM, BLOCK, dtype_bytes),
            traffic.prefill_traffic([context], [context], HEADS, KV_HEADS, HEAD_DIM, BLOCK, dtype_bytes)]


def block_table_share(batch: int = 64, context: int = 4096) -> float:
    """The block table's share of a decode launch's bytes (the chapter's §4.2 indirection)."""
    decode = next(t for t in predict(batch, context) if t.kernel.startswith("paged_decode"))
    return decode.fraction("block table")


def measure(batch: int, context: int, dtype: torch.dtype, repeats: int = 20) -> dict[str, float]:
    """Median µs per launch group on CUDA: ``cache write``, ``decode`` (with its merge), ``prefill``."""
    from minivllm.attention.triton_kernels import (
        paged_decode_attention,
        paged_prefill_attention,
        reshape_and_cache,
    )

    dev = "cuda"
    per_seq = -(-context // BLOCK)
    num_blocks = max(batch, 1) * per_seq + 1
    g = torch.Generator(device="cpu").manual_seed(0)
    perm = torch.randperm(num_blocks, generator=g)[: batch * per_seq].to(torch.int32)
    tables = perm.view(batch, per_seq).to(dev)
    k_cache = torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, device=dev, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=dev)
    q = torch.randn(batch, HEADS, HEAD_DIM, device=dev, dtype=dtype)
    kv = torch.randn(batch, KV_HEADS, HEAD_DIM, device=dev, dtype=dtype)
    slots = (tables[:, -1].long() * BLOCK + (context - 1) % BLOCK)
    qp = torch.randn(context, HEADS, HEAD_DIM, device=dev, dtype=dtype)
    starts = torch.tensor([0, context], dtype=torch.int32, device=dev)
    cases = {
        "cache write": lambda: reshape_and_cache(kv, kv, k_cache, v_cache, slots),
        "decode": lambda: paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, HEAD_DIM**-0.5,
                                                 max_seq_len=context),
        "prefill": lambda: paged_prefill_attention(qp, k_cache, v_cache, tables[:1], starts, seq_lens[:1],
                                                   HEAD_DIM**-0.5, context),
    }
    out = {}
    for name, fn in cases.items():
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3)
        out[name] = sorted(times)[len(times) // 2]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64])
    ap.add_argument("--contexts", nargs="+", type=int, default=[512, 4096])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    gpu = torch.cuda.is_available()
    if gpu and dtype == torch.bfloat16 and torch.cuda.get_device_capability()[0] < 8:
        dtype = torch.float16  # a T4 has no bfloat16 arithmetic: same bytes
    peak = None
    if gpu:
        from minivllm.sim.hardware import HARDWARE

        name = torch.cuda.get_device_name()
        peak = next((hw.memory_bandwidth for key, hw in HARDWARE.items()
                     if key.split("-")[0].lower() in name.lower()), None)
        print(f"{name}: peak {peak / 1e9:.0f} GB/s" if peak else f"{name}: peak bandwidth unknown")
    print(f"block table: {block_table_share():.3%} of a decode launch's bytes (batch 64, 4,096 tokens)")
    print("batch context kernel                    bytes   T4 us (pred)  H100 us (pred)  measured us  of peak")
    for batch in args.batches:
        for context in args.contexts:
            launches = predict(batch, context)
            measured = measure(batch, context, dtype) if gpu else {}
            groups = {"cache write": launches[:1], "decode": launches[1:-1], "prefill": launches[-1:]}
            for group, ts in groups.items():
                nbytes = sum(t.bytes for t in ts)
                line = (f"{batch:>5} {context:>7} {' + '.join(t.kernel for t in ts):<24} {nbytes:>12,} "
                        f"{nbytes / traffic.T4_BANDWIDTH * 1e6:>12.1f} {nbytes / traffic.H100_BANDWIDTH * 1e6:>14.2f}")
                if group in measured:
                    us = measured[group]
                    line += f" {us:>12.1f}" + (f" {nbytes / (us * 1e-6) / peak:>8.0%}" if peak else "")
                else:
                    line += "   (no GPU: prediction only)"
                print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
