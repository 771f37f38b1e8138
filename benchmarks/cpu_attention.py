"""The CPU attention backends side by side: ``"cpp"`` (the paged cache read in place) against
``"torch"`` (gather, then SDPA), in one run on one machine.

Two measurements:

1. **one layer's decode attention**: ``--seqs`` decode rows over contexts drawn lognormally
   around ``--context`` tokens (the tiny model's heads: 6 query heads, 2 KV heads, head_dim 32,
   blocks of 16 scattered over the pool), each backend's attention call alone (the cache write
   left out), best of 5 x 50 calls, at each of ``--threads``;
2. **the engine**: the trace of ``benchmarks/step_profile.py`` (128 requests, greedy,
   ``ignore_eos``) served by ``LLM(attention_backend=...)`` for each backend, alternating,
   ``--rounds`` times, best round of each, the outputs compared token for token; then the same for the
   first ``--batch1-requests`` requests served one at a time (batch 1).

It also reports what the first use of the kernel costs in a new process: loading the extension
that an earlier process built (the disk cache), and, with ``--cold``, building it from scratch
in a fresh cache directory.

    python benchmarks/cpu_attention.py [--threads 1 2] [--rounds 2] [--seqs 48] [--context 230] [--cold]
                                       [--batch1-requests 8]
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_profile import make_trace  # noqa: E402

from minivllm import LLM, SamplingParams  # noqa: E402
from minivllm.attention import get_attention_backend  # noqa: E402
from minivllm.attention.cpp_backend import kernel_status, paged_attention_cpu, plan_cpp_step  # noqa: E402
from minivllm.attention.metadata import AttentionMetadata  # noqa: E402
from minivllm.attention.torch_ragged import paged_attention_ragged, plan_step  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 6, 2, 32, 16
# torch and torch's extension loader are imported before the clock starts: every engine pays for those
LOAD_SNIPPET = ("import time, torch, torch.utils.cpp_extension; from minivllm.cpu_kernels import load_kernels; "
                "t1 = time.perf_counter(); load_kernels(); print(time.perf_counter() - t1)")


def decode_problem(seqs: int, context: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    lens = torch.exp(torch.randn(seqs, generator=gen) * 0.6 + math.log(context)).clamp(8, 1000).int().tolist()
    per_seq = [-(-n // BLOCK) for n in lens]
    num_blocks = sum(per_seq) + 8
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables, at = [], 0
    for n in per_seq:
        tables.append(order[at:at + n])
        at += n
    k = torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=gen)
    v = torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=gen)
    q = torch.randn(seqs, HEADS, HEAD_DIM, generator=gen)
    meta = AttentionMetadata.build([1] * seqs, lens, tables, [0] * seqs, BLOCK)
    return q, k, v, meta, sum(lens)


def best_ms(fn, calls: int = 50, repeats: int = 5) -> float:
    for _ in range(3):
        fn()
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e3)
    return best


def kernel_rows(seqs: int, context: int, threads: list[int]) -> list[str]:
    q, k, v, meta, keys = decode_problem(seqs, context)
    scale = HEAD_DIM ** -0.5
    ragged = plan_step(meta, q.device, q.dtype)
    cpp = plan_cpp_step(meta, q.device, q.dtype)
    want = paged_attention_ragged(q, q[:, :KV_HEADS], q[:, :KV_HEADS], k, v, ragged, scale)
    got = paged_attention_cpu(q, k, v, cpp.tables, cpp.seq_lens, cpp.query_start, scale)
    err = float((got - want).abs().max())
    rows = [f"{seqs} decode rows, {keys} cached positions in all (mean {keys / seqs:.0f}), "
            f"{len(ragged.decode)} length buckets for 'torch'; largest difference {err:.1e}", "",
            "| threads | 'torch' (gather + SDPA) ms | 'cpp' (in place) ms | torch / cpp |", "|---:|---:|---:|---:|"]
    for n in threads:
        torch.set_num_threads(n)
        t_torch = best_ms(lambda: paged_attention_ragged(q, q[:, :KV_HEADS], q[:, :KV_HEADS], k, v, ragged, scale))
        t_cpp = best_ms(lambda: paged_attention_cpu(q, k, v, cpp.tables, cpp.seq_lens, cpp.query_start, scale))
        rows.append(f"| {n} | {t_torch:.3f} | {t_cpp:.3f} | {t_torch / t_cpp:.2f}x |")
    return rows


ENGINES = ("torch", "cpp")  # the attention backends compared


def serve(engine: str, threads: int, requests: int = 128, one_at_a_time: bool = False
          ) -> tuple[float, list[list[int]]]:
    llm = LLM(max_num_seqs=64, max_model_len=1024, cpu_threads=threads, attention_backend=engine)
    vocab = llm.engine.model_config.vocab_size
    trace = make_trace(requests, 0)
    prompts = [it.prompt_token_ids(vocab) for it in trace]
    params = [SamplingParams(temperature=0, max_tokens=it.output_len, ignore_eos=True) for it in trace]
    llm.generate(prompts[:8], params[:8], use_tqdm=False)  # warm-up
    t0 = time.perf_counter()
    if one_at_a_time:
        outs = [llm.generate([p], [q], use_tqdm=False)[0] for p, q in zip(prompts, params, strict=True)]
    else:
        outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    return sum(map(len, tokens)) / wall, tokens


def engine_rows(threads: list[int], rounds: int, requests: int = 128, one_at_a_time: bool = False) -> list[str]:
    names = list(ENGINES)
    rows = ["| threads | " + " | ".join(f"'{n}' output tok/s" for n in names)
            + " | cpp / torch | per round | identical outputs |",
            "|---:|" + "---:|" * len(names) + "---:|---|---:|"]
    for n in threads:
        best = dict.fromkeys(names, 0.0)
        per_round, same = [], 0
        for _ in range(rounds):
            got = {}
            for engine in names:
                rate, tokens = serve(engine, n, requests, one_at_a_time)
                got[engine] = (rate, tokens)
                best[engine] = max(best[engine], rate)
            per_round.append(f"{got['cpp'][0] / got['torch'][0]:.2f}x")
            same = min(sum(a == b for a, b in zip(got["torch"][1], got[e][1])) for e in names)
        rows.append(f"| {n} | " + " | ".join(f"{best[e]:.0f}" for e in names)
                    + f" | {best['cpp'] / best['torch']:.2f}x | {', '.join(per_round)} | {same}/{requests} |")
    return rows


def first_use_rows(cold: bool) -> list[str]:
    rows = []
    warm = subprocess.run([sys.executable, "-c", LOAD_SNIPPET], capture_output=True, text=True, check=True)
    rows.append(f"loading the built kernel in a new process: {float(warm.stdout.split()[-1]):.2f} s")
    if cold:
        with tempfile.TemporaryDirectory() as build_dir:
            env = {**os.environ, "TORCH_EXTENSIONS_DIR": build_dir}
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", LOAD_SNIPPET], capture_output=True, text=True, check=True, env=env)
            rows.append(f"building it from scratch (empty TORCH_EXTENSIONS_DIR): {time.perf_counter() - t0:.1f} s "
                        "(the whole process)")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seqs", type=int, default=48)
    ap.add_argument("--context", type=int, default=230)
    ap.add_argument("--cold", action="store_true", help="also time a build from scratch")
    ap.add_argument("--kernel-only", action="store_true", help="skip the engine runs")
    ap.add_argument("--batch1-requests", type=int, default=8, help="requests of the one-at-a-time runs")
    args = ap.parse_args(argv)
    reason = kernel_status()
    if reason is not None:
        print(f"skipped: {reason}")
        return 0
    assert get_attention_backend("cpp").name == "cpp"
    print(f"$ python benchmarks/cpu_attention.py {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip())
    print("\n".join(first_use_rows(args.cold)), end="\n\n")
    print("\n".join(kernel_rows(args.seqs, args.context, args.threads)), end="\n\n")
    if not args.kernel_only:
        print("\n".join(engine_rows(args.threads, args.rounds)), end="\n\n")
        print(f"one request at a time ({args.batch1_requests} of the trace's requests, served one after the other):")
        print("\n".join(engine_rows(args.threads, args.rounds, args.batch1_requests, one_at_a_time=True)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
