"""KV-cache utilisation: tokens stored / token slots reserved, paged vs contiguous.

The same chat-like trace runs through the real engine (tiny model, continuous batching) twice
with the same KV memory: once with the paged cache (blocks taken as sequences grow), once with
the contiguous baseline (every request reserves ``max_model_len`` slots when admitted).
Utilisation is summed over every step (tokens stored in all steps / slots reserved in all
steps), so it weighs each step equally. Prefix caching is off so that every stored token
belongs to exactly one request.

    python benchmarks/kv_utilization.py [--requests 64] [--max-model-len 1024] [--blocks 640]
"""

from __future__ import annotations

import argparse
import sys
import time

import minivllm
from minivllm import LLM
from minivllm.workloads import LogNormalLengths, chat

PROMPT = LogNormalLengths(mean=64, sigma=0.8, low=4, high=512)
OUTPUT = LogNormalLengths(mean=128, sigma=0.9, low=4, high=480)


def run(trace, vocab: int, kv_cache: str, args) -> dict:
    llm = LLM(kv_cache=kv_cache, num_kv_blocks=args.blocks, block_size=args.block_size,
              max_model_len=args.max_model_len, enable_prefix_caching=False, max_num_seqs=256)
    prompts = [it.prompt_token_ids(vocab) for it in trace]
    t0 = time.perf_counter()
    llm.generate(prompts, [it.sampling_params() for it in trace], use_tqdm=False)
    s = llm.stats().summary()
    s["wall_s"] = time.perf_counter() - t0
    s["peak_seqs"] = max(llm.stats().column("num_running"))
    s["stats"] = llm.stats()  # every step's figures, for plots (notebook 04)
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--blocks", type=int, default=640, help="KV pool size, the same for both")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(f"$ python benchmarks/kv_utilization.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    trace = chat(args.requests, seed=args.seed, prompt=PROMPT, output=OUTPUT, name="kvutil")
    vocab = minivllm.model.ModelConfig.from_file(minivllm.TINY_MODEL_DIR).vocab_size
    print(trace.describe())
    print(f"KV pool: {args.blocks} blocks x {args.block_size} tokens = {args.blocks * args.block_size} "
          f"token slots; max_model_len {args.max_model_len}\n")
    rows = {kind: run(trace, vocab, kind, args) for kind in ("paged", "contiguous")}
    print("| KV cache | utilisation (stored / reserved) | mean seqs per step | peak seqs | steps | wall (s) |")
    print("|---|---:|---:|---:|---:|---:|")
    for kind, s in rows.items():
        print(f"| {kind} | {s['mean_kv_utilization']:.1%} | {s['mean_batch_seqs']:.1f} | {s['peak_seqs']} "
              f"| {s['num_steps']} | {s['wall_s']:.1f} |")
    ratio = rows["paged"]["mean_kv_utilization"] / rows["contiguous"]["mean_kv_utilization"]
    print(f"\npaged / contiguous utilisation: {ratio:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
